"""Compare a learned fabric with a cabling plan, in words an operator acts on (pure).

`check_plan(learned, plan)` returns a `PlanCheck`: ``matches_plan`` (True when nothing
differs) and ``differences``, one sentence each, e.g. ``nic5 (10.0.1.2) is cabled to leaf2,
the plan says leaf1`` or ``link leaf0-spine3 was not seen: no traced path crossed it``.

How the two are lined up:

- NICs by **address** (a learned NIC's id is whatever its prober calls it; its address is
  the plan's), then host and leaf compared;
- leaves by **name** (their LLDP system name is the plan's leaf id);
- spines, then super-spines, by id where the learned one carries the plan's name (``names``
  in `mesh.fabric.learn.learn_fabric`), the rest by what they connect to below: a learned
  switch is paired with the plan switch whose lower neighbours are the same, else with the
  one sharing most of them. Spines with identical wiring (a full mesh) are interchangeable,
  so the pairing is arbitrary among them and still exact for the comparison; to *name*
  learned spines after the plan, give their router ids to the learner instead;
- switch-to-switch links by their two (paired) ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mesh.fabric.model import Fabric, NodeKind

_TIER_NAME = {NodeKind.LEAF: "leaf", NodeKind.SPINE: "spine", NodeKind.SUPERSPINE: "super-spine"}


@dataclass(frozen=True)
class PlanCheck:
    """The comparison: ``matches_plan``, ``differences`` (sentences) and ``paired``
    (learned switch id -> plan switch id, for every switch that was paired)."""

    matches_plan: bool
    differences: tuple[str, ...] = ()
    paired: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready ``{"matches_plan", "differences", "paired"}``."""
        return {"matches_plan": self.matches_plan, "differences": list(self.differences),
                "paired": dict(self.paired)}  # fmt: skip


def _lower_neighbours(f: Fabric, kind: NodeKind) -> dict[str, set[str]]:
    kinds = {n.id: n.kind for n in f.nodes}
    out: dict[str, set[str]] = {n.id: set() for n in f.nodes if n.kind == kind}
    for lk in f.links:
        if kinds.get(lk.upper) == kind and lk.lower in kinds:
            out[lk.upper].add(lk.lower)
    return out


def _pair_tier(
    learned: Fabric, plan: Fabric, kind: NodeKind, paired: dict[str, str]
) -> tuple[list[str], list[str]]:
    """Pair the switches of ``kind``; return (unpaired learned, unpaired plan)."""
    mine = _lower_neighbours(learned, kind)
    theirs = _lower_neighbours(plan, kind)
    left = sorted(set(theirs))
    for sw in sorted(mine):
        if sw in theirs:
            paired[sw] = sw
            left.remove(sw)
    rest = [sw for sw in sorted(mine) if sw not in paired]
    if kind == NodeKind.LEAF:  # leaves are their LLDP names: no pairing by wiring
        return rest, left
    below = {sw: {paired.get(x, f"?{x}") for x in mine[sw]} for sw in rest}
    for exact in (True, False):
        for sw in list(rest):
            best, score = None, 0
            for cand in left:
                common = len(below[sw] & theirs[cand])
                if exact and below[sw] == theirs[cand]:
                    best = cand
                    break
                if not exact and common > score:
                    best, score = cand, common
            if best is not None:
                paired[sw] = best
                left.remove(best)
                rest.remove(sw)
    return rest, left


def check_plan(learned: Fabric, plan: Fabric, *, reference: str = "the plan") -> PlanCheck:
    """Return how ``learned`` differs from ``plan`` (see the module doc); never raises.

    ``reference`` names ``plan`` in the sentences (``"the last fabric"`` when comparing two
    learned fabrics, as the controller does for each change it applies)."""
    ref = reference
    diffs: list[str] = []
    mine = {n.address: n for n in learned.nics}
    theirs = {n.address: n for n in plan.nics}
    for addr, pn in sorted(theirs.items(), key=lambda kv: kv[1].index):
        ln = mine.get(addr)
        if ln is None:
            diffs.append(f"{pn.id} ({addr}, {pn.host}) was not seen: no prober reported it "
                         "with an LLDP neighbour")  # fmt: skip
            continue
        if ln.host != pn.host:
            diffs.append(f"{pn.id} ({addr}) is on host {ln.host}, {ref} says {pn.host}")
        if ln.leaf != pn.leaf:
            diffs.append(f"{pn.id} ({addr}) is cabled to {ln.leaf}, {ref} says {pn.leaf}")
    for addr, ln in sorted(mine.items(), key=lambda kv: kv[1].index):
        if addr not in theirs:
            diffs.append(f"{ln.id} ({addr}, {ln.host}, under {ln.leaf}) is not in {ref}")

    paired: dict[str, str] = {}
    for kind in (NodeKind.LEAF, NodeKind.SPINE, NodeKind.SUPERSPINE):
        extra, missing = _pair_tier(learned, plan, kind, paired)
        what = _TIER_NAME[kind]
        if kind == NodeKind.LEAF:
            diffs += [f"leaf {sw} is not in {ref}" for sw in extra]
            diffs += [f"leaf {sw} was not seen: no NIC reports it as its LLDP neighbour"
                      for sw in missing]  # fmt: skip
        else:
            diffs += [f"{what} {sw} (a router the traces crossed) is not in {ref}"
                      for sw in extra]  # fmt: skip
            diffs += [f"{what} {sw} was not seen: no traced path crossed it" for sw in missing]

    def shown(sw: str) -> str:
        p = paired.get(sw, sw)
        return p if p == sw else f"{p} (router {sw})"

    nic_ids = {n.id for n in learned.nics} | {n.id for n in plan.nics}
    plan_links = {(lk.lower, lk.upper) for lk in plan.links if lk.lower not in nic_ids}
    seen_links = set()
    for lk in learned.links:
        if lk.lower in nic_ids or lk.lower not in paired or lk.upper not in paired:
            continue
        pair = (paired[lk.lower], paired[lk.upper])
        seen_links.add(pair)
        if pair not in plan_links:
            diffs.append(f"link {shown(lk.lower)}-{shown(lk.upper)} is not in {ref}")
    matched = set(paired.values())
    for lower, upper in sorted(plan_links - seen_links):
        if lower in matched and upper in matched:
            diffs.append(f"link {lower}-{upper} was not seen: no traced path crossed it")
    return PlanCheck(not diffs, tuple(diffs), MappingProxyType(dict(paired)))


def fabric_changes(old: Fabric, new: Fabric) -> tuple[str, ...]:
    """Return what changed from ``old`` to ``new`` in sentences (empty: the same fabric).

    `check_plan` of ``new`` against ``old`` (``"the last fabric"``), and where it finds
    nothing but the two still differ (it lines NICs up by address and pairs switches by
    wiring, so a renamed NIC or spine passes it), the ids that came and went."""
    diffs = list(check_plan(new, old, reference="the last fabric").differences)
    if diffs or _facts(old) == _facts(new):
        return tuple(diffs)
    gone, came = sorted(_ids(old) - _ids(new)), sorted(_ids(new) - _ids(old))
    if gone or came:
        return (f"renamed: {', '.join(gone) or 'nothing'} -> {', '.join(came) or 'nothing'}",)
    return ("NIC groups or switch tiers changed",)


def _ids(f: Fabric) -> frozenset[str]:
    return frozenset([n.id for n in f.nodes] + [n.id for n in f.nics] + [lk.id for lk in f.links])


def _facts(f: Fabric) -> frozenset[str]:
    """Everything that places things in a fabric: node kinds, each NIC's host, leaf,
    address and group, links by their ends."""
    return frozenset(
        [f"{n.id}:{n.kind}" for n in f.nodes]
        + [f"{n.id}@{n.host}/{n.leaf}/{n.address}/{n.group}" for n in f.nics]
        + [f"{lk.lower}-{lk.upper}" for lk in f.links]
    )
