"""The fabric a controller learns instead of being told (pure; time passed in).

Inputs, as the dispatcher decodes them: every prober's retained neighbours document
(``neighbors/<host>``, `contract.neighbors.NeighborsDoc`: its NICs and their LLDP neighbours)
and the paths its probes crossed (``paths/<host>``, `contract.documents.TracedPath`).
`TopologyLearner` keeps the latest document per host and the latest path per flow, and
`relearn(now_ns, current)` runs `mesh.fabric.learn.learn_fabric` on them when something new
came (at most every ``relearn_ns``): a `FabricChange` when the learned fabric differs from
``current`` (`mesh.fabric.plancheck.fabric_changes`), else None. `relearn_live` hands it to
the live state's one door (`controller.live.LiveController.replace_fabric`), which records
the ``topology`` event, and refills the live state's path tables from the kept paths.

What is kept, and for how long:

- a host's document until it sends another; an empty one (its retained message cleared:
  the host was removed) forgets the host;
- per flow (src, dst, sport) its latest path; a path that did not reach its destination or
  has a silent hop does not replace a complete one (a fault must not unlearn a link); a
  path not renewed for ``path_max_age_ns`` is forgotten (a removed spine leaves the fabric
  once its flows were traced again elsewhere, or aged out);
- paths only from the host that owns their source NIC.

``owners`` (NIC id -> host of every NIC a document claims, placed in the fabric or not) is
what the origin checks of batches, presence and health read (`contract.origin`); it is one
mapping object, updated in place, so the admission that was handed it sees every change.
With a cabling plan (``plan``) each change also says how the new fabric compares with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from contract.documents import EventDoc, TracedPath
from contract.neighbors import NeighborsDoc
from contract.origin import claimed_nics, neighbors_origin_error
from controller.brainlike import BrainLike
from controller.live import LiveController
from controller.pathmap import path_rows
from controller.refabric import shorten
from mesh.fabric import Fabric
from mesh.fabric.learn import LearnedFabric, LinkDefaults, learn_fabric
from mesh.fabric.plancheck import PlanCheck, check_plan, fabric_changes

_Flow = tuple[str, str, int]


@dataclass(frozen=True)
class LearnConfig:
    """How the fabric is learned (``[fabric]`` without shape keys or a file):

    ``plan``: a cabling plan every change is checked against (None: none); ``names``:
    router address -> switch name for the tiers above the leaves (``[fabric.routers]``;
    `mesh.fabric.learn.learn_fabric`); ``relearn_ns``: at most one relearn this often;
    ``path_max_age_ns``: a flow's path not traced again for this long is forgotten;
    ``links``: capacities and delays given to learned links."""

    plan: Fabric | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    relearn_ns: int = 2_000_000_000
    path_max_age_ns: int = 600_000_000_000
    links: LinkDefaults = field(default_factory=LinkDefaults)

    def __post_init__(self) -> None:
        if self.relearn_ns < 0 or self.path_max_age_ns <= 0:
            raise ValueError("relearn_ns must be >= 0 and path_max_age_ns > 0")


@dataclass(frozen=True)
class FabricChange:
    """A relearned fabric that differs from the one in use: the `LearnedFabric`, what
    changed (sentences) and, with a plan, how it compares with the plan."""

    learned: LearnedFabric
    changes: tuple[str, ...]
    plan: PlanCheck | None = None

    def note(self) -> str:
        """Return the plan comparison in words ("" without a plan)."""
        if self.plan is None:
            return ""
        if self.plan.matches_plan:
            return "matches the plan"
        return f"differs from the plan: {shorten(self.plan.differences)}"


def _complete(p: TracedPath) -> bool:
    return p.reached and None not in p.hops


class TopologyLearner:
    """What the fabric is learned from, and when to learn it again (module doc)."""

    def __init__(self, config: LearnConfig | None = None) -> None:
        self.config = config or LearnConfig()
        self._docs: dict[str, NeighborsDoc] = {}
        self._owners: dict[str, str] = {}
        self.owners: Mapping[str, str] = MappingProxyType(self._owners)
        self._paths: dict[_Flow, tuple[TracedPath, int]] = {}
        self._oldest_ns = 0  # no kept path is older (times only move up: a bound, not exact)
        self._dirty = False
        self._last_ns: int | None = None
        self.learned: LearnedFabric | None = None
        self.counters = {"neighbors": 0, "paths": 0, "paths_foreign": 0, "relearned": 0}

    @property
    def router_nodes(self) -> Mapping[str, str]:
        """Router address -> fabric node of the last learned fabric (empty before)."""
        return self.learned.router_nodes if self.learned is not None else {}

    def neighbors(self, host: str, doc: NeighborsDoc) -> str | None:
        """Take ``host``'s neighbours document (from its topic); return why it cannot come
        from ``host`` (`contract.origin.neighbors_origin_error`; then it is ignored), else
        None. A document with no NICs forgets the host."""
        why = neighbors_origin_error(doc, host, self._owners)
        if why:
            return why
        if not doc.nics:
            self._dirty |= self._docs.pop(host, None) is not None
        elif self._docs.get(host) != _unstamped(doc):
            self._docs[host] = _unstamped(doc)
            self._dirty = True
        self._owners.clear()
        self._owners.update(claimed_nics(self._docs))
        self.counters["neighbors"] += 1
        return None

    def paths(self, host: str, paths: Iterable[TracedPath], now_ns: int) -> int:
        """Keep the paths of ``host``'s document whose source NIC ``host`` claims; return how
        many were kept (see the module doc for which replace which)."""
        kept = 0
        for p in paths:
            if self._owners.get(p.src) != host:
                self.counters["paths_foreign"] += 1
                continue
            key = (p.src, p.dst, p.sport)
            had = self._paths.get(key)
            if had is not None and _complete(had[0]) and not _complete(p):
                continue
            if had is None or had[0] != p:
                self._dirty = True
            if not self._paths:
                self._oldest_ns = now_ns
            self._paths[key] = (p, now_ns)
            kept += 1
        self.counters["paths"] += kept
        return kept

    def restore(self, paths: Iterable[tuple[TracedPath, int]]) -> int:
        """Keep the paths a predecessor kept (`controller.keptpaths`) with the times they
        came, each unless its flow has a path here already (what came since wins); their
        origin was judged when they came. Return how many were kept."""
        kept = 0
        for p, t in paths:
            key = (p.src, p.dst, p.sport)
            if key in self._paths:
                continue
            self._oldest_ns = t if not self._paths else min(self._oldest_ns, t)
            self._paths[key] = (p, t)
            self._dirty = True
            kept += 1
        return kept

    def traced(self) -> list[dict[str, Any]]:
        """Return every kept path as a ``paths/<host>`` document's entries (to refill a
        live state's path tables after a change: `controller.pathmap.path_rows`)."""
        return [p.to_json() for p, _ in self._paths.values()]

    def relearn(self, now_ns: int, current: Fabric) -> FabricChange | None:
        """Learn the fabric again if something new came and ``relearn_ns`` passed; return
        the change from ``current``, or None (nothing new, too soon, or the same fabric)."""
        last = self._last_ns
        if last is not None and now_ns - last < self.config.relearn_ns:
            return None
        horizon = now_ns - self.config.path_max_age_ns
        if self._oldest_ns < horizon:  # some path may have aged out: look (else none can)
            old = [k for k, (_, t) in self._paths.items() if t < horizon]
            for key in old:
                del self._paths[key]
            self._dirty |= bool(old)
            self._oldest_ns = min((t for _, t in self._paths.values()), default=now_ns)
        if not self._dirty:
            return None
        self._dirty = False
        self._last_ns = now_ns
        learned = learn_fabric(
            self._docs.values(), (p for p, _ in self._paths.values()),
            names=self.config.names, links=self.config.links,
        )  # fmt: skip
        self.learned = learned
        self.counters["relearned"] += 1
        changes = fabric_changes(current, learned.fabric)
        if not changes:
            return None
        plan = self.config.plan
        return FabricChange(learned, changes, check_plan(learned.fabric, plan) if plan else None)


def _unstamped(doc: NeighborsDoc) -> NeighborsDoc:
    """``doc`` without its time (a republished document that says the same is no news)."""
    return NeighborsDoc(doc.host, 0, doc.nics)


def relearn_live(
    live: LiveController,
    learner: TopologyLearner,
    now_ns: int,
    brain: Callable[[Fabric], BrainLike] | None = None,
    before: Callable[[Fabric], object] | None = None,
) -> tuple[FabricChange, EventDoc] | None:
    """Learn the fabric again when due (`TopologyLearner.relearn`) and, when it changed,
    call ``before(fabric)`` (what must see ``live`` on the old fabric a last time: the time
    series' open interval), replace ``live``'s by it (`LiveController.replace_fabric`, with
    ``brain(fabric)`` as its detection, None: the default) and refill its path tables from
    the learner's paths. Return the change and the ``topology`` event, or None."""
    change = learner.relearn(now_ns, live.fabric)
    if change is None:
        return None
    fab = change.learned.fabric
    if before is not None:
        before(fab)
    event = live.replace_fabric(
        fab, now_ns, brain=brain(fab) if brain is not None else None, note=change.note()
    )
    rows = path_rows(fab, change.learned.router_nodes, learner.traced(), live.max_hops)
    if len(rows.src):
        live.learn_paths(*rows)
    return change, event
