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

With ``batch`` (``prober.tick_batch``, the default) and every NIC on the host's clock, steps 2
and 3 are one C call for all NICs (`prober._fastpath.tick_all`: the same engine work, without
a Python wrapper, a clock read and a ``next_send_ns`` per NIC and tick); Python then sees only
the NICs that handed something back (trace datagrams, ICMP errors, a refused send), and the
timeouts of its own (trace) probes every ``poll_ns``. `batched` says whether it runs so.

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

from prober import compiled
from prober.compiled import CompiledUdpEndpoint


class CompiledDriver:
    """Tick ``endpoints`` (opened with ``external_ticks = True``) until `stop`.

    ``before_tick()`` runs first in every turn (the agent queues due probes there);
    ``tick_ns`` defaults to the endpoints' own tick; ``batch`` asks for one C call per tick
    for all of them (taken when every endpoint is on the host clock, `CompiledUdpEndpoint.
    host_clock`; `batched` says whether it was). Raises `ValueError` for no endpoints or a
    tick that is not positive.
    """

    def __init__(
        self,
        endpoints: Sequence[CompiledUdpEndpoint],
        before_tick: Callable[[], None] | None = None,
        tick_ns: int | None = None,
        batch: bool = True,
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
        self.batched = batch and all(ep.host_clock for ep in self.endpoints)
        self.engines = tuple(ep.engine for ep in self.endpoints)
        self.poll_ns = min(ep.poll_ns for ep in self.endpoints)
        self._next_poll = 0

    def stop(self) -> None:
        """End `run` after its current turn."""
        self._stopped = True

    def turn(self) -> None:
        """One tick: the hook, every endpoint's `tick`, then the coded pairs' second probes."""
        self.ticks += 1
        if self.before_tick is not None:
            self.before_tick()
        if self.batched:
            self._turn_batched()
            return
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

    def _turn_batched(self) -> None:
        """`turn`'s endpoint part as one `tick_all` call; Python for what it hands back."""
        eps = self.endpoints
        work = compiled.tick_all(self.engines, self.poll_ns, self.pair_spin_ns)
        if work is not None:
            for i, deferred, renumber, error in work:
                ep = eps[i]
                if error is not None:  # epoll_wait failed: counted, the other NICs went on
                    ep.counters[f"tick_error_{type(error).__name__}"] += 1
                    continue
                if not ep.closed:
                    ep.after_tick_all(deferred, renumber)
        now = time.time_ns()  # the host clock, as tick_all's
        if now >= self._next_poll:
            self._next_poll = now + self.poll_ns
            for ep in eps:
                if not ep.closed:
                    ep.poll_python(now)

    async def run(self) -> None:
        """Run `turn` once per tick, on the tick grid of the event loop's clock, until `stop`
        or every endpoint is closed; an exception of `turn` ends it (raised here).

        Each turn is a timer callback of the event loop (``loop.call_at`` on the grid), not a
        task step after ``asyncio.sleep``: a sleeping task is woken through its future and a
        second pass of the loop (another ``epoll_wait`` and the task machinery) every tick."""
        loop = asyncio.get_running_loop()
        tick_s = self.tick_ns / 1e9
        done: asyncio.Future[None] = loop.create_future()
        handle: asyncio.TimerHandle | None = None
        eps = self.endpoints

        def step() -> None:
            nonlocal handle
            handle = None
            if done.done():
                return
            if self._stopped or all(ep.closed for ep in eps):
                done.set_result(None)
                return
            try:
                self.turn()
            except Exception as exc:
                done.set_exception(exc)
                return
            t = loop.time()
            handle = loop.call_at(math.ceil((t + 1e-6) / tick_s) * tick_s, step)

        step()
        try:
            await done
        finally:
            if handle is not None:
                handle.cancel()
