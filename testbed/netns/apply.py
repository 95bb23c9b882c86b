"""Thin shell that builds a `Plan`: runs ``ip -batch``/``tc -batch`` and writes sysctls.

`check_environment()` refuses early (one-line `TestbedEnvError`) when not root or when network
namespaces are unavailable. `bring_up(plan, state)` records the state file first (so
``testbed down`` can clean up after a crash half-way), then creates everything.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from testbed.netns.lldp import lldp_dir, start_lldpd
from testbed.netns.nsutil import NamespaceError, write_sysctls
from testbed.netns.plan import MGMT_NETS, Plan, mgmt_network
from testbed.netns.state import load_state, save_state

Progress = Callable[[str], None]


class TestbedEnvError(OSError):
    """The machine cannot run the testbed (not root, no namespaces, a command failed)."""


def _quiet(_: str) -> None:
    return None


def run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    """Run ``argv``; return stdout. Raise `TestbedEnvError` with stderr's first line on failure."""
    try:
        proc = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedEnvError(f"{argv[0]}: {exc}") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["failed"])[0]
        raise TestbedEnvError(f"{' '.join(argv[:4])}: {msg}")
    return proc.stdout


def check_environment() -> None:
    """Raise `TestbedEnvError` unless we are root and ``ip netns`` works."""
    if os.geteuid() != 0:
        raise TestbedEnvError("the namespace testbed needs root (run with sudo)")
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            raise TestbedEnvError(f"{tool} not found (install iproute2 / nftables)")
    if not os.path.exists("/proc/self/ns/net"):
        raise TestbedEnvError("this kernel has no network namespaces")
    try:
        run(["ip", "netns", "list"])
    except TestbedEnvError as exc:
        raise TestbedEnvError(f"network namespaces unavailable: {exc}") from None


def pick_mgmt_index(prefix: str) -> int:
    """Return a management /24 index not used by any address in the root namespace."""
    used: set[int] = set()
    try:
        doc = json.loads(run(["ip", "-j", "addr", "show"]) or "[]")
    except (TestbedEnvError, ValueError):
        doc = []
    base = int(ipaddress.IPv4Address("198.18.0.0"))
    for link in doc:
        for a in link.get("addr_info", []):
            if a.get("family") == "inet":
                off = int(ipaddress.IPv4Address(a["local"])) - base
                if 0 <= off < 256 * MGMT_NETS:
                    used.add(off // 256)
    start = zlib.crc32(prefix.encode()) % MGMT_NETS
    for k in range(MGMT_NETS):
        idx = (start + k) % MGMT_NETS
        if idx not in used:
            return idx
    raise TestbedEnvError("no free management network in 198.18.0.0/15")


def bring_up(plan: Plan, state: dict[str, Any], progress: Progress = _quiet) -> None:
    """Create the namespaces, links, addresses, routes, qdiscs and sysctls of ``plan``.

    ``state`` (shape, options) is saved before anything is created. Raises `TestbedEnvError`;
    the caller should then run teardown (the state file says what to remove).
    """
    save_state(plan.prefix, {**state, "prefix": plan.prefix, "complete": False})
    progress(f"creating {len(plan.namespaces)} namespaces and {len(plan.links)} links")
    run(["ip", "-batch", "-"], stdin="\n".join(plan.root_lines) + "\n")
    progress("addresses, routes and sysctls")
    for ns in plan.namespaces:
        run(["ip", "-n", ns, "-batch", "-"], stdin="\n".join(plan.ns_ip[ns]) + "\n")
        try:
            write_sysctls(ns, plan.ns_sysctl.get(ns, ()))
        except (NamespaceError, OSError) as exc:
            raise TestbedEnvError(f"sysctl in {ns}: {exc}") from None
    progress("shaping links (tbf)")
    for ns in plan.namespaces:
        if plan.ns_tc[ns]:
            run(["tc", "-n", ns, "-batch", "-"], stdin="\n".join(plan.ns_tc[ns]) + "\n")
    if plan.lldp:
        progress(f"starting lldpd in {len(plan.namespaces)} namespaces")
        try:
            start_lldpd(plan, lldp_dir(plan.prefix))
        except OSError as exc:
            raise TestbedEnvError(f"lldpd: {exc}") from None
    doc = load_state(plan.prefix) or {}  # keeps the processes start_lldpd recorded
    save_state(plan.prefix, {**doc, **state, "prefix": plan.prefix, "complete": True})
    progress(f"fabric up: broker address {plan.broker_addr}")


def mgmt_cidr(plan: Plan) -> str:
    """Return the management network of ``plan`` as CIDR text."""
    return str(ipaddress.IPv4Network(f"{plan.broker_addr}/24", strict=False))


__all__ = ["TestbedEnvError", "bring_up", "check_environment", "mgmt_network", "run"]
