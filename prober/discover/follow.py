"""Follow ``<prefix>/neighbors/+`` into a `PeerBook` (the thin MQTT shell, as the RDMA
transport follows presence: `prober.rdma.presence`).

The documents are retained, so every prober's NICs arrive right after subscribing and later
changes as they happen. When the peers change, ``on_change()`` is called (the agent plans
its probes again). Broker errors reconnect through the shared loop (`mqttlink.reconnect`,
the publisher's backoff bounds); the book is kept across reconnects. Runs until cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

import aiomqtt

from contract.topics import TopicError, Topics
from mqttlink.reconnect import Backoff, reconnect_loop
from mqttlink.settings import BrokerSettings, client_kwargs
from prober.discover.peers import PeerBook


def apply_neighbors(book: PeerBook, topics: Topics, topic: str, payload: bytes | bytearray) -> bool:
    """Feed one message to ``book``; return whether the peers changed (pure, never raises).
    A topic that is not ``<prefix>/neighbors/<host>`` is counted (``bad_topic``)."""
    try:
        kind, host = topics.parse(topic)
    except TopicError:
        kind, host = "", ""
    if kind != "neighbors":
        book.counters["bad_topic"] += 1
        return False
    return book.update(host, payload)


async def follow_neighbors(
    settings: BrokerSettings, client_id: str, book: PeerBook, on_change: Callable[[], None]
) -> None:
    """Subscribe to every host's neighbours document and keep ``book`` current until
    cancelled, calling ``on_change()`` when the peers changed."""
    topics = Topics(settings.prefix)
    flt = topics.subscription("neighbors")

    async def session(connected: Callable[[], None]) -> None:
        async with aiomqtt.Client(
            settings.host, settings.port, identifier=client_id,
            keepalive=settings.keepalive_s, timeout=settings.timeout_s,
            **client_kwargs(settings.security),
        ) as client:  # fmt: skip
            await client.subscribe(flt, qos=1, timeout=settings.timeout_s)
            book.counters["connects"] += 1
            connected()
            async for msg in client.messages:
                payload = msg.payload if isinstance(msg.payload, bytes | bytearray) else b""
                if apply_neighbors(book, topics, str(msg.topic), payload):
                    on_change()
        raise aiomqtt.MqttError("neighbours subscription ended")  # reconnect, as on a drop

    def on_error(exc: BaseException, delay_s: float) -> None:
        book.counters["errors"] += 1
        book.last_error = f"neighbours subscription: {type(exc).__name__}: {exc}"

    await reconnect_loop(
        session, Backoff(settings.backoff_min_s, settings.backoff_max_s), on_error=on_error
    )
