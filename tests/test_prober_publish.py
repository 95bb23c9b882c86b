"""Publisher: in-order delivery through outages, backoff on a fake clock, presence + will;
and the same against a real mosquitto broker."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiomqtt
import pytest

from mqttlink.settings import BrokerSettings, backoff_delay
from prober.publish import MqttLike, Publisher, presence_payload
from prober.spool import Spool

HOST = "hostA"


class FakeBroker:
    """A scripted broker: ``up`` decides connects; ``lose_ack`` makes publishes of those
    payloads reach the broker but fail before the PUBACK (one time each)."""

    def __init__(self) -> None:
        self.up = False
        self.connects = 0
        self.will: aiomqtt.Will | None = None
        self.received: list[tuple[str, bytes, bool]] = []
        self.lose_ack: set[bytes] = set()
        self.drop_after: int | None = None  # connection dies after this many publishes

    def factory(self) -> Any:
        broker = self

        class Client:
            async def publish(self, topic: str, payload: bytes | None = None, qos: int = 0,
                              retain: bool = False, *, timeout: float | None = None) -> None:  # fmt: skip
                assert qos == 1 and timeout is not None
                if not broker.up:
                    raise aiomqtt.MqttError("connection lost")
                broker.received.append((topic, payload or b"", retain))
                if payload in broker.lose_ack:
                    broker.lose_ack.discard(payload)
                    raise aiomqtt.MqttError("no PUBACK")
                if broker.drop_after is not None:
                    broker.drop_after -= 1
                    if broker.drop_after <= 0:
                        broker.up = False
                        broker.drop_after = None

        @asynccontextmanager
        async def make(settings: BrokerSettings, client_id: str,
                       will: aiomqtt.Will) -> AsyncIterator[MqttLike]:  # fmt: skip
            if not broker.up:
                raise aiomqtt.MqttError("connection refused")
            broker.connects += 1
            broker.will = will
            yield Client()

        return make

    def probes(self) -> list[bytes]:
        return [p for t, p, _ in self.received if t.endswith(f"/probes/{HOST}")]

    def presence(self) -> list[tuple[dict[str, Any], bool]]:
        return [(json.loads(p), r) for t, p, r in self.received if "/presence/" in t]


class FakeSleep:
    """Records every backoff; runs ``on_sleep(n)`` so the test can heal the broker."""

    def __init__(self, on_sleep: Any = None) -> None:
        self.delays: list[float] = []
        self.on_sleep = on_sleep

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self.on_sleep is not None:
            self.on_sleep(len(self.delays))
        await asyncio.sleep(0)


async def run_until(pub: Publisher, cond: Any, max_iter: int = 10_000) -> asyncio.Event:
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    for _ in range(max_iter):
        if cond():
            break
        await asyncio.sleep(0)
    else:
        stop.set()
        await task
        raise AssertionError("condition never met")
    stop.set()
    await asyncio.wait_for(task, 5)
    return stop


def settings(**kw: Any) -> BrokerSettings:
    return BrokerSettings(**{"backoff_min_s": 0.5, "backoff_max_s": 4.0, **kw})


def test_backoff_delay() -> None:
    assert [backoff_delay(a, 0.5, 4.0) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff_delay(10_000, 0.5, 4.0) == 4.0
    for bad in ((-1, 0.5, 4.0), (0, 0.0, 1.0), (0, 2.0, 1.0)):
        with pytest.raises(ValueError):
            backoff_delay(*bad)


@pytest.mark.parametrize(
    "kw", [{"host": ""}, {"port": 0}, {"prefix": "a/+/b"}, {"prefix": "/x"}, {"timeout_s": 0}]
)
def test_bad_broker_settings(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        BrokerSettings(**kw)


def test_bad_host_id() -> None:
    with pytest.raises(ValueError):
        Publisher(BrokerSettings(), "a/b", Spool())


async def test_outage_then_in_order_delivery_with_backoff() -> None:
    broker = FakeBroker()
    sleep = FakeSleep(on_sleep=lambda n: setattr(broker, "up", n >= 4))
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=sleep)
    payloads = [f"batch{i}".encode() for i in range(6)]
    for i, p in enumerate(payloads):
        pub.submit(100 + i, p)
    await run_until(pub, lambda: len(pub.spool) == 0)
    assert sleep.delays == [0.5, 1.0, 2.0, 4.0]  # exponential, capped
    assert broker.probes() == payloads
    pres = broker.presence()
    assert pres[0] == ({"alive": True, "t_ns": pres[0][0]["t_ns"]}, True)
    assert pres[-1][0]["alive"] is False and pres[-1][1] is True
    assert broker.will is not None and broker.will.retain and broker.will.qos == 1
    assert json.loads(broker.will.payload)["alive"] is False  # type: ignore[arg-type]
    assert broker.will.topic == f"qpmesh/v1/presence/{HOST}"
    assert pub.errors == 4 and pub.published == 6 and pub.spool.delivered == 6


async def test_connection_drop_mid_stream_keeps_order() -> None:
    broker = FakeBroker()
    broker.up = True
    broker.drop_after = 3  # presence + 2 batches, then the link dies
    sleep = FakeSleep(on_sleep=lambda n: setattr(broker, "up", True))
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=sleep)
    payloads = [f"b{i}".encode() for i in range(5)]
    for i, p in enumerate(payloads):
        pub.submit(i, p)
    await run_until(pub, lambda: len(pub.spool) == 0)
    assert broker.probes() == payloads
    assert broker.connects == 2 and sleep.delays == [0.5]


async def _connected_with_a_batch_losing_its_ack() -> tuple[
    FakeBroker, Publisher, asyncio.Event, asyncio.Task[None]
]:
    """A publisher connected to a fake broker that will lose the PUBACK of batch b"last"."""
    broker = FakeBroker()
    broker.up = True
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=FakeSleep())
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    while not broker.presence():
        await asyncio.sleep(0)
    broker.lose_ack.add(b"last")
    return broker, pub, stop, task


async def test_a_stop_whose_drain_fails_still_publishes_alive_false() -> None:
    # the batch drained at stop loses its PUBACK (a timeout on a starved host): before, the
    # session ended with a clean disconnect and no alive=false, so no will either, and the
    # retained presence said "alive" for good
    broker, pub, stop, task = await _connected_with_a_batch_losing_its_ack()
    pub.submit(0, b"last")
    stop.set()
    await asyncio.wait_for(task, 5)
    assert broker.probes() == [b"last"]
    assert broker.presence()[-1] == (
        {"alive": False, "t_ns": broker.presence()[-1][0]["t_ns"]},
        True,
    )
    assert pub.offline_said


async def test_a_stop_after_a_failed_offline_publish_tries_once_more() -> None:
    broker, pub, stop, task = await _connected_with_a_batch_losing_its_ack()
    offline_prefix = b'{"alive":false'
    real_publish = pub._publish
    failed: list[bytes] = []

    async def flaky(client: Any, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if payload.startswith(offline_prefix) and not failed:
            failed.append(payload)
            raise aiomqtt.MqttError("timed out")
        await real_publish(client, topic, payload, retain=retain)

    pub._publish = flaky  # type: ignore[method-assign]
    stop.set()
    await asyncio.wait_for(task, 5)
    assert failed and broker.connects == 2  # the bounded extra connection said it
    assert broker.presence()[-1][0]["alive"] is False and pub.offline_said


async def test_lost_puback_retries_head_first() -> None:
    """A PUBACK lost after the broker took the batch: the batch is resent before newer ones
    (order kept); the duplicate carries the same batch_seq for the consumer to drop."""
    broker = FakeBroker()
    broker.up = True
    broker.lose_ack = {b"b1"}
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=FakeSleep())
    for i in range(3):
        pub.submit(i, f"b{i}".encode())
    await run_until(pub, lambda: len(pub.spool) == 0)
    assert broker.probes() == [b"b0", b"b1", b"b1", b"b2"]


async def test_spool_bound_during_outage_drops_oldest() -> None:
    broker = FakeBroker()
    healed = False

    def heal(n: int) -> None:
        nonlocal healed
        broker.up = healed

    pub = Publisher(settings(), HOST, Spool(max_batches=3), client_factory=broker.factory(),
                    sleep=FakeSleep(on_sleep=heal))  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    for i in range(10):
        pub.submit(i, f"b{i}".encode())
        await asyncio.sleep(0)
    assert pub.spool.dropped_batches == 7
    healed = True
    for _ in range(1000):
        if not len(pub.spool):
            break
        await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert broker.probes() == [b"b7", b"b8", b"b9"]
    assert pub.counters()["dropped_batches"] == 7


async def test_stop_while_broker_down_returns_promptly() -> None:
    broker = FakeBroker()

    async def slow_sleep(delay: float) -> None:
        await asyncio.sleep(3600)

    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=slow_sleep)
    pub.submit(1, b"x")
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 2)  # the backoff wait is interrupted by stop
    assert len(pub.spool) == 1 and pub.errors >= 1


async def test_health_latest_only() -> None:
    broker = FakeBroker()
    broker.up = True
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=FakeSleep())
    pub.set_health({"n": 1})
    pub.set_health({"n": 2})
    await run_until(pub, lambda: any("/health/" in t for t, _, _ in broker.received))
    health = [json.loads(p) for t, p, _ in broker.received if t == f"qpmesh/v1/health/{HOST}"]
    assert health == [{"n": 2}]


def test_presence_payload() -> None:
    assert json.loads(presence_payload(True, 5)) == {"alive": True, "t_ns": 5}


# ---- real broker --------------------------------------------------------------------------------


@pytest.mark.broker
async def test_real_broker_in_order_and_retained_presence(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    cfg = BrokerSettings(host=host, port=port, timeout_s=3.0)
    got: list[bytes] = []
    async with aiomqtt.Client(host, port, identifier="t-sub") as sub:
        await sub.subscribe("qpmesh/v1/probes/#", qos=1, timeout=3)
        pub = Publisher(cfg, HOST, Spool())
        for i in range(50):
            pub.submit(i, f"batch-{i}".encode())
        stop = asyncio.Event()
        task = asyncio.create_task(pub.run(stop))

        async def collect() -> None:
            async for msg in sub.messages:
                got.append(bytes(msg.payload))  # type: ignore[arg-type]
                if len(got) == 50:
                    return

        await asyncio.wait_for(collect(), 10)
        stop.set()
        await asyncio.wait_for(task, 10)
    assert got == [f"batch-{i}".encode() for i in range(50)]
    # presence is retained: a late subscriber sees the clean-stop alive=false
    async with aiomqtt.Client(host, port, identifier="t-late") as late:
        await late.subscribe(f"qpmesh/v1/presence/{HOST}", qos=1, timeout=3)
        msg = await asyncio.wait_for(anext(aiter(late.messages)), 5)
        assert msg.retain and json.loads(msg.payload)["alive"] is False  # type: ignore[arg-type]


_CRASHER = """
import asyncio, sys
from mqttlink.settings import BrokerSettings
from prober.publish import Publisher
from prober.spool import Spool
async def main():
    pub = Publisher(BrokerSettings(host=sys.argv[1], port=int(sys.argv[2]), keepalive_s=1), "hostA", Spool())
    await pub.run(asyncio.Event())
asyncio.run(main())
"""


@pytest.mark.broker
async def test_last_will_marks_prober_down(mosquitto: tuple[str, int]) -> None:
    """A prober killed with SIGKILL: the broker publishes its retained will alive=false."""
    import subprocess
    import sys
    from pathlib import Path

    host, port = mosquitto
    async with aiomqtt.Client(host, port, identifier="t-will") as sub:
        await sub.subscribe(f"qpmesh/v1/presence/{HOST}", qos=1, timeout=3)
        proc = subprocess.Popen([sys.executable, "-c", _CRASHER, host, str(port)],
                                cwd=Path(__file__).parents[1])  # fmt: skip
        try:
            it = aiter(sub.messages)
            first = await asyncio.wait_for(anext(it), 10)
            assert json.loads(first.payload)["alive"] is True  # type: ignore[arg-type]
            proc.kill()
            proc.wait(timeout=5)
            nxt = await asyncio.wait_for(anext(it), 10)
            assert json.loads(nxt.payload)["alive"] is False  # type: ignore[arg-type]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
    async with aiomqtt.Client(host, port, identifier="t-will-late") as late:
        await late.subscribe(f"qpmesh/v1/presence/{HOST}", qos=1, timeout=3)
        msg = await asyncio.wait_for(anext(aiter(late.messages)), 5)
        assert msg.retain and json.loads(msg.payload)["alive"] is False  # type: ignore[arg-type]


@pytest.mark.broker
async def test_unreachable_broker_keeps_spool(mosquitto: tuple[str, int]) -> None:
    host, _ = mosquitto
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    pub = Publisher(BrokerSettings(host=host, port=dead, timeout_s=1.0, backoff_min_s=0.01,
                                   backoff_max_s=0.02), HOST, Spool())  # fmt: skip
    pub.submit(1, b"kept")
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert pub.errors >= 2 and pub.connects == 0 and len(pub.spool) == 1


async def test_paths_go_through_the_publisher_connection_and_survive_a_drop() -> None:
    """Discovered paths share the publisher's connection (no second client) and are resent
    after a lost PUBACK; the queue is bounded (oldest dropped, counted)."""
    from prober.publish import PATHS_QUEUE

    broker = FakeBroker()
    broker.up = True
    broker.lose_ack = {b'[{"p":1}]'}
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=FakeSleep())
    pub.submit_paths(b'[{"p":1}]')
    pub.submit_paths(b'[{"p":2}]')
    pub.submit(1, b"batch")
    paths = lambda: [p for t, p, _ in broker.received if t == f"qpmesh/v1/paths/{HOST}"]  # noqa: E731
    await run_until(pub, lambda: len(paths()) >= 3 and not len(pub.spool))
    assert paths() == [b'[{"p":1}]', b'[{"p":1}]', b'[{"p":2}]']
    assert broker.probes() == [b"batch"] and broker.connects == 2
    for i in range(PATHS_QUEUE + 5):
        pub.submit_paths(str(i).encode())
    assert pub.counters()["paths_dropped"] == 5


async def test_agent_paths_go_to_the_publisher(monkeypatch: pytest.MonkeyPatch) -> None:
    from prober.agent import Agent
    from prober.config import parse_config
    from prober.pathdisc import DiscoveredPath, PathKey

    cfg = parse_config({"prober": {"host": HOST}, "nics": [{"id": "n0", "address": "127.0.0.1"}]})
    pub = Publisher(settings(), HOST, Spool())
    agent = Agent(cfg, publisher=pub)  # (never started: no endpoint is made)
    sent: list[bytes] = []
    monkeypatch.setattr(pub, "submit_paths", sent.append)
    agent._paths_out.append(DiscoveredPath(PathKey("n0", "n1", 50000), ("10.0.0.254",), True, 0))

    real_sleep = asyncio.sleep

    async def fast_sleep(s: float) -> None:
        await real_sleep(0)

    monkeypatch.setattr("prober.agent.asyncio.sleep", fast_sleep)
    task = asyncio.create_task(agent._paths_publisher())
    for _ in range(100):
        if sent:
            break
        await real_sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(sent) == 1 and json.loads(sent[0])[0]["sport"] == 50000
