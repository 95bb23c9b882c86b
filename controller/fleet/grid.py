"""The fleet-wide window grid: window k is ``[k W, (k+1) W)`` of UNIX ns, the same in every
process.

Every piece of the controller that cuts time into windows cuts it on this grid: a worker's
partials (`controller.fleet.partial.Partial`, one per worker and window), the detection
windows the brain judges (`controller.brain.Brain.judge`, stamped with the window's end) and
the clock selection's bins (`controller.clocksync.ClockSync`, whose bins are aligned to their
own width on the same UNIX time axis). A window's number depends only on the time and ``W``,
never on when a process started, so partials of the same window from different processes
merge. Pure: integers in, integers out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WindowGrid:
    """Windows of ``width_ns`` aligned to UNIX time 0 (window k starts at ``k * width_ns``).
    Raises ValueError unless ``width_ns`` is positive."""

    width_ns: int = 1_000_000_000

    def __post_init__(self) -> None:
        if self.width_ns <= 0:
            raise ValueError(f"window width must be > 0 ns, got {self.width_ns}")

    def index(self, t_ns: int) -> int:
        """Return the window holding time ``t_ns`` (floor division: negative times too)."""
        return t_ns // self.width_ns

    def indices(self, t_ns: I64) -> I64:
        """Return the window of each time in ``t_ns`` (int64, floor division)."""
        return np.floor_divide(np.asarray(t_ns, np.int64), self.width_ns)

    def start(self, k: int) -> int:
        """Return the first ns of window ``k``."""
        return k * self.width_ns

    def end(self, k: int) -> int:
        """Return the end of window ``k`` (exclusive: the start of window k + 1)."""
        return (k + 1) * self.width_ns

    def closed_before(self, upto_ns: int, lateness_ns: int = 0) -> int:
        """Return the first window that is not closed at ``upto_ns``: windows below it end at
        least ``lateness_ns`` before ``upto_ns`` (``end + lateness <= upto``)."""
        return (upto_ns - lateness_ns) // self.width_ns
