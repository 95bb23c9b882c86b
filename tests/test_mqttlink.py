"""The one reconnect loop: backoff grows while the broker is away, resets after a good
connection, and `run_service` uses it (the bug was a controller that never reset)."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Callable
from typing import Any

import aiomqtt
import pytest

from mqttlink.reconnect import Backoff, reconnect_loop, stop_tasks
from tests.waiting import until


def test_backoff_doubles_caps_and_resets() -> None:
    b = Backoff(0.5, 3.0)
    assert [b.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.reset()
    assert b.next_delay() == 0.5
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)


def test_backoff_jitter_shortens_each_delay_by_at_most_its_share() -> None:
    draws = iter([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.5])
    b = Backoff(0.5, 4.0, jitter=0.25, rand=lambda: next(draws))
    assert [b.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert [b.next_delay() for _ in range(2)] == [3.0, 3.5]  # capped, then 25% / 12.5% off
    b.reset()
    assert Backoff(1.0, 2.0, rand=lambda: 1 / 0).next_delay() == 1.0  # no jitter: no draw
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            Backoff(0.5, 4.0, jitter=bad)


def _run(session: Callable[[Callable[[], None]], Any], attempts: int) -> list[float]:
    waits: list[float] = []

    async def pause(delay: float) -> bool:
        waits.append(delay)
        return False

    asyncio.run(
        reconnect_loop(session, Backoff(1.0, 8.0), on_error=lambda e, d: None, pause=pause,
                       max_attempts=attempts)
    )  # fmt: skip
    return waits


def test_backoff_resets_after_a_connection_that_worked() -> None:
    plan = iter([False, False, False, True, False, True, True])  # connected before failing?

    async def session(connected: Callable[[], None]) -> None:
        if next(plan):
            connected()
        raise aiomqtt.MqttError("broker went away")

    waits = _run(session, 7)
    # three refused connects grow the wait; a good connection starts it over
    assert waits == [1.0, 2.0, 4.0, 1.0, 2.0, 1.0, 1.0]


def test_clean_return_ends_the_loop_and_other_errors_propagate() -> None:
    async def fine(connected: Callable[[], None]) -> None:
        connected()

    assert _run(fine, 5) == []

    async def broken(connected: Callable[[], None]) -> None:
        raise KeyError("a bug, not the broker")

    with pytest.raises(KeyError):
        _run(broken, 5)


def test_run_service_resets_its_backoff_after_a_good_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from contract.topics import Topics
    from controller import service
    from controller.config import ServiceConfig
    from controller.dispatch import JsonLog
    from mesh.fabric import FabricShape, build_fabric

    calls = {"n": 0}

    async def serve_once(*args: Any, connected: Callable[[], None], **kw: Any) -> None:
        calls["n"] += 1
        connected()  # subscribed, then the broker drops us
        raise aiomqtt.MqttError("connection lost")

    monkeypatch.setattr(service, "serve_once", serve_once)
    cfg = ServiceConfig(
        fabric=build_fabric(FabricShape(leaves=1, hosts_per_leaf=2, spines=1)),
        backoff_s=(0.001, 0.5),
    )
    out = io.StringIO()
    asyncio.run(
        service.run_service(service.Broker("127.0.0.1", 1, Topics()), cfg, log=JsonLog(out),
                            max_attempts=6)
    )  # fmt: skip
    retries = [line for line in out.getvalue().splitlines() if "broker error" in line]
    assert calls["n"] == 6 and len(retries) == 6
    # every connection worked before it dropped: every wait is the minimum, never doubled
    assert all('"retry_in_s": 0.001' in line for line in retries), retries


async def test_follow_hands_on_every_message_and_reports_errors_in_one_line(
    mosquitto: tuple[str, int],
) -> None:
    """The one follower session: retained messages arrive after subscribing, each to
    ``apply``; a broker that is not there is one line per try and the loop goes on."""
    from mqttlink.follow import follow
    from mqttlink.settings import BrokerSettings
    from tests.servers import free_port

    host, port = mosquitto
    seen: list[tuple[str, bytes]] = []
    connects: list[int] = []
    errors: list[str] = []

    def apply(topic: str, payload: bytes | bytearray) -> None:
        seen.append((topic, bytes(payload)))

    async with aiomqtt.Client(host, port, identifier="qpt-follow-pub") as pub:
        await pub.publish("qpt/v1/x/h1", b"one", 1, retain=True)
        await pub.publish("qpt/v1/y/h1", b"other", 1, retain=True)
        settings = BrokerSettings(host=host, port=port, prefix="qpt/v1", timeout_s=5.0)
        task = asyncio.create_task(follow(
            settings, "qpt-follow", "qpt/v1/x/+", apply, what="x subscription",
            on_connect=lambda: connects.append(1), on_error=errors.append,
        ))  # fmt: skip
        try:
            await until(lambda: bool(seen), 20.0)
            await pub.publish("qpt/v1/x/h2", b"two", 1)
            await until(lambda: len(seen) > 1, 20.0)
            assert seen == [("qpt/v1/x/h1", b"one"), ("qpt/v1/x/h2", b"two")]
            assert connects == [1] and errors == []
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    away = BrokerSettings(port=free_port(), timeout_s=2.0, backoff_min_s=0.01, backoff_max_s=0.02)
    task = asyncio.create_task(follow(
        away, "qpt-follow-away", "qpt/v1/x/+", apply, what="x subscription",
        on_connect=lambda: connects.append(1), on_error=errors.append,
    ))  # fmt: skip
    try:
        await until(lambda: len(errors) >= 2, 20.0)
        assert len(errors) >= 2 and connects == [1]
        assert errors[0].startswith("x subscription: MqttError: ") and "\n" not in errors[0]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_stop_tasks_cancels_again_a_task_that_lost_its_first_cancel() -> None:
    """A task whose first cancel a library's `asyncio.wait_for` swallowed (Python 3.11,
    cpython gh-86296) is cancelled again; one that fails has its error kept, not raised."""

    async def loses_one_cancel(lost: list[bool]) -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)  # what wait_for does when the call completes at the cancel

    async def fails() -> None:
        raise RuntimeError("boom")

    async def main() -> tuple[bool, bool, str]:
        lost: list[bool] = []
        a = asyncio.create_task(loses_one_cancel(lost))
        b = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await asyncio.wait_for(stop_tasks([a, b], again_s=0.05), 5)
        return bool(lost), a.cancelled(), str(b.exception())

    assert asyncio.run(main()) == (True, True, "boom")
