"""A prober's peers learned from the other probers' neighbours documents (pure).

Without a fabric file a prober does not know which NICs exist; every prober publishes its
own NICs (id, address) and each NIC's LLDP neighbour, retained, on
``<prefix>/neighbors/<host>`` (`contract.neighbors.NeighborsDoc`). A prober that follows
``<prefix>/neighbors/#`` (`prober.discover.follow`) therefore has the whole fleet's NICs as
soon as it subscribes, and every change after. `PeerBook` turns those documents into peers
(`prober.config.PeerConfig`): each NIC of another host with one LLDP neighbour, in the ECMP
group of that leaf (`contract.neighbors.leaf_group`, the same group the controller learns);
the probe port is the prober's own (a fleet probes on one port).

Left out, and counted: a NIC without one LLDP neighbour (``unplaced``: the controller cannot
place it either), a NIC id another host claimed first (``foreign``, first host in name order
wins, as in `contract.origin.claimed_nics`), a document whose ``host`` is not its topic's or
that does not decode (``bad``, the host keeps what it had). An empty document (the retained
message cleared: the host was removed) forgets the host. `merge_peers` lays ``[[peers]]``
entries over the learned ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from contract.jsondoc import DocumentError
from contract.neighbors import NeighborsDoc, leaf_group, leaf_of
from prober.config import PeerConfig


class PeerBook:
    """The other hosts' NICs, from their neighbours documents (module doc). ``host`` is this
    prober's host: its own document is not a source of peers."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._docs: dict[str, NeighborsDoc] = {}
        self._peers: tuple[PeerConfig, ...] = ()
        self.counters: Counter[str] = Counter()
        self.last_error = ""

    def update(self, host: str, payload: bytes | bytearray) -> bool:
        """Take ``host``'s document (the payload of ``neighbors/<host>``); return whether
        the peers changed. Never raises: a bad document is counted and ignored."""
        try:
            doc = NeighborsDoc.decode(payload)
            if doc.host and doc.host != host:
                raise DocumentError(f"neighbours of {doc.host!r} on the topic of {host!r}")
        except DocumentError as exc:
            self.counters["bad"] += 1
            self.last_error = str(exc)
            return False
        if host == self.host:
            return False
        if doc.nics:
            self._docs[host] = doc
        else:
            self._docs.pop(host, None)
        peers = self._rebuild()
        changed = peers != self._peers
        self._peers = peers
        return changed

    def peers(self) -> tuple[PeerConfig, ...]:
        """Return the learned peers, by host then NIC id."""
        return self._peers

    def _rebuild(self) -> tuple[PeerConfig, ...]:
        owner: dict[str, str] = {}
        out: list[PeerConfig] = []
        skipped: Counter[str] = Counter()
        for host in sorted(self._docs):
            for n in self._docs[host].nics:
                if owner.setdefault(n.nic, host) != host:
                    skipped["foreign"] += 1
                    continue
                leaf = leaf_of(n.neighbors)
                if not leaf:
                    skipped["unplaced"] += 1
                    continue
                out.append(PeerConfig(n.nic, n.address, leaf_group(leaf)))
        self.counters["foreign"] = skipped["foreign"]
        self.counters["unplaced"] = skipped["unplaced"]
        return tuple(out)


def merge_peers(
    explicit: Sequence[PeerConfig], learned: Sequence[PeerConfig], local: Sequence[str]
) -> tuple[PeerConfig, ...]:
    """Return ``learned`` with ``explicit`` entries in place of learned ones of the same id
    (and added when new), without the ``local`` NIC ids."""
    mine = set(local)
    over = {p.id: p for p in explicit}
    out = [over.pop(p.id, p) for p in learned if p.id not in mine]
    out += [p for p in explicit if p.id in over and p.id not in mine]
    return tuple(out)
