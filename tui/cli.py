"""``qpmesh tui`` (the live mesh grid), ``qpmesh tui bench`` and ``qpmesh demo``."""

from __future__ import annotations

import argparse
import json
from typing import Any


class TuiError(ValueError):
    """Bad ``qpmesh tui`` / ``qpmesh demo`` arguments."""


def register(subparsers: Any) -> None:
    """Add the ``tui`` and ``demo`` subcommands to the root parser."""
    p = subparsers.add_parser(
        "tui",
        help="live mesh grid (use --fake for a seeded example, or 'qpmesh demo')",
        description="The live mesh grid. Keys: arrows/hjkl move, Enter/click select, / filter, "
        "m mode, a inbound/outbound, w window, c Control, q quit.",
    )
    p.add_argument("--fake", action="store_true", help="show a seeded example fabric")
    p.add_argument("--nics", type=int, default=32, help="NICs of the --fake fabric (default 32)")
    p.add_argument("--seed", type=int, default=1, help="seed of the --fake source")
    p.add_argument(
        "--threshold-us",
        type=float,
        default=5.0,
        help="probe delay threshold in µs (default %(default)s)",
    )
    p.add_argument("--interval", type=float, default=0.5, help="refresh period s (default 0.5)")
    p.set_defaults(func=_tui)
    tsub = p.add_subparsers(dest="tui_command", metavar="SUBCOMMAND")
    b = tsub.add_parser("bench", help="frame render time for a large grid vs a small one")
    b.add_argument("--nics", type=int, default=1024, help="NICs (default %(default)s)")
    b.add_argument("--baseline-nics", type=int, default=64, help="baseline NICs (default 64)")
    b.add_argument("--frames", type=int, default=40, help="frames to time (default 40)")
    b.add_argument("--width", type=int, default=160, help="grid width in columns (default 160)")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=_bench)

    d = subparsers.add_parser(
        "demo",
        help="simulator + controller in-process with the mesh grid on top",
        description="Runs the simulator and the controller core in-process (no broker, no "
        "database). Keys: f link flap, e ECMP contention, n NIC failure, x clear faults, plus "
        "the tui keys. --headless plays the scripted scenario in simulated time.",
    )
    d.add_argument("--headless", action="store_true", help="no screen; play the scenario")
    d.add_argument("--duration", type=float, default=None, help="simulated seconds (headless)")
    d.add_argument("--json", action="store_true", help="print the result as JSON (headless)")
    d.add_argument("--scenario", default=None, help="scenario TOML (default: the demo's)")
    d.add_argument("--nics", type=int, default=None, help="scale the fabric to N NICs")
    d.add_argument("--seed", type=int, default=None, help="simulator seed")
    d.add_argument("--step", type=float, default=0.5, help="simulated seconds per tick")
    d.add_argument("--threshold-us", type=float, default=5.0, help="delay threshold µs")
    d.add_argument(
        "--timeseries",
        metavar="URL",
        help="also write the time series to this InfluxDB v2 write API "
        "(InfluxDB 2 or VictoriaMetrics, e.g. http://127.0.0.1:8428), 1 s intervals",
    )
    d.set_defaults(func=_demo)


def _tui(args: argparse.Namespace) -> int:
    from controller.fabric import FabricShape, build_fabric
    from tui.app import MeshApp
    from tui.fake import FakeSource

    if not args.fake:
        raise TuiError(
            "no remote controller connection yet: use 'qpmesh tui --fake' or 'qpmesh demo'"
        )
    fabric = build_fabric(
        FabricShape.for_nics(args.nics, nics_per_leaf=8 if args.nics <= 64 else 32)
    )
    source = FakeSource(fabric, seed=args.seed)
    MeshApp(
        source,
        interval_s=args.interval,
        threshold_ns=args.threshold_us * 1e3,
        on_tick=lambda: source.advance(args.interval),
    ).run()
    return 0


def _bench(args: argparse.Namespace) -> int:
    from tui.bench import bench

    result = bench(args.nics, args.baseline_nics, frames=args.frames, width=args.width)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from testbed.demo import run_demo

    return run_demo(args)
