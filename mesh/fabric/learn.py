"""Learn the fabric from what probers see: LLDP for NIC -> leaf, traced paths for the tiers above.

Inputs (the contract's documents, so this module needs no prober and no controller):

- `contract.neighbors.NeighborsDoc` per host: its NICs (id, address) and each NIC's LLDP
  neighbour. The neighbour's system name is the NIC's **leaf** (its chassis id when it sends
  no name). A NIC with no neighbour, or with two different ones, is not placed (a problem).
- `contract.documents.TracedPath`: the routers a probe's 5-tuple crossed, by TTL. In an
  up-down Clos a path between NICs under different leaves crosses ``2t - 1`` routers for
  ``t`` tiers: leaf, spine, (super-spine, spine,) leaf. The routers' tiers follow from their
  position; the first and last are the two NICs' leaves (known from LLDP, so a silent leaf
  costs nothing), the others are named by their address. Each consecutive pair is a link.
  ECMP groups follow from the leaves (one group per leaf, `leaf_group`).

**How an address names a switch (the assumption).** Every switch answers TTL-expired probes
from one address of its own, its router id (a loopback /32), whichever interface the probe
came in on. Routed fabrics (BGP unnumbered, SONiC, most vendors' defaults with a loopback as
the ICMP source) are built that way; the namespace testbed is configured so
(`testbed.netns.plan`, ``router_ids``). A switch that answers from the inbound interface's
address instead looks like one switch per interface: then give ``names`` (address -> switch
name) for its interface addresses, from a cabling plan or the switches' inventory. Spines and
super-spines are named by their router id unless ``names`` names them; leaves by LLDP.

`learn_fabric` returns a `LearnedFabric`: the `Fabric`, the router address -> node map the
controller's path mapping needs (`controller.pathmap`), and what could not be placed, in words.
Comparing with a plan is `mesh.fabric.plancheck`. Pure: values in, values out.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from contract.documents import TracedPath
from contract.neighbors import NeighborsDoc, leaf_group, switch_id
from mesh.fabric.model import Fabric, Link, Nic, Node, NodeKind

__all__ = ["LearnedFabric", "LinkDefaults", "leaf_group", "learn_fabric", "switch_id"]


@dataclass(frozen=True, slots=True)
class LinkDefaults:
    """Capacities (bits/s) and one-way propagation delays (ns) given to learned links: LLDP
    and TTL traces do not measure them."""

    nic_capacity_bps: float = 400e9
    fabric_capacity_bps: float = 400e9
    nic_delay_ns: float = 25.0
    leaf_spine_delay_ns: float = 100.0
    spine_super_delay_ns: float = 250.0


@dataclass(frozen=True)
class LearnedFabric:
    """A learned `Fabric`, ``router_nodes`` (router address -> node id, for
    `controller.pathmap`) and ``problems``: what was seen but could not be placed, in words."""

    fabric: Fabric
    router_nodes: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _SeenNic:
    id: str
    host: str
    address: str
    leaf: str


def _place_nics(docs: Iterable[NeighborsDoc], problems: list[str]) -> dict[str, _SeenNic]:
    placed: dict[str, _SeenNic] = {}
    by_addr: dict[str, str] = {}
    for doc in sorted((d for d in docs if d.host), key=lambda d: d.host):
        for n in doc.nics:
            what = f"{doc.host} {n.nic} ({n.address})"
            names = sorted({switch_id(x.name) for x in n.neighbors} - {""})
            if not names:
                problems.append(f"{what}: no LLDP neighbour (is lldpd running on the host and on its switch?)")  # fmt: skip
                continue
            if len(names) > 1:
                problems.append(f"{what}: several LLDP neighbours ({', '.join(names)}): not placed")
                continue
            if n.nic in placed:
                problems.append(f"{what}: NIC id also reported by {placed[n.nic].host}: not placed")
                continue
            if n.address in by_addr:
                problems.append(f"{what}: address also used by {by_addr[n.address]}: not placed")
                continue
            placed[n.nic] = _SeenNic(n.nic, doc.host, n.address, names[0])
            by_addr[n.address] = n.nic
    return placed


def _up_down_tiers(k: int) -> list[int]:
    """Tier of the router at each of ``k`` positions of an up-down path (k odd)."""
    return [min(i, k - 1 - i) + 1 for i in range(k)]


def learn_fabric(
    neighbors: Iterable[NeighborsDoc],
    paths: Iterable[TracedPath],
    *,
    names: Mapping[str, str] | None = None,
    links: LinkDefaults | None = None,
) -> LearnedFabric:
    """Return the fabric that ``neighbors`` and ``paths`` show (see the module doc).

    ``names``: router address -> switch name for switches above the leaves (a plan's names,
    or every interface address of a switch that does not answer from one router id).
    Paths that are not reached, whose NICs are not placed, or that cross an even number of
    routers are left out and counted in ``problems``. Never raises on what probers report.
    """
    names = dict(names or {})
    ld = links or LinkDefaults()
    problems: list[str] = []
    nics = _place_nics(neighbors, problems)
    leaves = {n.leaf for n in nics.values()}
    leaf_rids: dict[str, set[str]] = defaultdict(set)
    addr_tiers: dict[str, set[int]] = defaultdict(set)
    edges: set[tuple[tuple[int, str], tuple[int, str]]] = set()  # ((tier, key), (tier, key))
    skipped: Counter[str] = Counter()
    for p in paths:
        src, dst = nics.get(p.src), nics.get(p.dst)
        if not p.reached:
            skipped["did not reach their destination"] += 1
            continue
        if src is None or dst is None:
            skipped["have a NIC that is not placed"] += 1
            continue
        k = len(p.hops)
        if k % 2 == 0:
            skipped["cross an even number of routers (not an up-down path)"] += 1
            continue
        if (k == 1) != (src.leaf == dst.leaf):
            skipped["disagree with LLDP about the NICs' leaves"] += 1
            continue
        tiers = _up_down_tiers(k)
        if max(tiers) > 3:
            skipped["cross more than three tiers"] += 1
            continue
        keys: list[tuple[int, str] | None] = []
        for i, (hop, tier) in enumerate(zip(p.hops, tiers, strict=True)):
            if tier == 1:
                leaf = src.leaf if i == 0 else dst.leaf
                if hop is not None:
                    leaf_rids[leaf].add(hop)
                keys.append((1, leaf))
            elif hop is None:
                keys.append(None)
            else:
                addr_tiers[hop].add(tier)
                keys.append((tier, hop))
        for a, b in itertools.pairwise(keys):
            if a is not None and b is not None and a[0] != b[0]:
                edges.add((a, b) if a[0] < b[0] else (b, a))
    for what, count in sorted(skipped.items()):
        problems.append(f"{count} traced path(s) left out: they {what}")

    # router ids: leaves by the first / last hop, the tiers above by position
    router_nodes: dict[str, str] = {}
    for leaf in sorted(leaf_rids):
        rids = sorted(leaf_rids[leaf])
        if len(rids) > 1:
            problems.append(f"{leaf} answers from several addresses ({', '.join(rids)}): "
                            "switches must answer TTL probes from one router id")  # fmt: skip
        for rid in rids:
            router_nodes[rid] = leaf
    upper: dict[str, tuple[int, str]] = {}  # address -> (tier, node id)
    for addr in sorted(addr_tiers):
        tiers_seen = addr_tiers[addr]
        if addr in router_nodes:
            problems.append(f"router {addr} is seen as {router_nodes[addr]} and above the leaves")
            continue
        if len(tiers_seen) > 1:
            problems.append(f"router {addr} is seen at several tiers: left out")
            continue
        node = switch_id(names.get(addr, addr))
        if node in leaves:
            problems.append(f"router {addr} is named {node}, a leaf's LLDP name: left out")
            continue
        upper[addr] = (next(iter(tiers_seen)), node)
        router_nodes[addr] = node

    def node_of(key: tuple[int, str]) -> tuple[int, str] | None:
        if key[0] == 1:
            return key
        return upper.get(key[1])

    switch_links: set[tuple[tuple[int, str], tuple[int, str]]] = set()
    for a, b in edges:
        na, nb = node_of(a), node_of(b)
        if na is not None and nb is not None and na[1] != nb[1]:
            switch_links.add((na, nb))
    fabric = _build(nics, leaves, set(upper.values()), switch_links, ld)
    return LearnedFabric(fabric, router_nodes, tuple(problems))


def _pods(
    leaves: list[str], spines: list[str], links: set[tuple[tuple[int, str], tuple[int, str]]]
) -> dict[str, int]:
    """Pod of each leaf and spine: connected components of the leaf-spine links, numbered in
    order of their first leaf (all 0 when the fabric has two tiers)."""
    parent = {n: n for n in (*leaves, *spines)}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (ta, a), (tb, b) in links:
        if ta == 1 and tb == 2 and a in parent and b in parent:
            parent[root(a)] = root(b)
    order: dict[str, int] = {}
    for n in (*leaves, *spines):
        order.setdefault(root(n), len(order))
    return {n: order[root(n)] for n in parent}


def _build(
    nics: Mapping[str, _SeenNic],
    leaves: set[str],
    upper: set[tuple[int, str]],
    switch_links: set[tuple[tuple[int, str], tuple[int, str]]],
    ld: LinkDefaults,
) -> Fabric:
    leaf_ids = sorted(leaves)
    spine_ids = sorted(n for t, n in upper if t == 2)
    super_ids = sorted(n for t, n in upper if t == 3)
    pods = _pods(leaf_ids, spine_ids, switch_links) if super_ids else {}
    nodes = [Node(x, NodeKind.LEAF, i, pods.get(x, 0)) for i, x in enumerate(leaf_ids)]
    nodes += [Node(x, NodeKind.SPINE, i, pods.get(x, 0)) for i, x in enumerate(spine_ids)]
    nodes += [Node(x, NodeKind.SUPERSPINE, i) for i, x in enumerate(super_ids)]
    placed = sorted(nics.values(), key=lambda n: (n.leaf, n.host, n.id))
    hosts = sorted({n.host for n in placed})
    host_pod: dict[str, int] = {}
    for n in placed:
        host_pod.setdefault(n.host, pods.get(n.leaf, 0))
    nodes += [Node(h, NodeKind.HOST, i, host_pod[h]) for i, h in enumerate(hosts)]
    out_nics: list[Nic] = []
    out_links: list[Link] = []
    ports = {n.id: i for h in hosts for i, n in enumerate(sorted(
        (m for m in placed if m.host == h), key=lambda m: m.id))}  # fmt: skip
    for i, n in enumerate(placed):
        out_nics.append(Nic(n.id, i, n.host, n.leaf, n.address, leaf_group(n.leaf), ports[n.id]))
        out_links.append(Link(f"{n.id}-{n.leaf}", len(out_links), n.id, n.leaf,
                              ld.nic_capacity_bps, ld.nic_delay_ns))  # fmt: skip
    for (ta, a), (_, b) in sorted(switch_links):
        delay = ld.leaf_spine_delay_ns if ta == 1 else ld.spine_super_delay_ns
        out_links.append(Link(f"{a}-{b}", len(out_links), a, b, ld.fabric_capacity_bps, delay))
    return Fabric(tuple(nodes), tuple(out_nics), tuple(out_links), shape={})
