"""`FleetWorker`: which window a record goes to, what `close` hands out, exactly-once across a
takeover, and what it takes from the solver."""

from __future__ import annotations

import numpy as np

from contract.records import decode_batch
from controller.admission import Outcome
from controller.coalesce import ProbeQueue
from controller.fleet.config import FleetConfig
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import Partial
from controller.fleet.solver import Added, FleetSolver
from controller.fleet.worker import FleetWorker
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

FAB = build_fabric(FabricShape.for_nics(16, nics_per_leaf=4, spines=2))
MS = 1_000_000
W = 100 * MS


def _steps(seconds: float) -> list[tuple[int, list[bytes]]]:
    sim = Simulator(FAB, SimConfig(seed=3, peers=4))
    return [
        (EPOCH_NS + round(st.t1_s * 1e9), host_batches(FAB, st.batch, i + 1)[0])
        for i, st in enumerate(sim.run(seconds, W / 1e9))
    ]


def test_close_hands_every_window_once_oldest_first_empty_ones_too() -> None:
    w = FleetWorker(FAB, FleetConfig(grid=WindowGrid(W), lateness_ns=W), name="w")
    steps = _steps(0.5)
    k0 = WindowGrid(W).index(EPOCH_NS)
    got: list[Partial] = []
    for now, payloads in steps:
        for p in payloads:
            assert w.admit(None, p, now).outcome is Outcome.ACCEPTED
        got += w.close(now)
    # lateness of one window: the window ending at now - W is the newest handed out
    assert [p.window for p in got] == list(range(k0 - 1, k0 + 4))
    assert got[0].records == 0 and got[0].counts.batches == 0  # the window before the data
    assert all(p.records > 0 for p in got[1:])
    later = w.close(steps[-1][0] + 10 * W)  # a quiet second: empty partials, in order
    assert [p.window for p in later] == list(range(k0 + 4, k0 + 14))
    assert sum(p.records for p in later) > 0 and later[-1].records == 0
    assert w.close(steps[-1][0] + 10 * W) == []  # nothing twice
    total = sum(p.records for p in got + later)
    assert total == w.records == sum(len(decode_batch(p)) for _, ps in steps for p in ps)


def test_a_record_older_than_every_open_window_goes_into_the_oldest() -> None:
    w = FleetWorker(FAB, FleetConfig(grid=WindowGrid(W)), name="w")
    (t1, first), (t2, second), *_ = _steps(0.3)
    for p in first:
        w.admit(None, p, t1)
    assert [p.window for p in w.close(t1) if p.records] == [WindowGrid(W).index(t1) - 1]
    w.close(t2)  # the second step's window closes empty
    for p in second:  # ... and its batches come late: into the oldest open window
        w.admit(None, p, t2)
    (late,) = [p for p in w.close(t2 + W) if p.records]
    assert late.window == WindowGrid(W).index(t2)
    assert late.counts.verdicts == (("accepted", len(second)),)


def test_a_takeover_replays_batches_without_counting_them_twice() -> None:
    """A worker dies after handing out a window; the partition's new owner gets the same
    batches again (the stream redelivers what was not acked) and is told what the dead
    worker's partial covered: those records are dropped, the rest counted once."""
    cfg = FleetConfig(grid=WindowGrid(W))
    old, new = FleetWorker(FAB, cfg, name="old"), FleetWorker(FAB, cfg, name="new")
    solver = FleetSolver(FAB, cfg)
    (t1, batches), *_ = _steps(0.1)
    half = len(batches) // 2
    for p in batches[:half]:
        old.admit(None, p, t1)
    (done,) = [p for p in old.close(t1) if p.records]
    assert solver.add(done) is Added.TAKEN
    # the new owner: everything again (unacked), plus the rest
    new.exclude(done.window, done.covers)
    for p in batches:
        new.admit(None, p, t1)
    (mine,) = [p for p in new.close(t1) if p.records]
    assert mine.window == done.window and not mine.covers.overlaps(done.covers)
    assert mine.counts.covered == done.records
    assert solver.add(mine) is Added.TAKEN
    assert done.records + mine.records == sum(len(decode_batch(p)) for p in batches)
    # without being told, the replay would overlap and the solver refuses it
    blind = FleetWorker(FAB, cfg, name="blind")
    for p in batches:
        blind.admit(None, p, t1)
    (dup,) = [p for p in blind.close(t1) if p.records]
    assert solver.add(dup) is Added.OVERLAP


def test_the_worker_takes_the_solvers_clock_and_host_facts() -> None:
    cfg = FleetConfig(grid=WindowGrid(W))
    w = FleetWorker(FAB, cfg, name="w")
    solver = FleetSolver(FAB, cfg)
    for now, payloads in _steps(2.5):
        for p in payloads:
            w.admit(None, p, now)
        for part in w.close(now):
            solver.add(part)
        res = solver.solve(solver.pending_windows()[-1], now)
        w.install_clock(res.clock)
    assert w.delay_trust[0] > 0  # fine delays once the solver's clock was trusted
    assert np.array_equal(w.clock_trust().trust_ns, solver.clock.trust().trust_ns)
    solver.presence("host3", False, now)
    w.install_clock(res.clock)  # the state before the presence: host3 still counts
    assert not w._excluded.any()
    w.install(solver.host_state())
    assert w._excluded[[n.index for n in FAB.nics if n.host == "host3"]].all()
    assert not w.needs_full
    later = solver.state()
    gap = type(later)(**{**later.__dict__, "since": later.window + 5})
    w.install(gap)  # a state that starts after the last one taken: changes were missed
    assert w.needs_full
    w.install(solver.state(full=True))
    assert not w.needs_full


def test_a_clock_jump_hands_out_the_windows_with_records_not_every_empty_one() -> None:
    """A batch admitted on another time base (a monotonic clock's small numbers) and ingested
    on UNIX time, then a long silence: a bounded number of partials, none lost; the solver
    judges what it got without walking every empty window in between."""
    cfg = FleetConfig(grid=WindowGrid(W), max_gap=50)
    w = FleetWorker(FAB, cfg, name="w")
    solver = FleetSolver(FAB, cfg)
    queue = ProbeQueue()
    (t1, batches), *_ = _steps(0.1)
    for p in batches:
        w.admit(None, p, 5_000_000_000, queue=queue)  # a monotonic clock: seconds since boot
    assert w.flush(queue, t1) > 0
    first = w.close(t1)
    later = w.close(t1 + 10**6 * W)  # a day and more of silence
    assert len(first) + len(later) < 60 and sum(p.records for p in first + later) == w.records
    assert sum(n for p in first + later for _, n in p.counts.verdicts) == len(batches)
    for p in first + later:
        solver.add(p)
    res = solver.solve(later[-1].window, t1 + 10**6 * W)
    assert res.window == later[-1].window and solver.next_window == res.window + 1
