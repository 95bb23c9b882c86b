"""The batched UDP hot path: `BatchUdpEndpoint`, a `prober.udp.UdpEndpoint` that works per tick.

Same sockets, same stamps, same session and the same interface as `UdpEndpoint` (the
per-datagram path, kept as the benchmark baseline); what changes is how much work each
datagram costs:

- **receiving**: one readiness callback per socket drains it with ``recvmmsg`` (64 datagrams
  per system call, control messages included; `prober.mmsg`), stamps are read from the
  preallocated control buffers, and the whole batch goes to `ProbeSession.receive_many`
  (`ProbeSession.receive`'s rule applied to each: the same validation, HMAC check and
  matching). The error queue (TX stamps, ICMP errors) is drained the same way and fed to
  `ProbeSession.on_tx_stamps`.
- **sending**: replies and follow-ups are not sent from inside each callback; one flush per
  event-loop iteration (``call_soon``) sends everything the session has due, grouped by
  socket, with ``sendmmsg``. OPT_ID numbering stays per datagram (each message of a
  ``sendmmsg`` is its own send for the kernel).
- **timers**: `run` wakes at most once per ``tick_ns`` (default 5 ms), on a tick grid shared
  by every endpoint of the process, and sends everything due by then (a probe leaves up to
  one tick after its planned time: the schedule jitters probe times by a quarter period, 25 ms
  at 10 Hz, anyway, and stamps are taken by the kernel, not by the planner); `wake` only
  interrupts the sleep when new work is due before the planned wake-up;
  only a deadline closer than ``pair_spin_ns`` (the second probe of a coded pair, 20 µs) is
  busy-waited; probe timeouts are checked every ``poll_ns`` (10 ms), not at each probe's own
  deadline. The per-datagram path spins up to 300 µs before every probe, wakes at every
  probe's timeout and runs an ``asyncio.wait_for`` (a task) per wake-up.

Runtime errors are counted in ``counters`` as in `UdpEndpoint`; nothing raises at run time.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections import defaultdict
from typing import Any

from prober.events import Datagram, ProbeEvent
from prober.mmsg import RecvRing, SendRing
from prober.session import Session
from prober.timestamping import (
    SO_EE_ORIGIN_ICMP,
    SO_EE_ORIGIN_TIMESTAMPING,
    StampSource,
    parse_extended_err,
)
from prober.udp import _MAX_TOKENS, UdpEndpoint, _Sock

_RING = 64
_RCVBUF = 4 << 20
_SO_RCVBUFFORCE = 33


class BatchUdpEndpoint(UdpEndpoint):
    """`UdpEndpoint` with batched socket calls, per-tick timers and batched session calls.

    Extra arguments: ``tick_ns`` (timer granularity of `run`), ``pair_spin_ns`` (send times
    closer than this are busy-waited: coded-pair spacing), ``poll_ns`` (timeouts are
    reported at most this long after they pass: one timer for many probes' timeouts). See
    the module docstring.
    """

    def __init__(self, session: Session, addr: str, *, tick_ns: int = 5_000_000,
                 pair_spin_ns: int = 50_000, poll_ns: int = 10_000_000,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(session, addr, **kwargs)
        if tick_ns <= 0 or pair_spin_ns < 0 or poll_ns <= 0:
            raise ValueError("tick_ns and poll_ns must be positive and pair_spin_ns >= 0")
        self.tick_ns = tick_ns
        self.poll_ns = poll_ns
        self.pair_spin_ns = pair_spin_ns
        self._rx = RecvRing(_RING, 2048, 256)
        self._errq = RecvRing(_RING, 2048, 256, errqueue=True)
        self._tx = SendRing(_RING, 2048 + 64)
        self._flush_scheduled = False
        self._waiter: asyncio.Future[None] | None = None
        self._wake_at_ns = 0

    def _open_socket(self, port: int) -> _Sock:
        st = super()._open_socket(port)
        # a turn answers a whole batch at once: its TX stamps come back together and share the
        # receive buffer with the next probes; a stamp the buffer cannot take is dropped by the
        # kernel (the reply's FOLLOW_UP is then never sent). Ask for room (root may exceed
        # net.core.rmem_max with SO_RCVBUFFORCE).
        for opt in (_SO_RCVBUFFORCE, socket.SO_RCVBUF):
            try:
                st.sock.setsockopt(socket.SOL_SOCKET, opt, _RCVBUF)
                break
            except OSError:
                continue
        return st

    # ---- receiving ---------------------------------------------------------------------------

    def _on_readable(self, st: _Sock) -> None:
        events: list[ProbeEvent] = []
        self._drain_errqueue(st, events)
        fd = st.sock.fileno()
        ring, clock, counts = self._rx, self.clock, self.stamp_counts
        stamped = self.timestamping
        while True:
            try:
                n = ring.recv(fd)
            except OSError as exc:  # e.g. ECONNREFUSED surfaced by IP_RECVERR: details queued
                self.counters[f"recv_error_{type(exc).__name__}"] += 1
                self._drain_errqueue(st, events)
                continue
            if not n:
                break
            now = self.now_ns()
            batch, sources = ring.received(n, clock, now, stamped)
            counts.update(sources)
            events += self.session.receive_many(batch, now)
            if n < ring.size:
                break
        self._deliver(events)
        self._schedule_flush()

    def _drain_errqueue(self, st: _Sock, events: list[ProbeEvent]) -> None:
        ring, fd = self._errq, st.sock.fileno()
        while True:
            try:
                n = ring.recv(fd)
            except OSError as exc:
                self.counters[f"errqueue_error_{type(exc).__name__}"] += 1
                return
            if not n:
                return
            stamps: list[tuple[int, int]] = []
            tokens, clock, counts = st.tokens, self.clock, self.stamp_counts
            for i in range(n):
                origin, data, ns, source = ring.tx_stamp(i)
                if origin == SO_EE_ORIGIN_TIMESTAMPING:
                    token = tokens.pop(data, None)
                    if token is not None and source is not None:
                        counts[source] += 1
                        stamps.append((token, clock(ns)))
                    continue
                err = parse_extended_err(ring.cmsgs(i))
                if err is None:
                    self.counters["errqueue_unknown"] += 1
                elif err.origin == SO_EE_ORIGIN_ICMP:
                    self.counters["icmp_errors"] += 1
                    if self.on_icmp is not None:
                        self.on_icmp(st.port, err, bytes(ring.payload(i)), self.now_ns())
                else:
                    self.counters["errqueue_other"] += 1
            if stamps:
                events += self.session.on_tx_stamps(stamps)
            if n < ring.size:
                return

    # ---- sending -----------------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        if self._flush_scheduled or self._closed or self._loop is None:
            return
        self._flush_scheduled = True
        self._loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        if not self._closed:
            self.flush()

    def flush(self) -> None:
        """Send every datagram the session has due now, one ``sendmmsg`` per socket."""
        dgrams = self.session.next_datagrams(self.now_ns())
        if not dgrams:
            return
        if len(dgrams) == 1:
            self.send(dgrams[0])
            return
        groups: defaultdict[int, list[Datagram]] = defaultdict(list)
        for d in dgrams:
            groups[d.meta.sport].append(d)
        for sport, group in groups.items():
            st = self._pool.get(sport) if sport else self._responder
            if st is None:
                for d in group:
                    self.send(d)  # opens the port's socket
                continue
            self._send_group(st, group)

    def _send_group(self, st: _Sock, group: list[Datagram]) -> None:
        i, n = 0, len(group)
        while i < n:
            try:
                k = self._tx.send(
                    st.sock.fileno(), [(d.data, d.dest) for d in group[i : i + self._tx.size]]
                )
            except (OSError, ValueError):
                k = 0
            if k == 0:  # refused: the per-datagram send reports (and counts) why
                self._renumber(st)  # the refused datagram may have used up a stamp number
                self.send(group[i])
                i += 1
                sport = group[i - 1].meta.sport
                nxt = self._pool.get(sport) if sport else self._responder
                if nxt is None:
                    for d in group[i:]:
                        self.send(d)
                    return
                st = nxt
                continue
            if self.timestamping:
                tokens = st.tokens
                for d in group[i : i + k]:
                    if d.meta.token != -1:
                        tokens[st.sent] = d.meta.token
                        if len(tokens) > _MAX_TOKENS:
                            del tokens[next(iter(tokens))]
                            self.counters["tx_token_evicted"] += 1
                    st.sent += 1
            else:
                for d in group[i : i + k]:
                    if d.meta.wants_tx_stamp:
                        self.stamp_counts[StampSource.USER] += 1
                        self._deliver(self.session.on_tx_stamp(d.meta.token, self.now_ns()))
            i += k

    # ---- timer loop --------------------------------------------------------------------------

    def wake(self) -> None:
        """Tell `run` that the session has new work (after ``queue_probe`` and friends).

        `run` is only woken early when the new work is due before its planned wake-up (the
        agent queues probes ahead of time: most calls cost nothing).
        """
        w = self._waiter
        if w is None or w.done():
            return
        nxt = self.session.next_send_ns()
        if nxt is not None and nxt < self._wake_at_ns:
            w.set_result(None)

    def close(self) -> None:
        """Close every socket (idempotent) and stop `run`."""
        super().close()
        self.wake()

    async def run(self) -> None:
        """Send due probes once per tick and report timeouts every ``poll_ns``, until `close`.

        Every turn ends in an ``await`` of at least one tick, also when probes are overdue (a
        backlog after a stall is sent a tick at a time, everything due at once): the
        readiness callbacks, the publisher and the agent keep running.
        """
        loop = asyncio.get_running_loop()
        tick, session, now_ns = self.tick_ns, self.session, self.now_ns
        tick_s = tick / 1e9
        next_poll = 0
        while not self._closed:
            now = now_ns()
            if now >= next_poll:
                self._deliver(session.poll(now))
                next_poll = now + self.poll_ns
            self.flush()
            send_at = session.next_send_ns()
            timeout_at = session.next_timeout_ns()
            deadline = None if timeout_at is None else max(timeout_at, next_poll)
            if send_at is not None:
                gap = send_at - now_ns()
                if gap <= self.pair_spin_ns:  # the second probe of a coded pair: keep 20 us
                    while now_ns() < send_at:
                        pass
                    self.flush()
                    send_at = session.next_send_ns()
                if send_at is not None:
                    deadline = send_at if deadline is None else min(deadline, send_at)
            wait_ns = 1_000_000_000
            if deadline is not None:
                wait_ns = min(wait_ns, max(deadline - now_ns(), tick))
            # wake on the tick grid of the loop's clock: the timers of all endpoints of this
            # process fire together, one event-loop turn for all of them
            t = loop.time()
            at = math.ceil((t + wait_ns / 1e9) / tick_s) * tick_s
            fut: asyncio.Future[None] = loop.create_future()
            self._waiter = fut
            self._wake_at_ns = now_ns() + int((at - t) * 1e9)
            handle = loop.call_at(at, _resolve, fut)
            try:
                await fut
            finally:
                handle.cancel()
                self._waiter = None


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
