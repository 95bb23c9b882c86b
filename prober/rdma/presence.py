"""Follow ``<prefix>/presence/+`` into an `RdmaPeerTable` (the thin MQTT shell).

Presence is retained, so every live prober's document (and every dead one's last will,
``alive: false``) arrives right after subscribing; later changes arrive as they happen.
Each message goes through `RdmaPeerTable.update_payload`; the NIC ids it reports changed are
handed to ``on_change`` (the transport refreshes those address handles). The session and
its reconnects are `mqttlink.follow`'s (the one reconnect loop, the publisher's backoff
bounds); the table is kept across reconnects (retained messages bring it up to date again).
Runs until cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

from contract.topics import TopicError, Topics
from mqttlink.follow import follow
from mqttlink.settings import BrokerSettings
from prober.rdma.peers import RdmaPeerTable


def presence_filter(prefix: str) -> str:
    """Return the subscription filter of every host's presence: ``<prefix>/presence/+``."""
    return f"{Topics(prefix).prefix}/presence/+"


def apply_presence(
    table: RdmaPeerTable, topics: Topics, topic: str, payload: bytes | bytearray
) -> frozenset[str]:
    """Feed one presence message to ``table``; return the changed NIC ids (pure, never raises).

    A topic that is not ``<prefix>/presence/<host>`` is counted (``bad_topic``) and ignored.
    """
    try:
        kind, host = topics.parse(topic)
    except TopicError:
        kind, host = "", ""
    if kind != "presence":
        table.counters["bad_topic"] += 1
        return frozenset()
    return table.update_payload(host, payload)


async def follow_presence(
    settings: BrokerSettings,
    client_id: str,
    table: RdmaPeerTable,
    on_change: Callable[[frozenset[str]], None],
) -> None:
    """Subscribe to every host's presence and keep ``table`` current until cancelled,
    calling ``on_change(nic_ids)`` with the NICs whose addresses changed."""
    topics = Topics(settings.prefix)

    def apply(topic: str, payload: bytes | bytearray) -> None:
        changed = apply_presence(table, topics, topic, payload)
        if changed:
            on_change(changed)

    def connected() -> None:
        table.counters["presence_connects"] += 1

    def failed(line: str) -> None:
        table.counters["presence_errors"] += 1
        table.last_error = line

    await follow(
        settings, client_id, presence_filter(settings.prefix), apply,
        what="presence subscription", on_connect=connected, on_error=failed,
    )  # fmt: skip
