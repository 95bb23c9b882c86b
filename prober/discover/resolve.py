"""A prober's own NICs from what it found on its host, and the neighbours document it publishes.

`LocalNics` (pure) holds what the NICs are made from: the interfaces `discover_nics` found,
the ``[[nics]]`` entries that override them, the ``[discover]`` settings and the LLDP
neighbours last read. `LocalNics.nics()` returns the NICs to probe from:

- every selected interface (`prober.discover.nics.NicFilter`) as a `prober.config.NicConfig`:
  id from the ``nic_id`` template, its address, its netdev as ``device``, its RDMA device,
  port and RoCEv2 GID index when it has them, and as ECMP group the leaf its LLDP neighbour
  names (`contract.neighbors.leaf_group`, the controller's group too; `UNPLACED` without
  one neighbour);
- a ``[[nics]]`` entry replaces the found NIC with the same ``device``, address or id (and
  one that matches nothing is added as it is).

`LocalNics.document(t_ns)` is the `contract.neighbors.NeighborsDoc` of those NICs with an
IPv4 address and a netdev. `with_lldp(reading)` takes a new LLDP reading: an interface
whose neighbour went silent keeps the last one seen (a link that is down is a fault, not a
recabling; a recabled NIC shows its new neighbour as soon as LLDP sees it).

`discover_config(cfg)` (thin) runs the readers on this host and returns the config with its
NICs and the `LocalNics` the agent keeps. Raises `NoNicsError` (an OSError: exit 1) when
nothing is left to probe from.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from contract.neighbors import LldpNeighbor, NeighborsDoc, NicNeighbors, leaf_group, leaf_of
from prober.config import DiscoverConfig, NicConfig, ProberConfig
from prober.discover.lldp import LldpReadError, read_lldp
from prober.discover.nics import DiscoveredNic, NicFilter, discover_nics, nic_id

UNPLACED = "unplaced"
"""The ECMP group of a NIC with no single LLDP neighbour (its leaf is unknown)."""

Lldp = Mapping[str, tuple[LldpNeighbor, ...]]


class NoNicsError(OSError):
    """Discovery left no NIC to probe from (the message says why each interface was not)."""


def _ipv4(address: str) -> bool:
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class LocalNics:
    """What this host's NICs are made from (see the module doc)."""

    host: str
    discover: DiscoverConfig
    found: tuple[DiscoveredNic, ...]
    explicit: tuple[NicConfig, ...] = ()
    lldp: Lldp = field(default_factory=dict)

    def nics(self) -> tuple[NicConfig, ...]:
        """Return the NICs to probe from: found ones, overridden by ``explicit``."""
        out: list[NicConfig] = []
        for d in self.found:
            if not d.selected:
                continue
            leaf = leaf_of(self.lldp.get(d.ifname, ()))
            out.append(NicConfig(
                id=nic_id(self.discover.nic_id, self.host, d.ifname),
                address=d.address,
                group=leaf_group(leaf) if leaf else UNPLACED,
                device=d.ifname,
                rdma_device=d.rdma_device,
                rdma_port=d.rdma_port or 1,
            ))  # fmt: skip
            if d.gid_index is not None:  # else NicConfig's default (doctor warns: no RoCEv2 GID)
                out[-1] = replace(out[-1], gid_index=d.gid_index)
        for e in self.explicit:
            same = [i for i, n in enumerate(out) if (e.device and n.device == e.device)
                    or n.address == e.address or n.id == e.id]  # fmt: skip
            if same:
                out[same[0]] = e
                out = [n for i, n in enumerate(out) if i not in same[1:]]
            else:
                out.append(e)
        return tuple(out)

    def with_lldp(self, reading: Lldp) -> LocalNics:
        """Return these NICs with a new LLDP reading (a silent interface keeps its last
        neighbours, see the module doc)."""
        merged = dict(self.lldp)
        merged.update({k: v for k, v in reading.items() if v})
        return replace(self, lldp=MappingProxyType(merged))

    def document(self, t_ns: int) -> NeighborsDoc:
        """Return the neighbours document of `nics` (those with a netdev and IPv4 address)."""
        return NeighborsDoc(self.host, t_ns, tuple(
            NicNeighbors(n.id, n.device, n.address, self.lldp.get(n.device, ()))
            for n in self.nics() if n.device and _ipv4(n.address)
        ))  # fmt: skip


def read_lldp_or_none(socket_path: str) -> Lldp:
    """Return lldpd's neighbours (`prober.discover.lldp.read_lldp`), {} when it cannot be
    read (no lldpd: every NIC is then unplaced, and the controller says so)."""
    try:
        return read_lldp(socket_path)
    except LldpReadError:
        return {}


def discover_config(
    cfg: ProberConfig,
    *,
    find: Callable[[NicFilter], tuple[DiscoveredNic, ...]] = discover_nics,
    lldp: Callable[[str], Lldp] = read_lldp_or_none,
) -> tuple[ProberConfig, LocalNics | None]:
    """Return ``cfg`` with the NICs found on this host, and what they were made from (None,
    and ``cfg`` as it is, when discovery is off). Raises `NoNicsError` when none is left,
    ValueError when a found NIC's id is not a fabric id, and what ``find`` raises."""
    d = cfg.discover
    if d is None:
        return cfg, None
    found = find(NicFilter(d.include, d.exclude))
    local = LocalNics(cfg.host, d, found, cfg.nics).with_lldp(lldp(d.lldp_socket))
    nics = local.nics()
    if not nics:
        why = "; ".join(f"{n.ifname}: {n.reason}" for n in found) or "no interfaces"
        raise NoNicsError(f"no NIC to probe from ([discover] nics = {list(d.include)}): {why}")
    ids = [n.id for n in nics] + [p.id for p in cfg.peers]
    if len(ids) != len(set(ids)):
        raise ValueError(f"{cfg.source}: NIC ids repeat among found, [[nics]] and [[peers]]: {ids}")
    return replace(cfg, nics=nics), local
