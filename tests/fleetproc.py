"""A fleet worker or solver process on the stand-in core (`tests.fleetstub`), for the fault
tests: ``python -m tests.fleetproc worker|solver ID LOG SERVER...`` with the `Plane` of
``FLEET_PLANE`` (JSON of its fields). The solver writes one JSON line per solved window to
``LOG.results`` (window, the batches its partials covered)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from controller.dispatch import JsonLog
from controller.fleet.cores import SolveResultLike
from controller.fleet.plane import Plane
from controller.fleet.solverloop import SolverLoop
from controller.fleet.workerloop import WorkerLoop
from natslink.settings import NatsSettings
from tests.fleetstub import StubSolver, StubWorker


def main() -> None:
    role, ident, log_path, *servers = sys.argv[1:]
    plane = Plane(**json.loads(os.environ["FLEET_PLANE"]))
    settings = NatsSettings(servers=tuple(servers), timeout_s=2.0, connect_timeout_s=1.0,
                            backoff_min_s=0.1, backoff_max_s=1.0)  # fmt: skip
    with open(log_path, "a") as stream:
        log = JsonLog(stream)
        if role == "worker":
            loop: WorkerLoop | SolverLoop = WorkerLoop(
                plane,
                settings,
                ident,
                lambda p: StubWorker(plane.window_ns, plane.grace_ns),
                log=log,
            )
        else:
            solver = StubSolver()
            results = open(log_path + ".results", "a")  # noqa: SIM115

            def on_result(window: int, result: SolveResultLike) -> None:
                covered = sorted(solver.windows.get(window, ()))
                results.write(json.dumps({"window": window, "solver": ident,
                                          "batches": covered}) + "\n")  # fmt: skip
                results.flush()

            loop = SolverLoop(plane, settings, ident, lambda: solver, on_result, log=log)
        asyncio.run(loop.run())


if __name__ == "__main__":
    main()
