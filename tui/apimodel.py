"""What the TUI keeps of a remote controller besides its latest documents (pure).

The API's documents are decoded by `mesh.documents` (beside the encoders the controller's API
uses); this module keeps what only the screen needs of them, with no I/O and no clock:

- `merge_events` keeps the event log: new events by sequence number, the whole log replaced
  when the controller restarted (its sequence numbers start again);
- `HistoryRing` keeps the per-NIC worst delay over time (one sample per ``min_spacing_s`` of
  controller time) for the sparkline.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc

F64 = npt.NDArray[np.float64]
MAX_EVENTS = 5000


def merge_events(
    have: Sequence[tuple[int, EventDoc]],
    got: Sequence[tuple[int, EventDoc]],
    *,
    restarted: bool = False,
    limit: int = MAX_EVENTS,
) -> tuple[tuple[int, EventDoc], ...]:
    """Return the event log ``have`` with ``got`` added: only events with a sequence number
    above the newest of ``have`` (what was already seen is not repeated), ordered by sequence
    number, the newest ``limit`` kept. ``restarted`` (the controller started again, so its
    sequence numbers did too): ``got`` replaces the log."""
    base: list[tuple[int, EventDoc]] = [] if restarted else list(have)
    last = base[-1][0] if base else 0
    new = sorted(((s, e) for s, e in got if s > last), key=lambda x: x[0])
    seen: set[int] = set()
    uniq = []
    for s, e in new:
        if s not in seen:
            seen.add(s)
            uniq.append((s, e))
    out = base + uniq
    return tuple(out[-limit:])


class HistoryRing:
    """Per-NIC worst delay (max of in and out) over controller time, for the sparkline.

    `add(t_ns, worst_in, worst_out)` keeps one sample per ``min_spacing_s`` (later samples in
    the same slot are dropped) up to ``capacity`` samples (oldest dropped); a time before the
    newest sample (the controller restarted) starts over. `window(nic, window_s)` returns
    (times in s relative to the newest sample, values)."""

    def __init__(self, n: int, *, capacity: int = 3600, min_spacing_s: float = 1.0) -> None:
        if capacity < 1 or min_spacing_s < 0:
            raise ValueError("capacity must be >= 1 and min_spacing_s >= 0")
        self.n, self.capacity, self.spacing_ns = n, capacity, int(min_spacing_s * 1e9)
        self._t = np.zeros(capacity, np.int64)
        self._v = np.full((capacity, n), np.nan, np.float32)
        self._head = 0
        self._count = 0

    def add(self, t_ns: int, worst_in: F64, worst_out: F64) -> None:
        """Record the worst delays of every NIC at ``t_ns`` (arrays of length ``n``)."""
        if self._count:
            last = int(self._t[(self._head - 1) % self.capacity])
            if t_ns < last:
                self._head = self._count = 0
            elif t_ns - last < self.spacing_ns or t_ns == last:
                return
        with np.errstate(invalid="ignore"):
            self._v[self._head] = np.fmax(worst_in, worst_out)
        self._t[self._head] = t_ns
        self._head = (self._head + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def window(self, nic: int, window_s: float) -> tuple[F64, F64]:
        """Return (times s relative to the newest sample, worst delay ns) of ``nic`` within
        ``window_s``; empty arrays without samples. Raises IndexError for a bad NIC index."""
        if not 0 <= nic < self.n:
            raise IndexError(f"no NIC with index {nic}")
        if not self._count:
            return np.zeros(0), np.zeros(0)
        idx = (self._head - self._count + np.arange(self._count)) % self.capacity
        t = self._t[idx]
        rel = (t - t[-1]) / 1e9
        keep = rel >= -window_s
        return rel[keep].astype(np.float64), self._v[idx, nic][keep].astype(np.float64)
