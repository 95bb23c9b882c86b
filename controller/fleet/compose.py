"""The fleet's cores built for its shells from one controller config (no I/O).

`core_config` is the `controller.fleet.config.FleetConfig` every process of a fleet shares
(the grid and lateness of ``[fleet]``'s `Plane`, the ``[sync]`` and ``[thresholds]`` of the
config): the workers' and the solver's windows, clock bins and thresholds agree.
`worker_cores` makes a partition's `FleetWorker` (named ``p<partition>``: a partition's
partial of a window is the same whoever builds it), on the declared fabric or, with a learned
one, on the newest version a `controller.fleet.fabricwire.FabricFollow` took; `owner_cores`
an edge owner index's `OwnerCore`; `service_core` the controller service's solver core (with
edge owners: one that joins their blocks); `SolverCore` adapts a `FleetSolver` to the shell
(partials arrive encoded), also one that a learned fabric's change replaces (``follow``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from controller.config import ServiceConfig
from controller.fleet.config import FleetConfig
from controller.fleet.edges import SummaryBlock
from controller.fleet.fabricwire import FabricFollow
from controller.fleet.grid import WindowGrid
from controller.fleet.owner import OwnerCore, origin
from controller.fleet.partial import Partial
from controller.fleet.plane import Plane
from controller.fleet.solver import Added, FleetSolver, RemoteStages, SolveResult
from controller.fleet.worker import FleetWorker

if TYPE_CHECKING:
    from controller.live import LiveController


def core_config(config: ServiceConfig, plane: Plane) -> FleetConfig:
    """Return the cores' shared settings for ``config`` on ``plane``'s grid and grace."""
    return FleetConfig(
        grid=WindowGrid(plane.window_ns),
        lateness_ns=plane.grace_ns,
        sync=config.live.sync,
        detection=config.brain,
        baseline_bucket_ns=config.live.baseline_bucket_ns,
        edge_owners=plane.edge_owners,
    )


def worker_cores(
    config: ServiceConfig, plane: Plane, follow: FabricFollow | None = None
) -> Callable[[int], FleetWorker]:
    """Return ``make_core(partition)`` for `controller.fleet.workerloop.WorkerLoop`: a core
    on ``config.fabric``, or with ``follow`` (a learned fabric) on ``follow.fabric``, the
    version taken when it is made (the shell makes none before one came)."""
    shared = core_config(config, plane)

    def make(partition: int) -> FleetWorker:
        fabric = config.fabric
        if follow is not None and follow.fabric is not None:
            fabric = follow.fabric
        core = FleetWorker(fabric, shared, name=f"p{partition}")
        if follow is not None and follow.fabric is fabric and len(follow.paths.src):
            core.know_paths(*follow.paths)  # the traced paths published with the fabric
        # a learned fabric's ECMP model is no one's: only traced paths (as one process)
        core.use_model_paths(config.model_paths and config.learn is None)
        return core

    return make


def owner_cores(
    config: ServiceConfig, plane: Plane
) -> Callable[[int, int | None, bytes | None], OwnerCore]:
    """Return ``make_core(index, solved, models)`` for `controller.fleet.ownerloop.OwnerLoop`
    (the fabric's NIC and host counts, the fleet's shared settings; the first coded send of
    the solver's ``models``, `controller.fleet.owner.origin`). Raises
    `controller.fleet.state.StateError` on models of another fabric."""
    shared = core_config(config, plane)
    n_nics, n_hosts = len(config.fabric.nics), len(config.fabric.hosts)

    def make(index: int, solved: int | None, models: bytes | None) -> OwnerCore:
        t0 = origin(models, n_nics, n_hosts)
        return OwnerCore(n_nics, n_hosts, shared, index, solved, t0)

    return make


class SolverCore:
    """A `FleetSolver` behind the shell's `controller.fleet.cores.SolverCore`: ``add``
    decodes the partial; what `FleetSolver.add` made of each is counted in ``added``.
    ``follow``: where the solver in use is read at each call (a live state whose learned
    fabric changes replaces its solver: ``lambda: live.solver``); None: ``solver`` always.
    ``paths``: the worker whose learned paths (the probers' traced paths the service reads)
    go to the solver before each solve, and from it to every worker (``lambda:
    live.worker``, which makes no partials in a fleet: `FleetWorker.take_learned`). Also
    the shell's `controller.fleet.cores.BlockSink`, for a solver with edge owners apart:
    what `FleetSolver.add_block` made of each summary block is counted in ``blocks``."""

    def __init__(
        self,
        solver: FleetSolver,
        *,
        follow: Callable[[], FleetSolver] | None = None,
        paths: Callable[[], FleetWorker] | None = None,
    ) -> None:
        self._solver, self._follow, self._paths = solver, follow, paths
        self.added = dict.fromkeys(Added, 0)
        self.blocks = dict.fromkeys(Added, 0)
        self._remote: RemoteStages | None = None

    @property
    def solver(self) -> FleetSolver:
        """Return the solver in use."""
        return self._follow() if self._follow is not None else self._solver

    def add(self, partial: bytes) -> None:
        """Merge one encoded partial (raises `controller.fleet.partial.PartialError` on one
        of another grid; one of another fabric is counted ``stale``)."""
        self.added[self.solver.add(Partial.decode(partial))] += 1

    def solve(self, window: int, now_ns: int) -> SolveResult:
        """Judge ``window`` (`FleetSolver.solve`), first handing it the paths learned
        meanwhile (``paths``)."""
        if self._paths is not None:
            self.solver.learn(self._paths().take_learned())
        if self._remote is not None:
            self.solver.remote = self._remote
        return self.solver.solve(window, now_ns)

    def add_block(self, block: bytes) -> None:
        """Take one encoded summary block (raises `controller.fleet.edges.BlockError` on a
        malformed one, ValueError on one of an owner this solver does not have)."""
        self.blocks[self.solver.add_block(SummaryBlock.decode(block))] += 1

    def use_stages(self, remote: RemoteStages) -> None:
        """Run the rounds of each solve window through ``remote`` (`FleetSolver.remote`:
        the owners apart run the per-edge stages; set on the solver in use at each solve)."""
        self._remote = remote

    def needs_blocks(self, window: int) -> bool:
        """Return True when ``window`` is a solve window whose blocks come from owners apart
        (`FleetSolver.needs_blocks`)."""
        return self.solver.needs_blocks(window)

    def blocks_in(self, window: int) -> int:
        """Return how many owners' blocks of ``window`` are in."""
        return self.solver.blocks_in(window)


def service_core(live: LiveController, plane: Plane) -> SolverCore:
    """Return the solver core of the controller service with ``[fleet]`` (`run_service`'s
    ``fleet_core``): the live state's own `FleetSolver`, or with ``plane.edge_owners`` one
    that leaves the clock work per edge to the owner processes (``local_edges`` off), put in
    the live state's hands (its brain kept). The core follows the live state's solver (a
    learned fabric's change replaces it; `controller.config` refuses edge owners on a learned
    fabric, whose replaced solver would have none) and hands it the paths the service's
    worker learned."""
    if plane.edge_owners:
        live.solver = FleetSolver(
            live.fabric, dataclasses.replace(live.fleet, edge_owners=plane.edge_owners),
            brain=live.solver.brain, solve_inline=live.solver.solve_inline, local_edges=False,
        )  # fmt: skip
    return SolverCore(live.solver, follow=lambda: live.solver, paths=lambda: live.worker)
