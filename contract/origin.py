"""Does a message come from the host whose topic it was published on? Pure checks.

The broker's ACL should already stop a prober from publishing under another host's topics
(docs/security.md); these checks are the controller's own, for a broker that is misconfigured
or a client that holds another host's valid credentials. Each function takes the decoded
message, the ``host`` of its topic (``<prefix>/<kind>/<host>``) and ``nic_host`` (NIC id ->
owning host id, from the controller's fabric) and returns None when the message may come
from ``host``, else a one-line reason starting with ``untrusted:`` (the controller drops the
message and counts it with its other bad messages).

- a probe batch: its ``origin`` is ``host`` and every NIC that sent a probe in it (the ``src``
  of each record) belongs to ``host`` (the peers it probed may be anywhere);
- a presence document: ``host`` is a fabric host and every NIC of its ``rdma`` block is one
  of ``host``'s (a forged queue pair would send other probers' probes elsewhere);
- a health document: ``host`` is a fabric host, its ``host`` field (when set) is ``host``,
  and every NIC it reports on is one of ``host``'s;
- a neighbours document (`contract.neighbors.NeighborsDoc`): its ``host`` field is ``host``
  (or empty: a cleared retained document) and none of its NICs is another host's. A NIC
  nobody claimed yet is accepted: this is the document that makes a NIC known.

With a fabric learned from the neighbours documents (`mesh.fabric.learn`), ``nic_host`` is
`claimed_nics` of them: every NIC a host reported, placed in the fabric or not yet (its
LLDP neighbour missing), so a prober's batches are judged by what it claims and the
controller's ingest drops the records of NICs it cannot place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np

from contract.documents import HealthDoc, PresenceDoc
from contract.neighbors import NeighborsDoc
from contract.records import ProbeBatch

UNTRUSTED = "untrusted"


def _foreign(nics: Iterable[str], host: str, nic_host: Mapping[str, str]) -> str | None:
    for nic in nics:
        owner = nic_host.get(nic)
        if owner != host:
            whose = f"a NIC of {owner!r}" if owner is not None else "not a NIC of the fabric"
            return f"{UNTRUSTED}: NIC {nic!r} is {whose}, not of {host!r}"
    return None


def _known_host(host: str, nic_host: Mapping[str, str]) -> str | None:
    if host not in set(nic_host.values()):
        return f"{UNTRUSTED}: host {host!r} is not in the fabric"
    return None


def batch_origin_error(batch: ProbeBatch, host: str, nic_host: Mapping[str, str]) -> str | None:
    """Return why ``batch`` cannot come from ``host`` (its topic's host), or None."""
    if batch.origin != host:
        return f"{UNTRUSTED}: batch origin {batch.origin!r} published on the topic of {host!r}"
    used = np.unique(batch.src) if len(batch) else np.zeros(0, np.uint16)
    return _foreign((batch.nic_ids[int(i)] for i in used), host, nic_host)


def presence_origin_error(doc: PresenceDoc, host: str, nic_host: Mapping[str, str]) -> str | None:
    """Return why presence ``doc`` cannot come from ``host``, or None."""
    return _known_host(host, nic_host) or _foreign(doc.rdma or (), host, nic_host)


def health_origin_error(doc: HealthDoc, host: str, nic_host: Mapping[str, str]) -> str | None:
    """Return why health ``doc`` cannot come from ``host``, or None."""
    if doc.host and doc.host != host:
        return f"{UNTRUSTED}: health of {doc.host!r} published on the topic of {host!r}"
    return _known_host(host, nic_host) or _foreign(doc.nics, host, nic_host)


def neighbors_origin_error(doc: NeighborsDoc, host: str, nic_host: Mapping[str, str]) -> str | None:
    """Return why neighbours ``doc`` cannot come from ``host``, or None (NICs no host
    claimed yet are accepted)."""
    if doc.host and doc.host != host:
        return f"{UNTRUSTED}: neighbours of {doc.host!r} published on the topic of {host!r}"
    for n in doc.nics:
        owner = nic_host.get(n.nic, host)
        if owner != host:
            return f"{UNTRUSTED}: NIC {n.nic!r} is a NIC of {owner!r}, not of {host!r}"
    return None


def claimed_nics(docs: Mapping[str, NeighborsDoc]) -> dict[str, str]:
    """Return NIC id -> host of every NIC in ``docs`` (host -> its latest neighbours document;
    each document passed `neighbors_origin_error` when it came). A NIC two hosts claim (one
    moved it before the other's document was cleared) goes to the first host in name order."""
    out: dict[str, str] = {}
    for host in sorted(docs):
        for n in docs[host].nics:
            out.setdefault(n.nic, host)
    return out


def split_by_host(batch: ProbeBatch, nic_host: Mapping[str, str]) -> dict[str, ProbeBatch]:
    """Return host -> the records of ``batch`` its NICs sent, with ``origin`` = that host (how
    a batch of many hosts, e.g. the simulator's, is published as each host's prober would).
    Records sent by NICs ``nic_host`` does not know are left out."""
    owners = np.array([nic_host.get(n, "") for n in batch.nic_ids] or [""], dtype=object)
    src_host = owners[batch.src.astype(np.intp)] if len(batch) else owners[:0]
    out: dict[str, ProbeBatch] = {}
    for host in sorted({h for h in src_host if h}):
        out[host] = dataclasses.replace(batch.select(src_host == host), origin=host)
    return out
