"""Clocks that move between solves in a fleet (issue 34, docs/scale.md): the worker owning a
NIC's host finds the move from the NIC's own probes and withholds them at once, every worker
withholds the probes into it by their own evidence (`controller.clocksteps.off_probes`), and
the solver marks the move from the worker's partial and hands it to every worker."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from contract.records import decode_batch
from controller.clocksteps import MOVE_NS, off_probes
from controller.clocksync import ClockSync
from controller.fleet.config import FleetConfig
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import Partial
from controller.fleet.solver import FleetSolver
from controller.fleet.worker import FleetWorker
from controller.observations import Observations
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

FAB = build_fabric(FabricShape.for_nics(16, nics_per_leaf=4, spines=2))
NIC, AT_S, SIZE_NS = 5, 10.0, 5_000.0  # between the warm-up solves at 8 and 16 s


def test_a_probe_shows_its_destination_off_its_model_beyond_its_queueing() -> None:
    err_src = np.array([100.0, 100.0, 100.0, 100.0, np.nan])
    # half the difference: src error less dst error, give or take half the queueing
    fwd = np.array([5_000.0, 10_000.0, 10_000.0, 5_000.0, 10_000.0])
    rev = np.array([5_200.0, 200.0, 200.0, 5_200.0, 200.0])
    excess = np.array([0.0, 0.0, 12_000.0, 0.0, 0.0])
    unc = np.array([50.0, 50.0, 50.0, 2_000.0, 50.0])
    # 1: the destination 5 us ahead; 2: queued enough to explain it; 3: a clock too uncertain
    # for a 0 ns difference to say anything; 4: no source error
    assert off_probes(err_src, fwd, rev, excess, unc).tolist() == [False, True, False, False, False]
    assert MOVE_NS < 4_000


def test_a_move_found_by_one_worker_is_marked_by_the_solver_for_every_worker() -> None:
    cfg = FleetConfig(grid=WindowGrid(500_000_000))
    owner = {h.id: i % 2 for i, h in enumerate(FAB.hosts)}
    into: list[list[bool]] = [[], []]  # per worker: probes into NIC after the step, judged?
    state = {"on": False}

    def tap(k: int) -> Callable[[Observations], None]:
        def see(obs: Observations) -> None:
            if state["on"]:
                m = (obs.dst == NIC) & ~obs.lost
                into[k] += np.isfinite(obs.owd_fwd_ns[m]).tolist()

        return see

    workers = [FleetWorker(FAB, cfg, name=f"w{i}", observers=[tap(i)]) for i in range(2)]
    solver = FleetSolver(FAB, cfg)
    sim = Simulator(FAB, SimConfig(seed=4))
    sim.step_clock(NIC, AT_S, SIZE_NS)
    mine = owner[FAB.nics[NIC].host]
    carried: list[Partial] = []
    marked_at = None
    for i, st in enumerate(sim.run(AT_S + 3.0, 0.5)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        state["on"] = st.t0_s >= AT_S and marked_at is None
        for p in host_batches(FAB, st.batch, i + 1)[0]:
            host = decode_batch(p).origin
            assert workers[owner[host]].admit(host, p, now).accepted
        for w in workers:
            for part in w.close(now):
                again = Partial.decode(part.encode())
                assert np.array_equal(again.moved.nic, part.moved.nic)
                if len(again.moved):
                    carried.append(again)
                solver.add(again)
        top = cfg.grid.closed_before(now, cfg.lateness_ns) - 1
        if solver.pending_windows() and top >= (solver.next_window or top):
            res = solver.solve(top, now)
            for w in workers:
                w.install_clock(res.clock)
            if marked_at is None and res.state.trust.moved_at[NIC] != -1:
                marked_at = st.t1_s
    # the owner of NIC's host found it, from NIC's own probes, and its partial carried it
    assert [p.worker for p in carried] == [f"w{mine}"]
    assert carried[0].moved.nic.tolist() == [NIC]
    assert abs(carried[0].moved.since[0] - (EPOCH_NS + AT_S * 1e9)) < 1e9
    # the solver marked it within two windows of the step, for every worker
    assert marked_at is not None and marked_at <= AT_S + 2.0
    for w in workers:
        assert w.clock_trust().moved_at[NIC] != -1
    off, _ = solver.clock.offsets(solver.config.grid.end(solver.next_window or 0))
    assert np.isnan(off[NIC]) and np.isfinite(np.delete(off, NIC)).all()
    # before the mark, each worker withheld the probes into NIC by their own evidence (the
    # other worker's peers of NIC are on its hosts; a probe queued enough to explain the
    # move may pass)
    for seen in into:
        assert len(seen) > 20 and sum(seen) <= 0.1 * len(seen)


def test_a_whole_sync_marks_its_finds_and_a_workers_waits_for_its_solver() -> None:
    whole, part = ClockSync(4), ClockSync(4, whole=False)
    for cs in (whole, part):
        cs.note_moves(np.array([2, 2], np.int64), np.array([7, 9], np.int64))
        assert cs.stepped_at.tolist() == [-1, -1, 9, -1]  # the later instant
        assert cs.trust().moved_at.tolist() == [-1, -1, 9, -1]
        assert cs.take_moves()[0].tolist() == []  # marked, not found
    # a worker's own finds wait in found_at until a state carries them
    part.found_at[1] = 5
    trust = whole.trust()
    part.adopt(None, trust)
    assert part.found_at[1] == 5 and part.stepped_at.tolist() == [-1, -1, 9, -1]
    whole.note_moves(np.array([1], np.int64), np.array([5], np.int64))
    part.adopt(None, whole.trust())
    assert part.found_at[1] == -1 and part.stepped_at[1] == 5
