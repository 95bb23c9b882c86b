"""The LLDP neighbours of this host's interfaces, from lldpd: ``lldpcli -f json0 show neighbors``.

lldpd (Debian ``lldpd``; switch OSes such as SONiC run it too) keeps what its neighbours
announce; ``json0`` is its stable JSON shape, where every value is a list of objects::

    {"lldp": [{"interface": [{"name": "ens1", "chassis": [{"id": [{"type": "mac",
      "value": "..."}], "name": [{"value": "leaf0"}], "mgmt-ip": [{"value": "10.0.0.254"}]}],
      "port": [{"id": [{"type": "ifname", "value": "Ethernet0"}],
      "descr": [{"value": "..."}]}]}]}]}

No neighbour at all is ``{"lldp": [{}]}``. One interface with two neighbours appears as two
``interface`` entries with the same name. `parse_lldp` (pure) returns the neighbours per
interface as `contract.neighbors.LldpNeighbor`; `read_lldp` runs lldpcli (``-u SOCKET`` for a
daemon other than the system's, as in the namespace testbed).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from contract.jsondoc import DocumentError
from contract.neighbors import LldpNeighbor

LLDPCLI = "lldpcli"


class LldpReadError(OSError):
    """lldpcli is missing, cannot reach lldpd, or printed something that is not json0."""


def _objs(obj: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = obj.get(key, [])
    if isinstance(value, Mapping):  # the plain "json" format folds one-element lists
        value = [value]
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _first_value(obj: Mapping[str, Any], key: str) -> str:
    for v in _objs(obj, key):
        if isinstance(v.get("value"), str):
            return str(v["value"])
    return ""


def parse_lldp(text: str) -> dict[str, tuple[LldpNeighbor, ...]]:
    """Return ``{interface: (neighbour, ...)}`` from ``lldpcli -f json0 show neighbors``.

    Interfaces with no neighbour are absent. A neighbour with neither a system name nor a
    chassis id is skipped. Raises ValueError when ``text`` is not lldpcli's JSON.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"lldpcli: not JSON: {exc}") from None
    if not isinstance(doc, Mapping) or "lldp" not in doc:
        raise ValueError("lldpcli: expected an object with 'lldp'")
    out: dict[str, list[LldpNeighbor]] = {}
    for block in _objs(doc, "lldp"):
        for iface in _objs(block, "interface"):
            name = iface.get("name")
            if not isinstance(name, str) or not name:
                continue
            for ch in _objs(iface, "chassis") or [{}]:
                port = next(iter(_objs(iface, "port")), {})
                mgmt = tuple(
                    str(v["value"]) for v in _objs(ch, "mgmt-ip") if isinstance(v.get("value"), str)
                )
                try:
                    n = LldpNeighbor(
                        chassis_name=_first_value(ch, "name"),
                        chassis_id=_first_value(ch, "id"),
                        port_id=_first_value(port, "id"),
                        port_descr=_first_value(port, "descr"),
                        mgmt=mgmt,
                    )
                except DocumentError:
                    continue  # nothing names the neighbour
                out.setdefault(name, []).append(n)
    return {k: tuple(v) for k, v in out.items()}


def lldpcli_argv(socket_path: str = "") -> list[str]:
    """Return the lldpcli command line that prints the neighbours (``-u`` when given)."""
    argv = [LLDPCLI]
    if socket_path:
        argv += ["-u", socket_path]
    return [*argv, "-f", "json0", "show", "neighbors"]


def read_lldp(
    socket_path: str = "", timeout_s: float = 10.0, prefix: Sequence[str] = ()
) -> dict[str, tuple[LldpNeighbor, ...]]:
    """Run lldpcli (after ``prefix``, e.g. ``ip netns exec NS``) and return `parse_lldp` of it.

    Raises `LldpReadError` when lldpcli is missing, fails (no lldpd on the socket) or prints
    something else.
    """
    argv = [*prefix, *lldpcli_argv(socket_path)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LldpReadError(f"lldpcli: {exc}") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        raise LldpReadError(f"lldpcli: {why.split('] ', 1)[-1]}")  # less lldpd's log prefix
    try:
        return parse_lldp(proc.stdout)
    except ValueError as exc:
        raise LldpReadError(str(exc)) from None
