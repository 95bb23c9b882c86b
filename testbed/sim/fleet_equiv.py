"""The fleet's equivalence check (issue 29 item 4) as a function a command can run: the same
simulated input through one controller (`controller.live.LiveController`) and through ``n``
workers (`controller.fleet.worker.FleetWorker`, hosts split among them) and a solver
(`controller.fleet.solver.FleetSolver`), every partial and state crossing as bytes, joined in
lock-step as a shell joins them; the clock offsets must agree within ``tol_ns`` and the events
must be the same. ``tests/test_fleet_equivalence.py`` checks more (baselines, link health,
delay trust) on the same construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.documents import EventDoc
from contract.records import decode_batch
from controller.brain import Brain, BrainConfig
from controller.fleet.config import FleetConfig
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import Partial
from controller.fleet.solver import Added, FleetSolver
from controller.fleet.worker import FleetWorker
from controller.live import LiveConfig, LiveController
from mesh.fabric import Fabric, FabricShape, build_fabric
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

STEP_NS = 100_000_000


class _Fleet:
    """``n`` workers and a solver in lock-step: each host's batches to its worker, every
    closed window's partials (bytes) to the solver, each solve's clock state back."""

    def __init__(self, fabric: Fabric, n: int, config: FleetConfig) -> None:
        self.config = config
        self.owner = {h.id: i % n for i, h in enumerate(fabric.hosts)}
        self.workers = [FleetWorker(fabric, config, name=f"w{i}") for i in range(n)]
        self.solver = FleetSolver(fabric, config)
        self.events: list[EventDoc] = []
        self.refused = 0

    def admit(self, host: str, payload: bytes, now: int) -> None:
        self.workers[self.owner[host]].admit(host, payload, now)

    def tick(self, now: int) -> None:
        self.events += self.solver.pending()
        for w in self.workers:
            for part in w.close(now):
                if self.solver.add(Partial.decode(part.encode())) is not Added.TAKEN:
                    self.refused += 1
        top = self.config.grid.closed_before(now, self.config.lateness_ns) - 1
        nxt = self.solver.next_window
        if nxt is None:
            waiting = self.solver.pending_windows()
            nxt = waiting[0] if waiting else top + 1
        if top >= nxt:
            res = self.solver.solve(top, now)
            self.events += res.events
            for w in self.workers:
                w.install_clock(res.clock)


@dataclass(frozen=True)
class Equivalence:
    """The check's outcome: ``equivalent`` (offsets within ``tol_ns``, same events, the
    same clock solves, every partial taken), and what it compared."""

    equivalent: bool
    max_offset_diff_ns: float
    events: int
    same_events: bool
    clock_solves: int
    nics: int
    workers: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Return the figures as a JSON-ready dict."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def check(
    seconds: float = 6.0, workers: int = 3, seed: int = 1, tol_ns: float = 0.01
) -> Equivalence:
    """Run one controller and ``workers`` workers + a solver on a 32-NIC fabric with a flap,
    a loss and a congestion fault for ``seconds``; return the `Equivalence`."""
    fabric = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8, spines=2))
    faults = [
        Fault(FaultKind.FLAP, "leaf1-spine0", 2.0, 2.5, down_s=0.3, up_s=0.3),
        Fault(FaultKind.LOSS, "leaf2-spine1", 2.5, 2.5, magnitude=20.0),
        Fault(FaultKind.CONGEST, "leaf3-spine1", 2.0, 3.0, magnitude=20.0),
    ]
    sim = Simulator(fabric, SimConfig(seed=seed), faults)
    brain_cfg = BrainConfig(lateness_ns=0)
    # windows closed on the grid, as the NATS fleet closes them (no watermark wait)
    one = LiveController(
        fabric, LiveConfig(window_ns=STEP_NS, wait_ns=0), brain=Brain(fabric, brain_cfg)
    )
    fleet = _Fleet(fabric, workers, FleetConfig(grid=WindowGrid(STEP_NS), detection=brain_cfg))
    paths = sim.discovered_paths()
    one.learn_paths(*paths)
    for w in fleet.workers:
        w.learn_paths(*paths)
    for i, st in enumerate(sim.run(seconds, STEP_NS / 1e9)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        payloads, _ = host_batches(fabric, st.batch, i + 1)
        for p in payloads:
            host = decode_batch(p).origin
            one.admit(p, now, host=host)
            fleet.admit(host, p, now)
        one.tick(now)
        fleet.tick(now)
    off1, _ = one.clock.offsets(one.now_ns)
    off3, _ = fleet.solver.clock.offsets(one.now_ns)
    ok = np.isfinite(off1) & np.isfinite(off3)
    finite_alike = bool(np.array_equal(np.isfinite(off1), np.isfinite(off3)))
    diff = float(np.max(np.abs(off1[ok] - off3[ok]))) if ok.any() else float("inf")
    ev1 = [e.to_json() for e in one.events]
    ev3 = [e.to_json() for e in fleet.events]
    same = ev1 == ev3
    solves = fleet.solver.clock.solves
    equivalent = (finite_alike and diff <= tol_ns and same and one.solves == solves >= 1
                  and fleet.refused == 0)  # fmt: skip
    return Equivalence(equivalent, round(diff, 6), len(ev1), same, solves, len(fabric.nics),
                       workers, seconds)  # fmt: skip


__all__ = ["Equivalence", "check"]
