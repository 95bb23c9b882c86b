"""Glue between the live controller and the writer: intervals of points (time passed in).

`TimeseriesRecorder(fabric, sink, interval_ns)` folds every batch of `Observations`
(`observe`; `tee` wraps a brain so that it sees the brain's input, events and verdicts) into
`IntervalStats`, collects events and remediation actions, keeps the worst state of every NIC
and link over the interval's ticks (`WorstStates`, fed by the tee after each tick: a fault
shorter than the interval still shows), and on `tick(now_ns, snapshot, alive)` closes the
interval when ``interval_ns`` has passed: it renders the interval with `PointBuilder` and
hands the body to ``sink`` (`TsdbWriter.offer`). The sink must not block: the writer only
appends to its bounded buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from contract.documents import EventDoc
from controller.brainlike import BrainLike, TeeBrain
from controller.observations import Observations
from controller.timeseries.points import I8, MeshState, PointBuilder, RemediationAction
from controller.timeseries.stats import F64, IntervalStats, summarize
from mesh.fabric import Fabric
from mesh.fabric.ecmp import routing_tables
from mesh.snapshot import SEVERITY, Health, MeshSnapshot


class WorstStates:
    """The worst state code (`mesh.snapshot.SEVERITY`) of every NIC and link over the
    verdicts folded in since the last `take` (-1: none folded)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.nic: I8 = np.full(len(fabric.nics), -1, np.int8)
        self.link: I8 = np.full(len(fabric.links), -1, np.int8)

    def fold(self, nic_health: Sequence[Health], link_health: Mapping[str, Health]) -> None:
        """Fold one tick's verdicts (a link missing from ``link_health`` is unknown)."""
        if len(nic_health) == len(self.nic):
            codes = np.fromiter((SEVERITY[h] for h in nic_health), np.int8, len(self.nic))
            np.maximum(self.nic, codes, out=self.nic)
        unknown = Health.UNKNOWN
        links = self.fabric.links
        codes = np.fromiter(
            (SEVERITY[link_health.get(lk.id, unknown)] for lk in links), np.int8, len(links)
        )
        np.maximum(self.link, codes, out=self.link)

    def take(self) -> tuple[I8, I8]:
        """Return (NIC, link) worst codes and start over."""
        out = (self.nic.copy(), self.link.copy())
        self.nic.fill(-1)
        self.link.fill(-1)
        return out


class TimeseriesRecorder:
    """Intervals of time-series points for one fabric. One owner (the controller's loop)."""

    def __init__(
        self,
        fabric: Fabric,
        sink: Callable[[bytes], Any],
        *,
        interval_ns: int = 10_000_000_000,
        gone_after_ns: int = 300_000_000_000,
        max_samples: int = 4_000_000,
        pairs: bool = True,
        path_detail: str = "full",
        shift_ns: int = 0,
    ) -> None:
        if interval_ns <= 0:
            raise ValueError("interval must be > 0")
        self.fabric = fabric
        self.sink = sink
        self.interval_ns = interval_ns
        width = routing_tables(fabric).max_hops
        self.stats = IntervalStats(fabric, width, max_samples=max_samples, path_detail=path_detail)
        self.builder = PointBuilder(
            fabric, gone_after_ns=gone_after_ns, pairs=pairs, shift_ns=shift_ns
        )
        self._events: list[EventDoc] = []
        self._actions: list[RemediationAction] = []
        self.worst = WorstStates(fabric)
        self._last: int | None = None
        self._fold: tuple[int, F64] | None = None
        self.intervals = 0
        self.bytes_out = 0

    def tee(self, brain: BrainLike) -> BrainLike:
        """Return ``brain`` wrapped (`controller.brainlike.TeeBrain`) so that this recorder
        also gets each batch of its observations, each tick's new events and, after each
        tick, its NIC and link verdicts (`states`)."""

        def after_tick(events: list[EventDoc]) -> None:
            self.events(events)
            self.states(brain.nic_health(), brain.link_health())

        return TeeBrain(brain, self.observe, on_events=after_tick)

    def observe(self, obs: Observations) -> None:
        """Fold one batch of probe outcomes into the open interval."""
        self.stats.observe(obs)

    def events(self, events: Sequence[EventDoc]) -> None:
        """Record events (written with the next interval, at their own times)."""
        self._events.extend(events)

    def states(self, nic_health: Sequence[Health], link_health: Mapping[str, Health]) -> None:
        """Fold one tick's NIC and link verdicts into the interval's worst states."""
        self.worst.fold(nic_health, link_health)

    def action(self, doc: Mapping[str, Any]) -> RemediationAction:
        """Record a remediation action document; return it. Raises ValueError if malformed."""
        act = RemediationAction.from_doc(doc)
        self._actions.append(act)
        return act

    def due(self, now_ns: int) -> bool:
        """Return True when ``begin(now_ns, ...)`` closes an interval."""
        return self._last is not None and now_ns - self._last >= self.interval_ns

    def begin(
        self, now_ns: int, snapshot: Callable[[], MeshSnapshot], alive: Mapping[str, bool]
    ) -> Callable[[], bytes] | None:
        """Close the interval if due and return a job that renders it (None when not due).

        The cut and the snapshot happen here (cheap, on the caller's thread); the job does the
        sorting and formatting and may run in a worker thread while ingest goes on. Run jobs
        one at a time, in order, and hand each body to `finish`. The first call only starts
        the first interval."""
        self._apply_fold()
        if self._last is None:
            self._last = now_ns
            self.stats.cut(now_ns)
            self.worst.take()
            return None
        if now_ns - self._last < self.interval_ns:
            return None
        self._last = now_ns
        raw = self.stats.cut(now_ns)
        state = MeshState.from_snapshot(
            snapshot(), alive, self._events, self._actions, worst=self.worst.take()
        )
        self._events, self._actions = [], []

        def job() -> bytes:
            summary, wmin = summarize(raw)
            self._fold = (raw.end_ns, wmin)
            return self.builder.render(state, summary, now_ns)

        return job

    def _apply_fold(self) -> None:
        fold, self._fold = self._fold, None
        if fold is not None:
            self.stats.fold(*fold)

    def finish(self, body: bytes) -> int:
        """Hand a rendered interval to the sink; return its size in bytes."""
        self.sink(body)
        self.intervals += 1
        self.bytes_out += len(body)
        return len(body)

    def tick(
        self, now_ns: int, snapshot: Callable[[], MeshSnapshot], alive: Mapping[str, bool]
    ) -> int:
        """`begin`, run the job here and `finish`; return bytes written (0 when not due)."""
        job = self.begin(now_ns, snapshot, alive)
        if job is None:
            return 0
        size = self.finish(job())
        self._apply_fold()
        return size
