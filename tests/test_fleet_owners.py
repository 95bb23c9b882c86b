"""Edge owners on a real NATS cluster: two ``qpmesh controller worker`` processes, two
``qpmesh controller owner`` processes (``[fleet] edge_owners = 2``) and the solver's loop
(`SolverLoop` on a `FleetSolver` whose clock work per edge is the owners') solve the
simulator's batches, published as each host's prober would. Every call the solver's core
got (each partial, each solve) is replayed into one process (`FleetSolver` with its two
owners in-process): the clock offsets of every window agree within 0.01 ns and the events are
the same. The rounds run over NATS (`controller.fleet.stagelink`): the owners publish block
heads without summary rows and answer the solver's stage calls. With ``kill``, one owner
process is killed (SIGKILL) after the first clock solves: the other takes its index over
(lease), replays the partial stream, and the solves go on, equal to one process's; a solve
window whose rounds the dead owner could not finish (or the new holder did not build) is
judged without a clock solve (``missing_blocks``), never solved from some rounds."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from contract.origin import split_by_host
from contract.records import ProbeBatch, encode_batch
from controller.config import load_config
from controller.dispatch import JsonLog, nic_hosts
from controller.fleet.compose import SolverCore, core_config
from controller.fleet.ownershare import OwnerShare, rejoin
from controller.fleet.partial import Partial
from controller.fleet.partials import Assembler
from controller.fleet.plane import edge_key
from controller.fleet.solver import FleetSolver, SolveResult
from controller.fleet.solverloop import SolverLoop
from mesh.fabric import FabricShape, build_fabric
from mqttlink.reconnect import stop_tasks
from natslink.errors import NatsUnavailable
from natslink.link import Link, connect
from natslink.streams import ensure_bucket
from natslink.subjects import Subjects
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from tests.natscluster import Cluster, nats_cluster, read_stored

__all__ = ["nats_cluster"]
ROOT = Path(__file__).resolve().parent.parent
START_S, RUN_S = 90.0, 90.0
"""Bounds in monotonic seconds (a loaded machine is slow, never stuck)."""


def _shifted(batch: ProbeBatch, shift: int) -> ProbeBatch:
    cols = {k: np.where(getattr(batch, k) != 0, getattr(batch, k) + shift, 0)
            for k in ("t1", "t2", "t3", "t4")}  # fmt: skip
    return dataclasses.replace(batch, **cols)


async def _publish(link: Link, subject: str, payload: bytes, msg_id: str, deadline: float) -> None:
    while True:  # a new R3 stream may still elect its leader
        try:
            await link.publish(subject, payload, msg_id=msg_id)
            return
        except NatsUnavailable:
            if time.monotonic() > deadline:
                raise AssertionError(f"the stream never answered {msg_id}") from None
            await asyncio.sleep(0.2)


async def _dump_tasks_after(seconds: float) -> None:
    """Print every task's stack if the test still runs after ``seconds``: in three full
    suites of about twelve (2026-11-29) it hung until pytest-timeout's 300 s, whose report
    shows the threads' stacks only, and alone it has not hung since."""
    await asyncio.sleep(seconds)
    print(f"--- still running after {seconds:g} s: every task's stack ---", file=sys.stderr)
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


class Recording(SolverCore):
    """The solver's core, every call noted in order (to replay them in one process)."""

    def __init__(self, solver: FleetSolver) -> None:
        super().__init__(solver)
        self.calls: list[tuple[str, object, int]] = []
        self.results: list[SolveResult] = []

    def add(self, partial: bytes) -> None:
        self.calls.append(("add", partial, 0))
        super().add(partial)

    def solve(self, window: int, now_ns: int) -> SolveResult:
        self.calls.append(("solve", window, now_ns))
        result = super().solve(window, now_ns)
        self.results.append(result)
        return result


async def _shares(
    link: Link, subjects: Subjects, stream: str, owners: int
) -> dict[tuple[int, int, str], OwnerShare]:
    """Return every owner share the stream holds by (owner, window, worker)."""
    out: dict[tuple[int, int, str], OwnerShare] = {}
    for k in range(owners):
        asm = Assembler(10_000)
        for d in await read_stored(link, stream, subjects.shares_of(k)):
            c = asm.feed(d.headers, d.data)
            if c is not None and c.body:
                s = OwnerShare.decode(c.body)
                assert s.owner == k and (k, s.window, s.worker) not in out
                out[k, s.window, s.worker] = s
        assert asm.incomplete == 0, asm.incomplete
    return out


def _procs(role: str, idents: tuple[str, ...], conf: Path, tmp: Path) -> dict[str, subprocess.Popen[bytes]]:  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = {}
    for ident in idents:
        log = (tmp / f"{ident}.out").open("wb")
        out[ident] = subprocess.Popen(
            [sys.executable, "-m", "qpmesh.cli", "controller", role, "--config", str(conf),
             "--id", ident, "--log", str(tmp / f"{ident}.log")],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
    return out


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def started() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The processes a test starts, stopped by pid at teardown even when the test's event
    loop was cut short (pytest-timeout stops the loop, not the coroutine's ``finally``)."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    yield procs
    _stop(procs)


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True], ids=["steady", "owner-killed"])
async def test_workers_owners_and_solver_equal_one_process(
    nats_cluster: Cluster, tmp_path: Path, kill: bool, started: dict[str, subprocess.Popen[bytes]]
) -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    (tmp_path / "fabric.json").write_text(json.dumps(fab.to_dict()))
    servers = ", ".join(f'"{u}"' for u in nats_cluster.urls)
    conf = tmp_path / "controller.toml"
    conf.write_text(
        '[fabric]\nfile = "fabric.json"\n[controller]\ntick_s = 0.5\n'
        f"[nats]\nservers = [{servers}]\ntimeout_s = 2\nconnect_timeout_s = 1\n"
        "backoff_min_s = 0.1\nbackoff_max_s = 0.5\n"
        "[fleet]\npartitions = 8\ngrace_s = 2\nsolver_wait_s = 2\nmax_bytes = 67108864\n"
        "duplicate_window_s = 60\nedge_owners = 2\nedge_wait_s = 20\n"
    )
    config = load_config(conf)
    assert config.fleet is not None and config.nats is not None
    plane = config.fleet.plane
    shared = core_config(config, plane)
    core = Recording(FleetSolver(fab, shared, local_edges=False))
    log_file = (tmp_path / "solver.log").open("w")
    loop = SolverLoop(plane, config.nats, "s1", lambda: core, lambda w, r: None,
                      log=JsonLog(log_file), blocks=core)  # fmt: skip
    workers = _procs("worker", ("w1", "w2"), conf, tmp_path)
    owners = _procs("owner", ("o1", "o2"), conf, tmp_path)
    started.update({**workers, **owners})
    solver = asyncio.create_task(loop.run())
    watchdog = asyncio.create_task(_dump_tasks_after(240.0))
    try:
        async with connect(config.nats, "owners-test") as link:
            leases = await ensure_bucket(link, plane.lease_bucket_spec())
            t_end = time.monotonic() + START_S
            while True:  # the solver active, partitions and owner indices held
                held = [await leases.get(k) for k in ("solver", edge_key(0), edge_key(1))]
                names = {e.value.decode() for e in held[1:] if e is not None}
                if loop.active and None not in held and names == {"o1", "o2"}:
                    o1_index = next(k for k, e in enumerate(held[1:]) if e and e.value == b"o1")
                    break
                assert time.monotonic() < t_end, ("never started", names, loop.active)
                await asyncio.sleep(0.2)
            await asyncio.sleep(3.0)  # the workers share the partitions
            down = Fault(FaultKind.LINK_DOWN, "leaf0-spine0", 4.0, 5.0)  # findings to compare
            sim = Simulator(fab, SimConfig(peers=4, seed=7), [down])
            shift = time.time_ns() - EPOCH_NS - 500_000_000  # the simulator's time: now
            t_end = time.monotonic() + RUN_S
            killed_at: int | None = None
            for step in sim.run(12.0, 0.5):
                for h, b in split_by_host(_shifted(step.batch, shift), nic_hosts(fab)).items():
                    await _publish(link, config.nats.subjects.probes(h), encode_batch(b),
                                   f"{h}:{b.batch_seq}", t_end)  # fmt: skip
                if kill and killed_at is None and sum(r.solved for r in core.results) >= 2:
                    owners["o1"].send_signal(signal.SIGKILL)  # o2 takes its index over
                    await asyncio.to_thread(owners["o1"].wait, 10)
                    killed_at, kill_ns = len(core.results), time.time_ns()
                await asyncio.sleep(0.5)
            last = (time.time_ns() + 500_000_000) // plane.window_ns
            while not core.results or core.results[-1].window < last:
                assert time.monotonic() < t_end, ("the solver stopped", len(core.results))
                await asyncio.sleep(0.2)
            # the solver stopped first: every partial it took has its shares in the stream
            # (a worker commits them before the partial), and none comes after the read
            await stop_tasks([solver])
            shares = await _shares(link, config.nats.subjects, plane.partial_stream, 2)
    finally:
        watchdog.cancel()
        await stop_tasks([solver])
        _stop({**workers, **owners})
        log_file.close()
    one = FleetSolver(fab, shared)  # one process: the two owners in it
    mine = []
    for what, arg, now in core.calls:
        if what == "add":  # the solver's part lacks the clock rows its shares hold
            assert isinstance(arg, bytes)
            part = Partial.decode(arg)
            assert len(part.clock) <= 2  # the earliest coded pair alone
            cut = [shares.pop((k, part.window, part.worker)) for k in range(2)]
            SolverCore(one).add(rejoin(part, cut).encode())
        else:
            assert isinstance(arg, int)
            mine.append(one.solve(arg, now))
    solves = [r.window for r in core.results if r.solved]
    logs = "".join((tmp_path / f"{o}.log").read_text()[-1500:] for o in ("o1", "o2"))
    # killed: two solves before the kill, one at least after the takeover (below); a call the
    # killed owner held costs edge_wait_s (20 s: 40 windows), which the run may not outlast
    assert len(solves) >= (3 if kill else 4), (solves, logs)
    from controller.fleet.solver import Added

    assert core.blocks[Added.TAKEN] >= 2 * len(solves), (core.blocks, logs)
    # the rounds ran over NATS: every solve called both owners (fit, candidates, residuals,
    # lows at least), and the blocks came without their summary rows (~20 bytes a kept row
    # with them: docs/scale.md)
    assert loop.stages is not None and loop.stages.calls >= 2 * 4 * len(solves), logs
    owner_logs = [json.loads(line) for o in ("o1", "o2")
                  for line in (tmp_path / f"{o}.log").read_text().splitlines()]  # fmt: skip
    rows = sum(d["rows"] for d in owner_logs if d["msg"] == "summary block")
    print("block heads", loop.block_bytes, "bytes for", rows, "rows;",
          loop.stages.calls, "stage calls", loop.stages.bytes_in, "bytes back")  # fmt: skip
    assert rows > 1000 and loop.block_bytes < 2 * rows, (loop.block_bytes, rows)
    # steady: no solve window is judged without its clock solve. Killed: the takeover (lease
    # TTL, the other's registration gone, a replay of the stream) costs the solve windows
    # judged until the solves resume, never one after: the window whose rounds the dead owner
    # held (a call it held when killed waits edge_wait_s), and those that came due meanwhile
    # which the new holder did not build or no longer keeps (`stagelink.KEEP_WINDOWS`)
    assert kill or core.solver.missing_blocks == 0, (core.solver.missing_blocks, logs)
    if kill:
        assert killed_at is not None, "no owner killed"
        later = [r.window for r in core.results[killed_at:] if r.solved]
        assert later, ("no clock solve after the takeover", logs)
        missed = [r.window for r, m in zip(core.results, mine, strict=True)
                  if m.solved and not r.solved]  # fmt: skip
        assert all(core.results[killed_at - 1].window < w < later[0] for w in missed), (
            missed, later, logs)  # fmt: skip
        o2 = [json.loads(line) for line in (tmp_path / "o2.log").read_text().splitlines()]
        assert any(d["msg"] == "edge owner claimed" and d["index"] == o1_index
                   and d["t_ns"] > kill_ns for d in o2), ("no takeover", logs)  # fmt: skip
        print("owner killed after window", core.results[killed_at - 1].window,
              "solves after it", later, "judged without", core.solver.missing_blocks)  # fmt: skip
    assert any(r.events for r in mine), "no findings to compare"
    skipped, apart = 0, False
    for got, want in zip(core.results, mine, strict=True):
        assert got.window == want.window
        if got.solved != want.solved:  # no clock solve here, one there: apart until both solve
            assert kill and want.solved and not got.solved, got.window
            skipped += 1
            apart = True
            continue
        apart = apart and not got.solved
        if apart:
            continue
        assert (np.isnan(got.offsets_ns) == np.isnan(want.offsets_ns)).all(), got.window
        diff = np.abs(got.offsets_ns - want.offsets_ns)[~np.isnan(got.offsets_ns)]
        assert not len(diff) or diff.max() <= 0.01, (got.window, diff.max())
        assert [e.to_json() for e in got.events] == [e.to_json() for e in want.events]
    assert skipped == core.solver.missing_blocks  # each window without its solve counted
