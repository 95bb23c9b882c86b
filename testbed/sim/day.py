"""``qpmesh sim day``: a simulated day (issue 32 item 3), pure parts.

A day is ``hours`` simulated hours of ``hour_s`` seconds on one fabric with the simulator's
model (the realistic background by default: utilisation over time with hot spots and incasts,
background loss and bursts, clock wander and steps, ECMP the controller does not know),
``faults`` random faults spread over it (`day_faults`: one in each equal slot of the day, a
random start inside it) and ``restarts`` prober restarts (`prober_restarts`: a host's prober
silent for tens of seconds, then back, at random times from the seed, clear of the faults).
Every step goes through `testbed.sim.localize_bench.LocalizeRun` (by default the
controller's ingest, clock sync and detection: `LiveController`), the same as
``sim localize``. At the end of each simulated hour the caller's ``rss`` and ``cpu``
functions are sampled; the scoring is ``sim localize``'s (`Scorer`), bucketed by hour.

A prober restart is scored as a ``prober_down`` fault on its host (found when the controller
raises ``prober_down`` for it); any other finding on that host's NICs or NIC links while it
is silent (to ``GRACE_S`` after) is a ``restart_link_findings`` (and a false alert).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mesh.fabric import Fabric
from testbed.scenario import Fault, FaultKind
from testbed.sim.localize_bench import LocalizeRun
from testbed.sim.localize_score import GRACE_S, Alert, normalize
from testbed.sim.model import ModelKnobs

WARMUP_S = 5.0  # nothing starts before (the controller's blind start, as `random_faults`)
FAULT_S = (10.0, 15.0)  # a random fault lasts this long (as `random_faults`)
RESTART_S = (20.0, 60.0)  # a prober is silent this long
GAP_S = 2.0 + GRACE_S  # kept free between a restart and any other fault
_COUNTS = ("faults", "found", "restarts", "restarts_found", "false_alerts")
KINDS = (FaultKind.FLAP, FaultKind.CONGEST, FaultKind.LOSS, FaultKind.NIC_DOWN)


class DayError(ValueError):
    """A day that cannot be laid out (too short for its faults and restarts)."""


@dataclass(frozen=True, slots=True)
class DayPlan:
    """What a day is: its length, events, seed and detection window."""

    hours: float = 24.0
    hour_s: float = 3600.0
    faults: int = 30
    restarts: int | None = None  # None: one per started 3,600 simulated seconds
    seed: int = 1
    load: float = 0.4
    step_s: float = 0.1
    pipeline: str = "ingest"
    congest_us: float = 20.0
    loss_percent: float = 20.0
    flap_down_s: float = 1.0

    def __post_init__(self) -> None:
        if not (self.hours > 0 and self.hour_s > 0 and self.step_s > 0):
            raise DayError("hours, hour_s and step_s must be > 0")
        if self.faults < 0 or (self.restarts is not None and self.restarts < 0):
            raise DayError("faults and restarts must be >= 0")
        if self.total_s <= WARMUP_S + FAULT_S[1]:
            raise DayError(f"a day of {self.total_s:g} s is too short (> {WARMUP_S + 15:g} s)")

    @property
    def total_s(self) -> float:
        """The day's length in simulated seconds."""
        return self.hours * self.hour_s

    @property
    def n_restarts(self) -> int:
        """Prober restarts in the day (``restarts``, or one per started 3,600 s)."""
        return math.ceil(self.total_s / 3600 - 1e-9) if self.restarts is None else self.restarts


def day_faults(fabric: Fabric, plan: DayPlan) -> tuple[Fault, ...]:
    """Return ``plan.faults`` random faults of `KINDS` spread over the day: fault i starts at
    a random time in the i-th of as many equal slots after `WARMUP_S` and lasts 10-15 s;
    link faults on fabric (leaf-spine) links, ``nic_down`` on NICs, targets drawn without
    repeats until a pool is used up. Raises `DayError` when a slot is shorter than 20 s."""
    k = plan.faults
    if not k:
        return ()
    slot = (plan.total_s - WARMUP_S) / k
    if slot < 20.0:
        raise DayError(f"{k} faults in {plan.total_s:g} s: each needs a slot of 20 s")
    rng = np.random.default_rng([plan.seed, 32, 3])
    links = [lk.id for lk in fabric.links if not lk.lower.startswith("nic")]
    nics = [n.id for n in fabric.nics]
    pools: dict[bool, list[str]] = {True: [], False: []}
    out: list[Fault] = []
    for i in range(k):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        dur = float(rng.uniform(*FAULT_S))
        start = WARMUP_S + i * slot + float(rng.uniform(0.0, max(slot - dur - GAP_S, 0.0)))
        on_nic = kind == FaultKind.NIC_DOWN
        if not pools[on_nic]:
            pools[on_nic] = [str(x) for x in rng.permutation(nics if on_nic else links)]
        target = pools[on_nic].pop()
        if kind == FaultKind.FLAP:
            out.append(Fault(kind, target, start, dur, down_s=plan.flap_down_s, up_s=2.0))
        elif kind == FaultKind.CONGEST:
            out.append(Fault(kind, target, start, dur, magnitude=plan.congest_us))
        elif kind == FaultKind.LOSS:
            out.append(Fault(kind, target, start, dur, magnitude=plan.loss_percent))
        else:
            out.append(Fault(kind, target, start, dur))
    return tuple(out)


def prober_restarts(fabric: Fabric, plan: DayPlan, busy: Sequence[Fault] = ()) -> tuple[Fault, ...]:
    """Return ``plan.n_restarts`` prober restarts (``prober_down`` faults of 20-60 s on
    random hosts at random times from the seed), each clear of the faults in ``busy`` and of
    one another by `GAP_S`. Raises `DayError` when the day has no room for them."""
    rng = np.random.default_rng([plan.seed, 32, 4])
    hosts = [h.id for h in fabric.hosts]
    spans = [(f.start_s, f.end_s) for f in busy]
    out: list[Fault] = []
    for _ in range(plan.n_restarts):
        dur = float(rng.uniform(*RESTART_S))
        hi = plan.total_s - dur - GAP_S
        for _try in range(200):
            start = float(rng.uniform(WARMUP_S, max(hi, WARMUP_S)))
            if start <= hi and all(
                start + dur + GAP_S <= a or b + GAP_S <= start for a, b in spans
            ):
                break
        else:
            raise DayError(f"no room in {plan.total_s:g} s for {plan.n_restarts} prober restarts")
        host = hosts[int(rng.integers(len(hosts)))]
        out.append(Fault(FaultKind.PROBER_DOWN, host, start, dur))
        spans.append((start, start + dur))
    return tuple(sorted(out, key=lambda f: f.start_s))


def _hour(t_s: float, plan: DayPlan) -> int:
    return min(int(t_s // plan.hour_s), math.ceil(plan.hours - 1e-9) - 1)


def run_day(
    fabric: Fabric,
    plan: DayPlan,
    *,
    rss: Callable[[], int],
    cpu: Callable[[], float],
    progress: Callable[[dict[str, object]], None] | None = None,
    model: ModelKnobs | None = None,
) -> dict[str, object]:
    """Run the day; return its report: per hour (``hours``) the simulated seconds reached,
    resident memory (MiB, from ``rss()`` bytes), CPU seconds (``cpu()``), faults and restarts
    that started in it and how many were found, false alerts raised in it; overall the RSS
    growth after hour 1 (%, None with one hour), recall over the faults, restarts found,
    findings on a restarted host's links, false alerts (the first 20 listed) and whether
    each of issue 32's bars is met. ``progress`` gets each hour's row as it ends. Raises
    `DayError` when the day cannot be laid out."""
    faults = day_faults(fabric, plan)
    restarts = prober_restarts(fabric, plan, faults)
    events = tuple(sorted((*faults, *restarts), key=lambda f: f.start_s))
    run = LocalizeRun(
        fabric,
        events,
        load=plan.load,
        seed=plan.seed,
        step_s=plan.step_s,
        pipeline=plan.pipeline,
        model=model,
        voting=False,
    )
    total, step = plan.total_s, plan.step_s
    n_steps = math.ceil(total / step - 1e-9)
    n_hours = math.ceil(plan.hours - 1e-9)
    cpu0 = cpu()
    rows: list[dict[str, object]] = []
    i = 0
    for h in range(n_hours):
        end = min(n_steps, math.ceil(min((h + 1) * plan.hour_s, total) / step - 1e-9))
        while i < end:
            t0 = i * step
            run.feed(run.sim.step(t0, min(step, total - t0)))
            i += 1
        row: dict[str, object] = {
            "hour": h + 1,
            "sim_s": round(min((h + 1) * plan.hour_s, total), 3),
            "rss_mib": round(rss() / 2**20, 1),
            "cpu_s": round(cpu() - cpu0, 2),
        }
        rows.append(row)
        if progress is not None:
            progress(row)
    s = run.scorer(total).evaluate(run.ours)
    found: list[bool] = s["_found"]  # type: ignore[assignment]
    false = s["_false"]
    assert isinstance(false, list)
    is_restart = [f.kind == FaultKind.PROBER_DOWN for f in events]
    counts = [dict.fromkeys(_COUNTS, 0) for _ in rows]
    for f, ok, rs in zip(events, found, is_restart, strict=True):
        c = counts[_hour(f.start_s, plan)]
        c["restarts" if rs else "faults"] += 1
        c["restarts_found" if rs else "found"] += ok
    for a in false:
        counts[_hour(a.t_s, plan)]["false_alerts"] += 1
    for row, c in zip(rows, counts, strict=True):
        row.update(c)
    n_found = sum(ok for ok, rs in zip(found, is_restart, strict=True) if not rs)
    r_found = sum(ok for ok, rs in zip(found, is_restart, strict=True) if rs)
    rss1 = float(rows[0]["rss_mib"])  # type: ignore[arg-type]
    growth = (
        round((max(float(r["rss_mib"]) for r in rows[1:]) - rss1) / rss1 * 100, 2)  # type: ignore[arg-type]
        if len(rows) > 1
        else None
    )
    cpu_s = float(rows[-1]["cpu_s"])  # type: ignore[arg-type]
    on_restart = _restart_findings(fabric, restarts, run.ours)
    recall = round(n_found / len(faults), 4) if faults else 1.0
    return {
        "hours": rows,
        "faults": [
            {
                "kind": str(f.kind),
                "target": f.target,
                "start_s": round(f.start_s, 3),
                "end_s": round(f.end_s, 3),
                "found": ok,
            }
            for f, ok in zip(events, found, strict=True)
        ],
        "n_faults": len(faults),
        "found": n_found,
        "recall": recall,
        "n_restarts": len(restarts),
        "restarts_found": r_found,
        "restart_link_findings": len(on_restart),
        "false_alerts": len(false),
        "false": [{"t_s": round(a.t_s, 3), "target": a.target, "kind": a.kind} for a in false[:20]],
        "rss_growth_after_hour1_pct": growth,
        "probes": run.n_probes,
        "cpu_s": cpu_s,
        "cpu_s_per_sim_s": round(cpu_s / total, 3),
        "met": {
            "memory": growth is not None and growth < 5.0,
            "every_fault_found": n_found == len(faults),
            "no_false_alerts": not false,
            "restarts_prober_down_only": r_found == len(restarts) and not on_restart,
        },
    }


def _restart_findings(
    fabric: Fabric, restarts: Sequence[Fault], alerts: Sequence[Alert]
) -> list[Alert]:
    """The alerts other than ``prober_down`` raised on a restarted host's NICs or NIC links
    while its prober was silent (to ``GRACE_S`` after)."""
    out = []
    for f in restarts:
        nics = [n for n in fabric.nics if n.host == f.target]
        names = {n.id for n in nics} | {
            fabric.links[int(fabric.nic_link[fabric.nic_index[n.id]])].id for n in nics
        }
        for a in alerts:
            if (
                a.kind != "prober_down"
                and f.start_s <= a.t_s <= f.end_s + GRACE_S
                and normalize(fabric, a.target) in names
            ):
                out.append(a)
    return out
