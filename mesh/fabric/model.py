"""Fabric model values: nodes, NICs, links, ECMP groups, and index lookups.

Everything has a stable string id (usable in CLI arguments and MQTT topics: no '/', '+', '#')
and a dense integer index (usable in numpy arrays). Links are physical and full duplex; a
*hop* is one direction of a link: ``hop = 2 * link_index + direction`` where direction 0 is
"up" (from ``link.lower`` towards ``link.upper``) and 1 is "down".
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

_BAD_ID_CHARS = frozenset("/+# \t\n")


class FabricError(ValueError):
    """A fabric description or lookup is invalid (unknown id, bad shape, bad address)."""


class NodeKind(enum.StrEnum):
    """What a node in the fabric is; switch tiers are ordered leaf < spine < superspine."""

    HOST = "host"
    LEAF = "leaf"
    SPINE = "spine"
    SUPERSPINE = "superspine"


SWITCH_TIER: Mapping[NodeKind, int] = {
    NodeKind.LEAF: 1,
    NodeKind.SPINE: 2,
    NodeKind.SUPERSPINE: 3,
}


def check_id(ident: str) -> str:
    """Return ``ident`` unchanged if it is a valid fabric id, else raise `FabricError`."""
    if not ident or any(c in _BAD_ID_CHARS for c in ident):
        raise FabricError(
            f"invalid id {ident!r}: must be non-empty without '/', '+', '#' or spaces"
        )
    return ident


@dataclass(frozen=True, slots=True)
class Node:
    """A host or a switch. ``pod`` is the pod index for three-tier fabrics (0 otherwise)."""

    id: str
    kind: NodeKind
    index: int
    pod: int = 0

    def __post_init__(self) -> None:
        check_id(self.id)


@dataclass(frozen=True, slots=True)
class Nic:
    """A NIC: stable id, dense index, owning host, attached leaf, IPv4 address, ECMP group."""

    id: str
    index: int
    host: str
    leaf: str
    address: str
    group: str
    port: int = 0  # NIC number on its host

    def __post_init__(self) -> None:
        check_id(self.id)
        try:
            ipaddress.IPv4Address(self.address)
        except ValueError as exc:
            raise FabricError(f"NIC {self.id}: bad address {self.address!r}") from exc


@dataclass(frozen=True, slots=True)
class Link:
    """A physical full-duplex link between a lower-tier end and an upper-tier end.

    ``lower`` is a NIC id (NIC-to-leaf links) or a switch id; ``upper`` is a switch id.
    ``capacity_bps`` in bits/s, ``prop_delay_ns`` one-way propagation delay.
    """

    id: str
    index: int
    lower: str
    upper: str
    capacity_bps: float
    prop_delay_ns: float

    def __post_init__(self) -> None:
        check_id(self.id)
        if self.capacity_bps <= 0 or self.prop_delay_ns < 0:
            raise FabricError(f"link {self.id}: capacity must be > 0 and delay >= 0")


def hop_id(link_index: int, down: bool) -> int:
    """Return the directed hop id of traversing link ``link_index`` up (False) or down (True)."""
    return 2 * link_index + int(down)


def hop_link(hop: int) -> int:
    """Return the physical link index of a directed hop id."""
    return hop // 2


def hop_ids(links: npt.NDArray[np.integer[Any]], down: bool) -> npt.NDArray[np.int64]:
    """Return the directed hop ids of traversing ``links`` (link indices) up or down."""
    return 2 * np.asarray(links, np.int64) + int(down)


def hop_links(hops: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.integer[Any]]:
    """Return the link index of each directed hop id; padding (-1) stays -1."""
    return np.asarray(hops) >> 1


def reverse_hop(hop: int) -> int:
    """Return the same link traversed the other way."""
    return hop ^ 1


def hop_direction(hop: int) -> str:
    """Return ``"up"`` or ``"down"`` for a directed hop id."""
    return "down" if hop % 2 else "up"


@dataclass(frozen=True, eq=False)
class Fabric:
    """An immutable fabric: nodes (hosts and switches), NICs and links, with lookups.

    Raises `FabricError` on construction if ids collide or links name unknown ends.
    """

    nodes: tuple[Node, ...]
    nics: tuple[Nic, ...]
    links: tuple[Link, ...]
    shape: Mapping[str, int | float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [n.id for n in self.nodes] + [n.id for n in self.nics] + [lk.id for lk in self.links]
        if len(ids) != len(set(ids)):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise FabricError(f"duplicate id {dup!r}")
        known = {n.id for n in self.nodes} | {n.id for n in self.nics}
        for lk in self.links:
            if lk.lower not in known or lk.upper not in known:
                raise FabricError(f"link {lk.id} names an unknown end")
        for i, nic in enumerate(self.nics):
            if nic.index != i:
                raise FabricError(f"NIC {nic.id} has index {nic.index}, expected {i}")
        for i, lk in enumerate(self.links):
            if lk.index != i:
                raise FabricError(f"link {lk.id} has index {lk.index}, expected {i}")

    # ---- lookups -------------------------------------------------------------------------
    @cached_property
    def node_by_id(self) -> dict[str, Node]:
        """Map node id to node (hosts and switches)."""
        return {n.id: n for n in self.nodes}

    @cached_property
    def nic_index(self) -> dict[str, int]:
        """Map NIC id to its dense index."""
        return {n.id: n.index for n in self.nics}

    @cached_property
    def link_index(self) -> dict[str, int]:
        """Map link id to its dense index."""
        return {lk.id: lk.index for lk in self.links}

    @cached_property
    def link_between(self) -> dict[tuple[str, str], int]:
        """Map (lower, upper) end ids to the link index joining them."""
        return {(lk.lower, lk.upper): lk.index for lk in self.links}

    @cached_property
    def sibling_links(self) -> tuple[tuple[int, ...], ...]:
        """Per link index: the other links from the same lower node to an upper node of the
        same kind (a leaf's other spine uplinks, a spine's other super-spine uplinks), in index
        order; empty for a NIC's link. ECMP re-hashes a down link's flows onto these."""
        kind = {n.id: n.kind for n in self.nodes}
        groups: dict[tuple[str, object], list[int]] = {}
        for lk in self.links:
            groups.setdefault((lk.lower, kind.get(lk.upper)), []).append(lk.index)
        out: list[tuple[int, ...]] = []
        for lk in self.links:
            if lk.lower in self.nic_index:
                out.append(())
                continue
            group = groups[(lk.lower, kind.get(lk.upper))]
            out.append(tuple(i for i in group if i != lk.index))
        return tuple(out)

    @cached_property
    def nic_link(self) -> npt.NDArray[np.int32]:
        """Per NIC index: the index of its NIC-to-leaf link."""
        out = np.empty(len(self.nics), dtype=np.int32)
        for nic in self.nics:
            out[nic.index] = self.link_between[(nic.id, nic.leaf)]
        return out

    @cached_property
    def switches(self) -> tuple[Node, ...]:
        """All switch nodes, leaves first, then spines, then super-spines."""
        return tuple(
            sorted(
                (n for n in self.nodes if n.kind != NodeKind.HOST),
                key=lambda n: (SWITCH_TIER[n.kind], n.index),
            )
        )

    @cached_property
    def hosts(self) -> tuple[Node, ...]:
        """All host nodes."""
        return tuple(n for n in self.nodes if n.kind == NodeKind.HOST)

    @cached_property
    def leaves(self) -> tuple[Node, ...]:
        """All leaf switches in index order."""
        return tuple(n for n in self.switches if n.kind == NodeKind.LEAF)

    @cached_property
    def groups(self) -> dict[str, tuple[int, ...]]:
        """ECMP groups (one per leaf): group id -> NIC indices, in leaf order."""
        out: dict[str, list[int]] = {}
        for nic in self.nics:
            out.setdefault(nic.group, []).append(nic.index)
        return {g: tuple(v) for g, v in out.items()}

    @cached_property
    def nic_group_index(self) -> npt.NDArray[np.int32]:
        """Per NIC index: the dense index of its ECMP group (order of `groups`)."""
        gi = {g: i for i, g in enumerate(self.groups)}
        return np.array([gi[n.group] for n in self.nics], dtype=np.int32)

    @cached_property
    def host_index(self) -> dict[str, int]:
        """Host id -> its dense index (order of `hosts`)."""
        return {h.id: i for i, h in enumerate(self.hosts)}

    @cached_property
    def nic_host_index(self) -> npt.NDArray[np.int32]:
        """Per NIC index: the dense index of its host (order of `hosts`)."""
        hi = self.host_index
        return np.array([hi[n.host] for n in self.nics], dtype=np.int32)

    @property
    def n_hops(self) -> int:
        """Number of directed hops (two per link)."""
        return hop_id(len(self.links), down=False)

    def nic(self, ident: str) -> Nic:
        """Return the NIC with id ``ident``; raise `FabricError` if unknown."""
        try:
            return self.nics[self.nic_index[ident]]
        except KeyError:
            raise FabricError(f"unknown NIC {ident!r}") from None

    def link(self, ident: str) -> Link:
        """Return the link with id ``ident``; raise `FabricError` if unknown."""
        try:
            return self.links[self.link_index[ident]]
        except KeyError:
            raise FabricError(f"unknown link {ident!r}") from None

    def nics_of_host(self, host: str) -> tuple[Nic, ...]:
        """Return the NICs on ``host`` (empty if none)."""
        return tuple(n for n in self.nics if n.host == host)

    def hop_name(self, hop: int) -> str:
        """Return a readable name for a directed hop, e.g. ``leaf0->spine2``."""
        lk = self.links[hop_link(hop)]
        a, b = (lk.lower, lk.upper) if hop_direction(hop) == "up" else (lk.upper, lk.lower)
        return f"{a}->{b}"

    def to_dict(self) -> dict[str, object]:
        """Return a JSON-ready description: shape, nodes, NICs and links with their ids."""
        return {
            "shape": dict(self.shape),
            "nodes": [
                {"id": n.id, "kind": str(n.kind), "index": n.index, "pod": n.pod}
                for n in self.nodes
            ],
            "nics": [
                {
                    "id": n.id,
                    "index": n.index,
                    "host": n.host,
                    "leaf": n.leaf,
                    "group": n.group,
                    "address": n.address,
                    "port": n.port,
                }
                for n in self.nics
            ],
            "links": [
                {
                    "id": lk.id,
                    "index": lk.index,
                    "lower": lk.lower,
                    "upper": lk.upper,
                    "capacity_bps": lk.capacity_bps,
                    "prop_delay_ns": lk.prop_delay_ns,
                }
                for lk in self.links
            ],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Fabric:
        """Rebuild a `Fabric` from `to_dict` output; raise `FabricError` if it is not one."""
        try:
            nodes = tuple(
                Node(n["id"], NodeKind(n["kind"]), int(n["index"]), int(n.get("pod", 0)))
                for n in doc["nodes"]
            )
            nics = tuple(
                Nic(n["id"], int(n["index"]), n["host"], n["leaf"], n["address"], n["group"],
                    int(n.get("port", 0)))
                for n in doc["nics"]
            )  # fmt: skip
            links = tuple(
                Link(k["id"], int(k["index"]), k["lower"], k["upper"], float(k["capacity_bps"]),
                     float(k["prop_delay_ns"]))
                for k in doc["links"]
            )  # fmt: skip
            return cls(nodes, nics, links, dict(doc.get("shape", {})))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, FabricError):
                raise
            raise FabricError(f"bad fabric description: {exc}") from None


def ids_to_indices(fabric: Fabric, ids: Sequence[str]) -> npt.NDArray[np.int32]:
    """Map NIC ids to indices; raise `FabricError` naming the first unknown id."""
    table = fabric.nic_index
    out = np.empty(len(ids), dtype=np.int32)
    for i, ident in enumerate(ids):
        try:
            out[i] = table[ident]
        except KeyError:
            raise FabricError(f"unknown NIC {ident!r}") from None
    return out
