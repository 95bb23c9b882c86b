"""HTTP delivery of remediation actions and alerts: bounded queues, retries, never blocking.

`Delivery` is one POST (URL, JSON body, idempotency key). `HookSender` owns one bounded queue
and one worker task per URL, so a receiver that hangs or fails delays only its own deliveries:
`offer` never blocks and never raises (a full queue drops its oldest delivery, counted in
``dropped``); the worker POSTs with a timeout, and on a timeout, a connection error, a 5xx or a
429 waits ``backoff_delay`` (doubling from ``backoff_s`` up to ``backoff_max_s``) and tries
again, up to ``retries`` retries (counted in ``retries``; given up: ``failed``); any other
non-2xx answer is final (``rejected``). Each delivery carries ``Idempotency-Key`` (the action
id or the alert batch key) so a receiver that saw a request whose answer was lost can tell it
again. `stop` cancels the workers (undelivered items are lost, counted in ``pending``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from mqttlink.settings import backoff_delay


@dataclass(frozen=True, slots=True)
class Delivery:
    """One POST: where, what (any JSON value), and the key receivers de-duplicate on."""

    url: str
    body: Any
    key: str


@dataclass
class HookStats:
    """Counters of one sender, all URLs together."""

    offered: int = 0
    delivered: int = 0
    retries: int = 0
    failed: int = 0
    rejected: int = 0
    dropped: int = 0
    last_error: str = ""
    by_url: dict[str, int] = field(default_factory=dict)  # delivered per URL

    def to_dict(self) -> dict[str, Any]:
        """Return the counters as JSON-ready values."""
        return {"offered": self.offered, "delivered": self.delivered, "retries": self.retries,
                "failed": self.failed, "rejected": self.rejected, "dropped": self.dropped,
                "last_error": self.last_error}  # fmt: skip


Poster = Callable[[Delivery, float], Awaitable[int]]
"""(delivery, timeout s) -> HTTP status; raises on timeouts and connection errors."""


class HookSender:
    """Bounded per-URL queues drained by retrying workers (see the module docstring)."""

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_queue: int = 1000,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poster: Poster | None = None,
    ) -> None:
        if timeout_s <= 0 or retries < 0 or max_queue < 1:
            raise ValueError("webhooks need timeout > 0, retries >= 0, a queue of >= 1")
        backoff_delay(0, backoff_s, backoff_max_s)  # validates
        self.timeout_s, self.retries = timeout_s, retries
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.max_queue = max_queue
        self._sleep = sleep
        self._poster = poster
        self._session: aiohttp.ClientSession | None = None
        self._queues: dict[str, deque[Delivery]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self.stats = HookStats()

    @property
    def pending(self) -> int:
        """Return the deliveries queued and not yet done."""
        return sum(len(q) for q in self._queues.values())

    def offer(self, d: Delivery) -> None:
        """Queue ``d`` for its URL (call in the running loop); never blocks, never raises."""
        self.stats.offered += 1
        q = self._queues.setdefault(d.url, deque())
        if len(q) >= self.max_queue:
            q.popleft()
            self.stats.dropped += 1
        q.append(d)
        if d.url not in self._workers:
            self._wake[d.url] = asyncio.Event()
            self._workers[d.url] = asyncio.create_task(self._work(d.url))
        self._wake[d.url].set()

    async def _post(self, d: Delivery, timeout_s: float) -> int:
        if self._poster is not None:
            return await self._poster(d, timeout_s)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body = json.dumps(d.body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": d.key}
        async with self._session.post(
            d.url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            await r.read()
            return r.status

    async def _deliver(self, d: Delivery) -> None:
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats.retries += 1
                await self._sleep(backoff_delay(attempt - 1, self.backoff_s, self.backoff_max_s))
            try:
                status = await self._post(d, self.timeout_s)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                self.stats.last_error = f"{d.url}: {type(exc).__name__}: {exc}"[:300]
                continue
            if 200 <= status < 300:
                self.stats.delivered += 1
                self.stats.by_url[d.url] = self.stats.by_url.get(d.url, 0) + 1
                return
            self.stats.last_error = f"{d.url}: HTTP {status}"
            if status < 500 and status != 429:
                self.stats.rejected += 1
                return
        self.stats.failed += 1

    async def _work(self, url: str) -> None:
        q, wake = self._queues[url], self._wake[url]
        while True:
            while not q:
                wake.clear()
                await wake.wait()
            d = q[0]
            await self._deliver(d)
            if q and q[0] is d:  # not dropped meanwhile by a full queue
                q.popleft()

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty or ``timeout_s`` passed; return True if empty."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while self.pending and loop.time() < end:
            await asyncio.sleep(0.02)
        return not self.pending

    async def stop(self) -> None:
        """Cancel the workers and close the HTTP session (idempotent)."""
        workers, self._workers = list(self._workers.values()), {}
        for w in workers:
            w.cancel()
        for w in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await w
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
