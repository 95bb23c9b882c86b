"""What the live clock sync remembers across windows and what it does with it: round-trip
floors per directed pair (`controller.clockfloors`), clocks that moved between solves
(`controller.clocksteps`), NICs whose paths all queue, bad stamps (docs/sync.md, docs/controller.md)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

import controller.clocksync as csync
from controller.clockfloors import WINNER_RANK, FloorMemory, edge_raises, node_bounds, split_raise
from controller.clocksteps import MOVE_NS, clock_errors, moved, off_probes, queue_floor
from controller.clocksync import ClockSync, ClockSyncConfig
from controller.ingest import Ingestor
from mesh.fabric import FabricShape, build_fabric
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import SimConfig, Simulator
from testbed.sim.model import ModelKnobs

S = 1_000_000_000


def test_a_floor_is_an_epochs_fourth_lowest_and_is_forgotten_after_the_epochs() -> None:
    mem = FloorMemory(epoch_ns=10 * S, epochs=2)
    assert np.isnan(mem.floor(np.array([0]))[0])
    mem.observe(np.array([0, 0, 0, 0, 0, 1]), np.array([5e3, 3e3, 3.1e3, 3.2e3, 3.3e3, 7e3]), S)
    mem.observe(np.array([0, 0]), np.array([-40e3, -30e3]), 2 * S)  # bad stamps: three at most
    mem.observe(np.array([0]), np.array([-20e3]), 3 * S)
    np.testing.assert_array_equal(mem.floor(np.array([0, 1, 5])), [3_000, 7_000, np.nan])
    mem.observe(np.array([0] * 4), np.array([4e3, 4.2e3, 4.3e3, 4.4e3]), 11 * S)  # next epoch
    assert mem.floor(np.array([0]))[0] == 4_400  # the second lowest of the epochs' floors
    mem.observe(np.array([0] * 4), np.array([3.9e3, 4.1e3, 4.15e3, 4.16e3]), 21 * S)
    assert mem.floor(np.array([0]))[0] == 4_160  # of the last two epochs and this one
    mem.observe(np.array([0] * 4), np.array([9e3, 9.5e3, 9.6e3, 9.7e3]), 51 * S)  # long after
    assert mem.floor(np.array([0]))[0] == 9_700  # forgotten: the path may have changed
    with pytest.raises(ValueError):
        mem.observe(np.array([-1]), np.array([1]), 60 * S)


def test_a_floor_of_bins_lowest_is_an_epochs_second_lowest() -> None:
    """A fleet solver folds its workers' selections, each a bin's lowest round trip: a
    few per pair and window, so its floor is an epoch's second lowest (`WINNER_RANK`)."""
    mem = FloorMemory(epoch_ns=10 * S, epochs=2, rank=WINNER_RANK)
    mem.observe(np.array([0, 0, 0, 0]), np.array([3.4e3, -30e3, 3.1e3, 3.9e3]), S)
    assert mem.floor(np.array([0]))[0] == 3_100  # one bad stamp makes no floor
    with pytest.raises(ValueError):
        FloorMemory(epoch_ns=10 * S, rank=0)


def test_raised_floors_bound_the_nics_behind_them_and_are_split_by_nic() -> None:
    # 12 NICs in four leaves of three; every path out of the last leaf queues 4 us
    n = 12
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    src, dst = a[a != b], b[a != b]
    floor = np.full(len(src), 10_000.0)
    cross = (src >= 9) != (dst >= 9)
    rtt = floor + 50.0 + np.where(cross, 4_000.0, 0.0)
    edges, raised = edge_raises(n, src, dst, rtt, floor)
    bound = node_bounds(n, edges, 0.5 * raised)
    np.testing.assert_allclose(bound[:9], 0.0)
    np.testing.assert_allclose(bound[9:], 2_025.0)  # half the least raised path to the core
    q = split_raise(n, edges, raised)  # the leaf's NICs carry the queueing
    assert np.all(q[9:] > 1_000) and np.all(q[:9] < 100)


def test_clock_errors_show_a_moved_nic_and_not_its_peers() -> None:
    rng = np.random.default_rng(1)
    n, m = 20, 4000
    src = rng.integers(0, n, m)
    dst = (src + rng.integers(1, n, m)) % n
    floor = np.full(m, 20_000.0)
    rtt = floor + rng.uniform(0, 1_500, m)
    q = rng.normal(0, 100, m)  # queueing left by the models, either way
    fwd, rev = 5_000.0 + q, 5_000.0 - q
    before, _ = clock_errors(n, src, fwd, rev, rtt, floor)
    # NIC 4's clock jumps 3 us ahead: delays into it + 3 us, out of it - 3 us
    fwd2 = fwd + np.where(dst == 4, 3_000.0, 0.0) - np.where(src == 4, 3_000.0, 0.0)
    rev2 = rev - np.where(dst == 4, 3_000.0, 0.0) + np.where(src == 4, 3_000.0, 0.0)
    after, agree = clock_errors(n, src, fwd2, rev2, rtt, floor)
    assert after[4] == pytest.approx(3_000.0, abs=100.0) and agree[4] > 0.9
    unc = np.full(n, 50.0)
    assert moved(after, agree, before, unc).tolist() == [k == 4 for k in range(n)]
    # an uncertain clock drifts off more: no move below its uncertainty; nor without a before
    assert not moved(after, agree, before, np.full(n, 2_000.0))[4]
    assert not moved(after, agree, np.full(n, np.nan), unc).any()
    assert MOVE_NS < 3_000


def test_a_standing_queue_on_a_few_pairs_moves_no_clock() -> None:
    """Two of NIC 4's ~19 pairs queue 80 us one way for the floor's whole memory (their
    floors raised by it, so their probes sit at the floor 40 us off either way): NIC 4's
    error stays its clock's, and it is not read as moved (a 64-NIC run read 6 NICs so)."""
    rng = np.random.default_rng(2)
    n, m = 20, 4000
    src = rng.integers(0, n, m)
    dst = (src + rng.integers(1, n, m)) % n
    floor = np.full(m, 20_000.0)
    rtt = floor + rng.uniform(0, 1_500, m)
    q = rng.normal(0, 100, m)
    fwd, rev = 5_000.0 + q, 5_000.0 - q
    before, _ = clock_errors(n, src, fwd, rev, rtt, floor)
    # the paths 4 -> 7 and 4 -> 9 now queue: every probe on them at its (raised) floor
    out4 = (src == 4) & np.isin(dst, [7, 9])
    in4 = np.isin(src, [7, 9]) & (dst == 4)
    fwd2 = fwd + np.where(out4, 80_000.0, 0.0)
    rev2 = rev + np.where(in4, 80_000.0, 0.0)
    rtt2 = np.where(out4 | in4, floor, rtt)
    after, agree = clock_errors(n, src, fwd2, rev2, rtt2, floor)
    assert abs(after[4] - before[4]) < 100.0
    assert not moved(after, agree, before, np.full(n, 50.0)).any()


def test_a_queue_on_one_direction_is_no_clock_move_and_a_step_of_its_size_is() -> None:
    """A directed pair's hop turns hot as the floor memory's second epoch starts: the first
    four round trips of the epoch queue 8 us on the forward direction only. A probe queued so
    raises its round trip by the 8 us its forward delay rose; a step of the destination's
    clock by 8 us raises the forward delay and lowers the reverse one by as much, and keeps
    the round trip at the floor. The queue is read against the first epoch's floor (not the
    current epoch's fourth lowest, which is that queue): only the step is off its model."""
    rng = np.random.default_rng(3)
    base, q, err_src = 5_000.0, 8_000.0, 100.0  # each direction's fixed delay; source ahead
    mem = FloorMemory(epoch_ns=10 * S)
    mem.observe(np.zeros(200, np.int64), 2 * base + rng.uniform(0, 300, 200), S)
    mem.observe(np.zeros(4, np.int64), 2 * base + q + rng.uniform(0, 300, 4), 10 * S)
    slot = np.zeros(2, np.int64)
    floor = queue_floor(mem.floor(slot), mem.floor(slot, settled=True))
    # probe 0: queued forward; probe 1: the destination's clock stepped 8 us ahead
    fwd = np.array([base + q, base + q]) - err_src
    rev = np.array([base, base - q]) + err_src
    rtt = np.array([2 * base + q, 2 * base])  # a round trip needs no clock
    unc = np.full(2, 50.0)
    src_err = np.full(2, err_src)
    assert off_probes(src_err, fwd, rev, rtt - floor, unc).tolist() == [False, True]
    # the same with a NIC's true clock uncertainty of 1 us: the step still shows (4 x 1 us)
    assert off_probes(src_err, fwd, rev, rtt - floor, np.full(2, 1_000.0)).tolist() == [
        False,
        True,
    ]
    # a round trip under its floor says the floor is above the unqueued one: its queueing is
    # at most the slack, as at the floor (2.5 us queued one way, the floor 1 us too high)
    under = off_probes(np.zeros(1), np.array([7_500.0]), np.array([5_000.0]),
                       np.array([-1_000.0]), np.full(1, 50.0))  # fmt: skip
    assert not under[0]


def _run(faults: list[Fault] = (), step: tuple[int, float, float] | None = None, *,
         load: float = 0.6, seconds: float = 45.0, knobs: ModelKnobs | None = None):  # type: ignore[no-untyped-def]  # fmt: skip
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8))
    sim = Simulator(fab, SimConfig(seed=3, load=load, model=knobs or ModelKnobs()), faults)
    if step is not None:
        sim.step_clock(*step)
    ing = Ingestor(fab)
    cs = ClockSync(32, ClockSyncConfig(), leaf=fab.nic_group_index)
    for st in sim.run(seconds, 0.5):
        b = ing.ingest(st.batch)
        cs.add(b)
        cs.maybe_solve(int(b.t1.max()))
        yield st, b, cs, cs.delays(b), fab


def test_a_step_between_solves_is_never_judged_and_the_nic_is_re_solved() -> None:
    """A 5 us step on NIC 5 at 20 s: every delay into or out of it is off by 5 us against the
    last solve's models; those delays are withheld from the batch that shows the step until
    a solve of the NIC's later data alone, and the NIC is known again after it."""
    off_by_4us = 0
    marked = cleared = False
    for st, b, cs, d, _ in _run(step=(5, 20.0, 5_000.0)):
        err = np.concatenate([d.owd_fwd_ns - st.true_fwd_ns, d.owd_rev_ns - st.true_rev_ns])
        off_by_4us += int((np.abs(err[np.isfinite(err)]) > 4_000).sum())
        if cs.stepped_at[5] != -1:
            marked = True
            assert np.isnan(cs.offsets(int(b.t1.max()))[0][5])  # unknown while moved
        elif marked:
            cleared = True
    assert marked and cleared and cs.moves_seen >= 1
    assert off_by_4us == 0


def test_a_leaf_whose_uplinks_all_queue_gets_an_honest_bound_and_its_delays_are_withheld() -> None:
    """Standing queues of 200 us on every uplink of leaf 0 from 20 s: the solve cannot place
    the leaf's clocks against the rest, its NICs' uncertainty comes from their raised floors,
    and no delay across the leaf is judged on those clocks."""
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8))
    ups = [lk.id for lk in fab.links if lk.id.startswith("leaf0-spine")]
    faults = [Fault(FaultKind.CONGEST, u, 20.0, 25.0, 200.0) for u in ups]
    leaf0 = np.flatnonzero(fab.nic_group_index == 0)
    bound_seen = 0.0
    for st, b, cs, d, _ in _run(faults):
        s = cs.state
        if s is not None and s.bound_ns is not None and s.end_ns - s.span_ns > 0:
            bound_seen = max(bound_seen, float(np.nanmin(s.bound_ns[leaf0])))
        if st.t0_s >= 32.0:  # the solves since hold mostly congested data
            cross = np.isin(b.src, leaf0) ^ np.isin(b.dst, leaf0)
            err = np.abs(np.concatenate([d.owd_fwd_ns[cross] - st.true_fwd_ns[cross],
                                         d.owd_rev_ns[cross] - st.true_rev_ns[cross]]))  # fmt: skip
            assert not (err[np.isfinite(err)] > 1_000).any()
    assert bound_seen > 500.0


def test_hot_hops_through_the_floor_memorys_first_epoch_edge_move_no_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Load 0.7 (hot hops queue one direction for seconds) and no clock steps, through the
    end of the floor memory's first epoch (10 s): the second epoch's first round trips of a
    hot pair are no floor, so no NIC is read as moved and no probe as off its model. Against
    the memory's floor alone 3 NICs were read as moved and 6 % of the probes of the 11th
    second withheld (`controller.clocksteps.queue_floor`)."""
    seen = {"off": 0, "probes": 0}
    real = csync.off_probes

    def count(*args: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        off = real(*args)
        seen["off"] += int(off.sum())
        seen["probes"] += len(off)
        return off

    monkeypatch.setattr(csync, "off_probes", count)
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8))
    sim = Simulator(fab, SimConfig(seed=1, load=0.7))
    ing = Ingestor(fab)
    cs = ClockSync(32, ClockSyncConfig(), leaf=fab.nic_group_index)
    for st in sim.run(12.0, 0.1):
        b = ing.ingest(st.batch)
        cs.add(b)
        cs.maybe_solve(int(b.t1.max()))
        cs.delays(b)
    assert seen["probes"] > 100_000  # the check ran through the epoch's edge
    assert cs.moves_seen == 0 and seen["off"] == 0


def test_delays_with_a_round_trip_under_their_floor_are_withheld() -> None:
    """A bad stamp that shortens a round trip by more than 5 us can put it well under its pair's
    floor: no path is that fast, so neither of the probe's delays is judged."""
    twin = Simulator(build_fabric(FabricShape.for_nics(32, nics_per_leaf=8)),
                     SimConfig(seed=3, load=0.6)).run(30.0, 0.5)  # fmt: skip
    floor = np.full(32 * 32, np.inf)  # per directed pair the lowest clean round trip so far
    under = 0
    for st, b, _, d, _ in _run(knobs=ModelKnobs(hw_bad_stamp_prob=2e-3), seconds=30.0):
        clean = next(twin).batch  # the same probes with every stamp right
        pair = b.src.astype(np.int64) * 32 + b.dst
        rtt = (b.t4 - b.t1) - (b.t3 - b.t2)
        ok = ~b.lost
        np.minimum.at(floor, pair[ok], ((clean.t4 - clean.t1) - (clean.t3 - clean.t2))[ok])
        if st.t0_s < 21:  # the memory's floors are settled once an epoch (10 s) has closed
            continue
        low = (rtt < floor[pair] - 6_000) & ok  # (the memory's floor is at least this one)
        under += int(low.sum())
        assert not np.isfinite(d.owd_fwd_ns[low]).any()
    assert under > 0
