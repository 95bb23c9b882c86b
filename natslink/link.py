"""One connection to the NATS servers: `connect` (an async context manager) and `Link`.

nats-py's own reconnection is off: a connection that is lost ends (`Link.lost` is set and the
next request raises `NatsUnavailable`), and the service around it reconnects through the
project's one loop (`mqttlink.reconnect.reconnect_loop` with ``errors=LINK_ERRORS``) and its
`Backoff`. Connecting tries every server of the list (in order) within
``connect_timeout_s`` each. Every request has a timeout (``timeout_s``). Errors leave as
`natslink.errors.NatsLinkError` (`translate`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from natslink.errors import NatsRefused, NatsUnavailable, translate
from natslink.settings import NatsSettings, connect_kwargs

MSG_ID = "Nats-Msg-Id"


@dataclass(frozen=True, slots=True)
class Ack:
    """A JetStream publish acknowledgement: the ``stream`` and sequence ``seq`` that hold the
    message; ``duplicate``: the stream already had a message with this id (nothing new was
    stored, and the earlier copy stands)."""

    stream: str
    seq: int
    duplicate: bool


class Link:
    """One live connection (`connect` makes it): JetStream publish, the context the setup
    helpers of `natslink.streams` use, and ``lost`` (set when the connection ended)."""

    def __init__(self, nc: NatsClient, settings: NatsSettings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=settings.timeout_s)
        self.settings = settings
        self.lost = asyncio.Event()

    @property
    def max_payload(self) -> int:
        """Return the largest message the server takes (bytes, headers included)."""
        return int(self.nc.max_payload)

    @property
    def server(self) -> str:
        """Return the URL of the server this connection reached."""
        url = self.nc.connected_url
        return url.geturl() if url is not None else ""

    def check(self) -> None:
        """Raise `NatsUnavailable` if the connection was lost."""
        if self.lost.is_set() or self.nc.is_closed:
            raise NatsUnavailable("connection to the NATS server lost")

    async def publish(
        self, subject: str, payload: bytes, *, msg_id: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> Ack:  # fmt: skip
        """Publish ``payload`` to JetStream and wait for the stream's acknowledgement.

        ``msg_id`` (``Nats-Msg-Id``): the stream drops a second message with the same id
        within its duplicate window and acknowledges it with ``duplicate=True``. Raises
        `NatsRefused` for a payload over `max_payload` (retrying cannot help) and
        `NatsUnavailable` when no stream answered in time.
        """
        self.check()
        hdr = dict(headers or {})
        if msg_id:
            hdr[MSG_ID] = msg_id
        if len(payload) > self.max_payload:
            raise NatsRefused(f"publish {subject}: {len(payload)} bytes over the server's "
                              f"max_payload {self.max_payload}")  # fmt: skip
        timeout = self.settings.timeout_s
        with translate(f"publish {subject}"):
            async with asyncio.timeout(timeout + 1.0):
                ack = await self.js.publish(subject, payload, timeout=timeout, headers=hdr or None)
        return Ack(ack.stream, ack.seq, bool(ack.duplicate))


@asynccontextmanager
async def connect(settings: NatsSettings, name: str) -> AsyncIterator[Link]:
    """Connect to a server of ``settings.servers`` (tried in random order, so clients spread
    over the cluster) that answers; yield a `Link`.

    ``name`` labels the connection (server monitoring). Raises `NatsUnavailable` when no
    server answers (each tried within ``connect_timeout_s``), `NatsRefused` when a server
    refuses (authorisation, TLS), `CredentialError` for an unreadable credential file. The
    connection is closed when the block ends.
    """
    link: Link | None = None

    async def on_error(exc: Exception) -> None:  # reported by the request that failed
        return None

    async def on_lost() -> None:
        if link is not None:
            link.lost.set()

    kw = connect_kwargs(settings.security)
    budget = settings.connect_timeout_s * (len(settings.servers) + 1)
    with translate(f"connect {','.join(settings.servers)}"):
        async with asyncio.timeout(budget):
            nc = await nats.connect(
                list(settings.servers), name=name, allow_reconnect=False,
                max_reconnect_attempts=1, reconnect_time_wait=0,
                connect_timeout=settings.connect_timeout_s, error_cb=on_error,
                disconnected_cb=on_lost, closed_cb=on_lost, **kw,
            )  # fmt: skip
    link = Link(nc, settings)
    try:
        yield link
    finally:
        link.lost.set()
        with contextlib.suppress(Exception):  # closing a lost connection has nothing to report
            async with asyncio.timeout(settings.timeout_s):
                await nc.close()
