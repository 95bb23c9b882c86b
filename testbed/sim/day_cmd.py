"""``qpmesh sim day``: the shell of `testbed.sim.day` (options, resident memory and CPU time
read from the process, progress on stderr, the report on stdout)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from testbed.sim.day import DayPlan, run_day
from testbed.sim.options import add_model_options, model_from_args, nics_fabric, positive


def rss_bytes() -> int:
    """Return this process's resident memory now (bytes, from /proc/self/statm); raises
    OSError where there is no /proc."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
    return v


def _progress(row: Mapping[str, object]) -> None:
    print(
        f"hour {row['hour']}: {row['sim_s']} simulated s, RSS {row['rss_mib']} MiB, "
        f"CPU {row['cpu_s']} s",
        file=sys.stderr,
        flush=True,
    )


def _day(args: argparse.Namespace) -> int:
    if args.nics < 2:
        raise ValueError(f"--nics must be >= 2, got {args.nics}")
    plan = DayPlan(
        hours=args.hours,
        hour_s=args.hour_s,
        faults=args.faults,
        restarts=args.restarts,
        seed=args.seed,
        load=args.load,
        step_s=args.step,
        pipeline=args.pipeline,
    )
    fabric = nics_fabric(args.nics)  # the fabric of `sim localize --nics`
    wall = time.perf_counter()
    out = run_day(
        fabric,
        plan,
        rss=rss_bytes,
        cpu=time.process_time,
        progress=None if args.quiet else _progress,
        model=model_from_args(args),
    )
    report: dict[str, object] = {
        "nics": len(fabric.nics),
        "hours_simulated": args.hours,
        "hour_s": args.hour_s,
        "seed": args.seed,
        "step_s": args.step,
        "pipeline": args.pipeline,
        **out,
        "wall_s": round(time.perf_counter() - wall, 1),
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _show(report)
    return 0


def _show(r: Mapping[str, Any]) -> None:
    print(
        f"{r['nics']} NICs, {r['hours_simulated']} x {r['hour_s']} s: faults found "
        f"{r['found']}/{r['n_faults']}, prober restarts seen as prober_down "
        f"{r['restarts_found']}/{r['n_restarts']} ({r['restart_link_findings']} link findings), "
        f"false alerts {r['false_alerts']}, RSS growth after hour 1 "
        f"{r['rss_growth_after_hour1_pct']} %, {r['cpu_s_per_sim_s']} CPU-s per simulated s"
    )


def register_day(ssub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh sim day``."""
    p = ssub.add_parser(
        "day",
        help="a simulated day: background, prober restarts and random faults, memory per hour",
        description="Simulate hours of a fabric with the realistic background, prober "
        "restarts and random faults spread over them through the controller's detection; "
        "sample resident memory each simulated hour; score every fault and false alert.",
    )
    p.add_argument("--hours", type=positive, default=24.0, help="simulated hours (default 24)")
    p.add_argument(
        "--hour-s",
        type=positive,
        default=3600.0,
        help="seconds in a simulated hour (default 3600; less for short checks)",
    )
    p.add_argument("--nics", type=int, default=1024, help="NICs (default 1024)")
    p.add_argument("--faults", type=_count, default=30, help="random faults (default 30)")
    p.add_argument(
        "--restarts",
        type=_count,
        default=None,
        help="prober restarts, 20-60 s silent each (default one per 3,600 simulated s)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    p.add_argument("--load", type=float, default=0.4, help="background load (default 0.4)")
    p.add_argument("--step", type=positive, default=0.1, help="detection window, s (default 0.1)")
    p.add_argument(
        "--pipeline",
        choices=("ingest", "wire", "truth-clocks"),
        default="ingest",
        help="ingest: the controller's ingest + clock sync, a step's probes admitted at "
        "once (default); wire: the same controller fed as the service is (one encoded batch "
        "per host at its phase, admitted as bytes, coalesced, flushed before each tick); "
        "truth-clocks: the simulator's true clock offsets",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_model_options(p)
    p.set_defaults(func=_day)
