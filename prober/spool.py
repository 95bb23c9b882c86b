"""Bounded, ordered spool of encoded probe batches waiting for the broker.

The publisher takes the oldest batch with `Spool.peek`, publishes it, and only after the
broker acknowledged it calls `Spool.ack`: batches leave in the order they entered, and a
batch that failed to publish is retried before anything newer (in-order delivery).

Bounds: ``max_batches`` and ``max_bytes``. When a new batch would exceed either, the OLDEST
batches are dropped (fresh measurements matter more than old ones) and counted in
``dropped_batches``. A batch whose ``batch_seq`` is not above the last one accepted is a
duplicate (e.g. a replayed batch) and is ignored, counted in ``duplicates``.

Optional disk backing (``directory``): every batch is also written to
``<directory>/<batch_seq:020d>.qpb`` and removed on ack/drop, so a restarted prober finds the
batches its predecessor could not deliver. Memory is the source of truth while running.

No clocks, no network: the spool only holds bytes.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

_SUFFIX = ".qpb"


class SpoolError(ValueError):
    """Bad spool parameters or a batch that can never fit."""


@dataclass(frozen=True, slots=True)
class SpoolItem:
    """One spooled batch: its per-origin ``batch_seq`` and the encoded ``payload``."""

    batch_seq: int
    payload: bytes

    def __post_init__(self) -> None:
        if not 0 <= self.batch_seq < (1 << 64):
            raise SpoolError(f"batch_seq {self.batch_seq} outside uint64")


class Spool:
    """In-order bounded queue of `SpoolItem` with drop-oldest overflow and seq dedupe.

    Raises `SpoolError` for non-positive bounds. Disk errors raise `OSError`.
    """

    def __init__(
        self,
        max_batches: int = 10_000,
        max_bytes: int = 64 << 20,
        directory: Path | None = None,
    ) -> None:
        if max_batches <= 0 or max_bytes <= 0:
            raise SpoolError("spool bounds must be positive")
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.directory = directory
        self._items: deque[SpoolItem] = deque()
        self._bytes = 0
        self._last_seq: int | None = None
        self.dropped_batches = 0
        self.dropped_bytes = 0
        self.duplicates = 0
        self.delivered = 0
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._load(directory)

    # ---- queries ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Return the payload bytes currently held."""
        return self._bytes

    @property
    def last_seq(self) -> int | None:
        """Return the highest batch_seq ever accepted (None if none)."""
        return self._last_seq

    def peek(self) -> SpoolItem | None:
        """Return the oldest batch without removing it, or None when empty."""
        return self._items[0] if self._items else None

    def counters(self) -> dict[str, int]:
        """Return a snapshot of the spool counters (for the health topic)."""
        return {
            "spooled": len(self._items),
            "spooled_bytes": self._bytes,
            "dropped_batches": self.dropped_batches,
            "dropped_bytes": self.dropped_bytes,
            "duplicates": self.duplicates,
            "delivered": self.delivered,
        }

    # ---- mutation ---------------------------------------------------------------------------

    def put(self, batch_seq: int, payload: bytes) -> int:
        """Append a batch; return how many old batches were dropped to make room.

        A ``batch_seq`` not above the last accepted one is ignored (counted as duplicate).
        Raises `SpoolError` if the payload alone exceeds ``max_bytes``.
        """
        item = SpoolItem(batch_seq, bytes(payload))
        if len(item.payload) > self.max_bytes:
            raise SpoolError(f"batch of {len(item.payload)} bytes exceeds the spool bound")
        if self._last_seq is not None and batch_seq <= self._last_seq:
            self.duplicates += 1
            return 0
        dropped = 0
        while self._items and (
            len(self._items) >= self.max_batches or self._bytes + len(item.payload) > self.max_bytes
        ):
            old = self._items.popleft()
            self._bytes -= len(old.payload)
            self.dropped_batches += 1
            self.dropped_bytes += len(old.payload)
            self._unlink(old.batch_seq)
            dropped += 1
        self._items.append(item)
        self._bytes += len(item.payload)
        self._last_seq = batch_seq
        self._write(item)
        return dropped

    def ack(self, batch_seq: int) -> bool:
        """Remove the oldest batch if it is ``batch_seq`` (it was delivered); return whether it was.

        A stale ack (the batch was dropped meanwhile) returns False and changes nothing.
        """
        if not self._items or self._items[0].batch_seq != batch_seq:
            return False
        item = self._items.popleft()
        self._bytes -= len(item.payload)
        self.delivered += 1
        self._unlink(item.batch_seq)
        return True

    def drop_head(self, batch_seq: int) -> bool:
        """Drop the oldest batch if it is ``batch_seq`` (it can never be delivered, e.g. it is
        larger than the broker takes), counted in ``dropped_batches``; return whether it was."""
        if not self._items or self._items[0].batch_seq != batch_seq:
            return False
        item = self._items.popleft()
        self._bytes -= len(item.payload)
        self.dropped_batches += 1
        self.dropped_bytes += len(item.payload)
        self._unlink(item.batch_seq)
        return True

    # ---- disk backing -----------------------------------------------------------------------

    def _path(self, batch_seq: int) -> Path:
        assert self.directory is not None
        return self.directory / f"{batch_seq:020d}{_SUFFIX}"

    def _write(self, item: SpoolItem) -> None:
        if self.directory is None:
            return
        path = self._path(item.batch_seq)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(item.payload)
        os.replace(tmp, path)

    def _unlink(self, batch_seq: int) -> None:
        if self.directory is not None:
            self._path(batch_seq).unlink(missing_ok=True)

    def _load(self, directory: Path) -> None:
        found: list[tuple[int, Path]] = []
        for path in directory.iterdir():
            if path.suffix != _SUFFIX:
                continue
            try:
                seq = int(path.stem)
            except ValueError:
                continue
            found.append((seq, path))
        found.sort()
        for seq, path in found:
            payload = path.read_bytes()
            # re-apply the bounds (the bounds may have shrunk since the last run)
            self._write_disabled_put(seq, payload)

    def _write_disabled_put(self, seq: int, payload: bytes) -> None:
        directory, self.directory = self.directory, None
        try:
            dropped_before = self.dropped_batches
            self.put(seq, payload)
        finally:
            self.directory = directory
        if self.dropped_batches != dropped_before and directory is not None:
            # remove files of batches dropped while loading
            keep = {it.batch_seq for it in self._items}
            for p in directory.glob(f"*{_SUFFIX}"):
                if p.stem.isdigit() and int(p.stem) not in keep and int(p.stem) <= seq:
                    p.unlink(missing_ok=True)
