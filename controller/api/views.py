"""The API's views, as pure functions: a `MeshSnapshot` (and a `Scope`) in, JSON-ready
dicts out. The documents themselves are written by `mesh.documents` (where the TUI's client
reads them back with the decoders beside the encoders); a view narrows them to the caller's
scope. Nothing here reads a clock or does I/O.

A `Scope` is what a principal may see: the whole fleet (``Scope.fleet()``) or a tenant's NICs,
the hosts they sit on and the links on the paths between them (`tenant_scope`). Views raise
`NotFound` for a NIC outside the fabric or outside the scope (the same error, so a tenant
cannot learn whether another tenant's NIC exists) and `BadQuery` for a malformed query.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from contract.documents import SEVERITIES, EventDoc
from controller.jobs import Job
from controller.query import int_param
from mesh.documents import clocks_doc, delays_doc, event_doc, job_doc, link_rows, snapshot_doc
from mesh.fabric import Fabric
from mesh.snapshot import MeshSnapshot

MAX_EVENTS = 1000


class NotFound(LookupError):
    """No such thing in the caller's scope."""


class BadQuery(ValueError):
    """A malformed or contradictory query."""


@dataclass(frozen=True, slots=True)
class Scope:
    """What a principal sees: ``nics`` (indices), ``hosts`` and ``links`` (ids); None = all."""

    nics: frozenset[int] | None = None
    hosts: frozenset[str] | None = None
    links: frozenset[str] | None = None

    @classmethod
    def fleet(cls) -> Scope:
        """Return the operator's scope (everything)."""
        return cls()

    @property
    def is_fleet(self) -> bool:
        """Return True if nothing is hidden."""
        return self.nics is None

    def nic_visible(self, i: int) -> bool:
        """Return True if NIC index ``i`` is in scope."""
        return self.nics is None or i in self.nics

    def link_visible(self, link: str) -> bool:
        """Return True if link ``link`` is in scope."""
        return self.links is None or link in self.links

    def target_visible(self, fabric: Fabric, target: str) -> bool:
        """Return True if an event on ``target`` (NIC, host or link id, or a directed hop
        ``leaf0->spine1`` as contention findings name it: visible with its link) is in scope."""
        if self.nics is None:
            return True
        i = fabric.nic_index.get(target)
        if i is not None:
            return i in self.nics
        if "->" in target:
            a, _, b = target.partition("->")
            return self.links is not None and bool({f"{a}-{b}", f"{b}-{a}"} & self.links)
        return (self.hosts is not None and target in self.hosts) or (
            self.links is not None and target in self.links
        )


def tenant_scope(fabric: Fabric, nic_ids: Iterable[str]) -> Scope:
    """Return the scope of a tenant using ``nic_ids`` (ids not in the fabric are ignored):
    those NICs, their hosts, their NIC links and the switch links paths between them can
    cross (the uplinks of their leaves if they span several leaves, and the uplinks of the
    switches above those leaves if the leaves span several pods)."""
    idx = frozenset(fabric.nic_index[n] for n in nic_ids if n in fabric.nic_index)
    nics = [fabric.nics[i] for i in sorted(idx)]
    hosts = frozenset(n.host for n in nics)
    ids = {n.id for n in nics}
    leaves = {n.leaf for n in nics}
    links = {lk.id for lk in fabric.links if lk.lower in ids}
    if len(leaves) > 1:
        ups = [lk for lk in fabric.links if lk.lower in leaves]
        links.update(lk.id for lk in ups)
        pods = {fabric.node_by_id[leaf].pod for leaf in leaves}
        if len(pods) > 1:
            above = {lk.upper for lk in ups}
            links.update(lk.id for lk in fabric.links if lk.lower in above)
    return Scope(idx, hosts, frozenset(links))


def nic_index(snap: MeshSnapshot, scope: Scope, nic: str) -> int:
    """Return the index of NIC id ``nic``; raise `NotFound` if unknown or out of scope."""
    i = snap.fabric.nic_index.get(nic)
    if i is None or not scope.nic_visible(i):
        raise NotFound(f"no NIC {nic!r}")
    return i


def links_view(snap: MeshSnapshot, scope: Scope) -> list[dict[str, object]]:
    """Return the visible links with state (``unknown`` if not judged) and flap count."""
    return link_rows(snap, scope.links)


def snapshot_view(
    snap: MeshSnapshot, scope: Scope, *, control: bool | None, jobs: int | None
) -> dict[str, object]:
    """Return the mesh snapshot of what ``scope`` sees (`mesh.documents.snapshot_doc`)."""
    return snapshot_doc(snap, nics=scope.nics, links=scope.links, control=control, jobs=jobs)


def delays_view(snap: MeshSnapshot, scope: Scope, nic: str | None) -> dict[str, object]:
    """Return the one-way delay pairs between visible NICs, or with ``nic`` its row and
    column (`mesh.documents.delays_doc`). Raises `NotFound` for an unknown or hidden NIC."""
    focus = None if nic is None else nic_index(snap, scope, nic)
    return delays_doc(snap, nics=scope.nics, focus=focus)


def clocks_view(snap: MeshSnapshot, scope: Scope) -> dict[str, object]:
    """Return each visible NIC's clock offset and its uncertainty (ns; null if unknown)."""
    return clocks_doc(snap, scope.nics)


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Event filters: time range [since_ns, until_ns), kind, target, severity, limit."""

    since_ns: int | None = None
    until_ns: int | None = None
    kind: str | None = None
    target: str | None = None
    severity: str | None = None
    limit: int = 200


def _int_param(q: Mapping[str, str], key: str, lo: int, hi: int) -> int | None:
    return int_param(q, key, lo, hi, BadQuery)


def parse_event_query(q: Mapping[str, str]) -> EventQuery:
    """Return the filters of query string ``q``; raise `BadQuery` on unknown keys, non-integer
    or empty time ranges, an unknown severity or a limit outside 1..MAX_EVENTS."""
    unknown = set(q) - {"since_ns", "until_ns", "kind", "target", "severity", "limit"}
    if unknown:
        raise BadQuery(f"unknown query parameter {sorted(unknown)[0]!r}")
    since = _int_param(q, "since_ns", 0, 2**63 - 1)
    until = _int_param(q, "until_ns", 0, 2**63 - 1)
    if since is not None and until is not None and until <= since:
        raise BadQuery("until_ns must be after since_ns")
    sev = q.get("severity")
    if sev is not None and sev not in SEVERITIES:
        raise BadQuery(f"severity must be one of {', '.join(SEVERITIES)}")
    for key in ("kind", "target"):
        v = q.get(key)
        if v is not None and not (0 < len(v) <= 128):
            raise BadQuery(f"{key} must be 1..128 characters")
    limit = _int_param(q, "limit", 1, MAX_EVENTS)
    return EventQuery(since, until, q.get("kind"), q.get("target"), sev, limit or 200)


def event_view(ev: EventDoc, fabric: Fabric, scope: Scope, seq: int) -> dict[str, object]:
    """Return one event's document (`mesh.documents.event_doc`), its affected queue pairs
    limited to the scope's NICs."""
    if not scope.is_fleet:
        idx = fabric.nic_index
        flows = tuple(
            f for f in ev.flows
            if scope.nic_visible(idx.get(f[0], -1)) and scope.nic_visible(idx.get(f[1], -1))
        )  # fmt: skip
        if flows != ev.flows:
            ev = replace(ev, flows=flows)
    return event_doc(seq, ev)


def event_matches(ev: EventDoc, q: EventQuery) -> bool:
    """Return True if ``ev`` passes the filters of ``q`` (not the limit)."""
    return (
        (q.since_ns is None or ev.t_ns >= q.since_ns)
        and (q.until_ns is None or ev.t_ns < q.until_ns)
        and (q.kind is None or ev.kind == q.kind)
        and (q.target is None or ev.target == q.target)
        and (q.severity is None or ev.severity == q.severity)
    )


def events_view(
    events: Sequence[tuple[int, EventDoc]], fabric: Fabric, scope: Scope, q: EventQuery
) -> dict[str, object]:
    """Return the visible events (``(seq, event)``, oldest first) passing ``q``: the newest
    ``q.limit`` of them, oldest first, and whether older ones were cut."""
    hits = [
        (seq, ev)
        for seq, ev in events
        if event_matches(ev, q) and scope.target_visible(fabric, ev.target)
    ]
    cut = len(hits) > q.limit
    hits = hits[-q.limit :]
    return {"events": [event_view(ev, fabric, scope, s) for s, ev in hits], "truncated": cut}


def jobs_view(
    jobs: Sequence[Job], status: Callable[[str], Mapping[str, object] | None] | None = None
) -> dict[str, object]:
    """Return the jobs as JSON-ready values; with ``status``, each job's ``perf`` (its step
    time, baseline, slowdown, collective timeouts and the slowdown's attribution; null
    before its first report)."""
    out = []
    for j in jobs:
        doc = job_doc(j.id, j.tenant, j.ranks)
        if status is not None:
            st = status(j.id)
            doc["perf"] = dict(st) if st is not None else None
        out.append(doc)
    return {"jobs": out}
