"""Which windows the solver may solve, and which partials come too late (pure).

`WindowBook` counts, per window, the partitions whose partial was committed. A window is due
when every partition committed, or when its deadline (`Plane.deadline`: window end + workers'
grace + the solver's wait) passed and the solver's wait passed since its first partial was
stored (a window whose partials all come late, after an outage of the streams, is not solved
on the first of them alone; a standby reading partials stored long ago is not held up);
windows are solved in order, each once. A partial for a
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
    first_ns: dict[int, int] = field(default_factory=dict)  # a window's first partial stored

    def add(self, window: int, partition: int, stored_ns: int) -> bool:
        """Note ``partition``'s partial of ``window``, its commit stored at ``stored_ns``
        (UNIX ns); return False (counted late) if the window was solved already, True if it
        should be merged."""
        if self.solved is not None and window <= self.solved:
            self.late += 1
            return False
        self.pending.setdefault(window, set()).add(partition)
        self.first_ns.setdefault(window, stored_ns)
        return True

    def complete(self, window: int) -> bool:
        """Return True if every partition committed ``window``."""
        return len(self.pending.get(window, ())) >= self.plane.partitions

    def due(self, now_ns: int) -> list[int]:
        """Return the windows to solve now, in order: the lowest pending ones that are
        complete or past their deadline, stopping at the first that is neither."""
        out = []
        wait = self.plane.solver_wait_ns
        for w in sorted(self.pending):
            waited = now_ns >= max(self.plane.deadline(w), self.first_ns[w] + wait)
            if not (self.complete(w) or waited):
                break
            out.append(w)
        return out

    def mark_solved(self, window: int) -> None:
        """Record ``window`` as solved (and every window below it)."""
        self.solved = window if self.solved is None else max(self.solved, window)
        for w in [w for w in self.pending if w <= window]:
            del self.pending[w]
            self.first_ns.pop(w, None)
