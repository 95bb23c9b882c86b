"""The ``qpmesh`` command: one entry point, one subcommand per component.

This is the composition root: the one module that imports every component (downward only;
nothing imports it back). Each component registers its own subcommands from its ``cli``
module (``register(subparsers)``), so this file only wires them together and turns bad input into a one-line error: exit code 2
for bad input (``ValueError`` family: bad config, unknown ids, malformed files), 1 for an
environment problem (``OSError`` family: missing device, permission, no namespace support).
Set ``QPMESH_DEBUG=1`` to see the full traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from types import ModuleType

import controller.service_cli
import prober.cli
import prober.doctor_cli
import qpmesh.heap
import qpmesh.keys
import sync.cli
import testbed.cli
import testbed.demo_cli
import testbed.sim.cli
import tui.cli

# Components that contribute subcommands, in --help order.
COMPONENTS: tuple[ModuleType, ...] = (
    prober.cli,
    prober.doctor_cli,
    controller.service_cli,
    tui.cli,
    testbed.demo_cli,
    testbed.cli,
    testbed.sim.cli,
    sync.cli,
    qpmesh.keys,
)


def build_parser() -> argparse.ArgumentParser:
    """Return the root argument parser with every component's subcommands registered."""
    parser = argparse.ArgumentParser(
        prog="qpmesh",
        description=(
            "Active probe-mesh monitor for RDMA fabrics: probe every NIC pair on every ECMP path, "
            "sync clocks to nanoseconds, localize flaps and contention, recover jobs."
        ),
        epilog="Run 'qpmesh COMMAND --help' for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMPONENTS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``qpmesh`` with ``argv``; return the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    qpmesh.heap.keep_freed_blocks()  # large temporaries reused, not faulted in anew
    debug = os.environ.get("QPMESH_DEBUG") == "1"
    try:
        result: int | None = args.func(args)
    except KeyboardInterrupt:
        print("qpmesh: interrupted", file=sys.stderr)
        return 130
    except ValueError as exc:
        if debug:
            raise
        print(f"qpmesh {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if debug:
            raise
        print(f"qpmesh {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
