"""Clock trust in `controller.clocksync`: delays of a NIC are only given out while its clock is
certain to ``max_unc_ns``, judged by how far the previous solve missed the new one."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from contract.records import ProbeBatch
from controller.clocksolve import SampleRows, SampleWindow, compute_state, recent_errors
from controller.clocksync import (
    ClockState,
    ClockSync,
    ClockSyncConfig,
    bin_keys,
    rebased_errors,
    recent_drift,
    solve_miss,
    trust_horizon,
)
from controller.ingest import Ingestor
from controller.live import LiveConfig, LiveController
from mesh.fabric import FabricShape, build_fabric
from sync import ClockModels
from testbed.sim.engine import SimConfig, Simulator

EPOCH = 1_700_000_000_000_000_000
S = 1_000_000_000


def _state(
    offsets: list[float], t_ref: int, *, span: int = 4 * S, drift: float = 0.0
) -> ClockState:
    n = len(offsets)
    models = ClockModels.build(
        t_ref, np.array(offsets), np.full(n, drift), np.full(n, 2.0), np.full(n, 1e-10)
    )
    return ClockState(models, 0.0, t_ref, n, span_ns=span, end_ns=t_ref + span // 2)


def test_solve_miss_is_per_nic_and_ignores_a_common_shift() -> None:
    old = _state([0.0, 0.0, 0.0, 0.0], EPOCH)
    # the new solve: every clock 700 ns later on its timescale (common), NIC 2 5 us off
    new = _state([700.0, 700.0, 5700.0, 700.0], EPOCH + 4 * S)
    miss, derr = solve_miss(old, new)
    assert miss[2] == pytest.approx(5000.0, abs=1.0)
    assert np.delete(miss, 2) == pytest.approx(0.0, abs=1.0)
    dist = 6 * S  # old t_ref to the new state's latest samples
    assert derr[2] == pytest.approx(5000.0 / dist, rel=1e-3)
    miss0, derr0 = solve_miss(None, new)
    assert np.isnan(miss0).all() and np.isinf(derr0).all()


def test_trust_horizon_grows_with_certainty_and_is_negative_for_unknown() -> None:
    st = _state([0.0, 0.0, np.nan], EPOCH)
    h = trust_horizon(st.models, np.array([1e-9, 1e-7, 0.0]), 1000.0)
    # 1000 / sqrt 2 ns per clock, 2 ns offset std: ~707 s at 1 ppb, ~7 s at 100 ppb
    assert h[0] == pytest.approx(707.1 * S, rel=1e-3)
    assert h[1] == pytest.approx(7.071 * S, rel=1e-3)
    assert h[2] == -1.0
    assert (trust_horizon(st.models, np.full(3, np.inf), 1000.0) <= 0).all()


def test_a_nic_the_new_solve_contradicts_is_withheld_the_others_judged() -> None:
    cs = ClockSync(4, ClockSyncConfig(max_unc_ns=1000.0))
    assert cs.install(_state([0.0] * 4, EPOCH, span=S))
    assert (cs.trust_ns <= 0).all()  # nothing confirms the first solve
    assert cs.install(_state([0.0, 0.0, 4000.0, 0.0], EPOCH + 2 * S, span=2 * S))
    rel = np.full(4, 0.5e9)  # half a second from t_ref
    ok = cs.trusted(np.arange(4, dtype=np.int32), rel)
    assert ok.tolist() == [True, True, False, True]
    _, unc = cs.offsets(EPOCH + 3 * S)
    assert unc[2] > 1000.0 > unc[0]


def test_a_solve_over_too_short_a_span_is_not_trusted() -> None:
    cs = ClockSync(3, ClockSyncConfig(min_span_ns=S // 2))
    assert cs.install(_state([0.0] * 3, EPOCH, span=S // 10))
    assert cs.install(_state([0.0] * 3, EPOCH + S // 10, span=S // 5))  # agree, but one instant
    assert not cs.trusted(np.arange(3, dtype=np.int32), np.zeros(3)).any()


def test_warmup_splits_the_first_bin_so_early_solves_see_drift() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    ing = Ingestor(fab)
    cs = ClockSync(16, ClockSyncConfig(window_ns=10 * S, bins=4, warmup_bins=8))
    for st in Simulator(fab, SimConfig(seed=3, peers=4)).run(2.0, 0.25):
        b = ing.ingest(st.batch)
        assert b is not None
        cs.add(b)
    w = cs.window()
    assert w is not None
    pairs = w.src.astype(np.int64) * 16 + w.dst
    per_pair = np.bincount(np.unique(pairs, return_counts=True)[1])
    # 2 s of a 2.5 s first bin: 6-7 sub-bins of 0.3125 s, one coded pair (2 rows) each
    assert np.argmax(per_pair) >= 12
    one = ClockSyncConfig(window_ns=10 * S, bins=4, warmup_bins=1)
    assert bin_keys(np.array([0, 2 * S], np.int64), 0, one).tolist() == [0, 0]
    assert bin_keys(np.array([0, 2 * S, 3 * S], np.int64), 0, cs.config).tolist() == [0, 6, 15]


def test_bins_lie_on_a_fixed_grid_not_on_the_first_stamp() -> None:
    """Bins of 2.5 s aligned to UNIX time; the warm-up's sub-bins (0.3125 s) start at the
    first stamp's sub-bin, so two processes whose first stamps share a sub-bin bin alike
    (the fleet merges their selections: `controller.fleet`)."""
    cfg = ClockSyncConfig(window_ns=10 * S, bins=4, warmup_bins=8)
    t = np.array([S // 10, 27 * S // 10, 29 * S // 10, 6 * S], np.int64)
    # warm-up [0.3125, 2.8125) s: 0.1 s is before it (bin 0), 2.7 s in it (bin 1, sub 0)
    assert bin_keys(t, 4 * S // 10, cfg).tolist() == [7, 8, 15, 23]
    assert bin_keys(t, 6 * S // 10, cfg).tolist() == [7, 8, 15, 23]
    shift = EPOCH // (25 * S // 10) * 8  # EPOCH is a whole number of bins
    assert (bin_keys(t + EPOCH, EPOCH, cfg) - bin_keys(t, 0, cfg) == shift).all()


@pytest.mark.parametrize("seed", [1, 2])
def test_delays_given_out_on_the_realistic_model_are_within_the_bound(seed: int) -> None:
    """Early solves on a realistic fabric miss by microseconds (incast on one coded pair per
    directed pair, drift from one instant); none of that may reach detection."""
    fab = build_fabric(FabricShape.for_nics(64, nics_per_leaf=16, spines=4))
    sim = Simulator(fab, SimConfig(seed=seed))
    ing = Ingestor(fab)
    cs = ClockSync(len(fab.nics))
    worst, judged = 0.0, []
    for st in sim.run(4.0, 0.1):
        b = ing.ingest(st.batch)
        assert b is not None
        cs.add(b)
        cs.maybe_solve(int(b.t1.max()))
        d = cs.delays(b)
        err = np.abs(np.concatenate([d.owd_fwd_ns - st.true_fwd_ns, d.owd_rev_ns - st.true_rev_ns]))
        fin = np.isfinite(err)
        judged.append(fin.sum() / max(1, (~np.isnan(st.true_fwd_ns)).sum() * 2))
        if fin.any():
            worst = max(worst, float(err[fin].max()))
    assert worst < cs.config.max_unc_ns
    assert np.mean(judged[-10:]) > 0.9  # after warm-up nearly every delay is judged


def test_a_nic_missed_by_more_than_the_fine_bound_gives_coarse_delays() -> None:
    """A miss of 1.2 µs (over 1000/sqrt 2, under 2000/sqrt 2) leaves the NIC's delays coarse:
    given out, marked, judged only by the slow tier; a 4 µs miss withholds them."""
    cs = ClockSync(8, ClockSyncConfig(max_unc_ns=1000.0, coarse_unc_ns=2000.0))
    assert cs.install(_state([0.0] * 8, EPOCH, span=S))
    offsets = [0.0, 0.0, 0.0, 1200.0, 4000.0, 0.0, 0.0, 0.0]
    assert cs.install(_state(offsets, EPOCH + 2 * S, span=2 * S))
    nic = np.arange(5, dtype=np.int32)
    rel = np.full(5, 0.5e9)
    assert cs.trusted(nic, rel).tolist() == [True, True, True, False, False]
    assert cs.trusted(nic, rel, coarse=True).tolist() == [True, True, True, True, False]
    fab = build_fabric(FabricShape.for_nics(8, nics_per_leaf=4, spines=1))
    # probes nic0 -> nic3, nic4, nic1 sent 0.5 s after the new state's t_ref, 2 us each way
    t1 = np.full(3, EPOCH + 2 * S + S // 2, np.int64)
    batch = ProbeBatch.from_columns(
        fab.nics[0].host, "hw", tuple(n.id for n in fab.nics),
        {"seq": np.arange(3), "src": np.zeros(3), "dst": np.array([3, 4, 1]),
         "sport": np.full(3, 49152), "t1": t1, "t2": t1 + 2000, "t3": t1 + 2100,
         "t4": t1 + 4100},
    )  # fmt: skip
    b = Ingestor(fab).ingest(batch)
    assert b is not None
    assert b.dst.tolist() == [3, 4, 1]
    d = cs.delays(b)
    assert d.coarse.tolist() == [True, False, False]
    assert np.isfinite(d.owd_fwd_ns).tolist() == [True, False, True]
    assert np.isnan(d.fine()[0]).tolist() == [True, True, False]


def test_coarse_bound_below_the_fine_one_is_refused() -> None:
    with pytest.raises(ValueError, match="coarse_unc_ns"):
        ClockSyncConfig(max_unc_ns=1000.0, coarse_unc_ns=500.0)


def test_solves_come_as_often_as_their_reported_cost_allows() -> None:
    """Without a reported cost: once per solve_every; with one: cost / budget, clamped."""
    cfg = ClockSyncConfig(solve_every_ns=10 * S, min_solve_every_ns=2 * S, solve_budget=0.05)
    cs = ClockSync(3, cfg)
    assert cs.solve_period_ns() == 10 * S
    cs.install(None, cost_ns=20_000_000)  # 20 ms: 0.4 s at 5 % of a core, clamped up to 2 s
    assert cs.solve_period_ns() == 2 * S
    cs.install(None, cost_ns=200_000_000)  # 0.2 s -> 4 s
    assert cs.solve_period_ns() == 4 * S
    cs.install(None, cost_ns=5 * S)  # a 10,000-NIC solve: once per window
    assert cs.solve_period_ns() == 10 * S
    cs._last_solve_ns, cs._span_solved = EPOCH, 10 * S  # past warm-up
    cs.install(None, cost_ns=200_000_000)
    assert not cs.due(EPOCH + 4 * S - 1) and cs.due(EPOCH + 4 * S)


def test_the_cadence_is_set_by_the_solves_cpu_time_not_its_waits() -> None:
    """`timed_solve` reports the CPU time of the thread that ran the solve: time spent waiting
    (here a sleep, on a busy machine the GIL or other processes) is not what the solve cost
    of a core, and counting it made solves rarer exactly when the machine was busy."""
    import threading
    import time

    from controller.clocksolve import timed_solve

    def waits() -> None:
        threading.Event().wait(0.3)  # 0.3 s of wall time, almost no CPU

    def works() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:  # 50 ms of this thread's CPU
            pass

    state, idle = timed_solve(waits)
    assert state is None and idle < 0.1
    _, busy = timed_solve(works)
    assert busy >= 0.05


def test_the_controller_counts_its_delays_by_clock_trust() -> None:
    """Every arrived probe's delay is counted once: withheld before a trusted solve (the
    first 2 s here), then all fine on a hardware-stamped fabric."""
    fab = build_fabric(FabricShape.for_nics(16))
    live = LiveController(fab, LiveConfig(window_ns=250_000_000))
    arrived, at_3s = [], None
    for st in Simulator(fab, SimConfig(seed=5, peers=4)).run(6.0, 0.25):
        now = int(st.batch.t1.max())
        live.admit(st.batch, now)
        live.tick(now)  # closes the windows that are over: clocks solved when due
        arrived.append(int((~np.asarray(st.batch.lost, bool)).sum()))
        if len(arrived) == 2:
            assert live.delay_trust.tolist() == [0, 0, sum(arrived)]  # no trusted solve yet
        if len(arrived) == 12:
            at_3s = live.delay_trust.copy()
    assert at_3s is not None and int(live.delay_trust.sum()) == sum(arrived)
    grown = live.delay_trust - at_3s
    assert grown.tolist() == [sum(arrived[12:]), 0, 0]


def test_the_live_controller_gives_the_clock_solve_each_nics_leaf() -> None:
    """The hardware-stamp solve splits the queueing left in the best samples by NIC downlink
    and leaf uplink only if it knows each NIC's leaf (`sync.excess.split_excess`)."""
    fab = build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, spines=1))
    leaf = LiveController(fab).clock.leaf
    assert leaf is not None and leaf.tolist() == [0, 0, 1, 1]


def test_wandering_clocks_need_solves_every_few_seconds() -> None:
    """The simulator's NIC clocks wander (random-walk FM, 10 ppb/sqrt(s)): a model
    extrapolated tau past its data errs by ~q sqrt(tau^3 / 3) whatever its drift estimate.
    Solved every 2 s (what the service does when solves are cheap: ``min_solve_every_ns``),
    past the warm-up (8-16 s, 32 NICs at load 0.7) the judged delays stay within 400 ns of
    the truth at the 99th percentile (about 235 ns); solved once per 10 s (the default
    without a reported cost) the error grows linearly with the time since the solve, to
    950 ns at 15 s (770 ns p99 over 8-16 s; docs/benchmarks.md, "Clocks wander between
    solves")."""
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8))
    sim = Simulator(fab, SimConfig(seed=1, load=0.7))
    ing = Ingestor(fab)
    cs = ClockSync(32, ClockSyncConfig(solve_every_ns=2 * S), leaf=fab.nic_group_index)
    errs: list[np.ndarray] = []
    for st in sim.run(16.0, 0.1):
        b = ing.ingest(st.batch)
        assert b is not None and len(b) == len(st.batch)  # rows in batch order
        cs.add(b)
        cs.maybe_solve(int(b.t1.max()))
        d = cs.delays(b)
        if st.t0_s >= 8.0:
            for owd, true in ((d.owd_fwd_ns, st.true_fwd_ns), (d.owd_rev_ns, st.true_rev_ns)):
                ok = np.isfinite(owd) & np.isfinite(true)
                errs.append(np.abs(owd - true)[ok])
    err = np.concatenate(errs)
    assert len(err) > 200_000  # most delays judged
    assert np.percentile(err, 99) < 400.0
    assert cs.solves >= 10  # warm-up doublings, then every 2 s


def test_clock_errors_carry_over_a_solve_as_the_new_models_measure_them() -> None:
    """A solve that fitted part of a step (NIC 2: 2 us of it) keeps the error the NIC had
    before, rebased onto the new models, so the next batch still shows the step against it;
    a common shift of the reference timescale (700 ns) moves no NIC."""
    old = _state([0.0, 0.0, 0.0, 0.0], EPOCH)
    new = _state([700.0, 700.0, 2_700.0, 700.0], EPOCH + 2 * S)
    err = np.array([10.0, -10.0, 20.0, np.nan])
    got = rebased_errors(err, old, new)
    assert np.allclose(got[:3], [10.0, -10.0, 20.0 - 2_000.0]) and np.isnan(got[3])
    assert np.isnan(rebased_errors(err, None, new)).all()


def _rows(
    n: int, t0: int, t1: int, every: int, off: Any, late: Any, rng: np.random.Generator
) -> SampleRows:
    """Coded probe pairs (two probes 10 us apart) from every NIC to every other every
    ``every`` ns in [t0, t1): true one-way delay 2 us plus up to 100 ns of jitter; stamps on
    clocks ``off(nic, t)`` ns ahead, and each NIC's transmit stamps ``late(nic, t)`` ns late."""
    cols: dict[str, list[int]] = {k: [] for k in ("src", "dst", "pair", "t1", "t2", "t3", "t4")}
    pid = 0
    for t in range(t0, t1, every):
        for a in range(n):
            for b in range(n):
                if a == b:
                    continue
                for k in range(2):
                    ts = t + k * 10_000 + a * 1_000
                    fwd = 2_000 + int(rng.integers(0, 100))
                    back = 2_000 + int(rng.integers(0, 100))
                    row = (a, b, pid, ts + off(a, ts) + late(a, ts), ts + fwd + off(b, ts),
                           ts + fwd + 500 + off(b, ts) + late(b, ts),
                           ts + fwd + 500 + back + off(a, ts))  # fmt: skip
                    for name, v in zip(cols, row, strict=True):
                        cols[name].append(int(v))
                pid += 1
    arr = {k: np.array(v, np.int64) for k, v in cols.items()}
    arr["src"], arr["dst"] = arr["src"].astype(np.int32), arr["dst"].astype(np.int32)
    arr["sw"] = np.ones(len(arr["src"]), bool)
    return SampleRows.of(arr)


def test_recent_errors_are_how_far_each_model_sits_from_its_newest_rows() -> None:
    """Models all at 0; in the newest rows NIC 2's clock reads 800 ns ahead of its model: 800
    for NIC 2, ~0 for the others (each sees it on one peer of three: the median), whatever
    the common shift; too few rows: NaN."""
    rng = np.random.default_rng(1)
    models = ClockModels.build(EPOCH, np.zeros(4), np.zeros(4), np.full(4, 5.0), np.full(4, 1e-9))
    w = _rows(4, EPOCH, EPOCH + 2 * S, S // 4, lambda k, t: 800 * (k == 2) + 300,
              lambda k, t: 0, rng)  # fmt: skip
    err = recent_errors(models, w, EPOCH + S)
    assert err[2] == pytest.approx(800.0, abs=60.0)
    assert np.delete(err, 2) == pytest.approx(0.0, abs=60.0)
    assert np.isnan(recent_errors(models, w, EPOCH + S, min_rows=10**6)).all()
    assert np.isnan(recent_errors(models, w, EPOCH + 3 * S)).all()  # no newest rows


def test_stamps_late_for_part_of_the_window_are_no_longer_trusted_as_fitted() -> None:
    """NIC 3 stamps its transmits 1.5 us late for the first 6 s of a 10 s software-stamped
    window (a busy host), its clock true: its delays out look shorter, which no envelope can
    tell from its clock running behind, so the solve fits it as drift and its model ends the
    window off by hundreds of ns, more than it states; the window's newest rows show it
    (`ClockState.recent_ns`), the live uncertainty includes it, and the NIC's delays are
    trusted for less time than the others'."""
    rng = np.random.default_rng(2)
    n = 6
    late = lambda k, t: 1_500 * (k == 3 and t < EPOCH + 6 * S)  # noqa: E731
    w = _rows(n, EPOCH, EPOCH + 10 * S, S // 2, lambda k, t: 0, late, rng)
    cfg = ClockSyncConfig()
    st = compute_state(SampleWindow(**w.cols()), n, cfg, EPOCH + 10 * S)
    assert st is not None and st.recent_ns is not None
    at = EPOCH + 10 * S
    truth_err = st.models.offset_ns + st.models.drift * (at - st.models.t_ref_ns)
    truth_err = np.abs(truth_err - np.median(truth_err))  # every clock is true
    cs = ClockSync(n, cfg)
    cs.install(dataclasses.replace(st, solved_at_ns=1))
    cs.install(dataclasses.replace(st, solved_at_ns=2))  # agrees with itself: trusted
    m = st.models
    stated = np.sqrt(m.offset_std_ns**2 + (m.drift_std * (at - m.t_ref_ns)) ** 2)
    assert truth_err[3] > 500.0 > 10 * stated[3]  # off by ~750 ns, stating a few
    assert st.recent_ns[3] == pytest.approx(truth_err[3], rel=0.1)  # the newest rows show it
    assert np.delete(st.recent_ns, 3).max() < 20.0
    # ... as a drift error over their distance from t_ref (the middle of the newest quarter)
    assert 3 * S < st.recent_at_ns - m.t_ref_ns < 4 * S
    assert cs.drift_err[3] == pytest.approx(st.recent_ns[3] / (st.recent_at_ns - m.t_ref_ns))
    _, unc = cs.offsets(at)
    assert unc[3] > truth_err[3]  # stated at the window's end: covers how far off it is
    assert np.delete(unc, 3).max() < 30.0
    # fine only while within 707 ns: less than 4 s from t_ref (the others: minutes); coarse
    # still at the window's end
    assert 0 < cs.trust_ns[3] < 4 * S < 60 * S < np.delete(cs.trust_ns, 3).min()
    assert cs.coarse_trust_ns[3] > at - m.t_ref_ns


def test_what_the_newest_rows_show_is_a_drift_error_over_their_distance() -> None:
    st = dataclasses.replace(_state([0.0, 0.0, 0.0], EPOCH), recent_ns=np.array(
        [np.nan, 300.0, 800.0]), recent_at_ns=EPOCH + 3 * S)  # fmt: skip
    assert recent_drift(st) == pytest.approx([0.0, 100e-9, 800e-9 / 3])
    near = dataclasses.replace(st, recent_at_ns=EPOCH + S // 10)  # a second at least
    assert recent_drift(near) == pytest.approx([0.0, 300e-9, 800e-9])
    assert (recent_drift(_state([0.0, 0.0], EPOCH)) == 0).all()  # hardware stamps: none
    cs = ClockSync(3, ClockSyncConfig())
    cs.install(dataclasses.replace(st, solved_at_ns=1))
    cs.install(dataclasses.replace(st, solved_at_ns=2))
    assert cs.drift_err == pytest.approx([0.0, 100e-9, 800e-9 / 3])


def test_a_software_stamped_solve_is_trusted_once_it_spans_a_bin() -> None:
    """A second of kernel stamps does not pin a drift: a software-stamped state (one that
    read its newest rows) over 1.5 s is not trusted where a hardware-stamped one is; over a
    bin (2.5 s) it is."""
    cfg = ClockSyncConfig(min_span_ns=S)
    hw = ClockSync(3, cfg)
    sw = ClockSync(3, cfg)
    for k, span in enumerate((S // 2, 3 * S // 2)):
        st = _state([0.0] * 3, EPOCH + k * S, span=span)
        hw.install(st)
        sw.install(dataclasses.replace(st, recent_ns=np.zeros(3), recent_at_ns=st.end_ns))
    nic, rel = np.arange(3, dtype=np.int32), np.zeros(3)
    assert hw.trusted(nic, rel).all() and not sw.trusted(nic, rel, coarse=True).any()
    assert sw.state is not None and hw.state is not None
    assert sw.min_span_of(sw.state) == cfg.window_ns // cfg.bins == 5 * S // 2
    assert hw.min_span_of(hw.state) == S
    sw.install(dataclasses.replace(_state([0.0] * 3, EPOCH + 3 * S, span=3 * S),
                                   recent_ns=np.zeros(3), recent_at_ns=EPOCH + 4 * S))  # fmt: skip
    assert sw.trusted(nic, rel).all()
