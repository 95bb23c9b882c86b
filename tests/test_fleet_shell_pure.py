"""The fleet shell's pure parts: the plane's window grid, partials in chunks with one commit
per partition and window, the solver's window book (complete, deadline, late)."""

from __future__ import annotations

import pytest

from controller.fleet.book import WindowBook
from controller.fleet.partials import (
    H_COMMIT,
    Assembler,
    PartialWireError,
    chunk_messages,
    commit_id,
    commit_message,
)
from controller.fleet.plane import Plane


def test_plane_grid_and_validation() -> None:
    p = Plane(partitions=4, window_ns=10, grace_ns=3, solver_wait_ns=2, duplicate_window_s=1)
    assert p.window_of(25) == 2 and p.window_end(2) == 30
    assert p.closable(32) == 2 and p.closable(33) == 3  # window 2 closes 3 ns after its end
    assert p.deadline(2) == 35
    for bad in ({"partitions": 0}, {"grace_ns": -1}, {"chunk_bytes": 10},
                {"duplicate_window_s": 1e-8}):  # fmt: skip
        with pytest.raises(ValueError):
            Plane(**{"window_ns": 10, "grace_ns": 3, "duplicate_window_s": 1, **bad})


def _send(asm: Assembler, p: int, w: int, build: str, body: bytes, size: int = 4):
    out = None
    chunks = chunk_messages(p, w, build, body, size)
    for _, payload, hdr in chunks:
        assert asm.feed(hdr, payload) is None
    mid, payload, hdr = commit_message(p, w, build, len(chunks), "w1", 3)
    assert mid == commit_id(p, w) == f"partial:{p}:{w}"
    out = asm.feed(hdr, payload)
    return out


def test_chunks_reassemble_and_only_committed_builds_count() -> None:
    asm = Assembler()
    body = bytes(range(11))
    c = _send(asm, 2, 7, "b1", body)
    assert c is not None and c.body == body and (c.partition, c.window, c.batches) == (2, 7, 3)
    ids = [m for m, _, _ in chunk_messages(2, 7, "b1", body, 4)]
    assert ids == ["partial:2:7:b1:0", "partial:2:7:b1:1", "partial:2:7:b1:2"]
    empty = _send(asm, 3, 7, "b2", b"")
    assert empty is not None and empty.body == b""
    # a build whose sender died after one chunk: its chunks never count and are forgotten
    _, payload, hdr = chunk_messages(1, 8, "dead", body, 4)[0]
    asm.feed(hdr, payload)
    _, payload, hdr = commit_message(1, 8, "dead", 3, "w2", 1)  # (never sent in practice)
    assert asm.feed(hdr, payload) is None and asm.incomplete == 1
    for w in range(9, 20):
        _send(asm, 0, w, f"x{w}", b"abc")
    _, payload, hdr = chunk_messages(1, 20, "gone", body, 4)[0]
    asm.feed(hdr, payload)
    assert "gone" in asm._chunks and all(not b.startswith("dead") for b in asm._chunks)
    with pytest.raises(PartialWireError):
        asm.feed({"Qpmesh-Window": "x"}, b"")
    with pytest.raises(PartialWireError):
        asm.feed({"Qpmesh-Window": "1", H_COMMIT: "b"}, b"not json")


def test_window_book_complete_deadline_late() -> None:
    plane = Plane(partitions=2, window_ns=10, grace_ns=3, solver_wait_ns=2, duplicate_window_s=1)
    book = WindowBook(plane)
    assert book.add(5, 0, 53) and book.add(6, 0, 63) and book.add(6, 1, 63)
    assert book.due(55) == []  # window 5 waits for partition 1 until its deadline (65)
    assert book.add(5, 1, 54) and book.due(55) == [5, 6]  # complete: in order
    book.mark_solved(6)
    assert not book.add(5, 0, 56) and book.late == 1  # a window solved already: late, dropped
    assert book.add(7, 0, 83) and book.due(84) == [] and book.due(85) == [7]  # deadline 85
    book.mark_solved(7)
    # a partial stored in time (read late, as a standby does): the deadline alone
    assert book.add(8, 0, 91) and book.due(94) == [] and book.due(95) == [8]


def test_window_book_waits_after_the_first_of_partials_all_late() -> None:
    """The streams stored nothing for a while (a server that led them died): every
    partition's partial of window 5 comes after its deadline (65), the first stored at 70;
    solved on the first alone, the others would be late and dropped. It waits the solver's
    wait (2) after the first, or until complete."""
    plane = Plane(partitions=2, window_ns=10, grace_ns=3, solver_wait_ns=2, duplicate_window_s=1)
    book = WindowBook(plane)
    assert book.add(5, 0, 70) and book.due(70) == [] and book.due(71) == []
    assert book.due(72) == [5]  # partition 1 never came: solved without it
    assert book.add(5, 1, 71) and book.due(71) == [5]  # it came: complete


def test_reader_watch_reopens_after_a_window_without_deliveries() -> None:
    from controller.fleet.solverloop import ReaderWatch

    w = ReaderWatch(stall_s=4.0, since_s=100.0)
    assert not w.stalled(103.9)
    w.delivered(17, 103.9)
    assert not w.stalled(107.8) and w.last_seq == 17
    assert w.stalled(107.9)  # a whole window without a delivery: reopen after seq 17
    assert not w.stalled(108.0)  # and count again from the reopening


def test_a_reopened_reader_that_times_out_is_tried_again_with_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a server kill the reader's new ephemeral consumer can be placed on the dead
    server and its creation times out: `SolverLoop._reopen` tries again after the backoff
    while the lease holds (before, the error ended the solver's connection), from just
    after the last message delivered."""
    import asyncio

    from controller.fleet import solverloop
    from natslink.errors import NatsUnavailable
    from natslink.settings import NatsSettings

    calls: list[tuple[int, int | None]] = []
    slept: list[float] = []

    async def open_reader(link, stream, subject, start_seq=1, *, start_ns=None):  # type: ignore[no-untyped-def]
        calls.append((start_seq, start_ns))
        if len(calls) < 3:
            raise NatsUnavailable("reader QPMESH_PARTIALS: TimeoutError")
        return "reader"

    async def sleep(s: float) -> None:
        slept.append(s)

    class Link:
        def check(self) -> None:
            pass

    class Old:
        async def close(self) -> None:
            pass

    monkeypatch.setattr(solverloop, "open_reader", open_reader)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    settings = NatsSettings(servers=("nats://127.0.0.1:1",), backoff_min_s=0.1, backoff_max_s=1.0)
    loop = solverloop.SolverLoop(Plane(), settings, "s1", lambda: None, lambda w, r: None,  # type: ignore[arg-type,return-value]
                                 log=lambda *a, **k: None)  # fmt: skip

    async def renew() -> list[str]:
        return []

    monkeypatch.setattr(loop.lease, "renew", renew)
    monkeypatch.setattr(loop.lease, "valid", lambda key: True)
    got = asyncio.run(loop._reopen(Link(), Old(), 41, 0))  # type: ignore[arg-type]
    assert str(got) == "reader" and loop.reopened == 1
    assert calls == [(42, None)] * 3  # just after the last delivered, every time
    assert len(slept) == 2 and 0.08 <= slept[0] <= 0.1 and 0.16 <= slept[1] <= 0.2


def test_a_partial_the_core_refuses_is_counted_not_fatal() -> None:
    """A committed partial the core cannot take (another grid or fabric, a corrupt body:
    `PartialError`) is logged and counted in ``bad``; the session goes on with the next
    message (before, the error ended the solver's session)."""
    from controller.fleet import solverloop
    from controller.fleet.partial import PartialError
    from natslink.settings import NatsSettings
    from natslink.streams import Delivery

    plane = Plane()
    taken: list[bytes] = []

    class Core:
        def add(self, body: bytes) -> None:
            if body == b"other grid":
                raise PartialError("a partial of another grid")
            taken.append(body)

    logged: list[str] = []
    loop = solverloop.SolverLoop(plane, NatsSettings(), "s1", lambda: None, lambda w, r: None,  # type: ignore[arg-type,return-value]
                                 log=lambda t, what, **k: logged.append(what))  # fmt: skip
    book, asm = WindowBook(plane), Assembler()
    window = plane.window_of(10**18)
    for partition, body in ((0, b"other grid"), (1, b"fine")):
        msgs = chunk_messages(partition, window, "b1", body, 1024)
        msgs.append(commit_message(partition, window, "b1", len(msgs), "w1", 1))
        for seq, (_, data, hdr) in enumerate(msgs):
            d = Delivery("qpmesh.v1.partials.0", data, hdr, seq, 10**18, 0, False, None)  # type: ignore[arg-type]
            loop._take(Core(), book, asm, d)  # type: ignore[arg-type]
    assert loop.bad == 1 and logged == ["bad partial"] and taken == [b"fine"]
    assert book.pending[window] == {0, 1}  # the refused one's partition counts as committed
