"""The API's documents, as pure functions: a `MeshSnapshot` (and a `Scope`) in, JSON-ready
dicts out. NaN (unknown) becomes null. Nothing here reads a clock or does I/O.

A `Scope` is what a principal may see: the whole fleet (``Scope.fleet()``) or a tenant's NICs,
the hosts they sit on and the links on the paths between them (`tenant_scope`). Views raise
`NotFound` for a NIC outside the fabric or outside the scope (the same error, so a tenant
cannot learn whether another tenant's NIC exists) and `BadQuery` for a malformed query.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from contract.documents import EventDoc
from controller.jobs import Job
from controller.query import int_param
from mesh.fabric import Fabric
from mesh.snapshot import MeshSnapshot

SEVERITIES = ("info", "warning", "critical")
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


def _num(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def nic_index(snap: MeshSnapshot, scope: Scope, nic: str) -> int:
    """Return the index of NIC id ``nic``; raise `NotFound` if unknown or out of scope."""
    i = snap.fabric.nic_index.get(nic)
    if i is None or not scope.nic_visible(i):
        raise NotFound(f"no NIC {nic!r}")
    return i


def nic_doc(snap: MeshSnapshot, i: int) -> dict[str, object]:
    """Return NIC ``i``'s document: ids, state, worst in/out delay, its clock and its host's
    GPU health (null until the host's prober reported it)."""
    n = snap.fabric.nics[i]
    return {
        "id": n.id,
        "index": n.index,
        "host": n.host,
        "leaf": n.leaf,
        "group": n.group,
        "address": n.address,
        "state": str(snap.nic_health[i]),
        "worst_in_ns": _num(snap.worst_in_ns[i]),
        "worst_out_ns": _num(snap.worst_out_ns[i]),
        "clock_offset_ns": _num(snap.clock_offset_ns[i]),
        "clock_uncertainty_ns": _num(snap.clock_uncertainty_ns[i]),
        "gpu": _gpu_doc(snap, n.host),
    }


def _gpu_doc(snap: MeshSnapshot, host: str) -> dict[str, object] | None:
    g = snap.gpu.get(host)
    return None if g is None else {"present": g.present, "ok": g.ok, "detail": g.detail}


def _visible_nics(snap: MeshSnapshot, scope: Scope) -> list[int]:
    n = len(snap.fabric.nics)
    return [i for i in range(n) if scope.nic_visible(i)]


def links_view(snap: MeshSnapshot, scope: Scope) -> list[dict[str, object]]:
    """Return the visible links with state (``unknown`` if not judged) and flap count."""
    out: list[dict[str, object]] = []
    for lk in snap.fabric.links:
        if not scope.link_visible(lk.id):
            continue
        h = snap.link_health.get(lk.id)
        out.append({
            "id": lk.id,
            "lower": lk.lower,
            "upper": lk.upper,
            "state": str(h) if h is not None else "unknown",
            "flaps": int(snap.flap_counts.get(lk.id, 0)),
        })  # fmt: skip
    return out


def snapshot_view(
    snap: MeshSnapshot, scope: Scope, *, control: bool | None, jobs: int | None
) -> dict[str, object]:
    """Return the mesh snapshot: NICs, hosts, ECMP groups, links, counts, throughput,
    Control and the number of running jobs (null when unavailable)."""
    fab = snap.fabric
    vis = _visible_nics(snap, scope)
    vset = set(vis)
    hosts: dict[str, list[str]] = {}
    for i in vis:
        hosts.setdefault(fab.nics[i].host, []).append(fab.nics[i].id)
    groups = [
        {"id": g, "nics": [fab.nics[i].id for i in members if i in vset]}
        for g, members in fab.groups.items()
        if any(i in vset for i in members)
    ]
    nics = [nic_doc(snap, i) for i in vis]
    return {
        "t_ns": int(snap.t_ns),
        "scope": "fleet" if scope.is_fleet else "tenant",
        "nic_count": len(nics),
        "healthy_nics": sum(1 for d in nics if d["state"] == "up"),
        "nics": nics,
        "hosts": [{"id": h, "nics": v} for h, v in hosts.items()],
        "groups": groups,
        "links": links_view(snap, scope),
        "throughput_bps": None if snap.throughput_bps is None else float(snap.throughput_bps),
        "control_enabled": control,
        "running_jobs": jobs,
    }


def delays_view(snap: MeshSnapshot, scope: Scope, nic: str | None) -> dict[str, object]:
    """Return the one-way delay matrix as pairs (src, dst, worst owd, per-spine owd): all
    visible pairs, or with ``nic`` its row (as source) and column (as destination).
    Raises `NotFound` for an unknown or hidden NIC."""
    fab = snap.fabric
    only = None if nic is None else nic_index(snap, scope, nic)
    pairs: list[dict[str, object]] = []
    for s, d, v in zip(snap.owd_src.tolist(), snap.owd_dst.tolist(), snap.owd_ns.tolist(),
                       strict=True):  # fmt: skip
        if not (scope.nic_visible(s) and scope.nic_visible(d)):
            continue
        if only is not None and only not in (s, d):
            continue
        per = snap.path_owd.get((s, d), {})
        pairs.append({
            "src": fab.nics[s].id,
            "dst": fab.nics[d].id,
            "owd_ns": _num(v),
            "paths": [{"via": k, "owd_ns": _num(x)} for k, x in sorted(per.items())],
        })  # fmt: skip
    return {"t_ns": int(snap.t_ns), "nic": nic, "pairs": pairs}


def clocks_view(snap: MeshSnapshot, scope: Scope) -> dict[str, object]:
    """Return each visible NIC's clock offset and its uncertainty (ns; null if unknown)."""
    fab = snap.fabric
    return {
        "t_ns": int(snap.t_ns),
        "clocks": [
            {
                "nic": fab.nics[i].id,
                "offset_ns": _num(snap.clock_offset_ns[i]),
                "uncertainty_ns": _num(snap.clock_uncertainty_ns[i]),
            }
            for i in _visible_nics(snap, scope)
        ],
    }


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


def event_doc(ev: EventDoc, fabric: Fabric, scope: Scope, seq: int) -> dict[str, object]:
    """Return one event (its affected queue pairs limited to the scope's NICs)."""
    idx = fabric.nic_index
    flows = [
        {"src": s, "dst": d, "sport": p}
        for s, d, p in ev.flows
        if scope.is_fleet
        or (scope.nic_visible(idx.get(s, -1)) and scope.nic_visible(idx.get(d, -1)))
    ]
    return {"seq": seq, "t_ns": ev.t_ns, "kind": ev.kind, "target": ev.target,
            "severity": ev.severity, "detail": ev.detail, "flows": flows,
            "related": ev.related}  # fmt: skip


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
    return {"events": [event_doc(ev, fabric, scope, s) for s, ev in hits], "truncated": cut}


def jobs_view(
    jobs: Sequence[Job], status: Callable[[str], Mapping[str, object] | None] | None = None
) -> dict[str, object]:
    """Return the jobs as JSON-ready values; with ``status``, each job's ``perf`` (its step
    time, baseline, slowdown, collective timeouts and the slowdown's attribution; null
    before its first report)."""
    out = []
    for j in jobs:
        doc = j.to_dict()
        if status is not None:
            st = status(j.id)
            doc["perf"] = dict(st) if st is not None else None
        out.append(doc)
    return {"jobs": out}
