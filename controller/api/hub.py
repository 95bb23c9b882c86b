"""Where a producer hands the API its state: the latest snapshot and the event log.

The producer (the demo loop, the controller service) calls `ApiHub.publish(snapshot, events)`
from its own thread; the API reads `snapshot()` / `events()` and websocket clients subscribe
(`subscribe()` in the API's event loop) to be woken when something new arrives. The hub never
reads the live controller itself, so the API never races the producer's mutations: it only sees
immutable snapshots. The event log is bounded (oldest dropped); each event gets a sequence
number so clients can tell what they have seen. `snapshot_wait` is the pure coalescing rule.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from contract.documents import EventDoc
from mesh.snapshot import MeshSnapshot


def snapshot_wait(last_sent_s: float | None, now_s: float, min_interval_s: float) -> float:
    """Return how long to wait before the next snapshot may be sent (0 = now)."""
    if last_sent_s is None:
        return 0.0
    return max(0.0, last_sent_s + min_interval_s - now_s)


@dataclass(eq=False)
class Subscriber:
    """One websocket client's inbox, owned by the API's event loop."""

    loop: asyncio.AbstractEventLoop
    max_pending: int = 1000
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    pending: deque[tuple[int, EventDoc]] = field(default_factory=deque)
    snap_dirty: bool = True
    dropped: int = 0

    def push(self, events: tuple[tuple[int, EventDoc], ...], snap: bool) -> None:
        """Queue ``events`` (oldest dropped past `max_pending`, counted), mark the snapshot
        new if ``snap``, wake the sender. Call in the subscriber's loop."""
        for item in events:
            if len(self.pending) >= self.max_pending:
                self.pending.popleft()
                self.dropped += 1
            self.pending.append(item)
        self.snap_dirty = self.snap_dirty or snap
        self.wake.set()

    def drain(self) -> list[tuple[int, EventDoc]]:
        """Return and forget the queued events."""
        out = list(self.pending)
        self.pending.clear()
        return out


class ApiHub:
    """The latest snapshot, a bounded event log and the websocket subscribers (thread-safe)."""

    def __init__(self, snapshot: MeshSnapshot, *, max_events: int = 10_000) -> None:
        if max_events < 1:
            raise ValueError("max_events must be >= 1")
        self._lock = threading.Lock()
        self._snap = snapshot
        self._events: deque[tuple[int, EventDoc]] = deque(maxlen=max_events)
        self._seq = 0
        self._subs: set[Subscriber] = set()
        self.published = 0

    def publish(self, snapshot: MeshSnapshot | None, events: tuple[EventDoc, ...] = ()) -> None:
        """Install ``snapshot`` (None keeps the current one) and append ``events``; wake every
        subscriber. Safe from any thread."""
        with self._lock:
            if snapshot is not None:
                self._snap = snapshot
                self.published += 1
            numbered = []
            for ev in events:
                self._seq += 1
                numbered.append((self._seq, ev))
            self._events.extend(numbered)
            subs = list(self._subs)
        items = tuple(numbered)
        for sub in subs:
            try:
                sub.loop.call_soon_threadsafe(sub.push, items, snapshot is not None)
            except RuntimeError:  # its loop is closed: the client is gone
                self.unsubscribe(sub)

    def snapshot(self) -> MeshSnapshot:
        """Return the latest snapshot."""
        return self._snap

    def events(self) -> tuple[tuple[int, EventDoc], ...]:
        """Return the logged events with their sequence numbers, oldest first."""
        with self._lock:
            return tuple(self._events)

    def subscribe(self) -> Subscriber:
        """Return a new subscriber bound to the running loop (call inside it)."""
        sub = Subscriber(asyncio.get_running_loop())
        with self._lock:
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Forget ``sub`` (no error if already gone)."""
        with self._lock:
            self._subs.discard(sub)

    @property
    def clients(self) -> int:
        """Return the number of subscribed websocket clients."""
        with self._lock:
            return len(self._subs)

    def health(self) -> Mapping[str, object]:
        """Return the hub's figures: snapshots published, events logged, websocket clients."""
        with self._lock:
            return {"snapshots_published": self.published, "events_logged": self._seq,
                    "ws_clients": len(self._subs)}  # fmt: skip
