"""``qpmesh demo``: the simulator and the controller core in-process, the mesh grid on top.

Registered by the composition root (`qpmesh.cli`) right after ``qpmesh tui``; the command
itself is `testbed.demo.run_demo`.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand to the root parser."""
    d = sub.add_parser(
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
        "(InfluxDB 2 or VictoriaMetrics, e.g. http://127.0.0.1:8428), 1 s intervals; with "
        "--headless the demo then runs in real time (its points are stamped on the wall clock)",
    )
    d.add_argument(
        "--serve",
        metavar="HOST:PORT",
        help="also serve the HTTP API and websocket (/api/v1/, docs/api.md) on this address "
        "while the demo runs; with --headless the demo then runs in real time",
    )
    d.add_argument(
        "--token",
        help="the API's operator bearer token with --serve (default: a random one, printed "
        "on stderr at start)",
    )
    d.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from testbed.demo import run_demo

    return run_demo(args)
