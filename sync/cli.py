"""``qpmesh sync``: micro-benchmarks of the sync numerics (JSON with ``--json``)."""

from __future__ import annotations

import argparse
import json


def _network(args: argparse.Namespace) -> int:
    from sync.bench import bench_network_solve  # scipy loads with the command, not the parser

    res = bench_network_solve(args.nodes, args.peers, args.seed, repeats=args.repeats)
    _print(res, args.json)
    return 0


def _fits(args: argparse.Namespace) -> int:
    from sync.bench import bench_pair_fits

    res = bench_pair_fits(args.pairs, args.samples, args.seed)
    _print(res, args.json)
    return 0


def _print(res: dict[str, float], as_json: bool) -> None:
    if as_json:
        print(json.dumps(res, sort_keys=True))
    else:
        for k, v in res.items():
            print(f"{k:>34}: {v:.6g}")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh sync bench-network`` and ``qpmesh sync bench-fits``."""
    p = sub.add_parser("sync", help="clock-sync numerics: micro-benchmarks")
    ssub = p.add_subparsers(dest="sync_command", metavar="SYNC_COMMAND", required=True)
    net = ssub.add_parser(
        "bench-network",
        help="time the network solve vs the pairwise tree baseline on a random probe graph",
    )
    net.add_argument("--nodes", type=int, default=10_000, help="NICs (default %(default)s)")
    net.add_argument("--peers", type=int, default=16, help="mean degree (default %(default)s)")
    net.add_argument("--seed", type=int, default=1, help="random seed (default %(default)s)")
    net.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown")
    net.add_argument("--json", action="store_true", help="print one JSON object")
    net.set_defaults(func=_network)
    fits = ssub.add_parser(
        "bench-fits", help="time batched pair fits vs a loop of exact single-pair fits"
    )
    fits.add_argument("--pairs", type=int, default=80_000, help="pairs (default %(default)s)")
    fits.add_argument("--samples", type=int, default=100, help="samples per direction")
    fits.add_argument("--seed", type=int, default=1, help="random seed (default %(default)s)")
    fits.add_argument("--json", action="store_true", help="print one JSON object")
    fits.set_defaults(func=_fits)
