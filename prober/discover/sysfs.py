"""Network and RDMA devices as sysfs shows them: thin readers over a sysfs root, pure helpers.

`read_netdevs(root)` lists ``<root>/class/net/*`` (name, MAC, MTU, link up, link type, PCI
location, NUMA node); `read_rdma_ports(root)` lists ``<root>/class/infiniband/<dev>/ports/<p>``
(state, link layer, PCI location, the GID table with each entry's type and netdev, from
``gids/<i>``, ``gid_attrs/types/<i>`` and ``gid_attrs/ndevs/<i>``). ``root`` is ``/sys`` on a
host and a fixture tree in tests (the class entries are symlinks into ``devices/``, as in
sysfs). Unreadable files become defaults; a missing class directory is an empty list.

`roce_v2_gid_index(port, ifname, address)` (pure) finds the GID index a RoCEv2 queue pair on
that netdev uses for an IPv4 address: the entry of type ``RoCE v2`` whose GID is the
IPv4-mapped address (``::ffff:a.b.c.d``) and whose netdev is ``ifname``.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from prober.discover.pci import PciLocation, pci_location

SYSFS = Path("/sys")
ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772
_DOWN_STATES = ("down", "lowerlayerdown", "notpresent")


@dataclass(frozen=True, slots=True)
class Netdev:
    """A network interface: ``link_type`` is the ARPHRD number (1 Ethernet, 32 InfiniBand,
    772 loopback); ``virtual`` when it hangs off no device (veth, bridge, loopback);
    ``numa_node`` -1 when unknown."""

    name: str
    mac: str
    mtu: int
    up: bool
    link_type: int
    virtual: bool
    location: PciLocation
    numa_node: int = -1


@dataclass(frozen=True, slots=True)
class GidEntry:
    """One GID table entry: index, GID (IPv6 text), type (``RoCE v2``, ``IB/RoCE v1``), netdev."""

    index: int
    gid: str
    type: str
    netdev: str


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """One port of a verbs device: ``state`` (``ACTIVE``, ``DOWN``...), ``link_layer``
    (``Ethernet`` for RoCE, ``InfiniBand``), the non-zero GID entries, PCI location."""

    device: str
    port: int
    state: str
    link_layer: str
    location: PciLocation
    gids: tuple[GidEntry, ...] = ()

    @property
    def netdevs(self) -> frozenset[str]:
        """The netdevs the port's GIDs belong to (a RoCE port's Ethernet interface)."""
        return frozenset(g.netdev for g in self.gids if g.netdev)


def _text(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _int(path: Path, default: int = -1) -> int:
    try:
        return int(_text(path), 0)
    except ValueError:
        return default


def _numa(real: str, location: PciLocation) -> int:
    """The NUMA node of the PCI function ``location`` in the resolved device path ``real``."""
    if not location.address:
        return -1
    head, sep, _ = real.partition(f"/{location.address}/")
    pci_dir = Path(head + sep) if sep else Path(real)
    return _int(pci_dir / "numa_node")


def read_netdevs(root: Path = SYSFS) -> tuple[Netdev, ...]:
    """Return the network interfaces under ``root/class/net``, sorted by name."""
    base = root / "class" / "net"
    try:
        names = sorted(p.name for p in base.iterdir())
    except OSError:
        return ()
    out = []
    for name in names:
        d = base / name
        real = os.path.realpath(d)
        rel = os.path.relpath(real, root)
        loc = pci_location(rel)
        operstate = _text(d / "operstate", "unknown")
        carrier = _int(d / "carrier", 0)
        out.append(
            Netdev(
                name=name,
                mac=_text(d / "address"),
                mtu=_int(d / "mtu", 0),
                up=carrier == 1 and operstate not in _DOWN_STATES,
                link_type=_int(d / "type", 0),
                virtual=rel.startswith("devices/virtual/") or not (d / "device").exists(),
                location=loc,
                numa_node=_numa(real + "/", loc),
            )
        )
    return tuple(out)


def _gid_entries(port_dir: Path) -> tuple[GidEntry, ...]:
    try:
        indices = sorted(int(p.name) for p in (port_dir / "gids").iterdir() if p.name.isdigit())
    except OSError:
        return ()
    out = []
    for i in indices:
        gid = _text(port_dir / "gids" / str(i))
        try:
            if not gid or ipaddress.IPv6Address(gid) == ipaddress.IPv6Address(0):
                continue
        except ValueError:
            continue
        out.append(
            GidEntry(
                index=i,
                gid=str(ipaddress.IPv6Address(gid)),
                type=_text(port_dir / "gid_attrs" / "types" / str(i)),
                netdev=_text(port_dir / "gid_attrs" / "ndevs" / str(i)),
            )
        )
    return tuple(out)


def read_rdma_ports(root: Path = SYSFS) -> tuple[RdmaPort, ...]:
    """Return every port of every verbs device under ``root/class/infiniband`` (sorted)."""
    base = root / "class" / "infiniband"
    try:
        devices = sorted(p.name for p in base.iterdir())
    except OSError:
        return ()
    out = []
    for dev in devices:
        d = base / dev
        loc = pci_location(os.path.relpath(os.path.realpath(d), root))
        try:
            ports = sorted(int(p.name) for p in (d / "ports").iterdir() if p.name.isdigit())
        except OSError:
            continue
        for p in ports:
            pd = d / "ports" / str(p)
            state = _text(pd / "state", "unknown")  # "4: ACTIVE"
            out.append(
                RdmaPort(
                    device=dev,
                    port=p,
                    state=state.partition(":")[2].strip() or state,
                    link_layer=_text(pd / "link_layer", "unknown"),
                    location=loc,
                    gids=_gid_entries(pd),
                )
            )
    return tuple(out)


def roce_v2_gid_index(port: RdmaPort, ifname: str, address: str) -> int | None:
    """Return the index of ``port``'s RoCEv2 GID for IPv4 ``address`` on netdev ``ifname``,
    or None when the table has no such entry (pure; never raises on a bad address)."""
    try:
        mapped = ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(address)}")
    except ValueError:
        return None
    for g in port.gids:
        if (
            g.type.lower() == "roce v2"
            and g.netdev == ifname
            and ipaddress.IPv6Address(g.gid) == mapped
        ):
            return g.index
    return None


def port_of_netdev(ports: tuple[RdmaPort, ...], nd: Netdev) -> RdmaPort | None:
    """Return the RDMA port that serves netdev ``nd``: the one whose GIDs name it, else the
    one on the same PCI function (an InfiniBand or a RoCE port with an empty GID table)."""
    for p in ports:
        if nd.name in p.netdevs:
            return p
    if nd.location.address:
        for p in ports:
            if p.location.address == nd.location.address:
                return p
    return None
