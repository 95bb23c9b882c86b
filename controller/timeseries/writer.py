"""The time-series writer: a bounded buffer and a retry policy (pure) around influxdb-client.

`LineBuffer` holds line-protocol chunks, zlib-compressed, up to ``max_bytes`` of compressed
data: `offer` never waits for the sender; past the bound it drops the oldest chunks (counted
in lines and bytes). The retry delays are the project's one `mqttlink.reconnect.Backoff`
(exponential with a cap, here with jitter drawn from its passed-in random source). `TsdbWriter`
runs one background thread that takes chunks from the buffer and writes them with
influxdb-client's synchronous write API (InfluxDB v2 ``/api/v2/write``, ns precision, one
request per batch of up to ``batch_bytes``); a failed request is retried after the backoff
delay until it succeeds, the buffer keeps taking new chunks meanwhile, and nothing is lost
unless the bound forces a drop. A batch the server rejects as malformed (HTTP 4xx other than
408/429) cannot succeed on retry: it is dropped and counted as ``rejected``.

influxdb-client's own batching `WriteApi` is not used: it drops a batch for good once its
retries are spent and its retry delays run to minutes.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mqttlink.reconnect import Backoff

#: One interval at 1,024 NICs (32 leaves x 32 NICs, 8 spines, 16 peers per NIC outside its
#: group: 64,264 directed pairs, 7,968 switch paths, 1,280 links; 77,608 lines) is ~11.7 MB
#: of line protocol, ~1.4 MB compressed (measured by the slow test
#: ``test_default_buffer_holds_five_minutes_at_1024_nics``; see docs/timeseries.md).
COMPRESSED_BYTES_PER_INTERVAL_1024 = 1_400_000
DEFAULT_INTERVAL_S = 10.0
#: Default bound: 5 minutes at 1,024 NICs = 30 intervals x ~1.4 MB = ~42 MB compressed,
#: rounded up to 64 MiB (~7 minutes).
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024


def default_backoff() -> Backoff:
    """Return the writer's retry delays: 0.5 s doubling to 10 s, each up to 20% shorter."""
    return Backoff(0.5, 10.0, jitter=0.2)


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters of a writer (also reported in the controller's health)."""

    buffered_bytes: int
    buffered_lines: int
    max_bytes: int
    written_lines: int
    dropped_lines: int
    dropped_bytes: int
    rejected_lines: int
    failures: int
    last_error: str

    @property
    def fill(self) -> float:
        """Buffer fill ratio in [0, 1]."""
        return self.buffered_bytes / self.max_bytes if self.max_bytes else 0.0


@dataclass(frozen=True, slots=True)
class Chunk:
    """One offered body, zlib-compressed while it waits (line protocol compresses ~8x)."""

    data: bytes
    lines: int
    raw_bytes: int


class LineBuffer:
    """Bounded FIFO of line-protocol chunks, kept compressed; the bound is on the compressed
    bytes (memory held). Thread-safe; `offer` costs one zlib level-1 pass over the chunk
    (~3 ms per MB) on the caller's thread and never waits for the sender."""

    def __init__(self, max_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("buffer size must be > 0")
        self.max_bytes = max_bytes
        self._q: deque[Chunk] = deque()
        self._bytes = 0
        self._lines = 0
        self.dropped_lines = 0
        self.dropped_bytes = 0  # uncompressed
        self._lock = threading.Lock()
        self.ready = threading.Event()

    def offer(self, body: bytes) -> int:
        """Append ``body`` (lines ending in newlines); drop the oldest chunks past the bound;
        return lines dropped."""
        if not body:
            return 0
        chunk = Chunk(zlib.compress(body, 1), body.count(b"\n"), len(body))
        with self._lock:
            self._q.append(chunk)
            self._bytes += len(chunk.data)
            self._lines += chunk.lines
            dropped = self._trim()
            self.ready.set()
        return dropped

    def _trim(self) -> int:
        dropped = 0
        while self._bytes > self.max_bytes and self._q:
            old = self._q.popleft()
            self._bytes -= len(old.data)
            self._lines -= old.lines
            self.dropped_lines += old.lines
            self.dropped_bytes += old.raw_bytes
            dropped += old.lines
        return dropped

    def take(self, max_raw_bytes: int) -> list[Chunk]:
        """Remove and return the oldest chunks up to ``max_raw_bytes`` uncompressed (at
        least one if any)."""
        with self._lock:
            out: list[Chunk] = []
            size = 0
            while self._q and (not out or size + self._q[0].raw_bytes <= max_raw_bytes):
                c = self._q.popleft()
                out.append(c)
                size += c.raw_bytes
                self._bytes -= len(c.data)
                self._lines -= c.lines
            if not self._q:
                self.ready.clear()
            return out

    def putback(self, chunks: list[Chunk]) -> int:
        """Return a failed batch to the front (it is the oldest data); if that passes the
        bound, the oldest chunks go; return lines dropped."""
        with self._lock:
            for c in reversed(chunks):
                self._q.appendleft(c)
                self._bytes += len(c.data)
                self._lines += c.lines
            dropped = self._trim()
            if self._q:
                self.ready.set()
            return dropped

    def size(self) -> tuple[int, int]:
        """Return (compressed bytes, lines) buffered."""
        with self._lock:
            return self._bytes, self._lines


class WriteRejected(Exception):
    """The server refused a batch as malformed: retrying cannot help."""


def _influx_post(
    url: str, org: str, bucket: str, token: str, timeout_s: float
) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """Return (post(body), close()) writing with influxdb-client's synchronous write API.

    ``post`` raises `WriteRejected` for HTTP 4xx other than 408/429 and OSError-family or
    `ApiException` errors for anything retryable."""
    from influxdb_client.client.influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.domain.write_precision import WritePrecision
    from influxdb_client.rest import ApiException

    client = InfluxDBClient(
        url=url, token=token or "unused", org=org, timeout=int(timeout_s * 1000),
        retries=False, enable_gzip=True,
    )  # fmt: skip
    api = client.write_api(write_options=SYNCHRONOUS)

    def post(body: bytes) -> None:
        try:
            api.write(
                bucket=bucket,
                org=org,
                record=body,
                write_precision=WritePrecision.NS,  # type: ignore[arg-type]
            )
        except ApiException as exc:
            status = int(exc.status or 0)
            if 400 <= status < 500 and status not in (408, 429):
                raise WriteRejected(f"HTTP {status}: {str(exc.body)[:200]}") from None
            raise

    return post, client.close


class TsdbWriter:
    """Background writer: `offer` from any thread (never blocks); a daemon thread sends.

    ``post`` (tests) replaces the influxdb-client request. ``backoff`` (`default_backoff`
    if None) spaces the retries of a failed request and is reset by one that succeeds; the
    writer's thread owns it. `close(timeout_s)` stops after trying to send what is buffered
    for up to ``timeout_s``."""

    def __init__(
        self,
        url: str,
        *,
        org: str = "qpmesh",
        bucket: str = "qpmesh",
        token: str = "",
        max_bytes: int = DEFAULT_BUFFER_BYTES,
        batch_bytes: int = 16 * 1024 * 1024,
        backoff: Backoff | None = None,
        timeout_s: float = 10.0,
        post: Callable[[bytes], None] | None = None,
    ) -> None:
        if batch_bytes <= 0:
            raise ValueError("batch_bytes must be > 0")
        self.buffer = LineBuffer(max_bytes)
        self.batch_bytes = batch_bytes
        self.backoff = backoff or default_backoff()
        self._close: Callable[[], None] = lambda: None
        if post is None:
            post, self._close = _influx_post(url, org, bucket, token, timeout_s)
        self._post = post
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.written_lines = 0
        self.rejected_lines = 0
        self.failures = 0
        self.last_error = ""
        self._inflight = 0
        self._thread = threading.Thread(target=self._run, name="qpmesh-tsdb", daemon=True)
        self._thread.start()

    def offer(self, chunk: bytes) -> int:
        """Queue ``chunk`` (line protocol); return lines dropped to keep the bound."""
        return self.buffer.offer(chunk)

    def stats(self) -> WriterStats:
        """Return the current counters."""
        b, n = self.buffer.size()
        with self._lock:
            return WriterStats(
                b, n, self.buffer.max_bytes, self.written_lines, self.buffer.dropped_lines,
                self.buffer.dropped_bytes, self.rejected_lines, self.failures, self.last_error,
            )  # fmt: skip

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.buffer.ready.wait(0.2):
                continue
            with self._lock:
                chunks = self.buffer.take(self.batch_bytes)
                lines = sum(c.lines for c in chunks)
                self._inflight = lines
            if not chunks:
                continue
            body = b"".join(zlib.decompress(c.data) for c in chunks)
            try:
                self._post(body)
            except WriteRejected as exc:
                with self._lock:
                    self._inflight = 0
                    self.rejected_lines += lines
                    self.last_error = str(exc)
                continue
            except Exception as exc:  # every transport error is retried
                with self._lock:
                    self.buffer.putback(chunks)
                    self._inflight = 0
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                self._stop.wait(self.backoff.next_delay())
                continue
            self.backoff.reset()
            with self._lock:
                self._inflight = 0
                self.written_lines += lines
                self.last_error = ""

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the buffer to drain; return True if it did."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.buffer.size()[0] == 0 and self._inflight == 0:
                    return True
            time.sleep(0.05)
        return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Try to send what is buffered for up to ``timeout_s``, then stop the thread."""
        self.flush(timeout_s)
        self._stop.set()
        self._thread.join(timeout=max(1.0, timeout_s))
        self._close()
