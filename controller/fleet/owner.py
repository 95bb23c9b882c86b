"""One edge owner's core between the partial stream and its summary blocks (pure).

`OwnerCore(n_nics, config, owner)` is what an owner process runs per owner index it holds
(`controller.fleet.ownerloop`): ``add(partial)`` takes a committed partial of a window not
advanced past yet (its input for this owner kept: `controller.fleet.edges.split_partial`;
a second partial of the same worker and window, or one whose batches another's of the window
covers, is dropped as `controller.fleet.solver.FleetSolver.add` drops it); ``advance(window)``
folds every window up to ``window`` in order into the `EdgeStage` (a window with no partial
empty, as the solver judges it) and returns the `SummaryBlock` of each solve window on the way
(`solve_due`, `solve_cut`: the cadence and cut the solver computes alike); ``install(models)``
installs the clock state the solver published (the clocks it re-solved after a move).

``skip_upto``: solve windows up to it are folded but not summarized (an owner replaying the
stream after a takeover: the solver is past them); ``first_stamp``: the fleet's first coded
send from the solver's published state (`origin`), where the warm-up bins are, for an owner
whose replay no longer starts at the fleet's first clock rows. Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controller.fleet.config import FleetConfig
from controller.fleet.edges import (
    EdgeInput,
    EdgeStage,
    SummaryBlock,
    owner_bounds,
    solve_cut,
    solve_due,
    split_partial,
)
from controller.fleet.ownershare import OwnerShare
from controller.fleet.partial import Covers, Partial
from controller.fleet.state import decode_state


@dataclass
class OwnerCounts:
    """What an owner core made of its input."""

    partials: int = 0
    dropped: int = 0  # duplicates, overlaps, windows advanced past
    windows: int = 0
    blocks: int = 0
    skipped: int = 0  # solve windows not summarized (``skip_upto``)


@dataclass
class _Window:
    inputs: dict[str, EdgeInput] = field(default_factory=dict)
    covers: list[Covers] = field(default_factory=list)


class OwnerCore:
    """Edge owner ``owner`` of ``config.edge_owners`` on a fabric of ``n_nics`` NICs and
    ``n_hosts`` hosts (see the module docstring). Raises ValueError unless 0 <= owner <
    config.edge_owners."""

    def __init__(
        self,
        n_nics: int,
        n_hosts: int,
        config: FleetConfig,
        owner: int,
        skip_upto: int | None,
        first_stamp: int | None = None,
    ) -> None:
        if not 0 <= owner < config.edge_owners:
            raise ValueError(f"owner {owner} is not one of {config.edge_owners}")
        self.n_nics, self.n_hosts, self.config, self.owner = n_nics, n_hosts, config, owner
        self.bounds = owner_bounds(n_nics, config.edge_owners)
        self.stage = EdgeStage(n_nics, config.sync, owner, first_stamp)
        self.skip_upto = skip_upto
        self.next: int | None = None  # the next window to fold
        self._pending: dict[int, _Window] = {}
        self.counts = OwnerCounts()

    def add(self, partial: Partial) -> bool:
        """Keep this owner's input of ``partial``; return False when it is dropped (see the
        module docstring)."""
        return self._keep(partial.window, partial.worker, partial.covers,
                          lambda: split_partial(partial, self.bounds)[self.owner])  # fmt: skip

    def add_share(self, share: OwnerShare) -> bool:
        """Keep ``share`` (this owner's share of a worker's partial, cut by the worker:
        `controller.fleet.ownershare.cut_shares`) as `add` keeps a whole partial's input;
        return False when it is dropped. Raises ValueError on another owner's share."""
        if share.owner != self.owner:
            raise ValueError(f"share of owner {share.owner} given to owner {self.owner}")
        return self._keep(share.window, share.worker, share.covers, share.input)

    def _keep(
        self, window: int, worker: str, covers: Covers, edge_input: Callable[[], EdgeInput]
    ) -> bool:
        if self.next is not None and window < self.next:
            self.counts.dropped += 1
            return False
        w = self._pending.setdefault(window, _Window())
        if worker in w.inputs or (len(covers) and any(c.overlaps(covers) for c in w.covers)):
            self.counts.dropped += 1
            return False
        w.inputs[worker] = edge_input()
        w.covers.append(covers)
        self.counts.partials += 1
        return True

    def advance(self, window: int) -> list[SummaryBlock]:
        """Fold every window up to ``window`` not folded yet, in order; return the blocks of
        the solve windows among them (oldest first)."""
        start = window if self.next is None else self.next
        if self.next is None and self._pending:
            start = min(start, *self._pending)
        out = []
        for k in range(start, window + 1):
            got = self._pending.pop(k, None)
            self.stage.add(list(got.inputs.values()) if got is not None else [])
            self.counts.windows += 1
            first, t0 = self.stage.first_window, self.stage.first_stamp
            grid, sync = self.config.grid, self.config.sync
            if first is None or t0 is None or not solve_due(k, first, grid, sync):
                continue
            if self.skip_upto is not None and k <= self.skip_upto:
                self.counts.skipped += 1
                continue
            out.append(self.stage.block(k, *solve_cut(k, t0, grid, sync)))
            self.counts.blocks += 1
        self.next = max(window + 1, self.next or window + 1)
        return out

    def install(self, models: bytes) -> None:
        """Install the clock state of the solver's published models (`FleetSolver`'s
        `controller.fleet.state.FleetState`). Raises `controller.fleet.state.StateError` on
        a payload that is not one of this fabric."""
        self.stage.install(decode_state(models, self.n_nics, self.n_hosts).clock)


def origin(models: bytes | None, n_nics: int, n_hosts: int) -> int | None:
    """Return the fleet's first coded send in the solver's published ``models`` (None: no
    models, or none yet). Raises `controller.fleet.state.StateError` on a payload that is not
    a state of this fabric."""
    return None if not models else decode_state(models, n_nics, n_hosts).first_stamp
