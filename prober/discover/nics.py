"""This host's NICs, found rather than configured: pure assembly, one thin reader.

`assemble` (pure) joins what the readers saw, per network interface: its IPv4 addresses
(`prober.discover.ipaddr`), its RDMA port and the RoCEv2 GID index of its address
(`prober.discover.sysfs`), PCI address and NUMA node, the GPU it serves
(`prober.discover.pci.nearest_gpu` over `prober.discover.gpus`), and its timestamping
capability (`prober.discover.tsinfo`). It marks which interfaces the prober should probe from
and says why the others are left out.

Which interfaces are selected (`NicFilter`):

- never the loopback, never an interface without an IPv4 address;
- with ``include`` patterns (shell globs on the interface name, ``["ens*", "eth1"]``): those
  that match one, less those matching an ``exclude`` pattern;
- without ``include``: every interface that has an RDMA port (the RoCE / InfiniBand NICs the
  mesh watches), less those excluded. A host with no RDMA device selects nothing unless told:
  a management or container interface is never probed by accident.

`discover_nics(flt)` runs the readers on this host (in the caller's network namespace; sysfs
as mounted, so run under ``ip netns exec`` for a namespace) and returns `assemble` of them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prober.discover.gpus import read_gpu_locations
from prober.discover.ipaddr import read_ip_addr
from prober.discover.pci import GpuLocation, nearest_gpu
from prober.discover.sysfs import (
    ARPHRD_LOOPBACK,
    SYSFS,
    Netdev,
    RdmaPort,
    port_of_netdev,
    read_netdevs,
    read_rdma_ports,
    roce_v2_gid_index,
)
from prober.discover.tsinfo import TsInfo, read_ts_info

_BAD_ID_CHARS = frozenset("/+# \t\n")


@dataclass(frozen=True, slots=True)
class NicFilter:
    """Which interfaces to probe from: shell-glob ``include`` / ``exclude`` patterns on the
    interface name (see the module doc for the rule without ``include``). ValueError on an
    empty pattern."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for what in ("include", "exclude"):
            pats = tuple(getattr(self, what))
            if not all(isinstance(p, str) and p.strip() for p in pats):
                raise ValueError(f"NIC filter {what}: patterns must be non-empty strings")
            object.__setattr__(self, what, pats)

    def verdict(self, ifname: str, has_rdma: bool) -> tuple[bool, str]:
        """Return (selected, reason) for an interface, before the address check."""
        for pat in self.exclude:
            if fnmatch.fnmatchcase(ifname, pat):
                return False, f"excluded by {pat!r}"
        if self.include:
            for pat in self.include:
                if fnmatch.fnmatchcase(ifname, pat):
                    return True, f"matches {pat!r}"
            return False, "matches no include pattern"
        if has_rdma:
            return True, "has an RDMA port"
        return False, "no RDMA port (name it in the NIC filter to probe it over UDP)"


@dataclass(frozen=True, slots=True)
class DiscoveredNic:
    """One network interface as found: see the module doc. ``address`` is the primary IPv4
    address ("" when none); ``gid_index`` None when no RoCEv2 GID matches it; ``gpu`` the
    NVML index of the GPU it serves (None: none near) at topology ``gpu_level``;
    ``timestamping`` ``hardware`` / ``software`` / ``none`` / ``unknown`` (driver did not say)."""

    ifname: str
    selected: bool
    reason: str
    address: str = ""
    addresses: tuple[str, ...] = ()
    mac: str = ""
    mtu: int = 0
    up: bool = False
    virtual: bool = True
    pci: str = ""
    numa_node: int = -1
    rdma_device: str = ""
    rdma_port: int = 0
    rdma_state: str = ""
    link_layer: str = ""
    gid_index: int | None = None
    timestamping: str = "unknown"
    phc_index: int = -1
    gpu: int | None = None
    gpu_level: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (what ``qpmesh doctor --json`` prints per NIC)."""
        doc = asdict(self)
        doc["addresses"] = list(self.addresses)
        return doc


def _one(
    nd: Netdev,
    addrs: tuple[str, ...],
    ports: Sequence[RdmaPort],
    ts: TsInfo | None,
    gpus: Sequence[GpuLocation],
    flt: NicFilter,
) -> DiscoveredNic:
    port = port_of_netdev(tuple(ports), nd)
    address = addrs[0] if addrs else ""
    if nd.link_type == ARPHRD_LOOPBACK or nd.name == "lo":
        selected, reason = False, "loopback"
    else:
        selected, reason = flt.verdict(nd.name, port is not None)
        if selected and not address:
            selected, reason = False, "no IPv4 address"
    gpu = nearest_gpu(nd.location, nd.numa_node, gpus)
    return DiscoveredNic(
        ifname=nd.name,
        selected=selected,
        reason=reason,
        address=address,
        addresses=addrs,
        mac=nd.mac,
        mtu=nd.mtu,
        up=nd.up,
        virtual=nd.virtual,
        pci=nd.location.address,
        numa_node=nd.numa_node,
        rdma_device=port.device if port else "",
        rdma_port=port.port if port else 0,
        rdma_state=port.state if port else "",
        link_layer=port.link_layer if port else "",
        gid_index=roce_v2_gid_index(port, nd.name, address) if port and address else None,
        timestamping=ts.mode if ts is not None else "unknown",
        phc_index=ts.phc_index if ts is not None else -1,
        gpu=gpu.index if gpu else None,
        gpu_level=gpu.level if gpu else "",
    )


def assemble(
    netdevs: Sequence[Netdev],
    addresses: Mapping[str, tuple[str, ...]],
    ports: Sequence[RdmaPort],
    ts: Mapping[str, TsInfo | None],
    gpus: Sequence[GpuLocation],
    flt: NicFilter,
) -> tuple[DiscoveredNic, ...]:
    """Return every interface of ``netdevs`` as a `DiscoveredNic`, in name order (pure).

    ``addresses``: IPv4 addresses per interface; ``ts``: timestamping per interface (None or
    absent: unknown); ``gpus``: where the host's GPUs sit.
    """
    return tuple(
        _one(nd, addresses.get(nd.name, ()), ports, ts.get(nd.name), gpus, flt)
        for nd in sorted(netdevs, key=lambda n: n.name)
    )


def nic_id(template: str, host: str, ifname: str) -> str:
    """Return the fabric id of a discovered NIC: ``template`` with ``{host}`` and ``{ifname}``
    filled in (``"{host}.{ifname}"`` is unique in a fleet; ``"{ifname}"`` where interface
    names already are, as in the namespace testbed). Raises ValueError on a bad template or
    an id with ``/ + #`` or spaces."""
    try:
        out = template.format(host=host, ifname=ifname)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"NIC id template {template!r}: {exc}") from None
    if not out or any(c in _BAD_ID_CHARS for c in out):
        raise ValueError(f"NIC id {out!r} (from {template!r}) is not a valid fabric id")
    return out


def discover_nics(
    flt: NicFilter, sys_root: Path = SYSFS, nvml: Any = None
) -> tuple[DiscoveredNic, ...]:
    """Find this host's NICs (thin: sysfs, ``ip -j addr``, the ethtool ioctl, NVML).

    Raises `prober.discover.ipaddr.AddressReadError` (an OSError) when ``ip`` cannot be run;
    everything else the host lacks (RDMA, GPUs, a driver's timestamp answer) is an absence.
    """
    netdevs = read_netdevs(sys_root)
    ts: dict[str, TsInfo | None] = {}
    for nd in netdevs:
        try:
            ts[nd.name] = read_ts_info(nd.name)
        except OSError:
            ts[nd.name] = None
    return assemble(
        netdevs, read_ip_addr(), read_rdma_ports(sys_root), ts, read_gpu_locations(sys_root, nvml),
        flt,
    )  # fmt: skip
