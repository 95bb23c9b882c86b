"""``qpmesh sim ...``: the vectorized simulator's commands (topology, sync, localize, day, ingest,
run, rootcause)."""

from __future__ import annotations

import argparse
import json
import sys

from mesh.fabric import FabricShape, build_fabric


def add_shape_options(p: argparse.ArgumentParser) -> None:
    """Add the fabric shape options shared by ``sim`` and ``testbed`` commands."""
    d = FabricShape()
    g = p.add_argument_group("fabric shape")
    g.add_argument(
        "--leaves", type=int, default=d.leaves, help="leaves per pod (default %(default)s)"
    )
    g.add_argument(
        "--hosts-per-leaf",
        type=int,
        default=d.hosts_per_leaf,
        help="hosts under each leaf (default %(default)s)",
    )
    g.add_argument(
        "--nics-per-host",
        type=int,
        default=d.nics_per_host,
        help="NICs per host (default %(default)s)",
    )
    g.add_argument(
        "--spines", type=int, default=d.spines, help="spines per pod (default %(default)s)"
    )
    g.add_argument(
        "--pods",
        type=int,
        default=d.pods,
        help="pods; >1 needs --superspines (default %(default)s)",
    )
    g.add_argument(
        "--superspines",
        type=int,
        default=d.superspines,
        help="super-spines for a third tier, 0 = two tiers (default %(default)s)",
    )


def shape_from_args(args: argparse.Namespace) -> FabricShape:
    """Return the `FabricShape` named by the shape options; raises `FabricError` if invalid."""
    return FabricShape(
        leaves=args.leaves,
        hosts_per_leaf=args.hosts_per_leaf,
        nics_per_host=args.nics_per_host,
        spines=args.spines,
        pods=args.pods,
        superspines=args.superspines,
    )


def _topology(args: argparse.Namespace) -> int:
    fabric = build_fabric(shape_from_args(args))
    if args.json:
        json.dump(fabric.to_dict(), sys.stdout, indent=None if args.compact else 1)
        sys.stdout.write("\n")
        return 0
    print(
        f"{len(fabric.hosts)} hosts, {len(fabric.nics)} NICs, {len(fabric.leaves)} leaves, "
        f"{len(fabric.switches) - len(fabric.leaves)} spine/super-spine switches, {len(fabric.links)} links"
    )
    for group, nics in fabric.groups.items():
        names = " ".join(fabric.nics[i].id for i in nics)
        print(f"  {group}: {names}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh sim`` and its subcommands."""
    sim = sub.add_parser(
        "sim",
        help="vectorized fabric simulator: topology, sync / localize / ingest benchmarks, scenarios",
        description="Simulate a fabric with known truth and run qpmesh's sync and controller on it.",
    )
    ssub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND", required=True)
    topo = ssub.add_parser(
        "topology",
        help="print the fabric model (nodes, NICs, links with ids)",
        description="Print the fabric built from the shape options.",
    )
    add_shape_options(topo)
    topo.add_argument("--json", action="store_true", help="print JSON (nodes, nics, links)")
    topo.add_argument("--compact", action="store_true", help="one-line JSON")
    topo.set_defaults(func=_topology)
    from testbed.sim.sync_bench import register_sync

    register_sync(ssub)

    from testbed.sim.localize_bench import register_localize

    register_localize(ssub)

    from testbed.sim.day_cmd import register_day

    register_day(ssub)

    from testbed.sim.api_bench import register_api_bench
    from testbed.sim.ingest_bench import register_ingest

    register_ingest(ssub)
    register_api_bench(ssub)

    from testbed.sim.fleet_bench import register_fleet
    from testbed.sim.run_cmd import register_run

    register_fleet(ssub)

    register_run(ssub)

    from testbed.sim.rootcause_bench import register_rootcause

    register_rootcause(ssub)
