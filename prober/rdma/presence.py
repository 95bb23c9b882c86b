"""Follow ``<prefix>/presence/+`` into an `RdmaPeerTable` (the thin MQTT shell).

Presence is retained, so every live prober's document (and every dead one's last will,
``alive: false``) arrives right after subscribing; later changes arrive as they happen.
Each message goes through `RdmaPeerTable.update_payload`; the NIC ids it reports changed are
handed to ``on_change`` (the transport refreshes those address handles). Broker errors
reconnect through the shared loop (`mqttlink.reconnect`, the publisher's backoff bounds); the table is kept across reconnects (retained
messages bring it up to date again). Runs until cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

import aiomqtt

from contract.topics import TopicError, Topics
from mqttlink.reconnect import Backoff, reconnect_loop
from mqttlink.settings import BrokerSettings, client_kwargs
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
    """Subscribe to every host's presence and keep ``table`` current until cancelled."""
    topics = Topics(settings.prefix)
    flt = presence_filter(settings.prefix)

    async def session(connected: Callable[[], None]) -> None:
        async with aiomqtt.Client(
            settings.host, settings.port, identifier=client_id,
            keepalive=settings.keepalive_s, timeout=settings.timeout_s,
            **client_kwargs(settings.security),
        ) as client:  # fmt: skip
            await client.subscribe(flt, qos=1, timeout=settings.timeout_s)
            table.counters["presence_connects"] += 1
            connected()
            async for msg in client.messages:
                payload = msg.payload if isinstance(msg.payload, bytes | bytearray) else b""
                changed = apply_presence(table, topics, str(msg.topic), payload)
                if changed:
                    on_change(changed)
        raise aiomqtt.MqttError("presence subscription ended")  # reconnect, as on a drop

    def on_error(exc: BaseException, delay_s: float) -> None:
        table.counters["presence_errors"] += 1
        table.last_error = f"presence subscription: {type(exc).__name__}: {exc}"

    await reconnect_loop(
        session, Backoff(settings.backoff_min_s, settings.backoff_max_s), on_error=on_error
    )
