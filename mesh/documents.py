"""The HTTP API's documents of the mesh: encoders and their decoders side by side (pure).

The controller's API (`controller.api.views`) renders a `MeshSnapshot` with the encoders; the
TUI's API client (`tui.apiclient`) turns the same documents back into values with the
decoders, so what one side writes the other reads with the code beside it
(`tests/test_mesh_documents.py` round-trips each). `docs/openapi.yaml` describes the shapes.
NaN (unknown) is written as null and read back as NaN.

Encoders take what a caller may see as plain values: ``nics`` (NIC indices) and ``links``
(link ids), None meaning all; which NICs and links a tenant sees is the API's business
(`controller.api.views.Scope`).

- snapshot ``/snapshot``: `snapshot_doc`; back with `fabric_key` / `fabric_from_doc` (a
  tenant sees only its NICs: they get dense indices of their own; switch tiers follow the
  links: a NIC's leaf, the switches above leaves are spines, above spines super-spines) and
  `snapshot_from_doc`;
- one NIC ``/nics/{nic}``: `nic_doc`; links ``/links``: `links_doc`; clocks ``/clocks``:
  `clocks_doc` (their rows are read back as part of the snapshot);
- delays ``/delays``: `delays_doc`; back with `delays_from_doc` (a `DelayPairs`);
- one event (``/events`` entries, websocket ``event`` messages): `event_doc`, the finding's
  `EventDoc.to_json` with the API's sequence number; back with `event_from_doc`;
- one job (``/jobs`` entries): `job_doc`; ``/jobs`` back as the snapshot's job entries with
  `jobs_from_doc`.

Every decoder raises `contract.jsondoc.DocumentError` (a ValueError) with a one-line reason
for a document without the shape the encoder writes; unknown keys are ignored. Unknown
health states read as ``unknown`` (a newer controller may add one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from contract.jsondoc import DocumentError
from contract.jsondoc import field as read
from mesh.fabric import Fabric, FabricError, Link, Nic, Node, NodeKind
from mesh.snapshot import GpuHealth, Health, MeshSnapshot, worst

F64 = npt.NDArray[np.float64]
T = TypeVar("T")
NicRow = tuple[str, str, str, str, str]
LinkRow = tuple[str, str, str]
FabricKey = tuple[tuple[NicRow, ...], tuple[LinkRow, ...]]
"""NIC rows (id, host, leaf, group, address) and link rows (id, lower, upper) of a snapshot
document: equal keys give equal `fabric_from_doc` results."""


# ---- encoders -----------------------------------------------------------------------------------


def _null(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _shown(nics: frozenset[int] | None, i: int) -> bool:
    return nics is None or i in nics


def _shown_nics(snap: MeshSnapshot, nics: frozenset[int] | None) -> list[int]:
    return [i for i in range(len(snap.fabric.nics)) if _shown(nics, i)]


def nic_doc(snap: MeshSnapshot, i: int) -> dict[str, object]:
    """Return NIC index ``i``'s document: ids, state, worst in/out delay, its clock and its
    host's GPU health (null until the host's prober reported it)."""
    n = snap.fabric.nics[i]
    g = snap.gpu.get(n.host)
    return {
        "id": n.id,
        "index": n.index,
        "host": n.host,
        "leaf": n.leaf,
        "group": n.group,
        "address": n.address,
        "state": str(snap.nic_health[i]),
        "worst_in_ns": _null(snap.worst_in_ns[i]),
        "worst_out_ns": _null(snap.worst_out_ns[i]),
        "clock_offset_ns": _null(snap.clock_offset_ns[i]),
        "clock_uncertainty_ns": _null(snap.clock_uncertainty_ns[i]),
        "gpu": None if g is None else {"present": g.present, "ok": g.ok, "detail": g.detail},
    }


def _host_doc(snap: MeshSnapshot, host: str, nics: list[int]) -> dict[str, object]:
    """A host's row: its id, the worst state of its (shown) NICs, their ids."""
    fab = snap.fabric
    state = worst(snap.nic_health[i] for i in nics)
    return {"id": host, "state": str(state), "nics": [fab.nics[i].id for i in nics]}


def link_rows(snap: MeshSnapshot, links: frozenset[str] | None = None) -> list[dict[str, object]]:
    """Return the links (those in ``links``; None: all) with their state (``unknown`` if not
    judged) and flap count."""
    out: list[dict[str, object]] = []
    for lk in snap.fabric.links:
        if links is not None and lk.id not in links:
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


def links_doc(snap: MeshSnapshot, links: frozenset[str] | None = None) -> dict[str, object]:
    """Return the ``/links`` document: the snapshot's time and `link_rows`."""
    return {"t_ns": int(snap.t_ns), "links": link_rows(snap, links)}


def snapshot_doc(
    snap: MeshSnapshot,
    *,
    nics: frozenset[int] | None = None,
    links: frozenset[str] | None = None,
    control: bool | None,
    jobs: int | None,
) -> dict[str, object]:
    """Return the mesh snapshot document of the NICs in ``nics`` and the links in ``links``
    (None: all, ``scope`` ``fleet``; else ``tenant``): NICs, hosts (each with the worst
    state of its NICs), ECMP groups, links, counts (healthy = up, unknown = nothing measured
    them lately, unhealthy = the rest), throughput, Control and the number of running jobs
    (null when unavailable).
    Control and the job count are the last two keys (the API splices them into a cached
    fleet document)."""
    fab = snap.fabric
    vis = _shown_nics(snap, nics)
    vset = set(vis)
    hosts: dict[str, list[int]] = {}
    for i in vis:
        hosts.setdefault(fab.nics[i].host, []).append(i)
    groups = [
        {"id": g, "nics": [fab.nics[i].id for i in members if i in vset]}
        for g, members in fab.groups.items()
        if any(i in vset for i in members)
    ]
    rows = [nic_doc(snap, i) for i in vis]
    states = [snap.nic_health[i] for i in vis]
    healthy = sum(1 for h in states if h == Health.UP)
    unknown = sum(1 for h in states if h == Health.UNKNOWN)
    return {
        "t_ns": int(snap.t_ns),
        "scope": "fleet" if nics is None else "tenant",
        "nic_count": len(rows),
        "healthy_nics": healthy,
        "unknown_nics": unknown,
        "unhealthy_nics": len(rows) - healthy - unknown,
        # the controller's own lateness (issue 32): "controller behind by 3.2 s (loop lag)";
        # which probers say they are late is the operator's (host names)
        "status": snap.status or "ok",
        "behind_s": round(snap.behind_ns / 1e9, 3),
        "late_probers": {h: round(s / 1e9, 3) for h, s in sorted(snap.late_probers.items())}
        if nics is None
        else {},
        "nics": rows,
        "hosts": [_host_doc(snap, h, v) for h, v in hosts.items()],
        "groups": groups,
        "links": link_rows(snap, links),
        "throughput_bps": None if snap.throughput_bps is None else float(snap.throughput_bps),
        "control_enabled": control,
        "running_jobs": jobs,
    }


def delays_doc(
    snap: MeshSnapshot, *, nics: frozenset[int] | None = None, focus: int | None = None
) -> dict[str, object]:
    """Return the one-way delay matrix as pairs (src, dst, worst owd, per-switch owd) whose
    both ends are in ``nics`` (None: all); with ``focus`` (a NIC index) only its row (as
    source) and column (as destination), and ``nic`` names it."""
    fab = snap.fabric
    pairs: list[dict[str, object]] = []
    for s, d, v in zip(snap.owd_src.tolist(), snap.owd_dst.tolist(), snap.owd_ns.tolist(),
                       strict=True):  # fmt: skip
        if not (_shown(nics, s) and _shown(nics, d)):
            continue
        if focus is not None and focus not in (s, d):
            continue
        per = snap.path_owd.get((s, d), {})
        pairs.append({
            "src": fab.nics[s].id,
            "dst": fab.nics[d].id,
            "owd_ns": _null(v),
            "paths": [{"via": k, "owd_ns": _null(x)} for k, x in sorted(per.items())],
        })  # fmt: skip
    nic = None if focus is None else fab.nics[focus].id
    return {"t_ns": int(snap.t_ns), "nic": nic, "pairs": pairs}


def clocks_doc(snap: MeshSnapshot, nics: frozenset[int] | None = None) -> dict[str, object]:
    """Return each NIC's (in ``nics``; None: all) clock offset and its uncertainty (ns;
    null if unknown)."""
    fab = snap.fabric
    return {
        "t_ns": int(snap.t_ns),
        "clocks": [
            {
                "nic": fab.nics[i].id,
                "offset_ns": _null(snap.clock_offset_ns[i]),
                "uncertainty_ns": _null(snap.clock_uncertainty_ns[i]),
            }
            for i in _shown_nics(snap, nics)
        ],
    }


def event_doc(seq: int, ev: EventDoc) -> dict[str, object]:
    """Return the API's document of finding ``ev``: its sequence number, then
    `EventDoc.to_json`."""
    return {"seq": seq, **ev.to_json()}


def job_doc(job_id: str, tenant: str, ranks: Sequence[Sequence[str]]) -> dict[str, object]:
    """Return a job's document: id, tenant, and per rank its number and NIC ids."""
    return {
        "id": job_id,
        "tenant": tenant,
        "ranks": [{"rank": i, "nics": list(r)} for i, r in enumerate(ranks)],
    }


# ---- decoders -----------------------------------------------------------------------------------


def _obj(v: object, what: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise DocumentError(f"{what}: must be an object, got {type(v).__name__}")
    return v


def _objs(doc: Mapping[str, Any], key: str, what: str) -> list[Mapping[str, Any]]:
    """Return ``doc[key]``, a required list of objects."""
    return [_obj(v, f"{what}: {key}[{i}]") for i, v in enumerate(read(doc, key, list, what))]


def _num(doc: Mapping[str, Any], key: str, what: str) -> float:
    """Return the number ``doc[key]`` (NaN for null or absent)."""
    v = _maybe(doc, key, float, what)
    return math.nan if v is None else v


def _maybe(doc: Mapping[str, Any], key: str, kind: type[T], what: str) -> T | None:
    """Return ``doc[key]`` checked to be ``kind``; None when null or absent."""
    return None if doc.get(key) is None else read(doc, key, kind, what)


def _health(v: object) -> Health:
    try:
        return Health(v) if isinstance(v, str) else Health.UNKNOWN
    except ValueError:
        return Health.UNKNOWN


def fabric_key(doc: object) -> FabricKey:
    """Return the NIC and link rows of snapshot document ``doc`` (see `FabricKey`); raise
    `DocumentError`."""
    doc = _obj(doc, "snapshot")
    nics: list[NicRow] = []
    for i, n in enumerate(_objs(doc, "nics", "snapshot")):
        w = f"snapshot: nics[{i}]"
        nics.append((read(n, "id", str, w), read(n, "host", str, w), read(n, "leaf", str, w),
                     read(n, "group", str, w), read(n, "address", str, w)))  # fmt: skip
    links: list[LinkRow] = []
    for i, lk in enumerate(_objs(doc, "links", "snapshot")):
        w = f"snapshot: links[{i}]"
        links.append((read(lk, "id", str, w), read(lk, "lower", str, w), read(lk, "upper", str, w)))
    return tuple(nics), tuple(links)


def fabric_from_doc(doc: object) -> Fabric:
    """Return the fabric of snapshot document ``doc``: its NICs (dense indices in document
    order), their hosts and leaves, the links whose ends are known and the switches above.
    Raises `DocumentError` on a malformed document or ids the fabric model refuses."""
    nic_rows, link_list = fabric_key(doc)
    try:
        nics = tuple(Nic(i_, k, h, leaf, a, g) for k, (i_, h, leaf, g, a) in enumerate(nic_rows))
        tier: dict[str, NodeKind] = {n.leaf: NodeKind.LEAF for n in nics}
        up = {NodeKind.LEAF: NodeKind.SPINE, NodeKind.SPINE: NodeKind.SUPERSPINE}
        changed = True
        while changed:  # climb: the upper end of a leaf link is a spine, and so on
            changed = False
            for _, lower, upper in link_list:
                below = tier.get(lower)
                if below in up and upper not in tier:
                    tier[upper] = up[below]
                    changed = True
        hosts = list(dict.fromkeys(n.host for n in nics))
        nodes = [Node(h, NodeKind.HOST, i) for i, h in enumerate(hosts)]
        count: dict[NodeKind, int] = {}
        for sid, kind in tier.items():
            nodes.append(Node(sid, kind, count.get(kind, 0)))
            count[kind] = count.get(kind, 0) + 1
        known = {n.id for n in nics} | set(tier)
        kept = [(i_, lo, hi) for i_, lo, hi in link_list if lo in known and hi in known]
        links = tuple(Link(i_, k, lo, hi, 1.0, 0.0) for k, (i_, lo, hi) in enumerate(kept))
        return Fabric(tuple(nodes), nics, links)
    except FabricError as exc:
        raise DocumentError(f"snapshot: {exc}") from None


@dataclass(frozen=True, eq=False)
class DelayPairs:
    """Delay pairs in a fabric's indices: ``src``/``dst``/``owd_ns`` arrays and the per-switch
    delays of each (src, dst) that has some."""

    src: npt.NDArray[np.int32]
    dst: npt.NDArray[np.int32]
    owd_ns: F64
    paths: Mapping[tuple[int, int], Mapping[str, float]]

    @classmethod
    def empty(cls) -> DelayPairs:
        """Return no pairs."""
        z = np.zeros(0, np.int32)
        return cls(z, z.copy(), np.zeros(0), {})


def delays_from_doc(doc: object, fabric: Fabric) -> DelayPairs:
    """Return the pairs of a delays document whose NICs are in ``fabric`` (others are
    skipped: the fabric may have changed since); per-switch delays that are null are left
    out. Raises `DocumentError`."""
    idx = fabric.nic_index
    src: list[int] = []
    dst: list[int] = []
    owd: list[float] = []
    paths: dict[tuple[int, int], dict[str, float]] = {}
    for k, p in enumerate(_objs(_obj(doc, "delays"), "pairs", "delays")):
        w = f"delays: pairs[{k}]"
        s, d = idx.get(read(p, "src", str, w)), idx.get(read(p, "dst", str, w))
        per: dict[str, float] = {}
        for via in _objs(p, "paths", w) if "paths" in p else ():
            v = _num(via, "owd_ns", f"{w}: paths")
            if not math.isnan(v):
                per[read(via, "via", str, f"{w}: paths")] = v
        if s is None or d is None:
            continue
        src.append(s)
        dst.append(d)
        owd.append(_num(p, "owd_ns", w))
        if per:
            paths[(s, d)] = per
    return DelayPairs(np.array(src, np.int32), np.array(dst, np.int32),
                      np.array(owd, np.float64), paths)  # fmt: skip


def event_from_doc(doc: object, what: str = "event") -> tuple[int, EventDoc]:
    """Return (sequence number, finding) of an `event_doc` document (legacy flow triples are
    read too, see `EventDoc.from_json`); raise `DocumentError`."""
    seq = read(_obj(doc, what), "seq", int, what)
    return seq, EventDoc.from_json(doc, what)


def jobs_from_doc(doc: object) -> tuple[Mapping[str, object], ...]:
    """Return the ``/jobs`` document (``{"jobs": [job_doc, ...]}``) as the snapshot's job
    entries: ``{"name": id, "tenant", "nics": NIC ids in rank order}``, plus ``"cause"``: the
    text of its cross-layer root cause (``perf.root_cause.text``) while it has one; raise
    `DocumentError`."""
    out: list[Mapping[str, object]] = []
    for k, j in enumerate(_objs(_obj(doc, "jobs"), "jobs", "jobs")):
        w = f"jobs[{k}]"
        ranks = _objs(j, "ranks", w)
        order = sorted(range(len(ranks)), key=lambda r: read(ranks[r], "rank", int, w))
        nics = [_strs(ranks[r], "nics", f"{w}: ranks[{r}]") for r in order]
        entry: dict[str, object] = {"name": read(j, "id", str, w),
                                    "tenant": read(j, "tenant", str, w, ""),
                                    "nics": [n for r in nics for n in r]}  # fmt: skip
        perf = j.get("perf")
        rc = perf.get("root_cause") if isinstance(perf, Mapping) else None
        if isinstance(rc, Mapping):
            entry["cause"] = read(rc, "text", str, f"{w}: perf.root_cause")
        out.append(entry)
    return tuple(out)


def _strs(doc: Mapping[str, Any], key: str, what: str) -> list[str]:
    vals = read(doc, key, list, what)
    if not all(isinstance(v, str) for v in vals):
        raise DocumentError(f"{what}: {key}: must be a list of strings")
    return vals


def snapshot_from_doc(
    doc: object,
    fabric: Fabric,
    *,
    events: Iterable[tuple[int, EventDoc]] = (),
    jobs: tuple[Mapping[str, object], ...] | None = None,
    delays: DelayPairs | None = None,
) -> MeshSnapshot:
    """Return the `MeshSnapshot` of snapshot document ``doc`` on ``fabric`` (from
    `fabric_from_doc` of the same or an equal-keyed document), with the event log, the jobs
    (None = the controller has no job information: ``running_jobs`` is null) and the delay
    pairs. Raises `DocumentError`."""
    w = "snapshot"
    doc = _obj(doc, w)
    nics = _objs(doc, "nics", w)
    n = len(fabric.nics)
    if len(nics) != n:
        raise DocumentError(f"snapshot: {len(nics)} NICs for a fabric of {n}")
    keys = ("worst_in_ns", "worst_out_ns", "clock_offset_ns", "clock_uncertainty_ns")
    arr = {k: np.full(n, np.nan) for k in keys}
    health = []
    gpu: dict[str, GpuHealth] = {}
    for i, d in enumerate(nics):
        wn = f"snapshot: nics[{i}]"
        health.append(_health(d.get("state")))
        if d.get("gpu") is not None:
            g, wg = _obj(d["gpu"], f"{wn}: gpu"), f"{wn}: gpu"
            gpu[fabric.nics[i].host] = GpuHealth(
                read(g, "present", bool, wg), read(g, "ok", bool, wg, True),
                read(g, "detail", str, wg, ""),
            )  # fmt: skip
        for key, a in arr.items():
            a[i] = _num(d, key, wn)
    link_health: dict[str, Health] = {}
    flaps: dict[str, int] = {}
    for k, lk in enumerate(_objs(doc, "links", w)):
        wl = f"snapshot: links[{k}]"
        lid = read(lk, "id", str, wl)
        st = read(lk, "state", str, wl, "unknown")
        if st != "unknown":
            link_health[lid] = _health(st)
        fl = read(lk, "flaps", int, wl, 0)
        if fl:
            flaps[lid] = fl
    tp = _num(doc, "throughput_bps", w)
    running = _maybe(doc, "running_jobs", int, w)
    status = read(doc, "status", str, w, "ok")  # a controller before issue 32 has none
    behind = _num(doc, "behind_s", w)
    late = read(doc, "late_probers", dict, w, {})
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in late.values()):
        raise DocumentError("snapshot: late_probers: must be an object of numbers")
    dl = delays or DelayPairs.empty()
    return MeshSnapshot(
        t_ns=read(doc, "t_ns", int, w),
        fabric=fabric,
        nic_health=tuple(health),
        worst_in_ns=arr["worst_in_ns"],
        worst_out_ns=arr["worst_out_ns"],
        owd_src=dl.src,
        owd_dst=dl.dst,
        owd_ns=dl.owd_ns,
        clock_offset_ns=arr["clock_offset_ns"],
        clock_uncertainty_ns=arr["clock_uncertainty_ns"],
        link_health=link_health,
        flap_counts=flaps,
        path_owd=dl.paths,
        events=tuple(e for _, e in events),
        gpu=gpu,
        throughput_bps=None if math.isnan(tp) else tp,
        control_enabled=_maybe(doc, "control_enabled", bool, w),
        jobs=None if running is None else (jobs if jobs is not None else ()),
        behind_ns=0 if math.isnan(behind) else round(behind * 1e9),
        status="" if status == "ok" else status,
        late_probers={str(h): round(v * 1e9) for h, v in late.items()},
    )
