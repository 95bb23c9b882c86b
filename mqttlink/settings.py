"""Where and how to reach the MQTT broker, and the errors of the broker boundary."""

from __future__ import annotations

from dataclasses import dataclass

import aiomqtt

from contract.topics import DEFAULT_PREFIX, Topics

BROKER_ERRORS: tuple[type[BaseException], ...] = (aiomqtt.MqttError, OSError, TimeoutError)


def backoff_delay(attempt: int, lo_s: float, hi_s: float) -> float:
    """Return the wait before reconnect attempt ``attempt`` (0-based): lo * 2**attempt, capped.

    Raises ValueError unless attempt >= 0 and 0 < lo <= hi.
    """
    if attempt < 0 or lo_s <= 0 or hi_s < lo_s:
        raise ValueError("backoff needs attempt >= 0 and 0 < lo <= hi")
    return min(hi_s, lo_s * (2.0 ** min(attempt, 60)))


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Where and how to reach the broker; validated (ValueError)."""

    host: str = "127.0.0.1"
    port: int = 1883
    prefix: str = DEFAULT_PREFIX
    keepalive_s: int = 10
    timeout_s: float = 5.0
    backoff_min_s: float = 0.2
    backoff_max_s: float = 5.0
    drain_on_stop_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("broker host must not be empty")
        if not 0 < self.port <= 0xFFFF:
            raise ValueError(f"broker port {self.port} out of range")
        Topics(self.prefix)  # raises TopicError (a ValueError) on a bad prefix
        if self.keepalive_s <= 0 or self.timeout_s <= 0 or self.drain_on_stop_s < 0:
            raise ValueError("keepalive, timeout must be positive")
        backoff_delay(0, self.backoff_min_s, self.backoff_max_s)
