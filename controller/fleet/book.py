"""Which windows the solver may solve, and which partials come too late (pure).

`WindowBook` counts, per window, the partitions whose partial was committed. A window is due
when every partition committed, or when its deadline (`Plane.deadline`: window end + workers'
grace + the solver's wait) passed; windows are solved in order, each once. A partial for a
window already solved is *late*: counted (``late``) and dropped; the window's events and clock
models are out already, and folding it into a later window would count its batches in the
wrong window. Windows no partition reported are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.fleet.plane import Plane


@dataclass
class WindowBook:
    """Partitions committed per unsolved window; ``solved``: the last window solved."""

    plane: Plane
    solved: int | None = None
    pending: dict[int, set[int]] = field(default_factory=dict)
    late: int = 0

    def add(self, window: int, partition: int) -> bool:
        """Note ``partition``'s partial of ``window``; return False (counted late) if the
        window was solved already, True if the partial should be merged."""
        if self.solved is not None and window <= self.solved:
            self.late += 1
            return False
        self.pending.setdefault(window, set()).add(partition)
        return True

    def complete(self, window: int) -> bool:
        """Return True if every partition committed ``window``."""
        return len(self.pending.get(window, ())) >= self.plane.partitions

    def due(self, now_ns: int) -> list[int]:
        """Return the windows to solve now, in order: the lowest pending ones that are
        complete or past their deadline, stopping at the first that is neither."""
        out = []
        for w in sorted(self.pending):
            if not (self.complete(w) or now_ns >= self.plane.deadline(w)):
                break
            out.append(w)
        return out

    def mark_solved(self, window: int) -> None:
        """Record ``window`` as solved (and every window below it)."""
        self.solved = window if self.solved is None else max(self.solved, window)
        for w in [w for w in self.pending if w <= window]:
            del self.pending[w]
