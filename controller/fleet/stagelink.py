"""The rounds of the staged clock solve on NATS: what an edge owner publishes instead of its
block's summary rows, how it answers the solver's stage calls, and the solver's transport.

- **The block head** (`encode_head` / `decode_head`): at a solve window an owner publishes
  its `controller.fleet.edges.SummaryBlock` without the summary (rows, span, floor raises),
  with the edges of its range and its summary's point count (what the solver's
  `solve_blocks` reads of a summary: `StagedBlocks`), in the partial stream as before;
  the summary stays with the owner as that window's `sync.edgestage.EdgeRange`.
- **The owner's side** (`StageDesk`): per owner index the `StageServer`s of its last
  solve windows; ``answer(k, call)`` returns the reply bytes, or an error frame
  (``QPSE`` and one line) for a call it cannot answer (no range of that window: a new
  lease holder that did not build it, a skipped call number, a malformed call).
- **The solver's side** (`StageLink`): one `controller.fleet.stagewire.RemoteRange` per
  owner block whose transport is a core NATS request to ``<prefix>.stage.<k>``, made from
  a worker thread (`asyncio.run_coroutine_threadsafe` on the connection's loop) with a
  timeout per call; an error frame, a timeout or a lost connection raises `StageError`,
  and the solver judges the window without a clock solve (`FleetSolver`:
  ``missing_blocks``), never from part of the rounds.

Pure but for `StageLink`'s transport (a callable handed in by the shell).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.fleet.codec import CodecError, pack, unpack
from controller.fleet.edges import BlockError, SummaryBlock
from controller.fleet.stagewire import RemoteRange, StageCall, StageError, StageServer
from sync.edgestage import RangeStages

I64 = npt.NDArray[np.int64]
Request = Callable[[str, bytes, float], Coroutine[Any, Any, bytes]]
HEAD_MAGIC, ERROR_MAGIC, HEAD_VERSION = b"QPSH", b"QPSE", 1
KEEP_WINDOWS = 2  # an owner keeps the ranges of its last solve windows (a late solver's too)


def encode_head(block: SummaryBlock, edges: I64) -> bytes:
    """Return ``block`` without its summary rows, with its range's ``edges`` (m, 2) and its
    summary's point count (`decode_head` reads them back)."""
    head = SummaryBlock(block.owner, block.window, block.rows, block.t_lo, block.t_hi,
                        block.sw, None, block.raise_edges, block.raised)  # fmt: skip
    points = block.summary.n_points if block.summary is not None else 0
    cols: dict[str, npt.NDArray[Any]] = {"block": np.frombuffer(head.encode(), np.uint8),
            "edges": np.asarray(edges, np.int64).reshape(-1, 2)}  # fmt: skip
    return pack(HEAD_MAGIC, HEAD_VERSION, {"points": points}, cols)


def decode_head(data: bytes) -> tuple[SummaryBlock, I64, int]:
    """Return (the block without summary, its range's edges, its summary's points) of
    ``data``. Raises `BlockError` on a malformed frame."""
    try:
        _, head, cols = unpack(data, HEAD_MAGIC, frozenset({HEAD_VERSION}))
    except CodecError as exc:
        raise BlockError(str(exc)) from None
    points, raw, edges = head.get("points"), cols.get("block"), cols.get("edges")
    if not isinstance(points, int) or isinstance(points, bool) or points < 0:
        raise BlockError("block head needs a count of points")
    if raw is None or raw.dtype != np.uint8 or edges is None or edges.dtype.str != "<i8":
        raise BlockError("block head needs its block and (m, 2) int64 edges")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise BlockError("block head's edges must be (m, 2)")
    return SummaryBlock.decode(raw.tobytes()), np.array(edges), points


def stage_subject(prefix: str, k: int) -> str:
    """Return owner index ``k``'s stage subject under the NATS subject ``prefix``."""
    return f"{prefix}.stage.{k}"


def nats_request(nc: Any) -> Request:
    """Return the `StageLink` request of the nats-py client ``nc`` (core request/reply)."""

    async def request(subject: str, data: bytes, timeout_s: float) -> bytes:
        msg = await nc.request(subject, data, timeout=timeout_s)
        return bytes(msg.data)

    return request


def error_frame(message: str) -> bytes:
    """Return the reply that refuses a call (``message``: one line)."""
    return ERROR_MAGIC + message.encode()


class StageDesk:
    """An owner process's stage servers: per index, those of its last `KEEP_WINDOWS` solve
    windows. Not thread-safe: one call at a time per index (the shell holds a lock)."""

    def __init__(self) -> None:
        self._servers: dict[int, dict[int, StageServer]] = {}

    def keep(self, k: int, window: int, stages: RangeStages | None) -> None:
        """Keep index ``k``'s range of solve ``window`` (None: no summary or no edge, no
        calls come) for the solver's calls."""
        have = self._servers.setdefault(k, {})
        if stages is not None:
            have[window] = StageServer(window, stages)
        for w in sorted(have)[:-KEEP_WINDOWS]:
            del have[w]

    def drop(self, k: int) -> None:
        """Forget index ``k`` (its lease went)."""
        self._servers.pop(k, None)

    def windows(self, k: int) -> list[int]:
        """Return the solve windows of index ``k`` whose calls are answered."""
        return sorted(self._servers.get(k, {}))

    def answer(self, k: int, data: bytes) -> bytes:
        """Return the reply to ``data`` for index ``k``: the stage's frame, or an error frame
        (`error_frame`) when it cannot be answered."""
        try:
            window = StageCall.decode(data).window
            server = self._servers.get(k, {}).get(window)
            if server is None:
                return error_frame(f"owner {k} has no range of window {window}")
            return server.answer(data)
        except (StageError, ValueError, IndexError) as exc:  # a call its range cannot take
            return error_frame(f"owner {k}: {exc}")


class StageLink:
    """The solver's transport of the rounds: ``request(subject, data, timeout_s)`` (a
    coroutine run on the loop given to `attach`) answers a call; ``subject_of(k)`` names
    owner index ``k``'s stage subject; ``timeout_s``: per call. `StagedBlocks` asks
    `ranges` for a solve window's ranges from its worker thread. Counts ``calls`` and the
    replies' ``bytes_in``."""

    def __init__(self, subject_of: Callable[[int], str], timeout_s: float) -> None:
        self.subject_of, self.timeout_s = subject_of, timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._request: Request | None = None
        self._heads: dict[tuple[int, int], tuple[I64, int]] = {}
        self.calls = 0
        self.bytes_in = 0

    def attach(self, loop: asyncio.AbstractEventLoop, request: Request) -> None:
        """Send calls through ``request`` on ``loop`` (a new connection's)."""
        self._loop, self._request = loop, request

    def detach(self) -> None:
        """Refuse calls from now on (the connection ended)."""
        self._loop = self._request = None

    def send(self, k: int, data: bytes) -> bytes:
        """Return owner ``k``'s reply to ``data``. Raises `StageError` on a refusal, a time
        out, a lost connection or a call made on the loop's own thread."""
        loop, request = self._loop, self._request
        if loop is None or request is None:
            raise StageError("no connection for the stage calls")
        if loop.is_running() and _on_thread_of(loop):
            raise StageError("stage calls need the solve off the connection's loop")
        try:
            fut = asyncio.run_coroutine_threadsafe(
                request(self.subject_of(k), data, self.timeout_s), loop
            )
        except RuntimeError as exc:  # the loop closed meanwhile (the session ended)
            raise StageError(f"owner {k}: {exc}") from None
        try:
            reply = fut.result(self.timeout_s + 5.0)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise StageError(f"owner {k} did not answer within {self.timeout_s} s") from None
        except Exception as exc:  # the transport's errors (time-out, no responder, link)
            raise StageError(f"owner {k}: {type(exc).__name__} {exc}") from None
        self.calls += 1
        self.bytes_in += len(reply)
        if reply.startswith(ERROR_MAGIC):
            raise StageError(reply[len(ERROR_MAGIC) :].decode(errors="replace"))
        return reply

    def note(self, block: SummaryBlock, edges: I64, points: int) -> None:
        """Note a block head's range (`decode_head`) for its window's rounds; forget the
        heads of windows more than `KEEP_WINDOWS` solve windows older."""
        self._heads[(block.window, block.owner)] = (edges, points)
        windows = sorted({w for w, _ in self._heads})
        for key in [key for key in self._heads if key[0] in windows[: -KEEP_WINDOWS - 1]]:
            del self._heads[key]

    def ranges(
        self, window: int, blocks: Sequence[SummaryBlock]
    ) -> tuple[list[RangeStages | None], int]:
        """Return (per block a `RemoteRange` on its owner, None where it has no edge; the
        blocks' summary points) for solve ``window``: `controller.fleet.solver.RemoteStages`.
        Raises `StageError` for a block whose head was not noted."""
        out: list[RangeStages | None] = []
        points = 0
        for block in blocks:
            got = self._heads.get((window, block.owner))
            if got is None:
                raise StageError(f"no block head of owner {block.owner}, window {window}")
            edges, n = got
            points += n
            if not len(edges) or block.sw:
                out.append(None)
                continue
            out.append(RemoteRange(window, edges, functools.partial(self.send, block.owner)))
        return out, points


def _on_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


__all__ = [
    "StageDesk",
    "StageLink",
    "decode_head",
    "encode_head",
    "error_frame",
    "nats_request",
    "stage_subject",
]
