"""The edge owner process's pure parts: `OwnerCore` (partials in, summary blocks out) joined in
lock-step with two workers and a solver equals one process; a replaying owner that skips the
solve windows already solved makes the same later blocks (its warm-up bins where the
fleet's are, also from a stream cut after the first rows); blocks on the wire; the solver's
bounded wait for a solve window's blocks; ``[fleet] edge_owners``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contract.records import decode_batch
from controller.brain import BrainConfig
from controller.config import ConfigError, load_config
from controller.fleet.compose import service_core
from controller.fleet.config import FleetConfig
from controller.fleet.edges import SummaryBlock
from controller.fleet.grid import WindowGrid
from controller.fleet.owner import OwnerCore, origin
from controller.fleet.ownerloop import block_messages
from controller.fleet.partial import Partial
from controller.fleet.partials import Assembler
from controller.fleet.plane import Plane
from controller.fleet.solver import Added, FleetSolver
from controller.fleet.solverloop import SolverLoop
from controller.fleet.worker import FleetWorker
from controller.live import LiveController
from mesh.fabric import FabricShape, build_fabric
from natslink.settings import NatsSettings
from qpmesh.cli import main
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

STEP = 100_000_000


def test_owner_cores_apart_equal_one_process_and_a_replay_makes_the_same_blocks() -> None:
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8, spines=2))
    sim = Simulator(fab, SimConfig(seed=3), [Fault(FaultKind.LINK_DOWN, "leaf1-spine0", 1.5, 2.0)])
    cfg = FleetConfig(grid=WindowGrid(STEP), detection=BrainConfig(lateness_ns=0), edge_owners=2)
    workers = [FleetWorker(fab, cfg, name=f"w{i}") for i in range(2)]
    worker_of = {h.id: i % 2 for i, h in enumerate(fab.hosts)}
    apart, one = FleetSolver(fab, cfg, local_edges=False), FleetSolver(fab, cfg)
    n, hosts = len(fab.nics), len(fab.hosts)
    cores = [OwnerCore(n, hosts, cfg, k, None) for k in range(2)]
    replay: OwnerCore | None = None  # owner 1 again, made after the first solves
    history: list[Partial] = []
    blocks: dict[int, list[bytes]] = {0: [], 1: []}
    replayed: list[bytes] = []
    solved = events = 0
    for i, st in enumerate(sim.run(4.0, STEP / 1e9)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        payloads, _ = host_batches(fab, st.batch, i + 1)
        for p in payloads:
            host = decode_batch(p).origin
            assert workers[worker_of[host]].admit(host, p, now).accepted
        parts = [Partial.decode(x.encode()) for w in workers for x in w.close(now)]
        for p in parts:
            assert apart.add(p) is one.add(p) is Added.TAKEN
            assert all(c.add(p) for c in cores)
            assert not cores[0].add(p)  # a redelivery is dropped
            assert replay is None or replay.add(p)
            history.append(p)
        top = cfg.grid.closed_before(now, cfg.lateness_ns) - 1
        nxt = apart.next_window
        if nxt is None:
            nxt = min(apart.pending_windows(), default=top + 1)
        if top < nxt:
            continue
        for k, c in enumerate(cores):
            for b in c.advance(top):
                blocks[k].append(b.encode())
                assert apart.add_block(SummaryBlock.decode(b.encode())) is Added.TAKEN
        if replay is not None:
            replayed += [b.encode() for b in replay.advance(top)]
        got, want = apart.solve(top, now), one.solve(top, now)
        assert got.solved == want.solved and apart.missing_blocks == 0
        assert np.array_equal(np.isnan(got.offsets_ns), np.isnan(want.offsets_ns))
        assert np.nanmax(np.abs(got.offsets_ns - want.offsets_ns), initial=0.0) <= 0.01
        assert [e.to_json() for e in got.events] == [e.to_json() for e in want.events]
        solved += got.solved
        events += len(got.events)
        for w in workers:
            w.install_clock(got.clock)
        for c in cores:
            c.install(got.clock)
        if replay is None and solved >= 2:  # a new holder of index 1: replays what was sent
            replay = OwnerCore(n, hosts, cfg, 1, top)
            for p in history:
                replay.add(p)
            replay.install(got.clock)
            assert replay.advance(top) == [] and replay.counts.skipped == solved
            assert not replay.add(history[0])  # a window advanced past
            # a stream that no longer holds the first clock rows: the bins where they were,
            # from the solver's published state
            t0 = origin(got.clock, n, hosts)
            assert t0 is not None and t0 == cores[1].stage.first_stamp
            later = history[len(history) // 2 :]
            for seed, same in ((t0, True), (None, False)):
                cut = OwnerCore(n, hosts, cfg, 1, top, seed)
                for p in later:
                    cut.add(p)
                cut.advance(top)
                assert (cut.stage.first_stamp == t0) is same
            mark = len(blocks[1])
    assert solved >= 4 and events > 0
    assert replayed and replayed == blocks[1][mark:]  # the same bytes as the first holder's


def test_blocks_cross_the_wire_once_per_owner_and_window() -> None:
    b = SummaryBlock(1, 42, 0, 0, 0, False, None, np.zeros((0, 2), np.int64), np.zeros(0))
    msgs = block_messages(b, "abc", "o1", 1024)
    assert [m[0] for m in msgs] == ["block:1:42:abc:0", "block:1:42"]
    asm = Assembler()
    out = [asm.feed(h, d) for _, d, h in msgs]
    assert out[0] is None and out[1] is not None
    assert SummaryBlock.decode(out[1].body).window == 42


class Sink:
    def __init__(self) -> None:
        self.have = 0

    def add_block(self, block: bytes) -> None:
        self.have += 1

    def needs_blocks(self, window: int) -> bool:
        return window % 2 == 0

    def blocks_in(self, window: int) -> int:
        return self.have

    def use_stages(self, remote: object) -> None:
        self.remote = remote


def test_a_solve_window_waits_for_its_blocks_at_most_edge_wait() -> None:
    now = [0]
    plane = Plane(edge_owners=2, edge_wait_ns=5_000_000_000)
    sink = Sink()
    loop = SolverLoop(plane, NatsSettings(), "s", lambda: None, lambda w, r: None,  # type: ignore[arg-type,return-value]
                      log=lambda *a, **k: None, clock_ns=lambda: now[0], blocks=sink)  # fmt: skip
    assert loop._blocks_ready(1)  # not a solve window
    assert not loop._blocks_ready(2)
    now[0] += 4_000_000_000
    sink.have = 1
    assert not loop._blocks_ready(2)  # one of two: still waiting
    now[0] += 1_000_000_000
    assert loop._blocks_ready(2) and loop.blocks_missing == 1  # judged without the solve
    sink.have = 2
    assert loop._blocks_ready(4) and loop.blocks_missing == 1


def test_edge_owners_in_the_fleet_table_and_the_owner_command_refuses_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "c.toml"
    head = '[fabric]\nleaves = 2\n[nats]\nservers = ["nats://n1:4222"]\n[fleet]\n'
    f.write_text(head + "edge_owners = 3\nedge_wait_s = 4.5\n")
    plane = load_config(f).fleet.plane  # type: ignore[union-attr]
    assert (plane.edge_owners, plane.edge_wait_ns) == (3, 4_500_000_000)
    for text, key in [("edge_owners = -1\n", "fleet.edge_owners"),
                      ("edge_owners = 2000\n", "fleet.edge_owners"),
                      ("edge_wait_s = -1\n", "fleet.edge_wait_s")]:  # fmt: skip
        f.write_text(head + text)
        with pytest.raises(ConfigError, match=key):
            load_config(f)
    f.write_text(head + "partitions = 8\n")
    assert main(["controller", "owner", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "edge_owners >= 1" in err
    # a learned fabric (no shape keys, no file): its solver is replaced on every change, and
    # the owners would not follow it
    f.write_text(head.replace("leaves = 2\n", "") + "edge_owners = 2\n")
    with pytest.raises(ConfigError, match="fleet: edge_owners need a declared fabric"):
        load_config(f)
    f.write_text(head.replace("leaves = 2\n", "") + "partitions = 8\n")
    assert load_config(f).learn is not None  # without owners a fleet learns


def test_the_service_solver_with_edge_owners_joins_their_blocks() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    live = LiveController(fab)
    same, brain = live.solver, live.brain
    assert service_core(live, Plane()).solver is same  # no owners: the live state's own
    core = service_core(live, Plane(edge_owners=2))
    assert core.solver is live.solver is not same and live.brain is brain
    assert live.solver.edges is None and live.solver.config.edge_owners == 2
    empty = SummaryBlock(1, 5, 0, 0, 0, False, None, np.zeros((0, 2), np.int64), np.zeros(0))
    core.add_block(empty.encode())
    assert core.blocks[Added.TAKEN] == 1 and core.blocks_in(5) == 1
