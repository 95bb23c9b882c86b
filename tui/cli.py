"""``qpmesh tui`` (the live mesh grid) and ``qpmesh tui bench``.

``qpmesh demo`` (the simulator under the grid) is the testbed's: `testbed.demo_cli`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


class TuiError(ValueError):
    """Bad ``qpmesh tui`` arguments."""


def register(subparsers: Any) -> None:
    """Add the ``tui`` subcommand (and ``tui bench``) to the root parser."""
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
