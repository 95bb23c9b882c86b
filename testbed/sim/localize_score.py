"""Scoring of ``qpmesh sim localize``: alerts against the injected faults and against the
simulator's own congestion (pure).

Two kinds of truth, scored apart:

- **faults** (`testbed.scenario.Fault`): found when an alert names an accepted target
  (`accepted_targets`) while the fault is active (+ ``GRACE_S``) with a cause the fault can
  show as (`testbed.scoring.CAUSES`), or when such an alert raised before the fault still
  stands (not cleared) as it starts (a queue fault on a link already reported contended:
  latency 0);
- **congestion**: a directed hop whose median queueing is over the contention threshold
  (`testbed.sim.congestion_truth.CONTENTION_NS`) for a run of steps is a congestion
  *episode* (`CongestionTruth`). A ``contention`` alert raised on that hop, in that
  direction, while the episode lasts (+ ``GRACE_S``) is a hit; an episode of at least
  ``CONGESTION_MIN_S`` after ``warmup_s`` is found when an alert naming its hop stands
  (raised, not yet cleared) at some time during that part of it, and missed otherwise.
  ``warmup_s`` is when the run's random faults may start (`testbed.scenario.random_faults`:
  5 s, or a fifth of a shorter run): the controller's blind start (clocks trusted after
  ~1.5 s, then the queue estimate's 3 s warm-up) is spared the congestion as it is spared
  the faults. ``congestion_recall_from_start`` is the recall over every episode, that start
  included. A contention alert on a hop with a standing queue under the
  threshold (`STANDING_NS`) is counted apart (``near_congestion_alerts``: neither a hit nor
  false); one on the reverse direction of a queued hop is false (``wrong_direction_alerts``).

Every alert is counted each time it is raised: precision is hits over alerts raised, per
class. An alert that is not a hit belongs to the congestion class when it says
``contention`` and to the fault class otherwise; voting alerts name links only, with no
kind and no direction: a voting alert on a link with a contended hop (either direction) is a
congestion hit, and a voting alert that is no hit counts against its fault precision.
Allowances, neither hits nor false: an alert of kind loss / flap / down (or voting's) on a
link during one of the model's loss bursts (``burst_alerts``); a contention alert on a
sibling a down link's flows were re-hashed onto that names it as what it follows from, or a
voting alert there (``reroute_alerts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from mesh.fabric import Fabric
from testbed.scenario import Fault, FaultKind
from testbed.scoring import cause_ok, prf
from testbed.sim.congestion_truth import CONTENTION_NS, STANDING_NS

GRACE_S = 1.0
CONGESTION_MIN_S = 0.5
F64 = npt.NDArray[np.float64]
Span = tuple[int, float, float]  # (directed hop, start s, end s)


def accepted_targets(fabric: Fabric, fault: Fault) -> set[str]:
    """Targets that count as localizing ``fault`` (normalized link / NIC / host ids)."""
    if fault.kind == FaultKind.NIC_DOWN:
        return {fault.target, fabric.links[int(fabric.nic_link[fabric.nic_index[fault.target]])].id}
    return {fault.target}


def normalize(fabric: Fabric, target: str) -> str:
    """Map a directed hop name ``a->b`` to its link id; other targets unchanged."""
    if "->" in target:
        a, b = target.split("->", 1)
        lk = fabric.link_between.get((a, b), fabric.link_between.get((b, a)))
        if lk is not None:
            return fabric.links[lk].id
    return target


def hop_of(fabric: Fabric, target: str) -> int | None:
    """Return the directed hop id a ``a->b`` name means, or None (not a hop name)."""
    if "->" not in target:
        return None
    a, b = target.split("->", 1)
    if (a, b) in fabric.link_between:
        return 2 * fabric.link_between[(a, b)]
    if (b, a) in fabric.link_between:
        return 2 * fabric.link_between[(b, a)] + 1
    return None


class CongestionTruth:
    """Runs of steps per directed hop with the median queue over the contention threshold
    (episodes) and over the standing-queue level, from the simulator's steps."""

    def __init__(self, n_hops: int) -> None:
        self.n_hops = n_hops
        self._on = {k: np.full(n_hops, np.nan) for k in ("contended", "standing")}
        self.spans: dict[str, list[Span]] = {"contended": [], "standing": []}
        self._end = 0.0
        self._by_hop: dict[str, dict[int, list[Span]]] | None = None

    def add(self, t0_s: float, t1_s: float, hop_queue_ns: F64 | None) -> None:
        """Fold one step [t0_s, t1_s) with its per-hop median queueing (None: none)."""
        q = np.zeros(self.n_hops) if hop_queue_ns is None else hop_queue_ns
        for key, cut in (("contended", CONTENTION_NS), ("standing", STANDING_NS)):
            on, start = q >= cut, self._on[key]
            ended = np.flatnonzero(~on & np.isfinite(start))
            self.spans[key] += [(int(h), float(start[h]), t0_s) for h in ended]
            start[ended] = np.nan
            start[on & np.isnan(start)] = t0_s
        self._end = t1_s

    def close(self) -> None:
        """End the runs still open at the last step's end."""
        for key, start in self._on.items():
            open_ = np.flatnonzero(np.isfinite(start))
            self.spans[key] += [(int(h), float(start[h]), self._end) for h in open_]
            start[open_] = np.nan
        self._by_hop = None

    def episodes(self) -> list[Span]:
        """Return the contended runs (hop, start, end) in order of start."""
        return sorted(self.spans["contended"], key=lambda s: (s[1], s[0]))

    def covering(self, key: str, hops: Sequence[int], t_s: float) -> list[Span]:
        """Return the runs of ``spans[key]`` on ``hops`` covering ``t_s`` (from their start
        to ``GRACE_S`` after their end)."""
        if self._by_hop is None:
            self._by_hop = {k: {} for k in self.spans}
            for k, spans in self.spans.items():
                for sp in spans:
                    self._by_hop[k].setdefault(sp[0], []).append(sp)
        by = self._by_hop[key]
        return [sp for h in hops for sp in by.get(h, ()) if sp[1] <= t_s <= sp[2] + GRACE_S]


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert: time s, its raw target (a directed hop name for qpmesh's contention), kind
    (None: voting), what it says it follows from (``EventDoc.related``) and, for a link
    queued both ways, the other direction it names (``also``)."""

    t_s: float
    target: str
    kind: str | None = None
    related: str = ""
    also: str = ""
    until_s: float = float("inf")  # its clear (the finding stood until then)

    @classmethod
    def of_event(cls, t_s: float, ev: EventDoc) -> Alert:
        """Return the alert an event raises at ``t_s``: a contention's detail "queueing delay
        on A and B ..." (`controller.brain`: one event for a link queued both ways) names B
        too."""
        also = ""
        head = f"queueing delay on {ev.target} and "
        if ev.kind == "contention" and ev.detail.startswith(head):
            also = ev.detail[len(head) :].split(" ", 1)[0].rstrip(";,")
        return cls(t_s, ev.target, ev.kind, ev.related, also)

    def hops(self, fabric: Fabric) -> list[int]:
        """Return the directed hops a contention alert names (its target, and ``also``)."""
        out = [hop_of(fabric, self.target), hop_of(fabric, self.also) if self.also else None]
        return [h for h in out if h is not None]


@dataclass
class Scorer:
    """Scores the alerts of one estimator over a run (see the module docstring)."""

    fabric: Fabric
    faults: Sequence[Fault]
    truth: CongestionTruth
    bursts: list[tuple[int, float, float]] = field(default_factory=list)
    moved_onto: Callable[[float], dict[str, tuple[str, ...]]] = lambda _t: {}
    warmup_s: float = 0.0

    def evaluate(self, alerts: Sequence[Alert]) -> dict[str, object]:
        """Return the scores (P / R / F1 per class and over both, alert counts, per fault the
        first hit time under ``_first`` and whether found under ``_found``)."""
        f, faults = self.fabric, self.faults
        episodes = self.truth.episodes()
        found = [False] * len(faults)
        first: list[float | None] = [None] * len(faults)
        ep_found = [False] * len(episodes)
        hits: dict[str, list[Alert]] = {"fault": [], "congestion": []}
        false: dict[str, list[Alert]] = {"fault": [], "congestion": []}
        counts = dict.fromkeys(
            ("burst", "reroute", "near_congestion", "wrong_direction", "wrong_cause",
             "congestion_loss"), 0,
        )  # fmt: skip
        for a in alerts:
            link = normalize(f, a.target)
            fault_hit, wrong_cause = False, False
            for i, ft in enumerate(faults):
                if link in accepted_targets(f, ft) and ft.start_s <= a.t_s <= ft.end_s + GRACE_S:
                    if cause_ok(ft.kind, a.kind):
                        fault_hit, found[i] = True, True
                        first[i] = a.t_s if first[i] is None else min(first[i] or a.t_s, a.t_s)
                    else:
                        wrong_cause = True
            if fault_hit:
                hits["fault"].append(a)
                continue
            hop = hop_of(f, a.target) if a.kind == "contention" else None
            li = f.link_index.get(link)
            hops = a.hops(f) if hop is not None else [] if li is None else [2 * li, 2 * li + 1]
            if a.kind in ("contention", None) and hops:
                on = self.truth.covering("contended", hops, a.t_s)
                if on:
                    hits["congestion"].append(a)
                    continue
                if self.truth.covering("standing", hops, a.t_s):
                    counts["near_congestion"] += 1
                    continue
            if self._burst(a, li):
                counts["burst"] += 1
                continue
            moved = self.moved_onto(a.t_s).get(link, ())
            if moved and (a.kind is None or (a.kind == "contention" and a.related in moved)):
                counts["reroute"] += 1
                continue
            counts["wrong_cause"] += wrong_cause
            if hop is not None and self.truth.covering("standing", [hop ^ 1], a.t_s):
                counts["wrong_direction"] += 1
            if a.kind not in ("contention", None) and li is not None:
                queued = self.truth.covering("standing", [2 * li, 2 * li + 1], a.t_s)
                counts["congestion_loss"] += bool(queued)
            false["congestion" if a.kind == "contention" else "fault"].append(a)
        for i, ft in enumerate(faults):  # a finding raised before the fault, still standing
            if found[i]:
                continue
            for a in alerts:
                stands = a.t_s < ft.start_s <= a.until_s
                if (
                    stands
                    and normalize(f, a.target) in accepted_targets(f, ft)
                    and cause_ok(ft.kind, a.kind)
                ):
                    found[i], first[i] = True, ft.start_s
                    break
        standing = self._standing_alerts(alerts)
        w = self.warmup_s
        seen_from = [max(a0, w) for _, a0, _ in episodes]  # the part after the blind start
        for i, (h, _, a1) in enumerate(episodes):
            a0 = seen_from[i]
            ep_found[i] = any(t0 <= a1 + GRACE_S and t1 >= a0 for t0, t1 in standing.get(h, ()))
        required = [
            i for i, (_, _, b) in enumerate(episodes) if b - seen_from[i] >= CONGESTION_MIN_S - 1e-9
        ]
        cong_hits = [ep_found[i] for i in required]
        # the same over every episode, its blind start included (a queue there from t = 0)
        every = [i for i, (_, a, b) in enumerate(episodes) if b - a >= CONGESTION_MIN_S - 1e-9]
        ep_all = [
            any(
                t0 <= episodes[i][2] + GRACE_S and t1 >= episodes[i][1]
                for t0, t1 in standing.get(episodes[i][0], ())
            )
            for i in every
        ]
        out: dict[str, object] = {
            **prf(found, hits["fault"], false["fault"]),
            **{
                f"congestion_{k}": v
                for k, v in prf(cong_hits, hits["congestion"], false["congestion"]).items()
            },
        }
        both = prf(
            found + cong_hits,
            hits["fault"] + hits["congestion"],
            false["fault"] + false["congestion"],
        )
        out.update({f"overall_{k}": v for k, v in both.items()})
        out.update(
            {
                "false_alerts": len(false["fault"]) + len(false["congestion"]),
                "false_fault_alerts": len(false["fault"]),
                "false_congestion_alerts": len(false["congestion"]),
                "wrong_cause_alerts": counts["wrong_cause"],
                "wrong_direction_alerts": counts["wrong_direction"],
                "congestion_loss_alerts": counts["congestion_loss"],
                "near_congestion_alerts": counts["near_congestion"],
                "burst_alerts": counts["burst"],
                "reroute_alerts": counts["reroute"],
                "alerts": len(alerts),
                "congestion_episodes": len(required),
                "congestion_found": sum(cong_hits),
                "congestion_recall_from_start": round(sum(ep_all) / len(ep_all), 4)
                if ep_all
                else 1.0,
                "_missed": [episodes[i] for i in required if not ep_found[i]],
                "_false": false["fault"] + false["congestion"],
                "_found": found,
                "_first": first,
            }
        )
        return out

    def _standing_alerts(self, alerts: Sequence[Alert]) -> dict[int, list[tuple[float, float]]]:
        """Return per directed hop the (raised, cleared) times of the alerts naming it: a
        contention names its hops; a voting alert (no kind, no direction) both hops of its
        link. An episode is found when one of them stands at any time during it."""
        out: dict[int, list[tuple[float, float]]] = {}
        for a in alerts:
            if a.kind == "contention":
                hops = a.hops(self.fabric)
            elif a.kind is None and a.target in self.fabric.link_index:
                li = self.fabric.link_index[a.target]
                hops = [2 * li, 2 * li + 1]
            else:
                continue
            for h in hops:
                out.setdefault(h, []).append((a.t_s, a.until_s))
        return out

    def _burst(self, a: Alert, li: int | None) -> bool:
        """A loss / flap / down alert (or a voting one) on a link during one of its loss
        bursts (to ``GRACE_S`` after its end): a real, if short, loss."""
        return (
            li is not None
            and a.kind in (None, "loss", "link_flap", "link_down")
            and any(lb == li and b0 <= a.t_s <= b1 + GRACE_S for lb, b0, b1 in self.bursts)
        )


def reroute_targets(
    fabric: Fabric, faults: Sequence[Fault], redistributes: bool
) -> Callable[[float], dict[str, tuple[str, ...]]]:
    """Return a function of time s: per link id, the faulted links whose flows ECMP re-hashed
    onto it then (the siblings, `Fabric.sibling_links`, of a flapping or down link, from its
    fault's start to ``GRACE_S`` after its end); empty if the model does not move load.

    The realistic model moves a down link's utilisation onto its siblings, so their queues
    are real. A contention alert there that names the down link as what it follows from
    (`EventDoc.related`) reports that, and is neither a hit nor false unless the sibling's
    queue crossed the contention threshold (then it is a congestion hit); so is a voting alert
    on such a sibling, which names no cause (the same allowance for both)."""
    spans = [
        (f.start_s, f.end_s + GRACE_S, fabric.link_index[f.target])
        for f in faults
        if redistributes
        and f.kind in (FaultKind.FLAP, FaultKind.LINK_DOWN)
        and f.target in fabric.link_index
    ]

    def at(t_s: float) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for a, b, li in spans:
            if a <= t_s <= b:
                for s in fabric.sibling_links[li]:
                    sid = fabric.links[s].id
                    out[sid] = (*out.get(sid, ()), fabric.links[li].id)
        return out

    return at
