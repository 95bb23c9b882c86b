"""Why is this job slow? Walk its cross-layer graph for the most likely cause (pure).

`explain(graph, slowdown, anomalies, findings, now_ns)` weighs hypotheses ``(class,
target)`` with evidence from both layers and returns a `RootCause`:

1. **Signals of the job's own entities** (its NICs, hosts, GPUs in an anomaly episode,
   `controller.anomaly.detector.Anomaly`): a *root* signal names its entity (with the class
   `controller.rootcause.classes.root_class` gives its contributing signals), weighted by its
   strongest root signal's score over the detector's threshold (at most 3); a victim's and a
   congested NIC's weight is their strongest pause / ECN signal's.
2. **Pause victims to their source.** A job NIC that receives pauses points at its leaf: a
   NIC under that leaf (the job's or a neighbour's) whose anomaly is a pause source (sends
   pauses, PCIe replays, ignores CNPs) gets the victim's weight too. With no such NIC, a
   contended link of that leaf on the mesh explains the pauses; else the leaf itself is named
   as a pause storm whose source is not seen.
3. **Congestion.** Job NICs under one leaf that see ECN marks and send CNPs point at that
   leaf: a host there ignoring CNPs, or a contended link of the leaf on the mesh, else the
   leaf marking too early (``cnp_storm``) when at least two of them agree.
   When *every* NIC of the job moved together (the detector's group moves, which peers
   cannot show), pauses and marks point the same way at the job's leaves (a leaf itself
   only when the job sits under one).
4. **The mesh** (findings younger than ``window_ns``): a job NIC or a link of the job's
   leaves down or flapping (3), contention on the job's ring (2.5) or between its NICs (1.5)
   or on a job NIC's link (1; added to a pause explanation when that NIC is a pause victim),
   loss on a job link (1.5; added to a degraded link's FEC evidence). A flap on a link whose
   NIC shows rising FEC / symbol errors is one cause with both kinds of evidence.
5. The heaviest hypothesis wins (ties: `PRECEDENCE` order); under ``min_score`` the answer
   is ``unknown``. The text starts like attribution's (``step time 2.4x``) and gives the
   evidence, e.g. ``rank 5's nic12 receives pauses at 40 k/s from leaf2; nic14 (host3)
   sends them: ...``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract.documents import EventDoc
from controller.anomaly.detector import Anomaly, Contributor
from controller.attribution import ring_pairs
from controller.jobs import Job
from controller.rootcause.classes import PRECEDENCE, WALK_CLASSES, role_of, root_class
from controller.rootcause.graph import CrossLayerGraph

DOWN = {"nic_down": "link_down", "link_down": "link_down", "link_flap": "link_flap"}
PAUSE_SOURCES = ("pfc_storm", "pcie", "ecn_config")
HOST_CLASSES = ("ecn_config", "mtu_config")
LINK_CLASSES = ("link_degraded", "link_flap")
_ORDER = {c: i for i, c in enumerate((*PRECEDENCE, *WALK_CLASSES))}


@dataclass(frozen=True, slots=True)
class ChainConfig:
    """``threshold``: the detector's (anomaly scores are weighed against it);
    ``min_score``: the weight under which the answer is ``unknown``; ``window_ns``: how old a
    mesh finding may be."""

    threshold: float = 6.0
    min_score: float = 1.0
    window_ns: int = 120_000_000_000


@dataclass(frozen=True, slots=True)
class RootCause:
    """The answer: ``cause`` (a class, or ``unknown``), ``target`` (an entity, link or
    switch id; "" when unknown), its weight, the text and the evidence lines."""

    job: str
    cause: str
    target: str
    score: float
    slowdown: float
    text: str
    evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return JSON-ready values."""
        return {"job": self.job, "cause": self.cause, "target": self.target,
                "score": round(self.score, 2), "slowdown": round(self.slowdown, 2),
                "text": self.text, "evidence": list(self.evidence)}  # fmt: skip

    def event(self, t_ns: int) -> EventDoc:
        """Return the ``root_cause`` event of this answer (target: the cause, or the job)."""
        return EventDoc(t_ns=t_ns, kind="root_cause", target=self.target or self.job,
                        detail=f"job {self.job}: {self.text}", severity="warning")  # fmt: skip


@dataclass
class _Hyp:
    score: float = 0.0
    evidence: list[str] = field(default_factory=list)


class _Walk:
    def __init__(self, graph: CrossLayerGraph, anomalies: Mapping[str, Anomaly],
                 cfg: ChainConfig) -> None:  # fmt: skip
        self.g, self.an, self.cfg = graph, anomalies, cfg
        self.hyps: dict[tuple[str, str], _Hyp] = {}
        self.counted: set[tuple[str, str, str]] = set()

    def add(self, cls: str, target: str, w: float, text: str, key: str = "") -> None:
        if key:
            if (cls, target, key) in self.counted:
                return
            self.counted.add((cls, target, key))
        h = self.hyps.setdefault((cls, target), _Hyp())
        h.score += w
        if text and text not in h.evidence:
            h.evidence.append(text)

    def weight(self, a: Anomaly, role: str = "") -> float:
        """Return the evidence weight of ``a``: its strongest contributor of ``role`` (any
        contributor when "") over the detector's threshold, at most 3."""
        scores = [c.score for c in a.top if not role or role_of(c.signal)[0] == role]
        return min(max(scores, default=0.0) / self.cfg.threshold, 3.0)

    def where(self, ent: str) -> str:
        g = self.g
        if ent in g.rank_of_nic:
            return f"rank {g.rank_of_nic[ent]}'s {ent}"
        if ent in g.nic_host:
            return f"{ent} ({g.nic_host[ent]})"
        for nic, gpu in g.nic_gpu.items():
            if gpu == ent and nic in g.rank_of_nic:
                return f"rank {g.rank_of_nic[nic]}'s {ent}"
        return ent

    def target(self, cls: str, ent: str) -> str:
        if cls in LINK_CLASSES and ent in self.g.nic_link:
            return self.g.nic_link[ent]
        if cls in HOST_CLASSES and ent in self.g.nic_host:
            return self.g.nic_host[ent]
        return ent

    def says(self, a: Anomaly, roles: tuple[str, ...] | None = None) -> str:
        tops = [c for c in a.top if roles is None or role_of(c.signal)[0] in roles]
        return ", ".join(c.text() for c in tops[:2])


def _roles(a: Anomaly) -> set[str]:
    return {role_of(s)[0] for s in a.signals}


def explain(
    graph: CrossLayerGraph,
    slowdown: float,
    anomalies: Mapping[str, Anomaly],
    findings: Iterable[EventDoc],
    now_ns: int,
    cfg: ChainConfig | None = None,
    job: Job | None = None,
    moved: Mapping[str, Sequence[Contributor]] | None = None,
) -> RootCause:
    """Return the most likely cause of ``graph``'s job running ``slowdown`` times its
    baseline, from the entities in an anomaly episode (by entity id), the signals the job's
    entities moved together (``moved``: the detector's moves of the job's group, under the
    key "" for all its entities and under a leaf's id for those under that leaf) and the
    mesh's findings (see the module docstring). ``job`` (the registry's) lets the walk tell
    the ring's queue pairs from the job's others."""
    cfg = cfg or ChainConfig()
    w = _Walk(graph, anomalies, cfg)
    g = graph
    own = [*g.nics, *g.hosts(), *g.gpus()]
    victims: list[tuple[str, Anomaly]] = []
    congested: dict[str, list[tuple[str, Anomaly]]] = {}
    for ent in own:
        a = anomalies.get(ent)
        if a is None:
            continue
        cls = root_class(a.signals)
        if cls is not None:
            w.add(cls, w.target(cls, ent), w.weight(a, "root"), f"{w.where(ent)}: {w.says(a, ('root',))}",
                  key=ent)  # fmt: skip
        rl = _roles(a)
        if "victim_pfc" in rl and ent in g.nic_leaf:
            victims.append((ent, a))
        if "congestion_rx" in rl and ent in g.nic_leaf:
            congested.setdefault(g.nic_leaf[ent], []).append((ent, a))
    contended = _mesh(w, findings, now_ns, job)
    for ent, a in victims:
        _pause_source(w, ent, a, contended)
    for leaf, nics in congested.items():
        _congestion(w, leaf, nics, contended)
    for where, cs in (moved or {}).items():
        _group(w, where, cs, contended)
    for (cls, tgt), h in list(w.hyps.items()):  # FEC rising, then the flap: one cause
        if cls == "link_degraded" and ("link_flap", tgt) in w.hyps:
            w.add("link_flap", tgt, h.score, "before it: " + "; ".join(h.evidence[:1]))
            del w.hyps[(cls, tgt)]
    head = f"step time {slowdown:.1f}x"
    if not w.hyps:
        return RootCause(g.job, "unknown", "", 0.0, slowdown,
                         f"{head}; no anomaly or mesh finding on its hosts, NICs, GPUs or links")  # fmt: skip
    (cls, tgt), best = max(w.hyps.items(),
                           key=lambda kv: (kv[1].score, -_ORDER.get(kv[0][0], 99)))  # fmt: skip
    if best.score < cfg.min_score:
        return RootCause(g.job, "unknown", "", best.score, slowdown,
                         f"{head}; evidence too weak (best: {cls} {tgt})", tuple(best.evidence))  # fmt: skip
    text = f"{head}; {cls.replace('_', ' ')} at {tgt}: " + "; ".join(best.evidence[:3])
    return RootCause(g.job, cls, tgt, best.score, slowdown, text, tuple(best.evidence))


def _mesh(w: _Walk, findings: Iterable[EventDoc], now_ns: int, job: Job | None) -> dict[str, str]:
    """Add the mesh's evidence; return the contended links of the job's leaves (link ->
    the finding's target as written)."""
    g, cfg = w.g, w.cfg
    ring = ring_pairs(job) if job is not None else set()
    nics = set(g.rank_of_nic)
    job_links = {g.nic_link[n] for n in nics} | {u for ups in g.uplinks.values() for u in ups}
    contended: dict[str, str] = {}
    for f in findings:
        if now_ns - f.t_ns > cfg.window_ns:
            continue
        link = g.link(f.target) or (g.nic_link.get(f.target) if f.kind == "nic_down" else None)
        if link is None:
            continue
        if f.kind in DOWN and link in job_links:
            w.add(DOWN[f.kind], link, 3.0, f"the mesh sees {link} {f.kind.replace('_', ' ')}",
                  key="mesh")  # fmt: skip
        elif f.kind == "contention":
            contended[link] = f.target
            on_ring = [fl for fl in f.flows if (fl[0], fl[1]) in ring]
            on_job = [fl for fl in f.flows if fl[0] in nics and fl[1] in nics]
            ends = [e for e in f.target.split("->") if e in nics]
            if on_ring or on_job:
                pairs = ", ".join(dict.fromkeys(f"{s}->{d}" for s, d, _ in (on_ring or on_job)))
                what = "ring" if on_ring else "traffic"
                w.add("link_contention", link, 2.5 if on_ring else 1.5,
                      f"the mesh sees {f.target} contended on the job's {what} ({pairs})",
                      key="mesh")  # fmt: skip
            elif ends and link in job_links:
                nic = ends[0]
                a = w.an.get(nic)
                if a is not None and "victim_pfc" in _roles(a):
                    continue  # the pause explanation takes it (_pause_source)
                w.add("link_contention", link, 1.0, f"the mesh sees {f.target} contended",
                      key="mesh")  # fmt: skip
        elif f.kind == "loss" and link in job_links:
            nic = next((n for n in nics if g.nic_link[n] == link), "")
            a = w.an.get(nic) if nic else None
            cls = (
                "link_degraded"
                if a is not None and root_class(a.signals) == "link_degraded"
                else "link_loss"
            )
            w.add(cls, link, 1.5, f"the mesh sees loss on {link}", key="mesh")
    return contended


def _pause_source(w: _Walk, victim: str, a: Anomaly, contended: Mapping[str, str]) -> None:
    leaf = w.g.nic_leaf[victim]
    told = f"{w.where(victim)} receives pauses from {leaf} ({w.says(a, ('victim_pfc',))})"
    _pause_from(w, [leaf], told, w.weight(a, "victim_pfc"), victim, contended)


def _pause_from(w: _Walk, leaves: Sequence[str], told: str, weight: float, key: str,
                contended: Mapping[str, str]) -> None:  # fmt: skip
    """Credit the pause sources under ``leaves`` with a victim's ``weight``; with none, a
    contended link of those leaves; else (one leaf) the leaf itself."""
    g = w.g
    found = False
    for leaf in leaves:
        for nic in g.leaf_nics.get(leaf, ()):
            s = w.an.get(nic)
            if nic == key or s is None:
                continue
            cls = root_class(s.signals)
            if cls not in PAUSE_SOURCES:
                continue
            found = True
            tgt = w.target(cls, nic)
            w.add(cls, tgt, w.weight(s, "root"), f"{w.where(nic)} under {leaf}: {w.says(s, ('root',))}",
                  key=nic)  # fmt: skip
            w.add(cls, tgt, 0.8 * weight, told, key=key)
    if found:
        return
    local = {*(u for lf in leaves for u in g.uplinks.get(lf, ())),
             *(g.nic_link[n] for lf in leaves for n in g.leaf_nics.get(lf, ()))}  # fmt: skip
    mine = [lk for lk in contended if lk in local]
    if mine:
        w.add("link_contention", mine[0], 0.8 * weight + 1.0,
              f"{told}; the mesh sees {contended[mine[0]]} contended", key=key)  # fmt: skip
    elif len(leaves) == 1:
        w.add("pfc_storm", leaves[0], 0.5 * weight, f"{told}; no pause source seen", key=key)


def _congestion(
    w: _Walk, leaf: str, nics: list[tuple[str, Anomaly]], contended: Mapping[str, str]
) -> None:
    names = ", ".join(n for n, _ in nics[:4])
    told = f"{len(nics)} of the job's NICs under {leaf} see ECN marks / send CNPs ({names})"
    _congested_at(w, [leaf], told, sum(w.weight(a, "congestion_rx") for _, a in nics), f"cong:{leaf}",
                  contended, len(nics) >= 2)  # fmt: skip


def _congested_at(w: _Walk, leaves: Sequence[str], told: str, weight: float, key: str,
                  contended: Mapping[str, str], agree: bool) -> None:  # fmt: skip
    """Credit a host under ``leaves`` that ignores CNPs with congestion ``weight``; with none,
    a contended link of those leaves; else (one leaf, ``agree``) the leaf marking early."""
    g = w.g
    for leaf in leaves:
        for nic in g.leaf_nics.get(leaf, ()):
            s = w.an.get(nic)
            if s is not None and root_class(s.signals) == "ecn_config":
                host = g.nic_host[nic]
                w.add("ecn_config", host, w.weight(s, "root"), f"{w.where(nic)}: {w.says(s, ('root',))}",
                      key=nic)  # fmt: skip
                w.add("ecn_config", host, 0.7 * weight, told, key=key)
                return
    local = {*(u for lf in leaves for u in g.uplinks.get(lf, ())),
             *(g.nic_link[n] for lf in leaves for n in g.leaf_nics.get(lf, ()))}  # fmt: skip
    mine = [lk for lk in contended if lk in local]
    if mine:
        w.add("link_contention", mine[0], 0.7 * weight, told, key=key)
    elif len(leaves) == 1 and agree:
        w.add("cnp_storm", leaves[0], 0.7 * weight, f"{told}; no contended link on the mesh",
              key=key)  # fmt: skip


def _group(
    w: _Walk, where: str, moved: Sequence[Contributor], contended: Mapping[str, str]
) -> None:
    """The signals the job's NICs (``where`` "": all of them; a leaf: those under it) moved
    together (peers cancel them): pauses point at that leaf's pause sources, ECN marks at
    its congestion."""
    g = w.g
    leaves = [where] if where else sorted({g.nic_leaf[n] for n in g.rank_of_nic})
    thr = w.cfg.threshold
    for role, fn in (("victim_pfc", _pause_from), ("congestion_rx", _congested_at)):
        cs = [c for c in moved if role_of(c.signal)[0] == role]
        if not cs:
            continue
        weight = min(max(c.score for c in cs) / (thr / 2), 3.0)  # moves count from thr / 2
        what = ", ".join(c.text() for c in cs[:2])
        told = f"the job's NICs under {', '.join(leaves)} moved together: {what}"
        if fn is _pause_from:
            _pause_from(w, leaves, told, weight / 0.8, f"group:{role}", contended)
        else:
            _congested_at(w, leaves, told, weight / 0.7, f"group:{role}", contended, True)
