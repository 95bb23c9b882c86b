"""The API's views, as pure functions: a `MeshSnapshot` (and a `Scope`) in, JSON-ready
dicts out. The documents themselves are written by `mesh.documents` (where the TUI's client
reads them back with the decoders beside the encoders); a view narrows them to the caller's
scope. Nothing here reads a clock or does I/O.

A `Scope` is what a principal may see: the whole fleet (``Scope.fleet()``) or the NICs the
operator granted a tenant (`controller.tenancy.Grants`, never what its jobs declare), the hosts
they sit on and the links on the paths between them (`tenant_scope`). Views raise
`NotFound` for a NIC outside the fabric or outside the scope (the same error, so a tenant
cannot learn whether another tenant's NIC exists) and `BadQuery` for a malformed query.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contract.documents import SEVERITIES, EventDoc
from controller.jobs import Job
from controller.query import int_param, time_range
from mesh.documents import clocks_doc, delays_doc, event_doc, job_doc, link_rows, snapshot_doc
from mesh.fabric import Fabric
from mesh.snapshot import MeshSnapshot

MAX_EVENTS = 1000


class NotFound(LookupError):
    """No such thing in the caller's scope."""


class BadQuery(ValueError):
    """A malformed query or body (400)."""


class Forbidden(ValueError):
    """Something this principal may not do, whatever exists (403)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """What a principal sees: ``nics`` (indices), ``hosts`` and ``links`` (ids); None = all.
    ``foreign_jobs``: the ids of other tenants' jobs (never shown, not even in free text)."""

    nics: frozenset[int] | None = None
    hosts: frozenset[str] | None = None
    links: frozenset[str] | None = None
    foreign_jobs: frozenset[str] = frozenset()

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
        """Return True if an event on ``target`` (NIC, host or link id, a directed hop
        ``leaf0->spine1`` as contention findings name it: visible with its link, or a queue
        pair ``nic0->nic2``: visible with both NICs) is in scope."""
        if self.nics is None:
            return True
        i = fabric.nic_index.get(target)
        if i is not None:
            return i in self.nics
        if "->" in target:
            a, _, b = target.partition("->")
            ia, ib = fabric.nic_index.get(a), fabric.nic_index.get(b)
            if ia is not None and ib is not None:
                return ia in self.nics and ib in self.nics
            return self.links is not None and bool({f"{a}-{b}", f"{b}-{a}"} & self.links)
        return (self.hosts is not None and target in self.hosts) or (
            self.links is not None and target in self.links
        )

    def word_visible(self, fabric: Fabric, word: str) -> bool:
        """Return False if ``word`` names a NIC, host, link or directed hop out of scope, or
        another tenant's job; True for anything else (switches, kinds, numbers, ...)."""
        if self.nics is None:
            return True
        if word in self.foreign_jobs:
            return False
        named = (word in fabric.nic_index or word in fabric.host_index
                 or word in fabric.link_index or "->" in word)  # fmt: skip
        return not named or self.target_visible(fabric, word)

    def redact(self, fabric: Fabric, text: str) -> str:
        """Return ``text`` with every word out of scope (`word_visible`) replaced by
        ``(hidden)``: free text (an event's detail, an action's reason) may name other
        tenants' NICs, links and jobs."""
        if self.nics is None:
            return text

        def one(m: re.Match[str]) -> str:
            word = m.group(0).rstrip(".,:;")
            if self.word_visible(fabric, word):
                return m.group(0)
            return "(hidden)" + m.group(0)[len(word) :]

        return _WORD.sub(one, text)


_WORD = re.compile(r"[A-Za-z0-9_.:>-]+")


def tenant_scope(
    fabric: Fabric, nic_ids: Iterable[str], foreign_jobs: frozenset[str] = frozenset()
) -> Scope:
    """Return the scope of a tenant granted ``nic_ids`` (ids not in the fabric are ignored):
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
    return Scope(idx, hosts, frozenset(links), foreign_jobs)


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
    """Return the filters of query string ``q``; raise `BadQuery` on unknown keys, times
    that are not ASCII-digit integers in 0..2**63-1, an unknown severity, a kind or target
    outside 1..128 characters or a limit outside 1..MAX_EVENTS. A range whose end is not
    after its start matches nothing."""
    unknown = set(q) - {"since_ns", "until_ns", "kind", "target", "severity", "limit"}
    if unknown:
        raise BadQuery(f"unknown query parameter {sorted(unknown)[0]!r}")
    since, until = time_range(q, BadQuery)
    sev = q.get("severity")
    if sev is not None and sev not in SEVERITIES:
        raise BadQuery(f"severity must be one of {', '.join(SEVERITIES)}")
    for key in ("kind", "target"):
        v = q.get(key)
        if v is not None and not (0 < len(v) <= 128):
            raise BadQuery(f"{key} must be 1..128 characters")
    limit = _int_param(q, "limit", 1, MAX_EVENTS)
    return EventQuery(since, until, q.get("kind"), q.get("target"), sev, limit or 200)


def _flows_visible(fabric: Fabric, scope: Scope, flows: Iterable[Sequence[object]]) -> list[Any]:
    idx = fabric.nic_index
    return [
        f for f in flows
        if len(f) >= 2 and scope.nic_visible(idx.get(str(f[0]), -1))
        and scope.nic_visible(idx.get(str(f[1]), -1))
    ]  # fmt: skip


def event_view(ev: EventDoc, fabric: Fabric, scope: Scope, seq: int) -> dict[str, object]:
    """Return one event's document (`mesh.documents.event_doc`); for a tenant, its affected
    queue pairs limited to the scope's NICs, ``related`` empty when out of scope and the
    detail redacted (`Scope.redact`)."""
    if not scope.is_fleet:
        flows = tuple(_flows_visible(fabric, scope, ev.flows))
        related = ev.related if scope.target_visible(fabric, ev.related) else ""
        detail = scope.redact(fabric, ev.detail)
        if (flows, related, detail) != (ev.flows, ev.related, ev.detail):
            ev = replace(ev, flows=flows, related=related, detail=detail)
    return event_doc(seq, ev)


def actions_view(doc: Mapping[str, Any], fabric: Fabric, scope: Scope) -> dict[str, Any]:
    """Return ``/actions`` (`ActionLog.query`'s answer) as ``scope`` sees it: for a tenant,
    each action's NIC or link blank when out of scope, its queue pairs limited to the scope,
    its reason and finding redacted (`Scope.redact`)."""
    if scope.is_fleet:
        return dict(doc)
    out = []
    for orig in doc["actions"]:
        a = dict(orig)
        for key in ("nic", "link"):
            if a.get(key) and not scope.target_visible(fabric, a[key]):
                a[key] = ""
        for key in ("reason", "finding"):
            if isinstance(a.get(key), str):
                a[key] = scope.redact(fabric, a[key])
        if "flows" in a:
            a["flows"] = _flows_visible(fabric, scope, a["flows"])
        out.append(a)
    return {**doc, "actions": out}


def perf_view(perf: Mapping[str, Any], fabric: Fabric, scope: Scope) -> dict[str, Any]:
    """Return a job's ``perf`` as ``scope`` sees it: links and queue pairs out of scope left
    out, the text redacted."""
    out = dict(perf)
    if scope.is_fleet:
        return out
    if isinstance(out.get("text"), str):
        out["text"] = scope.redact(fabric, out["text"])
    if isinstance(out.get("links"), list):
        out["links"] = [lk for lk in out["links"] if scope.target_visible(fabric, str(lk))]
    if isinstance(out.get("flows"), list):
        out["flows"] = [f for f in out["flows"] if _flows_visible(fabric, scope, [_pair(f)])]
    return out


def _pair(flow: Any) -> list[object]:
    if isinstance(flow, Mapping):
        return [flow.get("src"), flow.get("dst")]
    return list(flow) if isinstance(flow, Sequence) else []


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
    jobs: Sequence[Job],
    status: Callable[[str], Mapping[str, object] | None] | None = None,
    fabric: Fabric | None = None,
    scope: Scope | None = None,
) -> dict[str, object]:
    """Return the jobs as JSON-ready values; with ``status``, each job's ``perf`` (its step
    time, baseline, slowdown, collective timeouts and the slowdown's attribution; null
    before its first report), as ``scope`` sees it (`perf_view`) on ``fabric``."""
    out = []
    for j in jobs:
        doc = job_doc(j.id, j.tenant, j.ranks)
        if status is not None:
            st = status(j.id)
            if st is not None and fabric is not None and scope is not None:
                st = perf_view(st, fabric, scope)
            doc["perf"] = dict(st) if st is not None else None
        out.append(doc)
    return {"jobs": out}
