"""``qpmesh testbed run`` scored like ``qpmesh sim localize``: precision / recall / F1 of the
controller's alerts and of the 007-style voting baseline on the same probes and paths.

- qpmesh: the controller's events (every kind but ``clear``) as (kind, target) alerts, scored
  with `testbed.scoring` (a right target with a wrong cause counts against precision).
- voting: the run's probe batches replayed after the run through the controller's own ingest
  and clock sync (`controller.live.LiveController`) with the discovered paths the probers
  published (``model = false``, as the run's controller), feeding `VotingBaseline`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contract.records import ProbeBatch
from controller.brain import Brain, BrainConfig
from controller.brainlike import TeeBrain
from controller.dispatch import apply_paths
from controller.live import LiveController
from controller.voting import VotingBaseline
from mesh.fabric import Fabric
from testbed.scenario import Fault
from testbed.scoring import cause_ok, prf

NOT_ALERTS = frozenset(("clear", "remediation", "topology"))  # not findings about faults


def _ends(name: str) -> frozenset[str]:
    for sep in ("->", "-"):
        if sep in name:
            return frozenset(name.replace(" ", "").split(sep)[:2])
    return frozenset((name,))


def score_alerts(
    faults: Sequence[Fault], alerts: Sequence[tuple[str | None, str]]
) -> dict[str, Any]:
    """Return precision / recall / F1 / false alerts of (kind or None, target) alerts."""
    found = [False] * len(faults)
    good: set[tuple[str | None, str]] = set()
    bad: set[tuple[str | None, str]] = set()
    wrong_cause = 0
    for kind, target in set(alerts):
        hit = False
        for i, f in enumerate(faults):
            if _ends(target) == _ends(f.target):
                if cause_ok(f.kind, kind):
                    hit = found[i] = True
                else:
                    wrong_cause += 1
        (good if hit else bad).add((kind, target))
    return {
        **prf(found, good, bad),
        "false_alerts": len(bad),
        "wrong_cause_alerts": wrong_cause,
        "alerts": len(good) + len(bad),
    }


def voting_alerts(
    fabric: Fabric,
    batches: Sequence[ProbeBatch],
    path_docs: Sequence[Mapping[str, Any]],
    routers: Mapping[str, str],
) -> list[str]:
    """Replay ``batches`` (with the discovered ``path_docs``) into the voting baseline and
    return the links it blamed, in order of first blame. Without discovered paths the
    fabric model's hash stands in."""
    brain = Brain(fabric, BrainConfig(lateness_ns=0))
    voter = VotingBaseline(fabric)
    live = LiveController(fabric, brain=TeeBrain(brain, voter.observe))
    if path_docs:  # as the run's controller: discovered paths only (model = false)
        live.use_model_paths(False)
        apply_paths(live, routers, list(path_docs))
    blamed: list[str] = []
    for b in sorted((b for b in batches if len(b)), key=lambda b: int(b.t1.min())):
        now = int(b.t1.max())
        live.admit(b, now)
        live.tick(now)
        blamed += [lk for lk in voter.tick(now) if lk not in blamed]
    return blamed


def estimators(
    fabric: Fabric,
    faults: Sequence[Fault],
    events: Sequence[Mapping[str, Any]],
    batches: Sequence[ProbeBatch],
    path_docs: Sequence[Mapping[str, Any]],
    routers: Mapping[str, str],
) -> dict[str, dict[str, Any]]:
    """Return ``{"qpmesh": {...}, "voting_baseline": {...}}`` in `sim localize`'s shape."""
    ours = [
        (str(e.get("kind")), str(e.get("target", "")))
        for e in events
        if e.get("kind") not in NOT_ALERTS and "action" not in e
    ]
    out = {"qpmesh": score_alerts(faults, ours)}
    try:
        theirs: list[tuple[str | None, str]] = [
            (None, lk) for lk in voting_alerts(fabric, batches, path_docs, routers)
        ]
        out["voting_baseline"] = score_alerts(faults, theirs)
    except ValueError as exc:  # a malformed paths document: say so, keep qpmesh's score
        out["voting_baseline"] = {"error": str(exc)}
    return out
