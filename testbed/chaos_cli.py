"""``qpmesh testbed chaos``'s arguments and handler (registered in `testbed.cli`'s table)."""

from __future__ import annotations

import argparse
import json
import secrets
from pathlib import Path
from typing import Any

from contract.interrupt import EXIT_INTERRUPTED
from testbed.chaos import DEFAULT_FAULTS, STARVE_S, STARVE_SHARE

HELP = (
    "run a scenario while qpmesh's own parts fail: the controller, the broker, a prober, the "
    "API process, VictoriaMetrics and a recovery agent killed and restarted, the controller "
    "and a prober starved of CPU, at seeded times -> JSON report (docs/reliability.md)"
)


def chaos_args(p: argparse.ArgumentParser) -> None:
    """Add the arguments of ``qpmesh testbed chaos``."""
    p.add_argument("scenario", help="scenario TOML; its faults repeat every scenario duration")
    p.add_argument("--seed", type=int, required=True, help="seed of the component faults' times")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument(
        "--prefix", default=None, help="testbed name prefix (default: a fresh random one)"
    )
    p.add_argument("--out", help="keep logs and report.json here (default /var/tmp/qpmesh/PREFIX)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="run length in s (default: the shortest that fits the component faults)",
    )
    p.add_argument(
        "--faults",
        default=",".join(DEFAULT_FAULTS),
        help="component faults, comma separated: kill:controller|broker|prober|api|tsdb|agent, "
        "starve:controller|prober (default: all of them)",
    )
    p.add_argument(
        "--starve-s", type=float, default=STARVE_S, help="seconds a part is starved (default 20)"
    )
    p.add_argument(
        "--starve-share",
        type=float,
        default=STARVE_SHARE,
        help="share of one CPU a starved part gets (default %(default)s)",
    )


def chaos(a: argparse.Namespace) -> int:
    """Run ``qpmesh testbed chaos``; return the exit code (130 when interrupted)."""
    from testbed.chaosrun import run_chaos
    from testbed.scenario import load_scenario

    sc = load_scenario(a.scenario)
    prefix = a.prefix or ("c" + secrets.token_hex(3) + "-")
    report: dict[str, Any] = run_chaos(
        sc, prefix, seed=a.seed, duration_s=a.duration,
        components=[x for x in a.faults.split(",") if x], starve_s=a.starve_s,
        share=a.starve_share, out_dir=Path(a.out) if a.out else None, progress=_progress,
    )  # fmt: skip
    if a.json:
        print(json.dumps(report))
    else:
        q = report.get("estimators", {}).get("qpmesh", {})
        print(f"scenario {report['scenario']} seed {a.seed}: lost records "
              f"{report.get('lost_records')} (spool bound {report.get('spool_bound', {}).get('batches')} "
              f"batches), duplicate actions {report.get('duplicate_actions')}, lost actions "
              f"{report.get('lost_actions')}, self-inflicted findings "
              f"{report.get('self_inflicted_findings')}, P {q.get('precision')} R {q.get('recall')}")  # fmt: skip
        for r in report.get("component_faults", []):
            print(f"  {r['fault']:28s} at {r['applied_t_s']:7.2f} s: recovered in "
                  f"{r['recover_s']} s ({r['recovery']})")  # fmt: skip
    return EXIT_INTERRUPTED if report["interrupted"] else 0


def _progress(msg: str) -> None:
    import sys

    print(f"testbed: {msg}", file=sys.stderr, flush=True)
