"""``qpmesh doctor``: gather this host's facts (thin) and print `prober.doctor`'s checks.

One line per check (``--json``: one document with the checks and every interface as found);
exit 1 when a check failed (probing is blocked), 0 otherwise. Runs in the caller's network
namespace: ``ip netns exec NS qpmesh doctor`` checks a namespace (sysfs is remounted there).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import resource
import socket
from pathlib import Path
from typing import Any

import aiomqtt

from mqttlink.settings import BROKER_ERRORS, BrokerSettings, client_kwargs
from prober.config import ProberConfig, load_config
from prober.discover.gpus import read_gpu_locations
from prober.discover.ipaddr import read_ip_addr
from prober.discover.lldp import LldpReadError, read_lldp
from prober.discover.nics import DiscoveredNic, NicFilter, assemble
from prober.discover.sysfs import SYSFS, read_netdevs, read_rdma_ports
from prober.discover.tsinfo import TsInfo, read_ts_info
from prober.doctor import BrokerResult, HostFacts, blocking, report_json, run_checks

CHRONY_CONFS = (Path("/etc/chrony/chrony.conf"), Path("/etc/chrony.conf"))


def register(subparsers: Any) -> None:
    """Add ``doctor`` to the root ``qpmesh`` parser."""
    p = subparsers.add_parser(
        "doctor",
        help="check whether this host can probe (NICs, stamps, RDMA, clock, broker, ...)",
        description="One line per check; exit 1 when something blocks probing.",
    )
    p.add_argument(
        "--config", metavar="FILE", help="prober TOML: its NICs, port, transport, broker"
    )
    p.add_argument("--nics", metavar="GLOBS", default="",
                   help="interfaces to probe from, comma-separated shell globs (default: the "
                        "config's NICs, else every interface with an RDMA port)")  # fmt: skip
    p.add_argument("--exclude-nics", metavar="GLOBS", default="", help="interfaces to leave out")
    p.add_argument("--transport", choices=("udp", "rdma"), help="override prober.transport")
    p.add_argument("--port", type=int, help="override prober.port (the probe UDP port)")
    p.add_argument("--lldp-socket", metavar="PATH", default="",
                   help="lldpd's control socket (default: the system lldpd's)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_run)


def _globs(text: str) -> tuple[str, ...]:
    return tuple(g.strip() for g in text.split(",") if g.strip())


def running_processes(proc: Path = Path("/proc")) -> tuple[str, ...]:
    """Return the command names (``comm``) of every running process, sorted, once each."""
    names = set()
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                names.add((d / "comm").read_text().strip())
            except OSError:
                continue
    return tuple(sorted(names))


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int | None:
    """Return the ``CapEff`` mask of this process, None when it cannot be read."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def memlock_limit() -> int:
    """Return the soft RLIMIT_MEMLOCK in bytes, -1 when unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return -1 if soft == resource.RLIM_INFINITY else int(soft)


def port_error(address: str, port: int) -> str:
    """Return why UDP ``address:port`` cannot be bound ("" when it can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use (another prober, or another program)"
            return exc.strerror or str(exc)
    return ""


async def _connect(settings: BrokerSettings, client_id: str) -> None:
    client = aiomqtt.Client(settings.host, settings.port, identifier=client_id,
                            keepalive=settings.keepalive_s, timeout=settings.timeout_s,
                            clean_session=True, **client_kwargs(settings.security))  # fmt: skip
    async with asyncio.timeout(settings.timeout_s):
        await client.__aenter__()
    async with asyncio.timeout(settings.timeout_s):
        await client.__aexit__(None, None, None)


def check_broker(settings: BrokerSettings, host: str) -> BrokerResult:
    """Connect to the broker with ``settings`` (TLS, credentials) and disconnect."""
    where = f"{settings.host}:{settings.port}"
    who = settings.security.username
    how = ("TLS" if settings.security.tls else "plain") + (f", user {who}" if who else "")
    try:
        asyncio.run(_connect(settings, f"qpmesh-doctor-{host}-{os.getpid()}"))
    except BROKER_ERRORS as exc:
        why = str(exc) or type(exc).__name__
        return BrokerResult(False, f"{where} ({how}): {why}")
    return BrokerResult(True, f"connected to {where} ({how})")


def gather(
    cfg: ProberConfig | None,
    flt: NicFilter,
    *,
    transport: str,
    port: int,
    lldp_socket: str = "",
    sys_root: Path = SYSFS,
) -> HostFacts:
    """Read everything `prober.doctor.run_checks` needs from this host (thin)."""
    addrs = read_ip_addr()
    if cfg is not None and cfg.discover is not None:  # [discover]: its patterns and lldpd
        d = cfg.discover
        flt = NicFilter(flt.include or d.include, flt.exclude or d.exclude)
        lldp_socket = lldp_socket or d.lldp_socket
    if cfg is not None:  # the config's NICs, by device name or by address
        named = {n.device for n in cfg.nics if n.device}
        wanted = {n.address for n in cfg.nics}
        named |= {ifname for ifname, a in addrs.items() if wanted & set(a)}
        flt = NicFilter(tuple(sorted(set(flt.include) | named)), flt.exclude)
    netdevs = read_netdevs(sys_root)
    ts: dict[str, TsInfo | None] = {}
    for nd in netdevs:
        try:
            ts[nd.name] = read_ts_info(nd.name)
        except OSError:
            ts[nd.name] = None
    nics: tuple[DiscoveredNic, ...] = assemble(
        netdevs, addrs, read_rdma_ports(sys_root), ts, read_gpu_locations(sys_root), flt
    )
    try:
        lldp, lldp_error = read_lldp(lldp_socket), ""
    except LldpReadError as exc:
        lldp, lldp_error = None, str(exc)
    processes = running_processes()
    chrony = ""
    if "chronyd" in processes:
        for path in CHRONY_CONFS:
            try:
                chrony = path.read_text()
                break
            except OSError:
                continue
    return HostFacts(
        nics=nics,
        transport=transport,
        port=port,
        processes=processes,
        cap_eff=effective_capabilities(),
        memlock_bytes=memlock_limit(),
        broker=check_broker(cfg.mqtt, cfg.host) if cfg is not None else None,
        port_errors={
            n.address: e for n in nics if n.selected if (e := port_error(n.address, port))
        },
        lldp=lldp,
        lldp_error=lldp_error,
        chrony_conf=chrony,
    )


def _run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config) if args.config else None
    transport = args.transport or (cfg.transport if cfg else "udp")
    port = args.port if args.port is not None else (cfg.port if cfg else 4791)
    if not 1 <= port <= 0xFFFF:
        raise ValueError(f"--port {port}: must be in 1..65535")
    flt = NicFilter(_globs(args.nics), _globs(args.exclude_nics))
    facts = gather(cfg, flt, transport=transport, port=port, lldp_socket=args.lldp_socket)
    checks = run_checks(facts)
    if args.json:
        print(json.dumps(report_json(checks, facts), indent=1))
    else:
        for c in checks:
            print(c.line())
    return 1 if blocking(checks) else 0
