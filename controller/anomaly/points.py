"""Hardware signals, anomalies and root causes as time-series points (pure).

The schema (docs/crosslayer.md, "Time series"; metric names in VictoriaMetrics /
Prometheus are ``<measurement>_<field>``):

- ``qpmesh_signal``, tags ``entity``, ``kind`` (``nic``, ``gpu``, ``host``), ``host``; one
  field per available signal, named as in the catalogue (``qpmesh_signal_pfc_rx_p3``). A
  signal that is not available is not written (no zero).
- ``qpmesh_anomaly``, tags ``entity``, ``kind``, ``signal`` (the top contributor); fields
  ``score`` and ``signals`` (how many contributed), one point per window an entity is in an
  anomaly episode.
- ``qpmesh_rootcause``, tags ``job``, ``cause``, ``target`` (``-`` when unknown); fields
  ``slowdown`` and ``score``, one point per window a slow job is explained.
"""

from __future__ import annotations

from collections.abc import Iterable

from contract.signals import SignalsDoc
from controller.anomaly.detector import Anomaly
from controller.rootcause.chain import RootCause
from controller.timeseries.lineproto import Point


def signal_points(doc: SignalsDoc) -> list[Point]:
    """Return one ``qpmesh_signal`` point per entity of ``doc`` with an available value."""
    out = []
    for kind, g in doc.groups.items():
        for ent, row in g.values.items():
            fields = {n: float(v) for n, v in zip(g.signals, row, strict=True) if v is not None}
            if fields:
                tags = {"entity": ent, "kind": str(kind), "host": doc.host}
                out.append(Point("qpmesh_signal", tags, fields, doc.t_ns))
    return out


def anomaly_points(anomalies: Iterable[Anomaly]) -> list[Point]:
    """Return one ``qpmesh_anomaly`` point per anomaly (entities in an episode now)."""
    return [
        Point(
            "qpmesh_anomaly",
            {"entity": a.entity, "kind": str(a.kind), "signal": a.top[0].signal if a.top else "-"},
            {"score": float(a.score), "signals": len(a.top)},
            a.t_ns,
        )
        for a in anomalies
    ]


def rootcause_point(rc: RootCause, t_ns: int) -> Point:
    """Return the ``qpmesh_rootcause`` point of one explained slow job."""
    tags = {"job": rc.job, "cause": rc.cause, "target": rc.target or "-"}
    return Point("qpmesh_rootcause", tags, {"slowdown": rc.slowdown, "score": rc.score}, t_ns)
