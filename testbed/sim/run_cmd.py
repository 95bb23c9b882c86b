"""``qpmesh sim run SCENARIO``: replay a scenario file on the simulator at any scale.

The same scenario TOML that ``qpmesh testbed run`` plays on the namespace fabric runs here on
the vectorized simulator with the in-process controller (`testbed.sim.demo_runner.DemoRunner`): faults on
schedule, the controller's events with their simulated times, and for every fault whether an
event named its target while it was active.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import replace
from typing import Any

from contract.interrupt import interruptible
from testbed.scenario import Fault, FaultKind, load_scenario, random_faults
from testbed.sim.demo_runner import DemoRunner, run_headless
from testbed.sim.model import ModelKnobs
from testbed.sim.options import add_model_options, model_from_args


def _targets(fault: Fault, runner: DemoRunner) -> set[str]:
    """Ids an event may name to count as finding ``fault``."""
    f = runner.fabric
    if fault.kind == FaultKind.NIC_DOWN:
        nic = f.nic(fault.target)
        return {nic.id, f"{nic.id}-{nic.leaf}", nic.host}
    if fault.kind in (FaultKind.PROBER_DOWN, FaultKind.GPU_FAULT):
        return {fault.target}
    lk = f.link(fault.target)
    return {lk.id, f"{lk.lower}->{lk.upper}", f"{lk.upper}->{lk.lower}"}


def run_scenario(
    path: str,
    *,
    duration_s: float | None = None,
    step_s: float = 0.5,
    random_k: int | None = None,
    seed: int | None = None,
    model: ModelKnobs | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Play the scenario at ``path`` and return the report (events, per-fault found/latency).

    ``model``: the simulator's fabric model (default: the realistic `ModelKnobs()`).
    ``stop``: set, it ends the run after the current step (``"interrupted": true``).

    Raises `ScenarioError` on a bad file, OSError if unreadable.
    """
    sc = load_scenario(path)
    if seed is not None:
        sc = replace(sc, seed=seed)
    if random_k is not None:
        sc = replace(
            sc,
            faults=random_faults(
                sc.fabric(), random_k, seed=sc.seed, duration_s=duration_s or sc.duration_s
            ),
        )
    knobs = ModelKnobs() if model is None else model
    runner = DemoRunner(sc, step_s=step_s, model=knobs)
    report = run_headless(runner, duration_s or sc.duration_s, stop=stop)
    report["model"] = knobs.to_dict()
    faults = []
    for fault in sc.faults:
        names = _targets(fault, runner)
        hits = [
            e["t_s"]
            for e in report["events"]
            if e["target"] in names
            and e["kind"] != "clear"
            and fault.start_s <= e["t_s"] <= fault.end_s + step_s
        ]
        faults.append(
            {
                "kind": str(fault.kind),
                "target": fault.target,
                "start_s": round(fault.start_s, 3),
                "found": bool(hits),
                "detected_s": min(hits) if hits else None,
                "latency_s": round(min(hits) - fault.start_s, 3) if hits else None,
            }
        )
    fault_names = set().union(*(_targets(f, runner) for f in sc.faults)) if sc.faults else set()
    report["fault_results"] = faults
    report["false_alerts"] = sum(
        1 for e in report["events"] if e["kind"] != "clear" and e["target"] not in fault_names
    )
    return report


def _cmd(args: argparse.Namespace) -> int:
    with interruptible(cooperative=True) as stop:  # a signal ends the run between two steps
        rep = run_scenario(
            args.scenario,
            duration_s=args.duration,
            step_s=args.step,
            random_k=args.random_faults,
            seed=args.seed,
            model=model_from_args(args),
            stop=stop.event,
        )
    if args.json:
        print(json.dumps(rep))
        return stop.exit_code()
    print(
        f"scenario {rep['scenario']}: {rep['nics']} NICs, {rep['duration_s']} s simulated in {rep['wall_s']} s"
    )
    for e in rep["events"]:
        print(f"  {e['t_s']:8.2f}s  {e['kind']:<12} {e['target']:<16} {e['detail']}")
    for f in rep["fault_results"]:
        status = f"found after {f['latency_s']} s" if f["found"] else "NOT found"
        print(f"  fault {f['kind']} on {f['target']} at {f['start_s']} s: {status}")
    print(f"  false alerts: {rep['false_alerts']}", file=sys.stdout)
    return stop.exit_code()


def register_run(ssub: Any) -> None:
    """Register ``qpmesh sim run``."""
    p = ssub.add_parser(
        "run",
        help="replay a scenario file on the simulator with the in-process controller",
        description="Play a scenario (see docs/scenarios.md) on the simulator and report what the controller found.",
    )
    p.add_argument("scenario", help="scenario TOML file (e.g. testbed/scenarios/demo.toml)")
    p.add_argument(
        "--duration", type=float, default=None, help="simulated seconds (default: the scenario's)"
    )
    p.add_argument(
        "--step", type=float, default=0.5, help="simulation step in seconds (default %(default)s)"
    )
    p.add_argument(
        "--random-faults",
        type=int,
        default=None,
        metavar="K",
        help="draw K faults instead of the file's",
    )
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_model_options(p)
    p.set_defaults(func=_cmd)
