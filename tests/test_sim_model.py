"""The realistic simulator model: each effect does what its knob says (docs/simulator.md)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from mesh.fabric import FabricShape, build_fabric
from qpmesh.cli import main
from testbed.scenario import Fault, FaultKind
from testbed.sim.clock_model import CHUNK, HISTORY_S, ClockWander
from testbed.sim.engine import SimConfig, SimStep, Simulator
from testbed.sim.load_model import UtilisationModel, redistribution
from testbed.sim.loss_model import LossModel
from testbed.sim.model import ModelError, ModelKnobs
from testbed.sim.stamp_model import StampModel
from testbed.sim.sync_truth import BestQueueing, mean_queueing

FABRIC = build_fabric(FabricShape())
QUIET = dataclasses.replace(  # realistic floors and clocks, nothing random on top
    ModelKnobs(),
    hotspot_frac=0.0,
    incast_prob=0.0,
    background_loss=0.0,
    burst_per_link_h=0.0,
    overflow_loss=0.0,
)


def test_realistic_is_the_default_and_ideal_switches_every_effect_off() -> None:
    assert SimConfig().model == ModelKnobs() and not ModelKnobs().ideal
    ideal = ModelKnobs.ideal_model().to_dict()
    assert ideal["ideal"] is True
    assert ideal["util_spread"] == ideal["background_loss"] == ideal["ecmp_mismatch"] == 0
    with pytest.raises(ModelError):
        ModelKnobs(background_loss=2.0)
    with pytest.raises(ModelError):
        ModelKnobs().with_overrides(["no_such=1"])
    assert ModelKnobs().with_overrides(["cable_m=2,3"]).cable_m == (2.0, 3.0)


def test_directed_utilisation_differs_per_direction_and_hot_spots_move() -> None:
    m = UtilisationModel(FABRIC, 0.9, ModelKnobs(), seed=1)
    up, down = m.base[0::2], m.base[1::2]
    assert np.all(np.abs(m.base - 0.9) <= 0.05 + 1e-12)
    assert np.mean(np.abs(up - down)) > 0.01  # the two directions of a link differ
    # hot spots: redrawn every period, constant within one
    assert np.array_equal(m.hot(0.0), m.hot(4.9))
    assert not np.array_equal(m.hot(0.0), m.hot(5.0)) or not np.array_equal(m.hot(5.0), m.hot(10.0))
    rho = np.full(FABRIC.n_hops, 0.5)
    assert not m.overflow_loss(rho).any()
    rho[:] = 0.95
    loss = m.overflow_loss(rho)
    # switch buffers overflow; a NIC's own transmit queue back-pressures its host instead
    assert np.all(loss[m.nic_egress] == 0) and np.all(loss[~m.nic_egress] > 0)
    assert m.nic_egress.sum() == len(FABRIC.nics)


def test_directed_queueing_differs_between_the_two_directions_of_a_link() -> None:
    knobs = dataclasses.replace(QUIET, util_spread=0.3, coded_fifo=False)
    sim = Simulator(FABRIC, SimConfig(load=0.5, seed=2, model=knobs))
    rho = sim._util.utilisation(0.0)
    li = int(np.argmax(np.abs(rho[0::2] - rho[1::2])))
    up, down = 2 * li, 2 * li + 1
    assert abs(rho[up] - rho[down]) > 0.2
    n = 20_000
    q = {
        h: sim._delays(np.full((n, 1), h, dtype=np.int32), rho, np.zeros(len(rho)), None)[0]
        - sim._hop_base_ns[h]
        for h in (up, down)
    }
    svc = sim._service_ns[up]
    for h in (up, down):  # M/M/1-like waiting: mean rho * S / (1 - rho)
        assert np.mean(q[h]) == pytest.approx(rho[h] * svc / (1 - rho[h]), rel=0.15)


def test_constant_asymmetry_is_the_same_at_every_time() -> None:
    sim = Simulator(
        FABRIC, SimConfig(load=0.0, seed=3, model=dataclasses.replace(QUIET, util_spread=0.0))
    )
    a, b = sim.step(0.0, 0.5), sim.step(100.0, 0.5)
    # at zero load the delay is the fixed part only: identical for the same pair and path
    ka = {
        (int(p), int(s)): d
        for p, s, d in zip(a.pair_index, a.batch.sport, a.true_fwd_ns, strict=True)
    }
    same = [
        (ka[(int(p), int(s))], d)
        for p, s, d in zip(b.pair_index, b.batch.sport, b.true_fwd_ns, strict=True)
        if (int(p), int(s)) in ka
    ]
    assert len(same) > 100
    x, y = np.array(same).T
    assert np.allclose(x, y)
    asym = sim.pair_asymmetry_ns()
    assert np.percentile(np.abs(asym), 90) > 2.0  # cables, ports and NICs: not symmetric
    ideal = Simulator(FABRIC, SimConfig(load=0.0, seed=3, model=ModelKnobs.ideal_model()))
    assert np.percentile(np.abs(ideal.pair_asymmetry_ns()), 90) < np.percentile(np.abs(asym), 90)


def test_wander_has_the_configured_random_walk_spectrum() -> None:
    knobs = dataclasses.replace(QUIET, wander_ppb_sqrt_s=10.0, temp_steps_per_h=0.0)
    w = ClockWander(2000, knobs, seed=4)
    w.offset_ns(np.array([200e9]), np.array([0]))
    f = w.freq_ppb[:, :200]
    for lag in (1, 16):
        d = f[:, lag:] - f[:, :-lag]
        # random-walk FM: the frequency change over T has std sigma * sqrt(T)
        assert np.std(d) == pytest.approx(10.0 * np.sqrt(lag), rel=0.1)
    # the offset is the integral of the frequency, continuous at knots
    t = np.array([9.999999e9, 10.0e9])
    o = w.offset_ns(t, np.array([7, 7]))
    assert abs(o[1] - o[0]) < 1e-3 + abs(w.freq_ppb[7, 9]) * 1e-6
    steps = dataclasses.replace(knobs, wander_ppb_sqrt_s=0.0, temp_steps_per_h=36.0)
    ws = ClockWander(500, steps, seed=5)
    ws.offset_ns(np.array([100e9]), np.array([0]))
    jumps = np.abs(np.diff(ws.freq_ppb[:, :101], axis=1))
    assert set(np.unique(np.round(jumps))) <= {0.0, 50.0, 100.0}
    assert 0.5 * 500 < (jumps > 0).sum() < 1.5 * 500  # 36/h x 100 s = 1 per NIC


def test_wander_holds_a_bounded_grid_over_a_day() -> None:
    # a simulated day queries ever later times: the grid behind HISTORY_S is dropped, so the
    # held knots stay bounded (they grew by 2 x 8 B per NIC per second before: issue 32's day)
    w = ClockWander(4, ModelKnobs(), seed=7)
    idx = np.arange(4)
    widths = []
    for t_s in range(0, 86_400, 20):
        w.offset_ns(np.full(4, t_s * 1e9), idx)
        widths.append(w.freq_ppb.shape[1])
    assert max(widths) <= HISTORY_S + 2 * CHUNK + 1
    assert w.base > 86_400 - HISTORY_S - 2 * CHUNK
    # the values do not depend on the order of queries: one jump to the end gives the same
    at = np.array([86_399.5e9, 86_399.5e9 - (HISTORY_S - 1) * 1e9, 86_380.25e9, 86_000e9])
    whole = ClockWander(4, ModelKnobs(), seed=7)
    assert np.array_equal(whole.offset_ns(at, idx), w.offset_ns(at, idx))
    with pytest.raises(ValueError, match="no longer held"):
        w.offset_ns(np.array([1e9]), np.array([0]))


def test_software_stamps_carry_a_per_host_bias() -> None:
    sm = StampModel(16, ModelKnobs(), seed=6)
    assert np.all(np.abs(sm.bias_tx) <= 500) and np.std(sm.bias_tx) > 100
    knobs = dataclasses.replace(QUIET, sw_outlier_prob=0.0)
    sim = Simulator(FABRIC, SimConfig(timestamps="sw", seed=6, model=knobs))
    st = sim.step(0.0, 2.0)
    b = st.batch
    host = FABRIC.nic_host_index[b.dst]
    theta = sim.true_offset_ns(st.true_t_ns, b.dst) - sim.true_offset_ns(st.true_t_ns, b.src)
    err = (b.t2 - b.t1) - st.true_fwd_ns - theta  # receive-stamp lateness minus send's
    per_host = [np.median(err[host == h]) for h in np.unique(host)]
    assert np.ptp(per_host) > 300.0  # hosts differ by hundreds of ns


def test_coded_pair_probes_go_through_each_fifo_one_behind_the_other() -> None:
    """Back-to-back probes through FIFO queues: the second never overtakes the first, it is
    compressed towards the first when the first is still queued on its arrival, and a pair
    keeps its sent spacing only when neither probe waited anywhere (a pure pair)."""

    def pairs(fifo: bool, spacing: int) -> tuple[Simulator, np.ndarray, np.ndarray, np.ndarray]:
        # (send stamps at the hand-off, so every hop's FIFO, the NIC's own too, is in the delay)
        knobs = dataclasses.replace(QUIET, coded_fifo=fifo, hw_stamp_at_wire=False)
        cfg = SimConfig(load=0.9, seed=7, coded_spacing_ns=spacing, model=knobs)
        sim = Simulator(FABRIC, cfg)
        st = sim.step(0.0, 1.0)
        first = np.flatnonzero(st.batch.pos == 0)
        first = first[first + 1 < len(st.batch)]
        hops = st.hops_fwd[first]
        floor = np.where(hops >= 0, sim._hop_base_ns[np.maximum(hops, 0)], 0.0).sum(axis=1)
        floor += sim.nic_tx_ns[st.batch.src[first]] + sim.nic_rx_ns[st.batch.dst[first]]
        queued = st.true_fwd_ns[first] - floor  # the first probe's total wait
        change = st.true_fwd_ns[first + 1] - st.true_fwd_ns[first]  # spacing out - spacing in
        return sim, queued, change, floor

    sim, queued, change, _ = pairs(True, 500)
    tau = float(sim._probe_ser_ns.min())
    assert np.all(500 + change >= tau - 1e-6)  # never overtakes: at least one probe time apart
    assert np.mean(change < -25) > 0.3  # 0.5 µs apart at load 0.9: often compressed
    _, queued, change, _ = pairs(True, 20_000)
    kept = np.abs(change) <= 1e-6
    assert kept.any() and np.all(queued[kept] < 1e-6)  # spacing kept <=> both unqueued
    assert np.mean(queued > 10) > 0.9  # (most first probes did wait: load 0.9)
    # the old, unphysical model: an independent wait for the second probe
    _, queued, change, _ = pairs(False, 20_000)
    assert np.all(queued[np.abs(change) <= 1e-6] < 1e-6)
    _, _, change, _ = pairs(False, 500)
    assert np.any(500 + change < 0)  # ... which lets the second overtake the first (unphysical)


@pytest.mark.parametrize(
    ("stamps", "at_wire", "hidden"), [("hw", True, True), ("hw", False, False), ("sw", True, False)]
)
def test_hw_send_stamps_are_taken_after_the_nics_own_egress_queue(
    stamps: str, at_wire: bool, hidden: bool
) -> None:
    """A NIC stamps a probe as it goes on the wire: its own egress queue (NIC -> leaf) is not
    in the hw-measured one-way delay, the leaf's egress towards it (leaf -> NIC) is; kernel
    (sw) stamps are taken before the NIC and see both."""
    nic = FABRIC.nics[0].id
    link = FABRIC.links[int(FABRIC.nic_link[0])]
    knobs = dataclasses.replace(QUIET, hw_stamp_at_wire=at_wire, sw_outlier_prob=0.0)
    sim = Simulator(
        FABRIC,
        SimConfig(load=0.1, seed=13, timestamps=stamps, model=knobs),
        [Fault(FaultKind.CONGEST, link.id, 0.0, 10.0, magnitude=20.0)],  # +Exp(20 µs) both ways
    )
    st = sim.step(0.0, 2.0)
    b = st.batch
    ok = ~b.lost
    theta = sim.true_offset_ns(st.true_t_ns, b.dst) - sim.true_offset_ns(st.true_t_ns, b.src)
    measured = (b.t2 - b.t1 - theta)[ok]  # one-way delay as the stamps give it
    src, dst = (b.src == 0)[ok], (b.dst == 0)[ok]
    other = ~(src | dst)
    assert np.median(measured[dst]) > np.median(measured[other]) + 5_000  # leaf -> NIC seen
    out = np.median(measured[src]) - np.median(measured[other])
    assert (out < 2_000) if hidden else (out > 5_000), (nic, out)
    # the truth is what the stamps measure (a perfect clock would see exactly this)
    if stamps == "hw":  # two 6.4 ns ticks, and rare TX-stamp outliers
        assert np.mean(np.abs(measured - st.true_fwd_ns[ok]) < 13.0) > 0.99


def test_background_loss_and_bursts() -> None:
    knobs = dataclasses.replace(QUIET, background_loss=0.01)
    st = Simulator(FABRIC, SimConfig(seed=8, model=knobs)).step(0.0, 2.0)
    hops = (st.hops_fwd >= 0).sum(axis=1) + (st.hops_rev >= 0).sum(axis=1)
    expect = float(np.mean(1 - 0.99**hops))
    assert st.batch.lost.mean() == pytest.approx(expect, rel=0.2)
    lm = LossModel(48, dataclasses.replace(QUIET, burst_per_link_h=10.0), seed=9)
    whole = lm.bursts(0.0, 3600.0)
    assert 300 < len(whole) < 700  # 48 links x 10/h
    pieces = [b for t in range(0, 3600, 60) for b in lm.bursts(float(t), float(t + 60))]
    assert set(whole) == set(pieces)  # independent of the step


def test_load_moves_off_a_down_link_onto_its_siblings() -> None:
    rho = np.full(FABRIC.n_hops, 0.4)
    li = FABRIC.link("leaf0-spine0").index
    extra = redistribution(FABRIC, [li], rho)
    sib = FABRIC.link("leaf0-spine1").index
    assert extra[2 * sib] > 0 and extra[2 * sib + 1] > 0
    assert extra.sum() == pytest.approx(0.8)  # both directions' load, nothing invented
    other = FABRIC.link("leaf1-spine1").index
    assert extra[2 * other] == 0
    sim = Simulator(
        FABRIC,
        SimConfig(load=0.6, seed=10, model=QUIET),
        [Fault(FaultKind.LINK_DOWN, "leaf0-spine0", 0.0, 10.0)],
    )
    assert sim.step(0.0, 0.5).batch.lost.any()


def test_controller_sees_a_realistic_fraction_of_wrong_paths() -> None:
    sim = Simulator(FABRIC, SimConfig(seed=11))
    st = sim.step(0.0, 2.0)
    assert st.seen_fwd is not None
    wrong = np.mean((st.seen_fwd != st.hops_fwd).any(axis=1))
    assert 0.005 < wrong < ModelKnobs().ecmp_mismatch * (1 - ModelKnobs().discovered) + 0.02
    ideal = Simulator(FABRIC, SimConfig(seed=11, model=ModelKnobs.ideal_model())).step(0.0, 0.5)
    assert ideal.seen_fwd is None


def test_sim_sync_json_names_the_model_and_the_asymmetry_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["sim", "sync", "--nics", "32", "--peers", "4", "--window", "0.5", "--rate", "20"]
    assert main([*args, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["model"]["ideal"] is False and rep["model"]["wander_ppb_sqrt_s"] == 10.0
    assert rep["asymmetry_floor"]["p99_ns"] > 0
    assert {"ntp_baseline", "ntp_tree", "qpmesh"} <= set(rep["estimators"])
    # hw: streamed into summaries, with the data's own queueing bound beside the floor
    assert rep["streamed"] is True and rep["summary_points"] > 0
    assert rep["queueing_bound"]["p99_ns"] > 0 and rep["drift_from"]
    # and the part of the receive correction's error no reading can remove (the luck)
    luck = rep["receive_luck_sd"]
    assert 0 < luck["p50_ns"] <= luck["p99_ns"] < rep["queueing_bound"]["p99_ns"]
    assert main([*args, "--json", "--ideal"]) == 0
    ideal = json.loads(capsys.readouterr().out)
    assert ideal["model"]["ideal"] is True
    assert ideal["asymmetry_floor"]["p99_ns"] < rep["asymmetry_floor"]["p99_ns"]


def test_software_stamp_bias_is_part_of_the_unobservable_floor() -> None:
    hw = Simulator(FABRIC, SimConfig(seed=12)).pair_asymmetry_ns()
    sw = Simulator(FABRIC, SimConfig(seed=12, timestamps="sw")).pair_asymmetry_ns()
    assert np.percentile(np.abs(sw), 90) > 10 * np.percentile(np.abs(hw), 90)


def test_discovered_paths_are_the_controllers_view() -> None:
    sim = Simulator(FABRIC, SimConfig(seed=13))
    src, dst, sport, fwd, rev = sim.discovered_paths()
    true_f = sim.probed_paths()[: len(src)]  # the probes' rows come first, then the replies'
    assert len(src) == len(dst) == len(sport) == len(fwd) == len(rev) > 0
    wrong = np.mean((fwd != true_f).any(axis=1))
    assert 0 < wrong < 0.1  # mismatched and not discovered: ~5 % by default


def test_redraw_luck_keeps_fabric_pairs_paths_and_load_and_redraws_the_queueing() -> None:
    """A luck draw is the same window with other per-probe randomness: probes, paths and fixed
    delays are the same, the queueing is not; draws are reproducible."""
    cfg = SimConfig(load=0.9, rate_hz=20.0, seed=4)

    def step(draw: int | None) -> tuple[Simulator, SimStep]:
        sim = Simulator(FABRIC, cfg)
        if draw is not None:
            sim.redraw_luck(draw)
        return sim, sim.step(0.0, 0.2)

    (s0, a), (s1, b), (_, b2) = step(None), step(1), step(1)
    np.testing.assert_array_equal(s0.pairs_src, s1.pairs_src)
    np.testing.assert_array_equal(a.batch.src, b.batch.src)
    np.testing.assert_array_equal(a.hops_fwd, b.hops_fwd)
    ok = np.isfinite(a.true_fwd_ns) & np.isfinite(b.true_fwd_ns)
    src, dst = a.batch.src.astype(np.int64), a.batch.dst.astype(np.int64)
    fixed = s0.fixed_delay_ns(a.hops_fwd[ok], src[ok], dst[ok])
    np.testing.assert_allclose(fixed, s1.fixed_delay_ns(b.hops_fwd[ok], src[ok], dst[ok]))
    qa, qb = a.true_fwd_ns[ok] - fixed, b.true_fwd_ns[ok] - fixed
    assert np.all(qa >= -1e-6) and np.all(qb >= -1e-6)
    assert np.mean(qa != qb) > 0.5  # most probes queue differently
    assert abs(np.mean(qa) / np.mean(qb) - 1.0) < 0.2  # at the same load
    np.testing.assert_array_equal(b.true_fwd_ns, b2.true_fwd_ns)
    with pytest.raises(ValueError):
        s0.redraw_luck(-1)


def test_mean_queueing_averages_each_direction_over_the_draws_it_arrived_in() -> None:
    edges = np.array([[0, 1], [1, 2]])
    draws = []
    for best in ([1.0, np.inf, 3.0, np.inf], [3.0, 5.0, np.inf, np.inf]):
        d = BestQueueing(edges, 3)
        d.best = np.array(best)
        draws.append(d)
    np.testing.assert_allclose(mean_queueing(draws).best, [2.0, 5.0, 3.0, np.inf])
    with pytest.raises(ValueError):
        mean_queueing([])
    with pytest.raises(ValueError):
        mean_queueing([draws[0], BestQueueing(edges[:1], 3)])


def test_sim_sync_luck_draws_report_the_expected_excess_oracle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--luck-draws`` adds what a perfect reading of the expected excess would reach; it
    needs the truth breakdown (a one-line error otherwise)."""
    args = ["sim", "sync", "--nics", "32", "--peers", "4", "--window", "0.5", "--rate", "20"]
    args += ["--load", "0.9", "--truth-breakdown", "--json"]
    assert main([*args, "--luck-draws", "3"]) == 0
    tb = json.loads(capsys.readouterr().out)["truth_breakdown"]
    assert tb["expected_split_p99_ns"] > 0 and tb["perfect_split_p99_ns"] > 0
    # the per-direction oracles: the realized queueing leaves less than its expectation
    assert 0 < tb["perfect_direction_p99_ns"] < tb["expected_direction_p99_ns"]
    assert main([*args[:-2], "--luck-draws", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--luck-draws needs --truth-breakdown" in err[0]
