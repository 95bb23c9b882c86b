"""The live controller's cross-layer room: signals documents in, ``anomaly`` and
``root_cause`` events and each slow job's named cause out (pure; time passed in).

`CrossLayer` keeps the latest `contract.signals.SignalsDoc` of every host (`offer`: the one
contract decoder, then `contract.origin.signals_origin_error` against the fabric) and, every
``interval_s`` of the controller's clock (`due`, `step`):

1. builds one frame per entity kind from the documents younger than ``2 * interval_s``
   (`controller.anomaly.frame.frame_from_docs`; a host that sent nothing is absent, never
   zero) and runs `controller.anomaly.fleet.FleetDetector` on it. Peer groups: the hosts of
   one registered job (``job:<id>``), else of one leaf (``leaf:<leaf>``); sites are leaves;
2. returns an ``anomaly`` event (`Anomaly.event`: target the entity, detail its top signals)
   for every episode that started;
3. for every job whose ``slowdown`` (the controller's step-time attribution,
   `controller.remediation.runtime.RemediationRuntime.job_status`) is at least
   ``slow_ratio``, walks its cross-layer graph (`controller.rootcause.graph.build_graph`,
   `controller.rootcause.chain.explain`) with the entities in an episode, the job's group
   moves and the mesh's recent findings, keeps the answer (`cause`) and returns a
   ``root_cause`` event when the named cause changed. A job no longer slow loses its cause.

The service calls `offer` for ``signals/<host>`` messages and `step` from its ticker, and
records the events through its usual door (the API, ``events/<kind>``, the JSON-lines log);
the API shows `cause` beside a job's attribution (``perf.root_cause``); `take_points` gives
the windows' time-series points (the Grafana dashboard's ``qpmesh_signal``,
``qpmesh_anomaly``, ``qpmesh_rootcause``) to the time-series writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract.documents import EventDoc
from contract.jsondoc import DocumentError
from contract.origin import signals_origin_error
from contract.signals import Entity, SignalsDoc
from contract.topics import TopicError, Topics
from controller.anomaly.detector import DetectorConfig
from controller.anomaly.fleet import FleetDetector, job_moves
from controller.anomaly.frame import SignalFrame, frame_from_docs
from controller.anomaly.points import anomaly_points, rootcause_point, signal_points
from controller.jobs import Job
from controller.rootcause.chain import ChainConfig, RootCause, explain
from controller.rootcause.graph import build_graph
from controller.timeseries.lineproto import Point
from mesh.fabric import Fabric, FabricError


@dataclass(frozen=True, slots=True)
class CrossLayerConfig:
    """``interval_s``: how often the detector runs (the probers' ``[signals] interval_s``);
    ``slow_ratio``: the slowdown from which a job's cause is walked for; the detector's and
    the walk's own settings."""

    interval_s: float = 10.0
    slow_ratio: float = 1.15
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    chain: ChainConfig = field(default_factory=ChainConfig)

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or not self.slow_ratio >= 1:
            raise ValueError("crosslayer: interval_s must be > 0 and slow_ratio >= 1")


class CrossLayer:
    """See the module docstring. Not thread-safe: the service's loop calls it."""

    def __init__(self, fabric: Fabric, config: CrossLayerConfig | None = None) -> None:
        self.cfg = config or CrossLayerConfig()
        self.windows = 0
        self.points: list[Point] = []
        self._next_ns: int | None = None
        self._reset(fabric)

    def follow(self, fabric: Fabric) -> None:
        """Work on ``fabric`` from now on; when it is not the current one (a learned fabric
        relearned) every normal, document and cause starts again, as detection's does."""
        if fabric is not self.fabric:
            self._reset(fabric)

    def _reset(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.docs: dict[str, tuple[int, SignalsDoc]] = {}
        self.fleet = FleetDetector(self.cfg.detector)
        self.causes: dict[str, RootCause] = {}
        self._nic_host = {n.id: n.host for n in fabric.nics}
        self._host_leaf = {n.host: n.leaf for n in fabric.nics}

    # ---- in -------------------------------------------------------------------------------
    def offer(self, host: str, payload: bytes, now_ns: int) -> str:
        """Keep ``host``'s signals document in ``payload``; return ``signals``, or
        ``bad:<reason>`` for a malformed document or one that cannot come from ``host``."""
        try:
            doc = SignalsDoc.decode(payload)
        except DocumentError as exc:
            return f"bad:{exc}"
        why = signals_origin_error(doc, host, self._nic_host)
        if why:
            return f"bad:{why}"
        self.docs[host] = (now_ns, doc)
        return "signals"

    def handle(self, topics: Topics, topic: str, payload: bytes, now_ns: int) -> str | None:
        """Return `offer`'s outcome for a ``signals/<host>`` message, None for any other topic."""
        try:
            kind, host = topics.parse(topic)
        except TopicError:
            return None
        return self.offer(host, payload, now_ns) if kind == "signals" else None

    # ---- one window -----------------------------------------------------------------------
    def due(self, now_ns: int) -> bool:
        """Return whether `step` would run a window at ``now_ns``."""
        return self._next_ns is None or now_ns >= self._next_ns

    def step(
        self,
        now_ns: int,
        jobs: Sequence[Job],
        slowdowns: Mapping[str, float],
        findings: Iterable[EventDoc],
    ) -> list[EventDoc]:
        """Run one window when due (see the module docstring); return its ``anomaly`` and
        ``root_cause`` events (none when not due or no host sent signals). ``slowdowns``:
        job id -> step time over baseline; ``findings``: the mesh's recent events."""
        if not self.due(now_ns):
            return []
        interval_ns = int(self.cfg.interval_s * 1e9)
        self._next_ns = now_ns + interval_ns
        fresh = [d for t, d in self.docs.values() if now_ns - t <= 2 * interval_ns]
        if not fresh:
            return []
        self.windows += 1
        group_of = self._groups(jobs)
        frames: dict[Entity, SignalFrame] = {}
        groups: dict[Entity, list[str]] = {}
        sites: dict[Entity, list[str]] = {}
        hosts: dict[Entity, list[str]] = {}
        for kind in Entity:
            frame = frame_from_docs(fresh, kind)
            owners = [self._host_of(kind, e) for e in frame.entities]
            keep = [i for i, h in enumerate(owners) if h in self._host_leaf]
            if len(keep) != len(owners):  # a host the fabric lost since its document came
                frame = SignalFrame(kind, tuple(frame.entities[i] for i in keep),
                                    frame.signals, frame.values[keep])  # fmt: skip
                owners = [owners[i] for i in keep]
            frames[kind] = frame
            hosts[kind] = owners
            sites[kind] = [self._host_leaf[h] for h in owners]
            groups[kind] = [group_of.get(h, f"leaf:{self._host_leaf[h]}") for h in owners]
        res = self.fleet.step(frames, groups, now_ns, sites, hosts)
        self.points += [p for d in fresh for p in signal_points(d)]
        self.points += anomaly_points(res.active.values())
        out = [a.event() for a in res.new]
        findings = list(findings)
        live = {j.id for j in jobs}
        for job_id in [
            j for j in self.causes if j not in live or slowdowns.get(j, 1.0) < self.cfg.slow_ratio
        ]:
            del self.causes[job_id]
        for job in jobs:
            slow = slowdowns.get(job.id, 1.0)
            if slow < self.cfg.slow_ratio:
                continue
            try:
                graph = build_graph(self.fabric, job)
            except FabricError:
                continue  # a NIC the fabric no longer has: the job is re-registered first
            moved = job_moves(res.moves, job.id)
            rc = explain(graph, slow, res.active, findings, now_ns, self.cfg.chain, job, moved)
            old = self.causes.get(job.id)
            self.causes[job.id] = rc
            self.points.append(rootcause_point(rc, now_ns))
            if rc.cause != "unknown" and (
                old is None or (old.cause, old.target) != (rc.cause, rc.target)
            ):
                out.append(rc.event(now_ns))
        return out

    def take_points(self) -> list[Point]:
        """Return the time-series points of the windows since the last call and forget them:
        ``qpmesh_signal`` per entity, ``qpmesh_anomaly`` per entity in an episode,
        ``qpmesh_rootcause`` per slow job walked (`controller.anomaly.points`)."""
        out, self.points = self.points, []
        return out

    # ---- out ------------------------------------------------------------------------------
    def cause(self, job_id: str) -> RootCause | None:
        """Return the latest named cause of ``job_id`` while it is slow, else None."""
        return self.causes.get(job_id)

    def _groups(self, jobs: Sequence[Job]) -> dict[str, str]:
        out: dict[str, str] = {}
        for job in sorted(jobs, key=lambda j: j.id):
            for nic in sorted(job.nics):
                host = self._nic_host.get(nic)
                if host is not None:
                    out.setdefault(host, f"job:{job.id}")
        return out

    def _host_of(self, kind: Entity, entity: str) -> str:
        if kind == Entity.NIC:
            return self._nic_host.get(entity, "")
        if kind == Entity.GPU:
            return entity.rpartition(".gpu")[0]
        return entity


def with_root_cause(
    status: Mapping[str, object] | None, rc: RootCause | None
) -> dict[str, object] | None:
    """Return a job's API status (``perf``) with ``root_cause``: the walk's answer as
    `RootCause.to_dict` (null while the job is not slow or no signals came)."""
    if status is None:
        return None
    return {**status, "root_cause": None if rc is None else rc.to_dict()}


def slowdowns(
    jobs: Iterable[Job], status: Callable[[str], Mapping[str, Any] | None]
) -> dict[str, float]:
    """Return job id -> slowdown from the controller's job status (``status(job_id)``:
    `RemediationRuntime.job_status`; a job without a report is left out)."""
    out: dict[str, float] = {}
    for j in jobs:
        st = status(j.id)
        if st is not None and isinstance(st.get("slowdown"), int | float):
            out[j.id] = float(st["slowdown"])
    return out
