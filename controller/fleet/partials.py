"""Partials on the wire (pure): chunks, the commit that makes one build count, reassembly.

A worker sends a closed window's partial of one partition as one *build*: the encoded
partial cut into chunks (``Qpmesh-Build``, ``Qpmesh-Chunk: i/n``; message id
``partial:<partition>:<window>:<build>:<i>``), then one small commit (``Qpmesh-Commit``) whose
message id is ``partial:<partition>:<window>``. The stream keeps only the first commit with
that id (a second is acknowledged ``duplicate``), so exactly one build counts per partition
and window: a new owner that rebuilt a window its predecessor had committed gets a duplicate
ack and acks the batches, and the solver never sees two. A partition with no batches in a
window commits an empty build (0 chunks): the solver knows the window is complete when every
partition committed.

`Assembler` reads the stream in order (chunks come before their commit: one publisher awaits
each ack) and returns each `Committed` partial; chunks of builds never committed (a worker
that died mid-send) are forgotten after ``keep_windows``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

H_PARTITION = "Qpmesh-Partition"
H_WINDOW = "Qpmesh-Window"
H_BUILD = "Qpmesh-Build"
H_CHUNK = "Qpmesh-Chunk"
H_COMMIT = "Qpmesh-Commit"


class PartialWireError(ValueError):
    """A partial message whose headers or commit document are malformed."""


def commit_id(partition: int, window: int, kind: str = "partial") -> str:
    """Return the message id of ``partition``'s commit for ``window`` (``kind``: ``partial``,
    or ``share<k>`` for edge owner k's share: `controller.fleet.ownershare`)."""
    return f"{kind}:{partition}:{window}"


def chunk_messages(
    partition: int, window: int, build: str, body: bytes, chunk_bytes: int, kind: str = "partial"
) -> list[tuple[str, bytes, dict[str, str]]]:
    """Return (message id, payload, headers) of each chunk of ``body`` (none when empty)."""
    n = -(-len(body) // chunk_bytes)
    out = []
    for i in range(n):
        hdr = {H_PARTITION: str(partition), H_WINDOW: str(window), H_BUILD: build,
               H_CHUNK: f"{i}/{n}"}  # fmt: skip
        out.append((f"{commit_id(partition, window, kind)}:{build}:{i}",
                    body[i * chunk_bytes : (i + 1) * chunk_bytes], hdr))  # fmt: skip
    return out


def commit_message(
    partition: int,
    window: int,
    build: str,
    chunks: int,
    worker: str,
    batches: int,
    kind: str = "partial",
) -> tuple[str, bytes, dict[str, str]]:
    """Return (message id, payload, headers) of the commit of a build."""
    doc = {"partition": partition, "window": window, "build": build, "chunks": chunks,
           "worker": worker, "batches": batches}  # fmt: skip
    hdr = {H_PARTITION: str(partition), H_WINDOW: str(window), H_COMMIT: build}
    return commit_id(partition, window, kind), json.dumps(doc).encode(), hdr


@dataclass(frozen=True, slots=True)
class Committed:
    """One partition's committed partial of one window: ``body`` (empty: no batches), the
    ``worker`` that built it and how many ``batches`` it covers."""

    partition: int
    window: int
    body: bytes
    worker: str
    batches: int


def _int(headers: Mapping[str, str], key: str) -> int:
    try:
        return int(headers[key])
    except (KeyError, ValueError):
        raise PartialWireError(f"header {key} missing or not an integer") from None


@dataclass
class Assembler:
    """Reassembles committed partials from the partial stream, read in order."""

    keep_windows: int = 4
    _chunks: dict[str, dict[int, bytes]] = field(default_factory=dict)
    _window_of: dict[str, int] = field(default_factory=dict)
    incomplete: int = 0  # commits whose chunks were not all there (counted, dropped)

    def feed(self, headers: Mapping[str, str], data: bytes) -> Committed | None:
        """Take one message; return the partial it commits (None for a chunk). Raises
        `PartialWireError` for a malformed message."""
        window = _int(headers, H_WINDOW)
        if H_COMMIT in headers:
            return self._commit(headers[H_COMMIT], window, data)
        build = headers.get(H_BUILD, "")
        try:
            i, n = (int(x) for x in headers.get(H_CHUNK, "").split("/"))
        except ValueError:
            raise PartialWireError("chunk header must be i/n") from None
        if not build or not 0 <= i < n:
            raise PartialWireError("chunk without a build or with i outside 0..n-1")
        self._chunks.setdefault(build, {})[i] = data
        self._window_of[build] = window
        for old in [b for b, w in self._window_of.items() if w < window - self.keep_windows]:
            self._chunks.pop(old, None)
            self._window_of.pop(old, None)
        return None

    def _commit(self, build: str, window: int, data: bytes) -> Committed | None:
        try:
            doc = json.loads(data)
            partition, chunks = int(doc["partition"]), int(doc["chunks"])
            worker, batches = str(doc["worker"]), int(doc["batches"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PartialWireError(f"bad commit document: {exc}") from None
        parts = self._chunks.pop(build, {})
        self._window_of.pop(build, None)
        if len(parts) != chunks or set(parts) != set(range(chunks)):
            self.incomplete += 1
            return None
        body = b"".join(parts[i] for i in range(chunks))
        return Committed(partition, window, body, worker, batches)
