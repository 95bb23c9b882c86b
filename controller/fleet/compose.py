"""The fleet's cores built for its shells from one controller config (no I/O).

`core_config` is the `controller.fleet.config.FleetConfig` every process of a fleet shares
(the grid and lateness of ``[fleet]``'s `Plane`, the ``[sync]`` and ``[thresholds]`` of the
config): the workers' and the solver's windows, clock bins and thresholds agree.
`worker_cores` makes a partition's `FleetWorker` (named ``p<partition>``: a partition's
partial of a window is the same whoever builds it), on the declared fabric or, with a learned
one, on the newest version a `controller.fleet.fabricwire.FabricFollow` took; `SolverCore`
adapts a `FleetSolver` to the shell (partials arrive encoded), also one that a learned
fabric's change replaces (``follow``).
"""

from __future__ import annotations

from collections.abc import Callable

from controller.config import ServiceConfig
from controller.fleet.config import FleetConfig
from controller.fleet.fabricwire import FabricFollow
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import Partial
from controller.fleet.plane import Plane
from controller.fleet.solver import Added, FleetSolver, SolveResult
from controller.fleet.worker import FleetWorker


def core_config(config: ServiceConfig, plane: Plane) -> FleetConfig:
    """Return the cores' shared settings for ``config`` on ``plane``'s grid and grace."""
    return FleetConfig(
        grid=WindowGrid(plane.window_ns),
        lateness_ns=plane.grace_ns,
        sync=config.live.sync,
        detection=config.brain,
        baseline_bucket_ns=config.live.baseline_bucket_ns,
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


class SolverCore:
    """A `FleetSolver` behind the shell's `controller.fleet.cores.SolverCore`: ``add``
    decodes the partial; what `FleetSolver.add` made of each is counted in ``added``.
    ``follow``: where the solver in use is read at each call (a live state whose learned
    fabric changes replaces its solver: ``lambda: live.solver``); None: ``solver`` always.
    ``paths``: the worker whose learned paths (the probers' traced paths the service reads)
    go to the solver before each solve, and from it to every worker (``lambda:
    live.worker``, which makes no partials in a fleet: `FleetWorker.take_learned`)."""

    def __init__(
        self,
        solver: FleetSolver,
        *,
        follow: Callable[[], FleetSolver] | None = None,
        paths: Callable[[], FleetWorker] | None = None,
    ) -> None:
        self._solver, self._follow, self._paths = solver, follow, paths
        self.added = dict.fromkeys(Added, 0)

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
        return self.solver.solve(window, now_ns)
