"""Scoring localization like a paper: precision, recall and F1 with the cause checked.

Shared by ``qpmesh sim localize`` and ``qpmesh testbed run``. An alert is a (kind, target)
pair; it is a true positive when its target is one a fault accepts *and* its kind is a cause
that fault can show as (`CAUSES`); an alert on the right target with a wrong cause (e.g.
``prober_down`` for a NIC that went down) counts against precision. Alerts without a kind
(``None``, the voting baseline, which names links only) are judged on the target alone.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from testbed.scenario import FaultKind

CAUSES: dict[FaultKind, frozenset[str]] = {
    FaultKind.FLAP: frozenset(("link_flap", "link_down", "loss")),
    FaultKind.LINK_DOWN: frozenset(("link_down", "link_flap", "loss")),
    FaultKind.LOSS: frozenset(("loss", "link_flap")),
    FaultKind.GRAY: frozenset(("loss",)),
    FaultKind.OPTIC: frozenset(("loss",)),
    FaultKind.CONGEST: frozenset(("contention",)),
    FaultKind.NIC_DOWN: frozenset(("nic_down", "link_down")),
    FaultKind.PROBER_DOWN: frozenset(("prober_down",)),
    FaultKind.GPU_FAULT: frozenset(("gpu_fault",)),
}


def cause_ok(fault_kind: FaultKind, alert_kind: str | None) -> bool:
    """Return True if an alert of ``alert_kind`` names a cause ``fault_kind`` can show as."""
    return alert_kind is None or alert_kind in CAUSES.get(fault_kind, frozenset())


def prf(
    hits: Sequence[bool], true_alerts: Collection[object], false_alerts: Collection[object]
) -> dict[str, float]:
    """Return precision (over distinct alerts), recall (over faults) and F1, rounded to 4.

    ``hits``: per fault whether it was localized; ``true_alerts`` / ``false_alerts``: the
    distinct alerts judged right / wrong. No alert at all gives precision 1; no fault, recall 1.
    """
    n_pred = len(true_alerts) + len(false_alerts)
    precision = len(true_alerts) / n_pred if n_pred else 1.0
    recall = sum(hits) / len(hits) if hits else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}
