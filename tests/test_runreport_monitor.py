"""`testbed.runreport.Monitor` keeps every event it is sent, also on a busy machine.

aiomqtt's message iterator loses the message it just took off its queue when its
``__anext__`` is cancelled at that moment; a monitor that polls with a timeout around it
cancels it every idle period and, on a loaded machine, lost a contention event of a testbed
run. The fake client below records every cancellation of a pending read.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar

import pytest

from testbed import runreport


@dataclass
class _Msg:
    topic: str
    payload: bytes


class _FakeClient:
    """Messages come from a thread-safe list; counts reads cancelled while pending."""

    inbox: ClassVar[list[_Msg]] = []
    cancelled_reads = 0
    lock = threading.Lock()

    def __init__(self, host: str, port: int, timeout: float) -> None:
        del host, port, timeout

    async def __aenter__(self) -> _FakeClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def subscribe(self, topic: str, qos: int, timeout: float) -> None:
        del topic, qos, timeout

    @property
    def messages(self) -> AsyncIterator[_Msg]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[_Msg]:
        while True:
            try:
                while True:
                    with self.lock:
                        if self.inbox:
                            msg = self.inbox.pop(0)
                            break
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                type(self).cancelled_reads += 1
                raise
            yield msg


def _event(i: int) -> _Msg:
    doc = {"t_ns": i, "kind": "contention", "target": f"l{i}", "detail": "", "flows": []}
    return _Msg(f"qpmesh/v1/events/contention/{i}", json.dumps(doc).encode())


def test_monitor_never_cancels_a_pending_read_and_keeps_every_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_FakeClient, "inbox", [])
    monkeypatch.setattr(_FakeClient, "cancelled_reads", 0)
    monkeypatch.setattr("testbed.runreport.aiomqtt.Client", _FakeClient)
    mon = runreport.Monitor("127.0.0.1", 1)
    mon.start()
    try:
        for i in range(3):
            with _FakeClient.lock:
                _FakeClient.inbox.append(_event(i))
            deadline = time.monotonic() + 30
            while len(mon.events) <= i and time.monotonic() < deadline:
                time.sleep(0.05)
            polls = mon.polls  # then idle for two polling periods of the monitor's own
            while mon.polls < polls + 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert mon.polls >= polls + 2, "the monitor stopped polling"
        reads_cancelled_while_running = _FakeClient.cancelled_reads
    finally:
        mon.stop()
    assert [e["target"] for e in mon.events] == ["l0", "l1", "l2"]
    assert reads_cancelled_while_running == 0
    assert not mon.errors
