"""``qpmesh prober``: run the prober agent of this host; ``qpmesh prober bench``.

Bad configuration raises `prober.config.ConfigError` (exit 2); a missing RDMA device or an
unusable socket raises an OSError (exit 1); both print one line (see `qpmesh.cli`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from contract.interrupt import finish, interruptible
from prober.config import ProberConfig, load_config, load_probe_keys

if TYPE_CHECKING:  # the transports are imported when a prober runs, not by every command
    from prober.discover.resolve import LocalNics
    from prober.endpoint import EndpointFactory


def register(subparsers: Any) -> None:
    """Add ``prober`` (and ``prober bench``) to the root ``qpmesh`` parser."""
    p = subparsers.add_parser(
        "prober",
        help="probe this host's NIC peers and publish the results over MQTT",
        description="Probe every peer NIC on every ECMP path; publish batches to MQTT.",
    )
    p.add_argument("--config", metavar="FILE", help="prober TOML configuration")
    p.add_argument("--once", action="store_true", help="probe a single round, publish, exit")
    p.add_argument("--dry-run", action="store_true", help="print what would be probed and exit")
    p.add_argument("--transport", choices=("udp", "rdma"), help="override prober.transport")
    p.add_argument("--json", action="store_true", help="machine-readable output (--once/--dry-run)")
    p.set_defaults(func=_run)
    sub = p.add_subparsers(dest="prober_command", metavar="SUBCOMMAND")
    b = sub.add_parser("bench", help="measure the probe protocol and transport throughput")
    b.add_argument("--seconds", type=float, default=3.0,
                   help="duration of each measurement (the round-trip runs last seconds/repeats/2 "
                        "each, at least 0.5 s)")  # fmt: skip
    b.add_argument("--path", default="both",
                   choices=("both", "compiled", "batched", "per-datagram", "compiled-auth",
                            "per-datagram-auth"),
                   help="hot path(s) whose full round trips per CPU second are measured: the "
                        "compiled path (prober.compiled, the C datagram loop; needs the built "
                        "extension), the batched Python path (prober.fastudp), the per-datagram "
                        "path (prober.udp, the baseline), compiled-auth / per-datagram-auth "
                        "(the same with probe HMAC on at both ends) or all of them, "
                        "interleaved, with the ratio of the fastest to the baseline and of "
                        "compiled-auth to per-datagram-auth (default)")  # fmt: skip
    b.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="round-trip runs per path; medians are reported (default 3)",
    )
    b.add_argument("--profile", action="store_true",
                   help="instead: profile one path's round trip (--path, default per-datagram) "
                        "and print CPU microseconds per stage")  # fmt: skip
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from prober.bench import bench_figures, show_figures

    if args.seconds <= 0:
        raise ValueError("--seconds must be positive")
    if args.repeats <= 0:
        raise ValueError("--repeats must be positive")
    if args.path.startswith("compiled"):
        from prober.compiled import available

        if not available():
            raise OSError(f"--path {args.path}: prober._fastpath is not built (pip install -e . "
                          "with a C compiler and the Python headers)")  # fmt: skip
    result: dict[str, object] | None = None
    with interruptible() as stop:  # the figures come at the end: none if stopped before
        result = bench_figures(
            args.seconds, path=args.path, repeats=args.repeats, profile=args.profile
        )
    return finish(stop, result, as_json=args.json, show=show_figures)


def _load(args: argparse.Namespace) -> ProberConfig:
    if not args.config:
        raise ValueError("--config FILE is required")
    cfg = load_config(args.config)
    if args.transport:
        cfg = replace(cfg, transport=args.transport)
    return cfg


def dry_run_plan(cfg: ProberConfig, probes_shown: int = 8) -> dict[str, Any]:
    """Return what the prober would probe: peers, ports, rates, the first probes (pure)."""
    from prober.agent import plan_peers
    from prober.schedule import ProbePlan

    peers = plan_peers(cfg)
    plan = ProbePlan(peers, cfg.schedule, start_ns=0)
    addr = cfg.peer_address()
    first = []
    for p in plan:
        first.append({"t_ms": p.at_ns / 1e6, "src": p.src, "dst": p.dst,
                      "dest": list(addr[p.dst]), "sport": p.sport, "coded": p.coded})  # fmt: skip
        if len(first) >= probes_shown:
            break
    return {
        "host": cfg.host,
        "transport": cfg.transport,
        "broker": f"{cfg.mqtt.host}:{cfg.mqtt.port}",
        "prefix": cfg.mqtt.prefix,
        "mqtt_security": cfg.mqtt.security.describe(),
        "streams": len(plan),
        "probes_per_s": plan.probes_per_second * (2 if cfg.schedule.coded else 1),
        "ports_per_nic": cfg.schedule.ports_per_nic,
        "nics": {
            n.id: {
                "address": n.address,
                "peers": list(peers[n.id]),
                "sports": list(plan.ports[n.id]),
            }
            for n in cfg.nics
        },
        "first_probes": first,
    }


def _print_dry_run(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    print(
        f"prober {doc['host']} ({doc['transport']}) -> mqtt {doc['broker']} under {doc['prefix']}/"
    )
    sec = doc["mqtt_security"]
    print(f"mqtt tls {'on' if sec['tls'] else 'off'}, user {sec['username'] or '(none)'}, "
          f"password {sec['password'] or '(none)'}")  # fmt: skip
    print(f"{doc['streams']} streams, {doc['probes_per_s']:.1f} probes/s, "
          f"{doc['ports_per_nic']} source ports per NIC")  # fmt: skip
    auth = doc.get("auth")
    print(
        f"probe auth: HMAC-SHA256, sending with key {auth['send']} of {', '.join(auth['ids'])}"
        f" ({auth['key_file']})"
        if auth
        else "probe auth: off (no [auth] key_file)"
    )
    for nic, d in doc["nics"].items():
        print(f"  {nic} {d['address']}: peers {', '.join(d['peers']) or '(none)'}")
        ports = d["sports"]
        print(f"    sports {ports[:6]}{' ...' if len(ports) > 6 else ''}")
    for p in doc["first_probes"]:
        print(f"  t+{p['t_ms']:8.3f} ms  {p['src']} -> {p['dst']} {p['dest'][0]}:{p['dest'][1]}"
              f"  sport {p['sport']}{' (coded pair)' if p['coded'] else ''}")  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    keys = load_probe_keys(cfg)  # a bad key file fails here, in one line, before anything runs
    if args.dry_run:
        from prober.discover.resolve import discover_config

        doc = dry_run_plan(discover_config(cfg)[0])
        doc["auth"] = {"key_file": cfg.auth_key_file, **keys.describe()} if keys else None
        _print_dry_run(doc, args.json)
        return 0
    return run_prober(cfg, once=args.once, as_json=args.json)


def run_prober(
    cfg: ProberConfig,
    *,
    clock: Callable[[int], int] | None = None,
    once: bool = False,
    as_json: bool = False,
) -> int:
    """Run the prober of ``cfg`` until SIGTERM/SIGINT (or one round with ``once``); return 0.

    ``clock`` is the UDP endpoints' clock hook (kernel ns -> host ns), None on a real host.
    With ``[discover]`` the NICs are found first (`prober.discover.resolve.discover_config`).
    Raises `prober.rdma.discover.RdmaUnavailable` (an OSError) for ``transport = "rdma"``
    without a usable device, `prober.discover.resolve.NoNicsError` (an OSError) when no NIC
    is found.
    """
    from prober.discover.resolve import discover_config

    cfg, local = discover_config(cfg)
    factory: EndpointFactory | None = None
    if cfg.transport == "rdma":
        from prober.rdma.discover import require_rdma

        require_rdma([n.rdma_device for n in cfg.nics])  # raises RdmaUnavailable (exit 1)
        from prober.rdma.transport import rdma_endpoint_factory

        factory = rdma_endpoint_factory(cfg)
    elif clock is not None:
        from prober.endpoint import udp_endpoint_factory

        factory = udp_endpoint_factory(cfg, clock)
    profile_to = os.environ.get(PROFILE_ENV)
    if not profile_to:
        return asyncio.run(_serve(cfg, factory, once=once, as_json=as_json, local=local))
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        return asyncio.run(_serve(cfg, factory, once=once, as_json=as_json, local=local))
    finally:
        prof.disable()
        prof.dump_stats(profile_to)


PROFILE_ENV = "QPMESH_PROBER_PROFILE"
"""When set to a file name, the prober runs under cProfile and writes its stats there at exit
(``python -m pstats FILE``): how the running agent spends its CPU (docs/benchmarks.md)."""


async def _serve(
    cfg: ProberConfig,
    factory: EndpointFactory | None,
    *,
    once: bool,
    as_json: bool,
    local: LocalNics | None = None,
) -> int:
    from prober.agent import Agent

    agent = Agent(cfg, endpoint_factory=factory, local=local)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        stats = await agent.run(stop, once=once)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    if once:
        doc = {
            "host": cfg.host,
            "probes": stats.probes_queued,
            "results": stats.results,
            "lost": stats.lost,
            "batches": stats.batches,
            **agent.publisher.counters(),
        }
        if as_json:
            print(json.dumps(doc))
        else:
            print(" ".join(f"{k}={v}" for k, v in doc.items()))
        sys.stdout.flush()
    return 0
