"""Follow ``<prefix>/neighbors/#`` into a `PeerBook` (the thin MQTT shell, as the RDMA
transport follows presence: `prober.rdma.presence`).

The documents are retained, so every prober's NICs arrive right after subscribing and later
changes as they happen. When the peers change, ``on_change()`` is called (the agent plans
its probes again). The session and its reconnects are `mqttlink.follow`'s (the one reconnect
loop, the publisher's backoff bounds); the book is kept across reconnects. Runs until
cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

from contract.topics import TopicError, Topics
from mqttlink.follow import follow
from mqttlink.settings import BrokerSettings
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

    def apply(topic: str, payload: bytes | bytearray) -> None:
        if apply_neighbors(book, topics, topic, payload):
            on_change()

    def connected() -> None:
        book.counters["connects"] += 1

    def failed(line: str) -> None:
        book.counters["errors"] += 1
        book.last_error = line

    await follow(
        settings, client_id, topics.subscription("neighbors"), apply,
        what="neighbours subscription", on_connect=connected, on_error=failed,
    )  # fmt: skip
