"""The controller's own operational metrics for Prometheus scraping (prometheus_client).

`ControllerMetrics(registry)` registers on the `CollectorRegistry` it is given (never the
global default): records ingested, batches dropped, decode errors, clock-solve time, the
time-series buffer (fill ratio, bytes, lines dropped, failures) and websocket clients (a gauge
the API sets). `serve_metrics(listen, registry)` serves ``/metrics`` on ``HOST:PORT`` from a
daemon thread and returns the server (``shutdown()`` stops it).
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from controller.timeseries.writer import WriterStats


class ControllerMetrics:
    """The metric families of one controller, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.records = Counter(
            "qpmesh_ingest_records", "Probe records ingested (rate = ingest rate)", registry=r
        )
        self.batches = Counter("qpmesh_ingest_batches", "Probe batches ingested", registry=r)
        self.batches_dropped = Counter(
            "qpmesh_batches_dropped", "Probe batches dropped (duplicates, replays)", registry=r
        )
        self.decode_errors = Counter(
            "qpmesh_decode_errors", "Malformed MQTT payloads dropped", ["topic_kind"], registry=r
        )
        self.delays = Counter(
            "qpmesh_delays",
            "One-way delays of arrived probes by clock trust (fine: both detection tiers; coarse: "
            "the slow tier only; withheld: a clock not certain enough, not judged)",
            ["trust"],
            registry=r,
        )
        self.solve_seconds = Histogram(
            "qpmesh_clock_solve_seconds",
            "Wall time of one clock-sync solve",
            buckets=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
            registry=r,
        )
        self.tsdb_fill = Gauge(
            "qpmesh_tsdb_buffer_fill_ratio", "Time-series buffer fill (0..1)", registry=r
        )
        self.tsdb_bytes = Gauge(
            "qpmesh_tsdb_buffer_bytes", "Line protocol waiting to be written", registry=r
        )
        self.tsdb_dropped = Gauge(
            "qpmesh_tsdb_dropped_lines", "Points dropped at the buffer bound (total)", registry=r
        )
        self.tsdb_written = Gauge(
            "qpmesh_tsdb_written_lines", "Points written to the time-series server", registry=r
        )
        self.tsdb_failures = Gauge(
            "qpmesh_tsdb_write_failures", "Failed write requests (retried)", registry=r
        )
        self.websocket_clients = Gauge(
            "qpmesh_websocket_clients", "Websocket clients attached to the API", registry=r
        )

    def tsdb(self, st: WriterStats) -> None:
        """Copy a writer's counters into the gauges."""
        self.tsdb_fill.set(st.fill)
        self.tsdb_bytes.set(st.buffered_bytes)
        self.tsdb_dropped.set(st.dropped_lines)
        self.tsdb_written.set(st.written_lines)
        self.tsdb_failures.set(st.failures)


def parse_listen(listen: str) -> tuple[str, int]:
    """Return (host, port) of ``HOST:PORT``; raises ValueError."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"metrics listen address must be HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def serve_metrics(listen: str, registry: CollectorRegistry) -> WSGIServer:
    """Serve ``registry`` on ``http://HOST:PORT/metrics`` (daemon thread); return the server.

    Raises ValueError for a bad address, OSError if it cannot listen."""
    host, port = parse_listen(listen)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
