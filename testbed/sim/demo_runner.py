"""The simulator-to-controller loop of the embedded demo (`DemoRunner`), pure of any screen.

`DemoRunner` steps the simulator in simulated time and feeds the live controller (batches,
prober presence, GPU health, ticks); its ``controller`` is the `SnapshotSource` the TUI reads.
Findings go through the product's remediation policy (`remediation`, Control off by default,
switched by the TUI's ``c``) for a demo training job (`demo_job`), so the header shows
Control and the running job and the events show what was (or would have been) done.
`inject(kind)` adds a link flap, an ECMP contention or a NIC failure at the current simulated
time and `clear()` removes them, so the TUI's keys can drive it (it satisfies
`tui.demo_app.DemoDriver`). `run_headless` plays a scenario as fast as possible (or in real
time) and returns the events as JSON-ready values, also when stopped early (``interrupted``).
Everything the demo stamps (events, the Control audit, remediation actions, time-series
points) is on one clock, `DemoRunner.now_ns`; `demo_timeseries` maps it onto the wall clock
for the time series, which is why a demo that writes them runs in real time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.documents import EventDoc
from controller.jobs import Job, JobRegistry
from controller.live import LiveConfig, LiveController, default_brain
from controller.remediation.runtime import RemediationRuntime, action_event
from controller.timeseries.recorder import TimeseriesRecorder
from controller.timeseries.writer import TsdbWriter
from mesh.fabric import Fabric, FabricShape
from testbed.scenario import Fault, FaultKind, Scenario, load_scenario
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelKnobs

DEMO_SCENARIO = Path(__file__).parents[1] / "scenarios" / "demo.toml"
INJECT_KEYS = ("flap", "contention", "nic_down")


DEMO_JOB = "demo-train"


class DemoError(ValueError):
    """Bad demo options (scenario, size, step)."""


def demo_job(fabric: Fabric) -> Job:
    """Return the demo's training job: one rank per host under the last two leaves (all of
    the host's NICs), tenant ``demo``; the demo's scripted contention and NIC failure touch
    it, so its remediation shows in the events."""
    last_two = {lf.id for lf in fabric.leaves[-2:]}
    ranks: dict[str, list[str]] = {}
    for n in fabric.nics:
        if n.leaf in last_two:
            ranks.setdefault(n.host, []).append(n.id)
    return Job(DEMO_JOB, "demo", tuple(tuple(r) for r in ranks.values()))


class DemoRunner:
    """Simulator and controller in one process, advanced by `step` in simulated time."""

    def __init__(
        self, scenario: Scenario, *, step_s: float = 0.5, model: ModelKnobs | None = None
    ) -> None:
        """``model``: the simulator's fabric model (default: the ideal one, which the demo's
        scripted faults were written for; `qpmesh sim run` passes the realistic default)."""
        if step_s <= 0:
            raise DemoError("step must be > 0")
        self.scenario = scenario
        self.fabric = scenario.fabric()
        n = len(self.fabric.nics)
        cfg = SimConfig(
            load=scenario.load,
            timestamps=scenario.timestamps,
            seed=scenario.seed,
            peers=min(16, max(1, n - len(self.fabric.groups[self.fabric.nics[0].group]))),
            model=ModelKnobs.ideal_model() if model is None else model,
        )
        self.sim = Simulator(self.fabric, cfg, faults=scenario.faults)
        # each step is delivered complete: judge it at its own tick (no lateness allowance)
        self.controller = LiveController(
            self.fabric,
            LiveConfig(window_ns=round(step_s * 1e9)),  # a detection window per step
            brain=default_brain(self.fabric, {"lateness_ns": 0}),
        )
        # the product's remediation policy (defaults: Control off, actions "would have");
        # the demo has no broker, so sent actions reach no job: the events say what went out
        self.remediation = RemediationRuntime(jobs=JobRegistry((demo_job(self.fabric),)))
        # the API's thread hands Alertmanager webhooks to the remediation the steps tick
        self._lock = threading.Lock()
        self.controller.attach_remediation(
            self.remediation.control, self.remediation.jobs, "demo operator"
        )
        self.step_s = step_s
        self.t_s = 0.0
        self.events: list[EventDoc] = []
        self._alive: set[str] = set()
        self._gpu_bad: frozenset[str] = frozenset()
        self.timeseries: TimeseriesRecorder | None = None
        # called after every step with its new events (the demo's API publishes from here)
        self.on_step: list[Callable[[list[EventDoc]], None]] = []
        now = self.now_ns
        for h in self.fabric.hosts:
            self.controller.gpu(h.id, True, "", now)

    @property
    def nic_count(self) -> int:
        """Return the number of NICs of the demo fabric."""
        return len(self.fabric.nics)

    @property
    def now_ns(self) -> int:
        """Controller time: the simulator's NIC-clock epoch plus simulated time."""
        return EPOCH_NS + round(self.t_s * 1e9)

    def step(self) -> list[EventDoc]:
        """Advance one step: simulate, ingest, report presence and GPU changes, tick.

        Returns the controller's new events.
        """
        st = self.sim.step(self.t_s, self.step_s)
        self.t_s = st.t1_s
        now = self.now_ns
        ctl = self.controller
        ctl.admit(st.batch, now)
        for host in st.alive_hosts:
            ctl.presence(host, True, now)
        for host in self._alive - st.alive_hosts:  # a prober's last will
            ctl.presence(host, False, now)
        self._alive = set(st.alive_hosts)
        for host in st.gpu_faults - self._gpu_bad:
            ctl.gpu(host, False, "Xid 79 (simulated)", now)
        for host in self._gpu_bad - st.gpu_faults:
            ctl.gpu(host, True, "", now)
        self._gpu_bad = st.gpu_faults
        new = ctl.tick(now)
        with self._lock:
            self.remediation.observe(new)
            _sent, docs = self.remediation.tick(now)
        if self.timeseries is not None:  # the Remediation annotation's series
            for d in docs:
                self.timeseries.action({**d, "status": str(d["status"]).replace(" ", "_")})
        acted = [action_event(d) for d in docs]
        ctl.record_events(acted)
        new += acted
        self.events.extend(new)
        if self.timeseries is not None:
            self.timeseries.tick(now, ctl.snapshot, ctl.alive)
        for hook in self.on_step:
            hook(new)
        return new

    def ask(self, payload: object, now_ns: int) -> Mapping[str, object]:
        """Hand an Alertmanager webhook to the demo's remediation (any thread; its actions
        come with the next step). Raises `controller.remediation.alerts.WebhookError`."""
        with self._lock:
            return self.remediation.ask(payload, now_ns)

    def record_to(self, recorder: TimeseriesRecorder) -> None:
        """Write time series through ``recorder`` from now on (its intervals in sim time)."""
        self.controller.brain = recorder.tee(self.controller.brain)
        self.timeseries = recorder

    def fault_for(self, kind: str, duration_s: float = 30.0) -> Fault:
        """Return the fault the demo key ``kind`` (flap, contention, nic_down) injects now."""
        f = self.fabric
        leaves = len(f.leaves)
        spines = [s for s in f.switches if s.id.startswith("spine")]
        start = self.t_s
        if kind == "flap":
            link = f"leaf{1 % leaves}-{spines[-1].id}"
            return Fault(FaultKind.FLAP, link, start, duration_s, down_s=1.0, up_s=2.0)
        if kind == "contention":
            link = f"leaf{2 % leaves}-{spines[1 % len(spines)].id}"
            return Fault(FaultKind.CONGEST, link, start, duration_s, magnitude=20.0)
        if kind == "nic_down":
            return Fault(FaultKind.NIC_DOWN, f.nics[-5 % len(f.nics)].id, start, duration_s)
        raise DemoError(f"unknown demo fault {kind!r}: one of {', '.join(INJECT_KEYS)}")

    def inject(self, kind: str) -> Fault:
        """Inject a fault of demo kind ``kind`` starting now; return it."""
        fault = self.fault_for(kind)
        self.sim.add_fault(fault)
        return fault

    def clear(self) -> None:
        """End every fault now (scripted and injected)."""
        self.sim.clear_faults(until_s=self.t_s)


def demo_scenario(path: str | None, *, nics: int | None, seed: int | None) -> Scenario:
    """Return the scenario from ``path`` (default: the demo's), rescaled to ``nics`` NICs.

    Rescaling keeps faults whose targets still exist. Raises `ScenarioError`/`DemoError`.
    """
    sc = load_scenario(path or DEMO_SCENARIO)
    if nics is not None:
        if nics < 2:
            raise DemoError("--nics must be >= 2")
        shape = FabricShape.for_nics(nics, nics_per_leaf=min(8 if nics <= 64 else 32, nics))
        shape = replace(shape, spines=max(shape.spines, min(4, sc.shape.spines)))
        fab = Scenario(sc.name, shape).fabric()
        keep = tuple(
            fl
            for fl in sc.faults
            if fl.target in fab.link_index
            or fl.target in fab.nic_index
            or fl.target in {h.id for h in fab.hosts}
        )
        sc = replace(sc, shape=shape, faults=keep)
    if seed is not None:
        sc = replace(sc, seed=seed)
    return sc


def pace(sim_s: float, wall_elapsed_s: float) -> float:
    """Return seconds to sleep so that ``sim_s`` simulated seconds take as long on the wall."""
    return max(0.0, sim_s - wall_elapsed_s)


def run_headless(
    runner: DemoRunner,
    duration_s: float,
    *,
    realtime: bool = False,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Step ``runner`` for ``duration_s`` simulated seconds (as fast as possible, or with
    ``realtime`` one simulated second per wall second), or until ``stop`` is set; return
    events and a summary (``interrupted``: stopped early)."""
    stop = stop or threading.Event()
    t_wall = time.perf_counter()
    while runner.t_s < duration_s - 1e-9 and not stop.is_set():
        runner.step()
        if realtime:
            stop.wait(pace(runner.t_s, time.perf_counter() - t_wall))
    snap = runner.controller.snapshot()
    return {
        "scenario": runner.scenario.name,
        "nics": len(runner.fabric.nics),
        "duration_s": round(runner.t_s, 3),
        "wall_s": round(time.perf_counter() - t_wall, 3),
        "faults": [f.to_dict() for f in runner.sim.faults],
        "events": [
            {
                "kind": e.kind,
                "target": e.target,
                "t_s": round((e.t_ns - EPOCH_NS) / 1e9, 3),
                "severity": e.severity,
                "detail": e.detail,
            }
            for e in runner.events
        ],
        "healthy_nics": snap.healthy_count,
        "unknown_nics": snap.unknown_count,
        "unhealthy_nics": snap.unhealthy_count,
        "flap_counts": dict(snap.flap_counts),
        "interrupted": stop.is_set(),
    }


def demo_timeseries(runner: DemoRunner, url: str | None) -> TsdbWriter | None:
    """With ``url``, write the demo's time series there (1 s intervals of simulated time,
    stamped from the wall clock at the start: run the demo in real time, or its points lie
    in the future); return the writer to close, else None."""
    if not url:
        return None
    writer = TsdbWriter(url)
    shift = time.time_ns() - runner.now_ns
    runner.record_to(
        TimeseriesRecorder(runner.fabric, writer.offer, interval_ns=1_000_000_000, shift_ns=shift)
    )
    return writer
