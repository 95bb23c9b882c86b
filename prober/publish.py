"""MQTT publisher of the prober: spool in, QoS 1 batches out, presence with a last will.

Shape (aiomqtt 2.x): one connection is an ``async with`` block; reconnection is the shared
loop of `mqttlink.reconnect` (exponential backoff, starting over after a good connection);
every await on the broker has a timeout.

Delivery: the publisher always publishes the OLDEST spooled batch and removes it from the
spool only after the broker's PUBACK (`Spool.ack`). A failure leaves it at the head, so after
a reconnect it is retried before anything newer: batches arrive in order. A batch whose
PUBACK was lost may arrive twice; consumers drop repeats by ``(origin, batch_seq)``.

Presence: ``<prefix>/presence/<host>`` is retained; ``{"alive": true}`` after every connect
(with the RDMA transport also ``"rdma": {nic: {qpn, gid, qkey, port}}``, `set_presence_rdma`),
a last will ``{"alive": false}`` for the broker to publish if the prober dies, and an explicit
``{"alive": false}`` on a clean stop. The controller tells "prober down" (presence false) from
"NIC down" (prober alive, probes to/from the NIC lost).

Neighbours: with NIC discovery on, ``<prefix>/neighbors/<host>`` (retained,
`contract.neighbors.NeighborsDoc`, set with `set_neighbors`) goes out after every connect,
before the presence it vouches for (a controller learning the fabric judges the presence by
the NICs the document claims), and again whenever it changes. It is not cleared on a stop:
the host is still cabled where it was (removing a host clears it, docs/deploy.md).

Discovered paths (`submit_paths`) go out on ``<prefix>/paths/<host>`` over the same connection:
a bounded queue (oldest dropped and counted at its bound), each document removed only after its
PUBACK, like the batches.

Probe batches over JetStream (a prober config with ``[nats]``): the batches go to a
`BatchSender` (`prober.jspublish.JetStreamBatches`) that this publisher runs beside its own
connection and wakes on `submit`; the MQTT connection then carries presence, health and
paths only.

Errors from the broker boundary (aiomqtt `MqttError`, `OSError`, timeouts) are caught in the
loop and counted; nothing escapes `run` except cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import aiomqtt

from contract.topics import Topics
from mqttlink.reconnect import Backoff, reconnect_loop
from mqttlink.settings import BROKER_ERRORS, BrokerSettings, backoff_delay, client_kwargs
from prober.spool import Spool

PATHS_QUEUE = 64  # path documents waiting for the broker at most (oldest dropped)

__all__ = ["BROKER_ERRORS", "BrokerSettings", "MqttLike", "Publisher", "backoff_delay"]

# ---- payloads -----------------------------------------------------------------------------------


def presence_payload(
    alive: bool, t_ns: int, rdma: Mapping[str, Mapping[str, Any]] | None = None
) -> bytes:
    """Return the JSON presence document ``{"alive", "t_ns"[, "rdma"]}``.

    ``rdma`` (NIC id -> {qpn, gid, qkey, port}, see `prober.rdma.peers.presence_rdma`) is
    only included in an ``alive`` document: a stopped prober announces no queue pairs.
    """
    doc: dict[str, Any] = {"alive": alive, "t_ns": t_ns}
    if alive and rdma:
        doc["rdma"] = {nic: dict(entry) for nic, entry in rdma.items()}
    return json.dumps(doc, separators=(",", ":")).encode()


# ---- pure policy --------------------------------------------------------------------------------


# ---- the broker boundary ------------------------------------------------------------------------


class MqttLike(Protocol):
    """The part of `aiomqtt.Client` the publisher uses (tests pass a fake)."""

    async def publish(
        self,
        topic: str,
        payload: bytes | None = None,
        qos: int = 0,
        retain: bool = False,
        *,
        timeout: float | None = None,
    ) -> None: ...


class BatchSender(Protocol):
    """Sends the spooled probe batches over another link (`prober.jspublish`)."""

    def wake(self) -> None: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    def counters(self) -> dict[str, int]: ...


ClientFactory = Callable[[BrokerSettings, str, aiomqtt.Will], AbstractAsyncContextManager[MqttLike]]


@asynccontextmanager
async def aiomqtt_client(
    settings: BrokerSettings, client_id: str, will: aiomqtt.Will
) -> AsyncIterator[MqttLike]:
    """Connect a fresh `aiomqtt.Client` (connect bounded by ``timeout_s``); yield it.

    A fresh client per connection: paho's own queue of unacknowledged messages is dropped
    with it, so retries come only from the spool and keep their order.
    """
    client = aiomqtt.Client(
        settings.host,
        settings.port,
        identifier=client_id,
        keepalive=settings.keepalive_s,
        timeout=settings.timeout_s,
        will=will,
        clean_session=True,
        **client_kwargs(settings.security),
    )
    async with asyncio.timeout(settings.timeout_s):
        await client.__aenter__()
    try:
        yield client
    finally:
        with contextlib.suppress(*BROKER_ERRORS):
            async with asyncio.timeout(settings.timeout_s):
                await client.__aexit__(None, None, None)


class Publisher:
    """Publishes spooled batches, presence and health of ``host`` until stopped.

    ``sleep`` and ``now_ns`` are injectable so tests drive backoff with a fake clock.
    ``batches``: the spool's batches go through it instead of this connection (run by `run`).
    Counters: ``connects``, ``errors``, ``published``; ``connected`` is the current state.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        host: str,
        spool: Spool,
        *,
        client_factory: ClientFactory = aiomqtt_client,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        now_ns: Callable[[], int] = time.time_ns,
        batches: BatchSender | None = None,
    ) -> None:
        self.settings = settings
        self.batches = batches
        self.host = host
        self.spool = spool
        self._factory = client_factory
        self._sleep = sleep
        self._now_ns = now_ns
        self.topics = Topics(settings.prefix)
        self.topics.probes(host)  # validates the host id as a topic level
        self._wake = asyncio.Event()
        self._health: bytes | None = None
        self._rdma: dict[str, dict[str, Any]] | None = None
        self._presence_dirty = False
        self._neighbors: bytes | None = None
        self._neighbors_dirty = False
        self._paths: deque[bytes] = deque()
        self.paths_dropped = 0
        self.connected = False
        self.connects = 0
        self.offline_said = False  # the last stop published alive=false
        self.errors = 0
        self.published = 0
        self.last_error = ""

    # ---- producer side ------------------------------------------------------------------------

    def submit(self, batch_seq: int, payload: bytes) -> int:
        """Spool one encoded batch and wake the sender; return how many old batches were dropped."""
        dropped = self.spool.put(batch_seq, payload)
        if self.batches is not None:
            self.batches.wake()
        else:
            self._wake.set()
        return dropped

    def submit_paths(self, payload: bytes) -> int:
        """Queue one ``paths/<host>`` document (JSON bytes) and wake the sender; return how many
        old documents were dropped to stay within `PATHS_QUEUE`."""
        dropped = 0
        while len(self._paths) >= PATHS_QUEUE:
            self._paths.popleft()
            dropped += 1
        self._paths.append(payload)
        self.paths_dropped += dropped
        self._wake.set()
        return dropped

    def set_health(self, doc: dict[str, Any]) -> None:
        """Queue ``doc`` as the next health message (only the latest one is kept)."""
        self._health = json.dumps(doc, separators=(",", ":"), default=str).encode()
        self._wake.set()

    def set_presence_rdma(self, rdma: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Announce these RDMA queue pairs in every ``alive`` presence from now on.

        Set before `run` to have them in the first presence; when connected, the retained
        presence is republished with them.
        """
        self._rdma = {k: dict(v) for k, v in rdma.items()} if rdma else None
        self._presence_dirty = True
        self._wake.set()

    def set_neighbors(self, payload: bytes) -> None:
        """Publish ``payload`` (a `contract.neighbors.NeighborsDoc`'s bytes) retained on
        ``neighbors/<host>`` after every connect, and now if connected and it changed."""
        if payload != self._neighbors:
            self._neighbors = payload
            self._neighbors_dirty = True
            self._wake.set()

    def _alive_payload(self) -> bytes:
        return presence_payload(True, self._now_ns(), self._rdma)

    def counters(self) -> dict[str, int]:
        """Return publisher and spool counters."""
        return {
            "connects": self.connects,
            "errors": self.errors,
            "published": self.published,
            "paths_dropped": self.paths_dropped,
            **self.spool.counters(),
            **(self.batches.counters() if self.batches is not None else {}),
        }

    # ---- the service loop -------------------------------------------------------------------

    def _will(self) -> aiomqtt.Will:
        topic = self.topics.presence(self.host)
        return aiomqtt.Will(topic, presence_payload(False, 0), qos=1, retain=True)

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, publish, reconnect with backoff; return after ``stop`` is set.

        On stop, spooled batches are flushed for up to ``drain_on_stop_s`` if connected, then
        presence ``alive=false`` is published and the connection closed; if that publish (or
        the drain) failed, one more bounded connection tries to say it (``offline_said``):
        after a clean disconnect the broker publishes no last will.
        """
        client_id = f"qpmesh-prober-{self.host}"

        async def session(connected: Callable[[], None]) -> None:
            if stop.is_set():
                return
            try:
                async with self._factory(self.settings, client_id, self._will()) as client:
                    self.connected = True
                    self.connects += 1
                    connected()
                    self._presence_dirty = False
                    if self._neighbors is not None:
                        self._neighbors_dirty = False
                        await self._publish(client, self.topics.neighbors(self.host),
                                            self._neighbors, retain=True)  # fmt: skip
                    await self._publish(
                        client, self.topics.presence(self.host), self._alive_payload(), retain=True
                    )
                    try:
                        await self._serve(client, stop)
                    finally:  # a stop whose drain failed still says so before it disconnects
                        if stop.is_set():
                            await self._say_offline(client)
            finally:
                self.connected = False

        def on_error(exc: BaseException, delay_s: float) -> None:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"

        async def pause(delay_s: float) -> bool:
            if not stop.is_set():
                await self._pause(delay_s, stop)
            return stop.is_set()

        backoff = Backoff(self.settings.backoff_min_s, self.settings.backoff_max_s)
        self.offline_said = False
        sender = None if self.batches is None else asyncio.create_task(self.batches.run(stop))
        try:
            await reconnect_loop(session, backoff, on_error=on_error, pause=pause)
        finally:
            if sender is not None and stop.is_set():
                await sender  # it drains what is spooled, for a bounded time
            elif sender is not None:  # this run was cancelled
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
        if self.connects and not self.offline_said:
            # the last session ended with a clean disconnect but without alive=false (e.g. a
            # publish timed out on a starved host): the broker fires no will after a clean
            # disconnect, so one more bounded attempt, else the retained presence says alive
            with contextlib.suppress(*BROKER_ERRORS, TimeoutError):
                async with self._factory(self.settings, client_id, self._will()) as client:
                    await self._say_offline(client)

    async def _say_offline(self, client: MqttLike) -> None:
        """Publish the retained ``alive=false`` presence (raises broker errors)."""
        payload = presence_payload(False, self._now_ns())
        await self._publish(client, self.topics.presence(self.host), payload, retain=True)
        self.offline_said = True

    async def _pause(self, delay_s: float, stop: asyncio.Event) -> None:
        sleeper = asyncio.ensure_future(self._sleep(delay_s))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((sleeper, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, stopper):
                t.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    async def _publish(
        self, client: MqttLike, topic: str, payload: bytes, *, retain: bool = False
    ) -> None:
        timeout = self.settings.timeout_s
        async with asyncio.timeout(timeout + 1.0):
            await client.publish(topic, payload, qos=1, retain=retain, timeout=timeout)

    async def _serve(self, client: MqttLike, stop: asyncio.Event) -> None:
        """Publish until stop (then drain for a bounded time); raise broker errors."""
        probes = self.topics.probes(self.host)
        health = self.topics.health(self.host)
        paths = self.topics.paths(self.host)
        drain_until: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            if stop.is_set() and drain_until is None:
                drain_until = loop.time() + self.settings.drain_on_stop_s
            if self._health is not None:
                doc, self._health = self._health, None
                await self._publish(client, health, doc)
            if self._neighbors_dirty and self._neighbors is not None and not stop.is_set():
                self._neighbors_dirty = False
                neighbors = self.topics.neighbors(self.host)
                await self._publish(client, neighbors, self._neighbors, retain=True)
            if self._presence_dirty and not stop.is_set():
                self._presence_dirty = False
                presence = self.topics.presence(self.host)
                await self._publish(client, presence, self._alive_payload(), retain=True)
            if self._paths and not stop.is_set():
                await self._publish(client, paths, self._paths[0])
                self._paths.popleft()
                continue
            item = self.spool.peek() if self.batches is None else None
            if item is not None:
                if drain_until is not None and loop.time() > drain_until:
                    return
                await self._publish(client, probes, item.payload)
                self.spool.ack(item.batch_seq)
                self.published += 1
                continue
            if stop.is_set():
                return
            self._wake.clear()
            waker = asyncio.ensure_future(self._wake.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait((waker, stopper), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (waker, stopper):
                    t.cancel()
                await asyncio.gather(waker, stopper, return_exceptions=True)
