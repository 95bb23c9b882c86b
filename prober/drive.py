"""One timer for every compiled endpoint of a prober: `CompiledDriver`.

With the compiled hot path each NIC used to run its own timer loop (`prober.fastudp.
BatchUdpEndpoint.run`: a future and a timer handle per turn), its own readiness callback and
drain tick, and its own delayed hand-over of records, and the agent had its scheduling loop
besides: at 8 NICs that was dozens of event-loop callbacks per 5 ms tick, each costing more
Python than the C call it made. The driver replaces them all by one task that wakes once per
tick (``tick_ns``, on the grid of the event loop's clock) and, in that one turn:

1. asks the agent's hook (``before_tick``) to queue the probes the schedule has due soon;
2. calls `prober.compiled.CompiledUdpEndpoint.tick` of every NIC: timeouts and records every
   ``poll_ns``, then one `Engine.tick` (drain whatever epoll reports ready, send the probes
   due, read the TX stamps those sends queued);
3. if a NIC's next probe (the second of a coded pair) is due within ``pair_spin_ns``, waits
   for it once for all NICs (busy: 20 µs is shorter than a timer's slack) and sends it.

A probe leaves up to one tick after its planned time (the schedule's own jitter is a quarter
period, 25 ms at 10 Hz) and a probe received is answered up to one tick after it arrived (its
t2 and t3 are kernel stamps, so that is responder residence, which neither the RTT nor the
one-way delays include), as with the per-NIC timers before. The wake-ups no longer depend on
the datagram rate or on the number of NICs.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence

from prober.compiled import CompiledUdpEndpoint


class CompiledDriver:
    """Tick ``endpoints`` (opened with ``external_ticks = True``) until `stop`.

    ``before_tick()`` runs first in every turn (the agent queues due probes there);
    ``tick_ns`` defaults to the endpoints' own tick. Raises `ValueError` for no endpoints or
    a tick that is not positive.
    """

    def __init__(
        self,
        endpoints: Sequence[CompiledUdpEndpoint],
        before_tick: Callable[[], None] | None = None,
        tick_ns: int | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("a driver needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self.before_tick = before_tick
        self.tick_ns = tick_ns if tick_ns is not None else self.endpoints[0].tick_ns
        if self.tick_ns <= 0:
            raise ValueError("tick_ns must be positive")
        self.pair_spin_ns = max(ep.pair_spin_ns for ep in self.endpoints)
        self.ticks = 0
        self._stopped = False

    def stop(self) -> None:
        """End `run` after its current turn."""
        self._stopped = True

    def turn(self) -> None:
        """One tick: the hook, every endpoint's `tick`, then the coded pairs' second probes."""
        self.ticks += 1
        if self.before_tick is not None:
            self.before_tick()
        spin: list[tuple[int, CompiledUdpEndpoint]] = []
        for ep in self.endpoints:
            now = ep.now_ns()
            try:
                ep.tick(now)
            except OSError as exc:  # epoll_wait failed: counted, the other NICs go on
                ep.counters[f"tick_error_{type(exc).__name__}"] += 1
                continue
            nxt = ep.next_send_ns()
            if nxt is not None and nxt - now <= self.pair_spin_ns:
                spin.append((nxt - now, ep))
        if spin:
            end = time.monotonic_ns() + max(gap for gap, _ in spin)
            while time.monotonic_ns() < end:
                pass
            for _, ep in spin:
                ep.flush()

    async def run(self) -> None:
        """Run `turn` once per tick, on the tick grid of the event loop's clock, until `stop`
        or every endpoint is closed."""
        loop = asyncio.get_running_loop()
        tick_s = self.tick_ns / 1e9
        while not self._stopped and not all(ep.closed for ep in self.endpoints):
            self.turn()
            t = loop.time()
            await asyncio.sleep(max(0.0, math.ceil((t + 1e-6) / tick_s) * tick_s - t))
