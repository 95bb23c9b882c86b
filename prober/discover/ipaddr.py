"""The IPv4 addresses of each interface: ``ip -j addr show`` parsed (pure) and run (thin).

iproute2 is on every Linux host and prints one JSON list per namespace; run under
``ip netns exec NS`` it shows that namespace. Only global-scope IPv4 addresses are kept, in the
order the kernel lists them (the first is the interface's primary address).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping


class AddressReadError(OSError):
    """``ip -j addr show`` could not be run or printed something that is not its JSON."""


def parse_ip_addr(text: str) -> dict[str, tuple[str, ...]]:
    """Return ``{ifname: (IPv4 address, ...)}`` from ``ip -j addr show`` output.

    Interfaces without a global IPv4 address map to an empty tuple. Raises ValueError when
    ``text`` is not that command's JSON (a list of objects with ``ifname``).
    """
    try:
        doc = json.loads(text or "[]")
    except json.JSONDecodeError as exc:
        raise ValueError(f"ip -j addr: not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise ValueError("ip -j addr: expected a JSON list")
    out: dict[str, tuple[str, ...]] = {}
    for link in doc:
        if not isinstance(link, Mapping) or not isinstance(link.get("ifname"), str):
            raise ValueError("ip -j addr: an entry without ifname")
        addrs = []
        for a in link.get("addr_info", []):
            if (
                isinstance(a, Mapping)
                and a.get("family") == "inet"
                and a.get("scope", "global") == "global"
                and isinstance(a.get("local"), str)
            ):
                addrs.append(a["local"])
        out[link["ifname"]] = tuple(addrs)
    return out


def read_ip_addr(timeout_s: float = 10.0) -> dict[str, tuple[str, ...]]:
    """Run ``ip -j addr show`` and return its parse; raise `AddressReadError`."""
    try:
        proc = subprocess.run(
            ["ip", "-j", "addr", "show"],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AddressReadError(f"ip -j addr show: {exc}") from None
    if proc.returncode != 0:
        raise AddressReadError(f"ip -j addr show: {proc.stderr.strip().splitlines()[:1]}")
    try:
        return parse_ip_addr(proc.stdout)
    except ValueError as exc:
        raise AddressReadError(str(exc)) from None
