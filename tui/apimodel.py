"""The API's JSON documents back into `MeshSnapshot` values (pure: documents in, values out).

`qpmesh tui --api` reads a remote controller's ``/api/v1/`` documents (`docs/api.md`); this
module turns them into what the screen reads, with no I/O and no clock:

- `fabric_from_doc` rebuilds a `Fabric` from the snapshot document's NICs and links (a tenant
  sees only its NICs: they get dense indices of their own). Switch tiers follow the links: a
  NIC's leaf, the switches above leaves (spines), above spines (super-spines).
- `event_from_doc`, `merge_events` keep the event log: new events by sequence number, the
  whole log replaced when the controller restarted (its sequence numbers start again).
- `jobs_from_doc` turns ``/jobs`` into the screen's ``{"name", "nics"}`` entries.
- `delays_from_doc` turns ``/delays?nic=N`` into the pair arrays and per-spine delays.
- `build_snapshot` puts it together; `HistoryRing` keeps the per-NIC worst delay over time
  (one sample per ``min_spacing_s`` of controller time) for the sparkline.

Every function raises `ApiDocError` (a ValueError) for a document that does not have the
shape `docs/openapi.yaml` describes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from mesh.fabric import Fabric, Link, Nic, Node, NodeKind
from mesh.fabric.model import FabricError
from mesh.snapshot import GpuHealth, Health, MeshSnapshot

F64 = npt.NDArray[np.float64]
MAX_EVENTS = 5000


class ApiDocError(ValueError):
    """An API document without the expected shape."""


def _get(doc: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if not isinstance(doc, Mapping) or key not in doc:
        raise ApiDocError(f"{where}: missing {key!r}")
    v = doc[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise ApiDocError(f"{where}: {key!r} has the wrong type ({type(v).__name__})")
    return v


def _num(v: object) -> float:
    """Return a float of a JSON number, NaN for null."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ApiDocError(f"expected a number or null, got {type(v).__name__}")
    return float(v)


def _health(v: object) -> Health:
    try:
        return Health(str(v))
    except ValueError:
        return Health.UNKNOWN


FabricKey = tuple[tuple[tuple[str, str, str, str, str], ...], tuple[tuple[str, str, str], ...]]


def fabric_key(doc: Mapping[str, Any]) -> FabricKey:
    """Return what identifies the fabric of a snapshot document (NIC and link ids and ends):
    equal keys = the same `fabric_from_doc` result, so it need not be rebuilt."""
    nics = _get(doc, "nics", list, "snapshot")
    links = _get(doc, "links", list, "snapshot")
    try:
        return (
            tuple(
                (str(n["id"]), str(n["host"]), str(n["leaf"]), str(n["group"]), str(n["address"]))
                for n in nics
            ),
            tuple((str(lk["id"]), str(lk["lower"]), str(lk["upper"])) for lk in links),
        )
    except (KeyError, TypeError) as exc:
        raise ApiDocError(f"snapshot: a NIC or link lacks {exc}") from None


def fabric_from_doc(doc: Mapping[str, Any]) -> Fabric:
    """Return the fabric of a snapshot document: its NICs (dense indices in document order),
    their hosts and leaves, the links whose ends are known and the switches above. Raises
    `ApiDocError` on a malformed document or ids the fabric model refuses."""
    nic_rows, link_rows = fabric_key(doc)
    try:
        nics = tuple(Nic(i_, k, h, leaf, a, g) for k, (i_, h, leaf, g, a) in enumerate(nic_rows))
        nic_ids = {n.id for n in nics}
        tier: dict[str, NodeKind] = {n.leaf: NodeKind.LEAF for n in nics}
        up = {NodeKind.LEAF: NodeKind.SPINE, NodeKind.SPINE: NodeKind.SUPERSPINE}
        changed = True
        while changed:  # climb: the upper end of a leaf link is a spine, and so on
            changed = False
            for _, lower, upper in link_rows:
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
        known = nic_ids | set(tier)
        kept = [(i_, lo, hi) for i_, lo, hi in link_rows if lo in known and hi in known]
        links = tuple(Link(i_, k, lo, hi, 1.0, 0.0) for k, (i_, lo, hi) in enumerate(kept))
        return Fabric(tuple(nodes), nics, links)
    except FabricError as exc:
        raise ApiDocError(f"snapshot: {exc}") from None


def event_from_doc(doc: Mapping[str, Any]) -> tuple[int, EventDoc]:
    """Return (sequence number, event) of one event document; raise `ApiDocError`."""
    w = "event"
    flows = []
    for f in _get(doc, "flows", list, w) if "flows" in doc else []:
        if not isinstance(f, Mapping):
            raise ApiDocError("event: a flow is not an object")
        flows.append((str(f.get("src", "")), str(f.get("dst", "")), int(f.get("sport", 0))))
    try:
        ev = EventDoc(
            int(_get(doc, "t_ns", int, w)),
            str(_get(doc, "kind", str, w)),
            str(_get(doc, "target", str, w)),
            str(doc.get("detail", "")),
            str(doc.get("severity", "warning")),
            tuple(flows),
            str(doc.get("related", "")),
        )
    except ValueError as exc:
        raise ApiDocError(f"event: {exc}") from None
    return int(_get(doc, "seq", int, w)), ev


def merge_events(
    have: Sequence[tuple[int, EventDoc]],
    got: Sequence[tuple[int, EventDoc]],
    *,
    restarted: bool = False,
    limit: int = MAX_EVENTS,
) -> tuple[tuple[int, EventDoc], ...]:
    """Return the event log ``have`` with ``got`` added: only events with a sequence number
    above the newest of ``have`` (what was already seen is not repeated), ordered by sequence
    number, the newest ``limit`` kept. ``restarted`` (the controller started again, so its
    sequence numbers did too): ``got`` replaces the log."""
    base: list[tuple[int, EventDoc]] = [] if restarted else list(have)
    last = base[-1][0] if base else 0
    new = sorted((s, e) for s, e in got if s > last) if got else []
    seen: set[int] = set()
    uniq = []
    for s, e in new:
        if s not in seen:
            seen.add(s)
            uniq.append((s, e))
    out = base + uniq
    return tuple(out[-limit:])


def jobs_from_doc(doc: Mapping[str, Any]) -> tuple[Mapping[str, object], ...]:
    """Return the ``/jobs`` document as the screen's jobs: ``{"name": id, "tenant", "nics":
    NIC ids in rank order}``; raise `ApiDocError`."""
    out: list[Mapping[str, object]] = []
    for j in _get(doc, "jobs", list, "jobs"):
        ranks = sorted(
            _get(j, "ranks", list, "job"), key=lambda r: int(_get(r, "rank", int, "rank"))
        )
        nics = [str(n) for r in ranks for n in _get(r, "nics", list, "rank")]
        out.append({"name": str(_get(j, "id", str, "job")), "tenant": str(j.get("tenant", "")),
                    "nics": nics})  # fmt: skip
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Delays:
    """Delay pairs in a fabric's indices: ``src``/``dst``/``owd_ns`` arrays and per-path
    delays per (src, dst)."""

    src: npt.NDArray[np.int32]
    dst: npt.NDArray[np.int32]
    owd_ns: F64
    paths: Mapping[tuple[int, int], Mapping[str, float]]

    @classmethod
    def empty(cls) -> Delays:
        """Return no pairs."""
        z = np.zeros(0, np.int32)
        return cls(z, z.copy(), np.zeros(0), {})


def delays_from_doc(doc: Mapping[str, Any], fabric: Fabric) -> Delays:
    """Return the pairs of a ``/delays`` document whose NICs are in ``fabric`` (others are
    skipped: the fabric may have changed since); raise `ApiDocError`."""
    idx = fabric.nic_index
    src: list[int] = []
    dst: list[int] = []
    owd: list[float] = []
    paths: dict[tuple[int, int], dict[str, float]] = {}
    for p in _get(doc, "pairs", list, "delays"):
        s = idx.get(str(_get(p, "src", str, "pair")))
        d = idx.get(str(_get(p, "dst", str, "pair")))
        if s is None or d is None:
            continue
        src.append(s)
        dst.append(d)
        owd.append(_num(p.get("owd_ns")))
        per = {}
        for via in p.get("paths") or []:
            v = _num(via.get("owd_ns") if isinstance(via, Mapping) else None)
            if isinstance(via, Mapping) and not math.isnan(v):
                per[str(via.get("via", "?"))] = v
        if per:
            paths[(s, d)] = per
    return Delays(np.array(src, np.int32), np.array(dst, np.int32), np.array(owd, np.float64),
                  paths)  # fmt: skip


def build_snapshot(
    doc: Mapping[str, Any],
    fabric: Fabric,
    *,
    events: Sequence[tuple[int, EventDoc]] = (),
    jobs: tuple[Mapping[str, object], ...] | None = None,
    delays: Delays | None = None,
) -> MeshSnapshot:
    """Return the `MeshSnapshot` of snapshot document ``doc`` on ``fabric`` (from
    `fabric_from_doc` of the same or an equal-keyed document), with the event log, the jobs
    (None = the controller has no job information: ``running_jobs`` is null) and the delay
    pairs of the focused NIC. Raises `ApiDocError`."""
    w = "snapshot"
    nics = _get(doc, "nics", list, w)
    n = len(fabric.nics)
    if len(nics) != n:
        raise ApiDocError(f"snapshot: {len(nics)} NICs for a fabric of {n}")
    arr = {k: np.full(n, np.nan) for k in ("worst_in_ns", "worst_out_ns", "clock_offset_ns",
                                            "clock_uncertainty_ns")}  # fmt: skip
    health = []
    gpu: dict[str, GpuHealth] = {}
    for i, d in enumerate(nics):
        if not isinstance(d, Mapping):
            raise ApiDocError("snapshot: a NIC is not an object")
        health.append(_health(d.get("state")))
        g = d.get("gpu")
        if isinstance(g, Mapping) and isinstance(g.get("present"), bool):
            gpu[fabric.nics[i].host] = GpuHealth(
                g["present"], bool(g.get("ok", True)), str(g.get("detail", ""))
            )
        for k, a in arr.items():
            a[i] = _num(d.get(k))
    link_health: dict[str, Health] = {}
    flaps: dict[str, int] = {}
    for lk in _get(doc, "links", list, w):
        lid = str(_get(lk, "id", str, "link"))
        st = lk.get("state")
        if st not in (None, "unknown"):
            link_health[lid] = _health(st)
        fl = lk.get("flaps", 0)
        if isinstance(fl, int) and not isinstance(fl, bool) and fl:
            flaps[lid] = fl
    tp = doc.get("throughput_bps")
    ctl = doc.get("control_enabled")
    running = doc.get("running_jobs")
    dl = delays or Delays.empty()
    return MeshSnapshot(
        t_ns=int(_get(doc, "t_ns", int, w)),
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
        throughput_bps=None if tp is None else _num(tp),
        control_enabled=ctl if isinstance(ctl, bool) else None,
        jobs=None if running is None else (jobs if jobs is not None else ()),
    )


class HistoryRing:
    """Per-NIC worst delay (max of in and out) over controller time, for the sparkline.

    `add(t_ns, worst_in, worst_out)` keeps one sample per ``min_spacing_s`` (later samples in
    the same slot are dropped) up to ``capacity`` samples (oldest dropped); a time before the
    newest sample (the controller restarted) starts over. `window(nic, window_s)` returns
    (times in s relative to the newest sample, values)."""

    def __init__(self, n: int, *, capacity: int = 3600, min_spacing_s: float = 1.0) -> None:
        if capacity < 1 or min_spacing_s < 0:
            raise ValueError("capacity must be >= 1 and min_spacing_s >= 0")
        self.n, self.capacity, self.spacing_ns = n, capacity, int(min_spacing_s * 1e9)
        self._t = np.zeros(capacity, np.int64)
        self._v = np.full((capacity, n), np.nan, np.float32)
        self._head = 0
        self._count = 0

    def add(self, t_ns: int, worst_in: F64, worst_out: F64) -> None:
        """Record the worst delays of every NIC at ``t_ns`` (arrays of length ``n``)."""
        if self._count:
            last = int(self._t[(self._head - 1) % self.capacity])
            if t_ns < last:
                self._head = self._count = 0
            elif t_ns - last < self.spacing_ns or t_ns == last:
                return
        with np.errstate(invalid="ignore"):
            self._v[self._head] = np.fmax(worst_in, worst_out)
        self._t[self._head] = t_ns
        self._head = (self._head + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def window(self, nic: int, window_s: float) -> tuple[F64, F64]:
        """Return (times s relative to the newest sample, worst delay ns) of ``nic`` within
        ``window_s``; empty arrays without samples. Raises IndexError for a bad NIC index."""
        if not 0 <= nic < self.n:
            raise IndexError(f"no NIC with index {nic}")
        if not self._count:
            return np.zeros(0), np.zeros(0)
        idx = (self._head - self._count + np.arange(self._count)) % self.capacity
        t = self._t[idx]
        rel = (t - t[-1]) / 1e9
        keep = rel >= -window_s
        return rel[keep].astype(np.float64), self._v[idx, nic][keep].astype(np.float64)
