"""The rounds' NATS seam without a server (`controller.fleet.stagelink`): the owners' block
heads (no summary rows) and their `StageDesk`s answer the solver's `StageLink` calls,
made from a worker thread onto a running event loop, and the solve equals one process's to
the bit; a call an owner cannot answer, one that times out, or one made on the loop's own
thread raises `StageError` (the solver then judges the window without a clock solve)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
import pytest

from contract.records import decode_batch
from controller.brain import BrainConfig
from controller.clocksolve import (
    ClockState,
    ClockSyncConfig,
    SampleWindow,
    compute_state,
    window_summary,
)
from controller.fleet.config import FleetConfig
from controller.fleet.edges import EdgeStage, SummaryBlock, owner_bounds, solve_blocks, split_clock
from controller.fleet.grid import WindowGrid
from controller.fleet.owner import OwnerCore
from controller.fleet.partial import Partial
from controller.fleet.solver import Added, FleetSolver, SolveResult
from controller.fleet.stagelink import StageDesk, StageLink, decode_head, encode_head
from controller.fleet.stagewire import RemoteRange, StageError
from controller.fleet.worker import FleetWorker
from mesh.fabric import FabricShape, build_fabric
from sync.edgestage import RangeStages
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches
from tests.edgewindow import NICS, stepped_window

STEP = 100_000_000


def _blocks(w: SampleWindow, cfg: ClockSyncConfig, owners: int, t_ref: int) -> list[SummaryBlock]:
    none = (np.zeros((0, 2), np.int64), np.zeros(0))
    out = []
    for o, rows in enumerate(split_clock(w, owner_bounds(NICS, owners))):
        s = window_summary(SampleWindow(**rows.cols()), t_ref, cfg.coded_tol_hw_ns)
        lo, hi = int(rows.t1.min()), int(rows.t1.max())
        out.append(SummaryBlock(o, 3, len(rows), lo, hi, False, s, *none))
    return out


def _same(a: ClockState, b: ClockState) -> None:
    for f in ("offset_ns", "drift", "offset_std_ns", "drift_std", "known"):
        assert np.array_equal(getattr(a.models, f), getattr(b.models, f), equal_nan=True), f
    assert np.array_equal(a.stepped, b.stepped)
    assert (a.n_pairs, a.n_samples, a.summary_points, a.span_ns) == (
        b.n_pairs, b.n_samples, b.summary_points, b.span_ns,
    )  # fmt: skip


async def _solve_over_link(owners: int, *, refuse: bool = False) -> None:
    w, cfg, leaf = stepped_window()
    t_lo, t_hi = int(w.t1.min()), int(w.t1.max())
    t_ref = t_lo + (t_hi - t_lo) // 2
    want = compute_state(w, NICS, cfg, 7, leaf)
    assert want is not None
    desk = StageDesk()
    link = StageLink(lambda k: f"qpmesh.stage.{k}", timeout_s=30.0)
    calls: list[str] = []

    async def request(subject: str, data: bytes, timeout_s: float) -> bytes:
        calls.append(subject)
        return await asyncio.to_thread(desk.answer, int(subject.rsplit(".", 1)[1]), data)

    link.attach(asyncio.get_running_loop(), request)
    heads = []
    for b in _blocks(w, cfg, owners, t_ref):
        stages = EdgeStage(NICS, cfg, b.owner).stages(b)
        desk.keep(b.owner, b.window, None if refuse and b.owner == 1 else stages)
        edges = stages.edges if stages is not None else np.zeros((0, 2), np.int64)
        data = encode_head(b, edges)
        assert len(data) * 4 < len(b.encode())  # no summary rows on the wire
        head, e, points = decode_head(data)
        assert head.summary is None and head.rows == b.rows
        link.note(head, e, points)
        heads.append(head)

    def solve() -> ClockState | None:  # the solver's worker thread
        ranges, points = link.ranges(3, heads)
        st = solve_blocks(heads, NICS, cfg, t_ref, 7, leaf=leaf, ranges=list(ranges))
        return None if st is None else dataclasses.replace(st, summary_points=points)

    if refuse:
        with pytest.raises(StageError, match="no range of window 3"):
            await asyncio.to_thread(solve)
        return
    got = await asyncio.to_thread(solve)
    assert got is not None
    _same(got, want)
    assert {c.rsplit(".", 1)[1] for c in calls} == {str(o) for o in range(owners)}
    assert link.calls == len(calls) and link.bytes_in > 0
    with pytest.raises(StageError, match="off the connection's loop"):
        link.send(0, b"")  # on the loop's own thread: it would wait on itself


@pytest.mark.parametrize("owners", [1, 3])
async def test_the_rounds_through_the_link_solve_as_one_process(owners: int) -> None:
    await _solve_over_link(owners)


async def test_an_owner_without_the_window_refuses_and_the_solve_fails_whole() -> None:
    await _solve_over_link(2, refuse=True)


async def test_a_call_not_answered_in_time_or_without_a_connection_raises() -> None:
    link = StageLink(lambda k: f"p.stage.{k}", timeout_s=0.2)
    with pytest.raises(StageError, match="no connection"):
        link.send(0, b"x")

    async def silent(subject: str, data: bytes, timeout_s: float) -> bytes:
        async with asyncio.timeout(timeout_s):
            await asyncio.Event().wait()
        return b""

    link.attach(asyncio.get_running_loop(), silent)
    with pytest.raises(StageError, match="owner 2"):
        await asyncio.to_thread(link.send, 2, b"x")
    link.detach()
    with pytest.raises(StageError, match="no connection"):
        await asyncio.to_thread(link.send, 2, b"x")
    with pytest.raises(StageError, match="no block head"):
        link.ranges(9, [SummaryBlock(0, 9, 2, 0, 1, False, None, np.zeros((0, 2), np.int64),
                                     np.zeros(0))])  # fmt: skip


def test_the_desk_keeps_the_last_windows_per_index() -> None:
    desk = StageDesk()
    w, cfg, _ = stepped_window()
    (b,) = _blocks(w, cfg, 1, int(w.t1.min()))
    stages = EdgeStage(NICS, cfg, 0).stages(b)
    for window in (3, 5, 7):
        desk.keep(0, window, stages)
    assert desk.windows(0) == [5, 7]
    assert desk.answer(0, b"junk").startswith(b"QPSE")
    desk.drop(0)
    assert desk.windows(0) == []


def test_an_owner_gone_mid_rounds_costs_that_solve_whole_and_the_next_is_made() -> None:
    """Lock-step: two workers, two `OwnerCore`s whose blocks cross as heads and whose rounds
    are answered by their desks; in one solve window owner 1's range goes after its first
    calls (its process died; the new holder did not build that window): the window is
    judged without a clock solve (counted, the clock as before), and the next solve window
    is solved equal to one process's again."""
    fab = build_fabric(FabricShape.for_nics(16))
    sim = Simulator(fab, SimConfig(seed=3), [])
    cfg = FleetConfig(grid=WindowGrid(STEP), detection=BrainConfig(lateness_ns=0), edge_owners=2)
    workers = [FleetWorker(fab, cfg, name=f"w{i}") for i in range(2)]
    worker_of = {h.id: i % 2 for i, h in enumerate(fab.hosts)}
    apart, one = FleetSolver(fab, cfg, local_edges=False), FleetSolver(fab, cfg)
    n, hosts = len(fab.nics), len(fab.hosts)
    cores = [OwnerCore(n, hosts, cfg, k, None) for k in range(2)]
    desk = StageDesk()
    heads: dict[tuple[int, int], tuple[np.ndarray, int]] = {}
    cut_in: list[int] = []  # the solve window whose rounds lose owner 1
    calls = [0]

    def send(o: int, window: int, data: bytes) -> bytes:
        if o == 1 and window in cut_in:
            calls[0] += 1
            if calls[0] == 3:  # owner 1 answered two calls of this solve, then died
                desk.drop(1)
        reply = desk.answer(o, data)
        if reply.startswith(b"QPSE"):
            raise StageError(reply[4:].decode())
        return reply

    def remote(window: int, blocks: Sequence[SummaryBlock]) -> tuple[list[RangeStages | None], int]:
        out: list[RangeStages | None] = []
        for b in blocks:
            edges, _ = heads[(window, b.owner)]
            out.append(RemoteRange(window, edges, functools.partial(send, b.owner, window)))
        return out, sum(heads[(window, b.owner)][1] for b in blocks)

    apart.remote = remote
    results: list[tuple[SolveResult, SolveResult]] = []
    for i, st in enumerate(sim.run(4.0, STEP / 1e9)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        payloads, _ = host_batches(fab, st.batch, i + 1)
        for raw in payloads:
            host = decode_batch(raw).origin
            assert workers[worker_of[host]].admit(host, raw, now).accepted
        for p in [Partial.decode(x.encode()) for wk in workers for x in wk.close(now)]:
            assert apart.add(p) is one.add(p) is Added.TAKEN
            assert all(c.add(p) for c in cores)
        top = cfg.grid.closed_before(now, cfg.lateness_ns) - 1
        nxt = apart.next_window
        if top < (nxt if nxt is not None else min(apart.pending_windows(), default=top + 1)):
            continue
        for k, c in enumerate(cores):
            for b in c.advance(top):
                stages = c.stage.stages(b)
                desk.keep(k, b.window, stages)
                block, edges, points = decode_head(encode_head(b, stages.edges if stages
                                                               else np.zeros((0, 2), np.int64)))  # fmt: skip
                heads[(block.window, k)] = (edges, points)
                assert apart.add_block(block) is Added.TAKEN
                if not cut_in and sum(r[0].solved for r in results) >= 2:
                    cut_in.append(b.window)
        got, want = apart.solve(top, now), one.solve(top, now)
        results.append((got, want))
        for wk in workers:
            wk.install_clock(got.clock)
        for c in cores:
            c.install(got.clock)
    assert cut_in and calls[0] >= 3 and apart.missing_blocks == 1
    lost = [g for g, _ in results if g.window == cut_in[0]]
    assert lost and not lost[0].solved
    before = [g for g, _ in results if g.window < cut_in[0]][-1]
    same = np.isnan(lost[0].offsets_ns) == np.isnan(before.offsets_ns)
    assert same.all()  # the clock as it was: nothing of the broken rounds installed
    after = [(g, w) for g, w in results if g.window > cut_in[0] and g.solved]
    assert after, "no clock solve after the broken rounds"
    g, want = after[0]
    assert want.solved
    diff = np.abs(g.offsets_ns - want.offsets_ns)[~np.isnan(g.offsets_ns)]
    assert not len(diff) or diff.max() <= 0.01
