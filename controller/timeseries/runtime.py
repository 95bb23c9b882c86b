"""The time series and metrics inside a running controller (thin asyncio shell).

`TimeseriesRuntime(fabric, config)` owns a `TimeseriesRecorder` and a `TsdbWriter`; wrap the
controller's brain with `brain(...)` before the first ingest (the recorder then sees every
batch of observations and every new event), run `run(live, tick_s, clock)` as a task, and
`close()` at the end (sends what is buffered for a few seconds). Each interval is cut on the
loop and rendered, compressed and queued in a worker thread, so ingest never waits for it.

`MetricsRuntime(metrics)` copies the controller's counters into the Prometheus families
(`sync`), so the service only keeps its own counters.

`Observability(fabric, timeseries, metrics_listen, log)` is what the service shell wires in:
``async with`` it (starts the metrics server), wrap the brain with `brain`, run
`run(live, counters, tick_s, clock)` as a task and time clock solves with `solve`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry

from controller.brainlike import BrainLike
from controller.timeseries.config import TimeseriesConfig
from controller.timeseries.metrics import ControllerMetrics, serve_metrics
from controller.timeseries.recorder import TimeseriesRecorder
from controller.timeseries.writer import TsdbWriter, WriterStats
from mesh.fabric import Fabric
from mesh.snapshot import MeshSnapshot

TRUST = ("fine", "coarse", "withheld")
"""The ``trust`` labels of ``qpmesh_delays_total``, in `LiveController.delay_trust` order."""


class LiveLike(Protocol):
    """What the runtime reads from the live controller (`controller.live.LiveController`)."""

    alive: dict[str, bool]

    @property
    def records(self) -> int: ...
    @property
    def delay_trust(self) -> npt.NDArray[np.int64]: ...  # fine, coarse, withheld delays so far

    def snapshot(self) -> MeshSnapshot: ...


class TimeseriesRuntime:
    """Recorder + writer for one controller."""

    def __init__(
        self, fabric: Fabric, config: TimeseriesConfig, *, writer: TsdbWriter | None = None
    ) -> None:
        self.config = config
        self.writer = writer or TsdbWriter(
            config.url,
            org=config.org,
            bucket=config.bucket,
            token=config.token,
            max_bytes=config.buffer_bytes,
        )
        self.recorder = TimeseriesRecorder(
            fabric,
            self.writer.offer,
            interval_ns=round(config.interval_s * 1e9),
            pairs=config.pairs,
            path_detail=config.path_detail,
        )

    def brain(self, brain: BrainLike) -> BrainLike:
        """Return ``brain`` wrapped so the recorder sees its input and events."""
        return self.recorder.tee(brain)

    async def step(self, live: LiveLike, now_ns: int) -> int:
        """Close the interval if due; render and queue it in a worker thread; return bytes."""
        job = self.recorder.begin(now_ns, live.snapshot, live.alive)
        if job is None:
            return 0
        rec = self.recorder
        return await asyncio.to_thread(lambda: rec.finish(job()))

    async def run(self, live: LiveLike, tick_s: float, clock: Callable[[], int]) -> None:
        """Step every ``tick_s`` until cancelled."""
        while True:
            await asyncio.sleep(tick_s)
            await self.step(live, clock())

    def stats(self) -> WriterStats:
        """Return the writer's counters (for the controller's health)."""
        return self.writer.stats()

    def health(self) -> dict[str, Any]:
        """Return the time-series part of the controller's health as JSON-ready values."""
        st = self.writer.stats()
        return {
            "url": self.config.url,
            "intervals": self.recorder.intervals,
            "buffer_bytes": st.buffered_bytes,
            "buffer_fill": round(st.fill, 4),
            "written_lines": st.written_lines,
            "dropped_lines": st.dropped_lines,
            "rejected_lines": st.rejected_lines,
            "write_failures": st.failures,
            "last_error": st.last_error,
        }

    def close(self, timeout_s: float = 5.0) -> None:
        """Try to send what is buffered for up to ``timeout_s``; stop the writer."""
        self.writer.close(timeout_s)


class MetricsRuntime:
    """Keeps the Prometheus families in step with the controller's own counters."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics
        self._seen: dict[str, float] = {}

    def _inc(self, name: str, total: float, counter: Any) -> None:
        delta = total - self._seen.get(name, 0.0)
        if delta > 0:
            counter.inc(delta)
            self._seen[name] = total

    def sync(
        self,
        records: int,
        counters: Mapping[str, int],
        tsdb: WriterStats | None = None,
        delay_trust: Sequence[int] = (),
    ) -> None:
        """Copy totals: ``records`` ingested, the service's message ``counters`` (``probes``,
        ``duplicate``, ``bad:<kind>`` or ``bad``), the writer's counters and the delays by
        clock trust (fine, coarse, withheld)."""
        m = self.metrics
        self._inc("records", records, m.records)
        for name, n in zip(TRUST, delay_trust, strict=False):
            self._inc(f"delays/{name}", n, m.delays.labels(name))
        self._inc("batches", counters.get("probes", 0), m.batches)
        self._inc("dropped", counters.get("duplicate", 0), m.batches_dropped)
        for key, n in counters.items():
            if key == "bad" or key.startswith("bad:"):
                kind = key.removeprefix("bad").removeprefix(":") or "any"
                self._inc(f"bad/{kind}", n, m.decode_errors.labels(kind))
        if tsdb is not None:
            m.tsdb(tsdb)

    def solve(self, seconds: float) -> None:
        """Record one clock solve's wall time."""
        self.metrics.solve_seconds.observe(seconds)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Return (fn(), its wall time in s) (for the clock-solve histogram)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


class Observability:
    """Time series and Prometheus metrics of one running controller (either may be off)."""

    def __init__(
        self,
        fabric: Fabric,
        timeseries: TimeseriesConfig | None,
        metrics_listen: str | None,
        log: Callable[..., None] | None = None,
        *,
        writer: TsdbWriter | None = None,
    ) -> None:
        self.timeseries = (
            TimeseriesRuntime(fabric, timeseries, writer=writer) if timeseries else None
        )
        self.metrics_listen = metrics_listen
        self.registry = CollectorRegistry()
        self.metrics = MetricsRuntime(ControllerMetrics(self.registry))
        self.log = log
        self._server: Any = None
        self._intervals = 0

    def brain(self, brain: BrainLike) -> BrainLike:
        """Return ``brain``, wrapped for the time series when they are on."""
        return self.timeseries.brain(brain) if self.timeseries else brain

    async def __aenter__(self) -> Observability:
        if self.metrics_listen:
            self._server = serve_metrics(self.metrics_listen, self.registry)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.timeseries is not None:
            await asyncio.to_thread(self.timeseries.close, 5.0)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """The (host, port) the metrics server listens on, if any."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def solve(self, seconds: float) -> None:
        """Record the wall time of one clock solve."""
        self.metrics.solve(seconds)

    def websocket_clients(self, n: int) -> None:
        """Set the websocket-clients gauge (the API calls this as clients come and go)."""
        self.metrics.metrics.websocket_clients.set(n)

    def action(self, doc: Mapping[str, Any]) -> None:
        """Record a remediation action document (an audit record of the remediation policy,
        or the generic form; see `RemediationAction.from_doc`) in the time series, if on.
        Raises ValueError if it is malformed."""
        if self.timeseries is not None:
            self.timeseries.recorder.action(doc)

    async def step(self, live: LiveLike, counters: Mapping[str, int], now_ns: int) -> None:
        """Write an interval if due; copy counters into the metrics; log the writer's
        health once per interval."""
        ts = self.timeseries
        if ts is not None:
            await ts.step(live, now_ns)
        trust = [int(n) for n in live.delay_trust]
        self.metrics.sync(live.records, counters, ts.stats() if ts else None, trust)
        if ts is not None and self.log is not None and ts.recorder.intervals != self._intervals:
            self._intervals = ts.recorder.intervals
            self.log(now_ns, "timeseries", **ts.health())

    def health(self) -> dict[str, Any]:
        """Return the time-series health (``{}`` when off) for the controller's health."""
        return self.timeseries.health() if self.timeseries else {}

    async def run(
        self,
        live: LiveLike,
        counters: Mapping[str, int],
        tick_s: float,
        clock: Callable[[], int],
    ) -> None:
        """`step` every ``tick_s`` until cancelled."""
        while True:
            await asyncio.sleep(tick_s)
            await self.step(live, counters, clock())
