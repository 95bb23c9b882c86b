"""Follow one subscription for as long as the caller runs: the session every MQTT follower of
qpmesh shares (connect, subscribe, report the connection, hand each message on).

`follow` connects with the settings' address, timeouts and security, subscribes to one topic
filter (QoS 1) and hands every message's topic and payload to ``apply`` (a payload that is not
bytes arrives as ``b""``). Retained documents arrive right after subscribing, later changes as
they happen. Broker errors, and a subscription that ends, go through the one reconnect loop
(`mqttlink.reconnect`) with the settings' backoff bounds; what ``apply`` fed is the caller's
and is kept across reconnects. Runs until cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

import aiomqtt

from mqttlink.reconnect import Backoff, reconnect_loop
from mqttlink.settings import BrokerSettings, client_kwargs

Apply = Callable[[str, bytes | bytearray], None]


async def follow(
    settings: BrokerSettings,
    client_id: str,
    topic_filter: str,
    apply: Apply,
    *,
    what: str,
    on_connect: Callable[[], None],
    on_error: Callable[[str], None],
) -> None:
    """Subscribe to ``topic_filter`` and call ``apply(topic, payload)`` for every message
    until cancelled; never returns otherwise.

    ``on_connect()`` is called each time the subscription stands; ``on_error(line)`` with a
    one-line ``"<what>: <Error>: <message>"`` for each broker error before the wait to retry.
    Anything ``apply`` raises propagates (a bug in the caller, not a broker error).
    """

    async def session(connected: Callable[[], None]) -> None:
        async with aiomqtt.Client(
            settings.host, settings.port, identifier=client_id,
            keepalive=settings.keepalive_s, timeout=settings.timeout_s,
            **client_kwargs(settings.security),
        ) as client:  # fmt: skip
            await client.subscribe(topic_filter, qos=1, timeout=settings.timeout_s)
            on_connect()
            connected()
            async for msg in client.messages:
                payload = msg.payload if isinstance(msg.payload, bytes | bytearray) else b""
                apply(str(msg.topic), payload)
        raise aiomqtt.MqttError(f"{what} ended")  # reconnect, as on a drop

    def report(exc: BaseException, delay_s: float) -> None:
        on_error(f"{what}: {type(exc).__name__}: {exc}")

    await reconnect_loop(
        session, Backoff(settings.backoff_min_s, settings.backoff_max_s), on_error=report
    )
