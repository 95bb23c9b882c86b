"""JetStream sender of the prober's probe batches (when the config has a ``[nats]`` table).

The same delivery rule as the MQTT publisher (`prober.publish`): always the OLDEST spooled
batch, removed from the spool (`Spool.ack`) only after the stream's acknowledgement. Each
batch carries ``Nats-Msg-Id: <host>:<batch_seq>`` (`natslink.subjects.msg_id`), so a batch
sent again after a lost acknowledgement is stored once: the stream answers ``duplicate``, and
a duplicate acknowledgement counts as delivered (the stream holds the earlier copy). Subject:
``<prefix>.probes.<host>``; the servers' mapping puts it in the host's partition.

A batch larger than the server's ``max_payload`` can never be stored: it is dropped from the
spool and counted (``too_large``) instead of blocking every batch behind it.

Connections: `natslink.link.connect`, reconnected by the project's one loop
(`mqttlink.reconnect`) with ``[nats]``'s backoff; a lost connection or a request that timed
out leaves the batch at the head of the spool for the next connection. MQTT stays for
presence (with its last will), health and paths (`prober.publish.Publisher`, which runs this
sender beside its own connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from mqttlink.reconnect import Backoff, reconnect_loop
from natslink.errors import LINK_ERRORS, NatsUnavailable
from natslink.link import Ack, Link, connect
from natslink.settings import NatsSettings
from natslink.subjects import msg_id
from prober.spool import Spool


class LinkLike(Protocol):
    """What the sender needs of a `natslink.link.Link` (tests pass a fake)."""

    lost: asyncio.Event

    @property
    def max_payload(self) -> int: ...

    @property
    def server(self) -> str: ...

    async def publish(self, subject: str, payload: bytes, *, msg_id: str = "") -> Ack: ...


LinkFactory = Callable[[NatsSettings, str], AbstractAsyncContextManager[LinkLike]]


def _connect(settings: NatsSettings, name: str) -> AbstractAsyncContextManager[Link]:
    return connect(settings, name)


class JetStreamBatches:
    """Sends ``host``'s spooled batches to JetStream until stopped; `wake` after a `Spool.put`.

    ``sleep`` is injectable (tests drive the backoff). Counters: ``connects``, ``errors``,
    ``published`` (acknowledged, duplicates included), ``duplicates``, ``too_large``.
    """

    def __init__(
        self,
        settings: NatsSettings,
        host: str,
        spool: Spool,
        *,
        link_factory: LinkFactory = _connect,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.settings, self.host, self.spool = settings, host, spool
        self.subject = settings.subjects.probes(host)  # validates the host as one token
        self._factory = link_factory
        self._sleep = sleep
        self._wake = asyncio.Event()
        self.connected = False
        self.server = ""  # the URL of the server of the current (or last) connection
        self.connects = self.errors = self.published = self.duplicates = self.too_large = 0
        self.last_error = ""

    def wake(self) -> None:
        """A batch was spooled: send it."""
        self._wake.set()

    def counters(self) -> dict[str, int]:
        """Return the sender's counters (the spool's are the publisher's)."""
        return {
            "nats_connects": self.connects,
            "nats_errors": self.errors,
            "nats_published": self.published,
            "nats_duplicates": self.duplicates,
            "nats_too_large": self.too_large,
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, send, reconnect with backoff; return after ``stop`` (having sent what is
        spooled for up to ``drain_on_stop_s`` while connected)."""

        async def session(connected: Callable[[], None]) -> None:
            if stop.is_set() and not len(self.spool):
                return
            async with self._factory(self.settings, f"qpmesh-prober-{self.host}") as link:
                self.connected = True
                self.connects += 1
                self.server = link.server
                connected()
                try:
                    await self._serve(link, stop)
                finally:
                    self.connected = False

        def on_error(exc: BaseException, delay_s: float) -> None:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"

        async def pause(delay_s: float) -> bool:
            if stop.is_set():
                return True
            sleeper = asyncio.ensure_future(self._sleep(delay_s))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait((sleeper, stopper), return_when=asyncio.FIRST_COMPLETED)
            for t in (sleeper, stopper):
                t.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)
            return stop.is_set()

        backoff = Backoff(self.settings.backoff_min_s, self.settings.backoff_max_s, jitter=0.2)
        await reconnect_loop(session, backoff, on_error=on_error, pause=pause, errors=LINK_ERRORS)

    async def _serve(self, link: LinkLike, stop: asyncio.Event) -> None:
        """Send until stop (then drain for a bounded time); raise the link's errors."""
        loop = asyncio.get_running_loop()
        drain_until: float | None = None
        while True:
            if link.lost.is_set():
                raise NatsUnavailable("connection to the NATS server lost")
            if stop.is_set() and drain_until is None:
                drain_until = loop.time() + self.settings.drain_on_stop_s
            item = self.spool.peek()
            if item is not None:
                if drain_until is not None and loop.time() > drain_until:
                    return
                if len(item.payload) + 256 > link.max_payload:  # 256: the headers' room
                    self.spool.drop_head(item.batch_seq)
                    self.too_large += 1
                    continue
                ack = await link.publish(
                    self.subject, item.payload, msg_id=msg_id(self.host, item.batch_seq)
                )
                self.spool.ack(item.batch_seq)
                self.published += 1
                self.duplicates += ack.duplicate
                continue
            if stop.is_set():
                return
            self._wake.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self._wake, stop, link.lost)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in waits:
                    t.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
