"""Observations of a fabric as its probers would report them, made from the fabric model
itself (`flow_path`): every host's neighbours document, and traces of its flows with each
switch answering from an address ``answer(node, previous node)`` gives (shared by the tests of
fabric learning, of the controller's learner and of live topology changes)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from contract.documents import TracedPath
from contract.neighbors import LldpNeighbor, NeighborsDoc, NicNeighbors
from mesh.fabric import Fabric, flow_path
from mesh.fabric.model import hop_direction, hop_link

SPORTS = range(49152, 49152 + 24)


def router_ids(f: Fabric) -> dict[str, str]:
    """A router id (loopback) per switch: 100.64.0.k."""
    return {sw.id: f"100.64.0.{k + 1}" for k, sw in enumerate(f.switches)}


def neighbors(
    f: Fabric, leaf_of: Callable[[str], str | None] = lambda n: None
) -> list[NeighborsDoc]:
    """What every host's prober reports: its NICs, each with its leaf as LLDP neighbour
    (``leaf_of(nic)`` overrides: None keeps the plan's leaf, "" means no neighbour)."""
    docs = []
    for h in f.hosts:
        entries = []
        for n in f.nics_of_host(h.id):
            leaf = leaf_of(n.id)
            leaf = n.leaf if leaf is None else leaf
            seen = (
                (LldpNeighbor(leaf, "aa:bb:cc:00:00:01", "Ethernet4", "to " + h.id),)
                if leaf
                else ()
            )
            entries.append(NicNeighbors(n.id, n.id, n.address, seen))
        docs.append(NeighborsDoc(h.id, 1, tuple(entries)))
    return docs


def traces(
    f: Fabric, answer: Callable[[str, str], str | None], skip_link: Iterable[str] = ()
) -> list[TracedPath]:
    """Trace every NIC pair on every source port through the fabric model; ``answer(node,
    previous node)`` is the address the router ``node`` answers from (None: silent)."""
    skip = set(skip_link)
    out = []
    for a, b in itertools.permutations(f.nics, 2):
        if a.host == b.host:
            continue
        for sport in SPORTS:
            hops = flow_path(f, a.id, b.id, sport)
            if any(f.links[hop_link(h)].id in skip for h in hops):
                continue
            nodes = [a.id]
            for h in hops:
                lk = f.links[hop_link(h)]
                nodes.append(lk.upper if hop_direction(h) == "up" else lk.lower)
            routers = tuple(answer(n, p) for p, n in itertools.pairwise(nodes[:-1]))
            out.append(TracedPath(a.id, b.id, sport, routers, True))
    return out


def by_router_id(f: Fabric) -> Callable[[str, str], str | None]:
    rid = router_ids(f)
    return lambda node, _prev: rid[node]
