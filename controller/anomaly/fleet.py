"""The detectors of all three entity kinds, run together on one window (pure).

`FleetDetector.step` runs the GPU, NIC and host detectors in that order. A peer group whose
members moved together in one kind (a job's GPUs going idle for a checkpoint or an
evaluation: the group's median change at least half the threshold) is passed to the kinds
after it as *shifted*, so a host alone in its job is not flagged for its job's phase
(`controller.anomaly.detector`, step 3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contract.signals import Entity
from controller.anomaly.detector import Anomaly, AnomalyDetector, Contributor, DetectorConfig
from controller.anomaly.frame import SignalFrame

ORDER = (Entity.GPU, Entity.NIC, Entity.HOST)


@dataclass(frozen=True, slots=True)
class FleetResult:
    """Episodes that started this window, every entity in an episode now (by id), and per
    peer group the signals its members moved together (all kinds)."""

    new: tuple[Anomaly, ...]
    active: Mapping[str, Anomaly]
    moves: Mapping[str, tuple[Contributor, ...]]


class FleetDetector:
    """One `AnomalyDetector` per kind, sharing a `DetectorConfig`."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.cfg = config or DetectorConfig()
        self.detectors = {k: AnomalyDetector(k, self.cfg) for k in ORDER}

    def step(
        self,
        frames: Mapping[Entity, SignalFrame],
        groups: Mapping[Entity, Sequence[str]],
        t_ns: int,
        sites: Mapping[Entity, Sequence[str]] | None = None,
        hosts: Mapping[Entity, Sequence[str]] | None = None,
    ) -> FleetResult:
        """Score one window of every kind present in ``frames`` (``groups[kind][i]``: the
        peer group of ``frames[kind].entities[i]``; ``sites``: where each sits, its leaf, for
        moves per group and leaf; ``hosts``: each one's host, so peers come from two hosts
        at least). Raises ValueError like `AnomalyDetector.step`."""
        shifted: set[str] = set()
        new: list[Anomaly] = []
        active: dict[str, Anomaly] = {}
        moves: dict[str, tuple[Contributor, ...]] = {}
        for kind in ORDER:
            frame = frames.get(kind)
            if frame is None:
                continue
            where = None if sites is None else sites[kind]
            owner = None if hosts is None else hosts[kind]
            res = self.detectors[kind].step(frame, groups[kind], t_ns, shifted, where, owner)
            shifted |= {g for g, s in res.shifts.items() if s >= self.cfg.threshold / 2}
            new += res.new
            active.update({a.entity: a for a in res.active})
            for g, tops in res.moves.items():
                moves[g] = moves.get(g, ()) + tops
        return FleetResult(tuple(new), active, moves)


def job_moves(
    moves: Mapping[str, tuple[Contributor, ...]], job: str
) -> dict[str, tuple[Contributor, ...]]:
    """Return the moves (`FleetResult.moves`) of ``job``'s peer group ``job:<job>``: under
    "" those of all its entities, under a leaf's id those of its entities under that leaf."""
    head = f"job:{job}"
    return {key.partition("@")[2]: cs for key, cs in moves.items()
            if key == head or key.startswith(head + "@")}  # fmt: skip
