"""`prober.drive.CompiledDriver.run`: one turn per tick until stopped or every endpoint closed,
errors out of `run`, cancellation leaves no turn behind (fake endpoints, the real event loop)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any, cast

import pytest

from prober.compiled import CompiledUdpEndpoint
from prober.drive import CompiledDriver
from tests.waiting import until


class _Ep:
    """What the driver uses of a `CompiledUdpEndpoint`."""

    tick_ns = 1_000_000
    pair_spin_ns = 0
    poll_ns = 1_000_000
    host_clock = False  # a fake: the per-NIC turn (tick_all needs real engines)
    engine = None

    def __init__(self, fail_at: int = -1) -> None:
        self.ticks = 0
        self.closed = False
        self.counters: Counter[str] = Counter()
        self.fail_at = fail_at

    def now_ns(self) -> int:
        return 0

    def tick(self, now_ns: int) -> None:
        self.ticks += 1
        if self.ticks == self.fail_at:
            raise RuntimeError("boom")

    def next_send_ns(self) -> int | None:
        return None

    def flush(self) -> None:
        pass


def _driver(*eps: _Ep, hook: Any = None) -> CompiledDriver:
    return CompiledDriver(cast(list[CompiledUdpEndpoint], list(eps)), before_tick=hook)


async def test_run_turns_every_tick_until_stop_or_all_closed() -> None:
    a, b = _Ep(), _Ep()
    hooks: list[int] = []
    drv = _driver(a, b, hook=lambda: hooks.append(a.ticks))
    task = asyncio.create_task(drv.run())
    await until(lambda: drv.ticks >= 5, 20.0, 0.005)
    assert a.ticks == b.ticks == drv.ticks and hooks[:3] == [0, 1, 2]  # hook first, each turn
    drv.stop()
    await asyncio.wait_for(task, 20)
    n = drv.ticks
    await asyncio.sleep(0.02)
    assert drv.ticks == n  # no turn after run returned
    # every endpoint closed: run returns too
    c, d = _Ep(), _Ep()
    drv2 = _driver(c, d)
    task2 = asyncio.create_task(drv2.run())
    await until(lambda: drv2.ticks >= 2, 20.0, 0.005)
    c.closed = True
    await asyncio.sleep(0.01)
    assert not task2.done()  # one endpoint still open
    d.closed = True
    await asyncio.wait_for(task2, 20)


async def test_turns_are_timer_callbacks_on_the_tick_grid() -> None:
    """After the first turn (run's own step), every turn is a timer callback of the event loop
    (no task runs it: no ``asyncio.sleep`` wake-up through a future and a second loop pass),
    called at or just after a point of the ``tick_ns`` grid of the loop's clock, one per grid
    point."""
    loop = asyncio.get_running_loop()
    seen: list[tuple[float, bool]] = []
    drv = _driver(_Ep(), hook=lambda: seen.append((loop.time(), asyncio.current_task() is None)))
    task = asyncio.create_task(drv.run())
    await until(lambda: drv.ticks >= 12, 20.0, 0.005)
    drv.stop()
    await asyncio.wait_for(task, 20)
    assert seen[0][1] is False and all(cb for _, cb in seen[1:])
    tick_s = drv.tick_ns / 1e9
    slots = [round(t / tick_s - 0.5) for t, _ in seen[1:]]  # the grid point each one follows
    assert all(b > a for a, b in itertools.pairwise(slots))  # one turn per point
    for (t, _), k in zip(seen[1:], slots, strict=True):
        assert k * tick_s - 1e-9 <= t  # never early


async def test_an_error_in_a_turn_ends_run_with_it_and_cancel_stops_the_timer() -> None:
    drv = _driver(_Ep(fail_at=3))
    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.wait_for(drv.run(), 20)
    assert drv.ticks == 3
    ep = _Ep()
    drv2 = _driver(ep)
    task = asyncio.create_task(drv2.run())
    await until(lambda: drv2.ticks >= 2, 20.0, 0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    n = drv2.ticks
    await asyncio.sleep(0.02)
    assert drv2.ticks == n  # the pending turn was cancelled with run
