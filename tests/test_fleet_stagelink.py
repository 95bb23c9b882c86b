"""The rounds' NATS seam without a server (`controller.fleet.stagelink`): the owners' block
heads (no summary rows) and their `StageDesk`s answer the solver's `StageLink` calls,
made from a worker thread onto a running event loop, and the solve equals one process's to
the bit; a call an owner cannot answer, one that times out, or one made on the loop's own
thread raises `StageError` (the solver then judges the window without a clock solve)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from controller.clocksolve import (
    ClockState,
    ClockSyncConfig,
    SampleWindow,
    compute_state,
    window_summary,
)
from controller.fleet.edges import EdgeStage, SummaryBlock, owner_bounds, solve_blocks, split_clock
from controller.fleet.stagelink import StageDesk, StageLink, decode_head, encode_head
from controller.fleet.stagewire import StageError
from tests.edgewindow import NICS, stepped_window


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
