"""UDP transport for one NIC: a thin asyncio shell around a `ProbeSession`.

Sockets, RoCEv2-shaped (5-tuple: NIC address, peer address, UDP, source port, dport 4791):

- one *responder* socket bound to (NIC address, ``dport``): probes arrive there and replies /
  follow-ups leave from it back to the sender's (address, source port);
- one *initiator* socket per source port, bound to (NIC address, sport), in a pool keyed by
  port. Why a socket per port: the kernel takes the source port from the bound socket (neither
  ``sendto`` nor ``IP_PKTINFO`` can choose it), raw sockets would need CAP_NET_RAW and lose the
  kernel's UDP handling and per-socket TX stamps, and the schedule uses one fixed set of ~80
  ports per NIC (`prober.schedule`), so the pool is ~80 file descriptors per NIC. The replies
  and the ICMP errors of path discovery come back to the same socket, which keeps the 5-tuple
  of probe, reply and TTL-limited trace identical.

All sockets use ``SO_BINDTODEVICE`` when ``device`` is given, and SO_TIMESTAMPING
(`prober.timestamping`): hardware when the NIC supports it, software otherwise; without stamps
(``timestamping=False``) the user-space clock is used (`StampSource.USER`). ``stamp_counts``
tells which stamps were actually seen. Every stamp and every "now" goes through ``clock``
(kernel/realtime ns -> this NIC's clock; identity in production, a virtual clock with known
offset/drift in the testbed).

Errors from the OS at setup raise `UdpError`; at run time they are counted, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prober.events import Address, Datagram, ProbeEvent
from prober.session import Session
from prober.timestamping import (
    ANC_BUFSIZE,
    IP_TTL,
    SO_BINDTODEVICE,
    SO_EE_ORIGIN_ICMP,
    SO_EE_ORIGIN_TIMESTAMPING,
    SOL_IP,
    ExtendedErr,
    StampSource,
    enable_timestamping,
    parse_extended_err,
    parse_stamp,
)

ROCE_DPORT = 4791
_MAX_TOKENS = 65536
_TTL = struct.Struct("=i")  # an IP_TTL control message's int
# errnos an ICMP error leaves pending on an IP_RECVERR socket (icmp_err_convert): a send that
# reports one of them sent nothing and cleared it
_PENDING_ICMP_ERRNOS = frozenset(
    {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED, errno.EHOSTDOWN, errno.EPROTO,
     errno.ENOPROTOOPT, errno.ENONET}
)  # fmt: skip


class UdpError(OSError):
    """Setting up the UDP transport failed (bind, device, socket options)."""


IcmpHandler = Callable[[int, ExtendedErr, bytes, int], None]
"""Called as handler(sport, error, quoted_payload, now_ns) for each ICMP error (path discovery)."""


def identity_clock(ns: int) -> int:
    """Return ``ns``: the clock hook of a real host (kernel stamps are already its clock). The
    compiled engine recognises this very function and then maps no stamp through Python."""
    return ns


@dataclass(slots=True)
class _Sock:
    sock: socket.socket
    port: int
    sent: int = 0  # OPT_ID: the kernel numbers this socket's sends from 0
    tokens: dict[int, int] = field(default_factory=dict)


class UdpEndpoint:
    """Carry one NIC's probe session (a `prober.session.Session`) over UDP; use as ``async with``, or `start` / `close`.

    ``clock`` maps kernel/realtime ns to the NIC's clock; ``realtime`` reads the host clock
    (``time.time_ns``, the clock software stamps use). ``on_events`` receives completed results
    and losses (default: kept for `take_events`); ``on_icmp`` receives ICMP errors.
    ``spin_ns``: deadlines closer than this are busy-waited so coded pairs keep their 20 µs
    spacing (asyncio timers are millisecond-grained). ``on_events`` and ``on_icmp`` are plain
    attributes: adapters such as `prober.pathdisc.PathDiscovery` may chain into them.
    """

    def __init__(
        self,
        session: Session,
        addr: str,
        *,
        device: str | None = None,
        dport: int = ROCE_DPORT,
        sports: Iterable[int] = (),
        timestamping: bool = True,
        want_hw: bool = True,
        clock: Callable[[int], int] = identity_clock,
        realtime: Callable[[], int] = time.time_ns,
        on_events: Callable[[list[ProbeEvent]], None] | None = None,
        on_icmp: IcmpHandler | None = None,
        spin_ns: int = 300_000,
    ) -> None:
        self.session = session
        self.addr = addr
        self.device = device
        self.dport = dport
        self.timestamping = timestamping
        self.want_hw = want_hw
        self.clock = clock
        self.realtime = realtime
        self.on_icmp = on_icmp
        self.spin_ns = spin_ns
        self.counters: Counter[str] = Counter()
        self.stamp_counts: Counter[str] = Counter()
        self.stamp_source = StampSource.USER
        self.ttl_cmsg = True  # a trace probe's TTL in a control message (see `_sendto`)
        self.on_events = on_events
        self._events: list[ProbeEvent] = []
        self._initial_sports = tuple(sports)
        self._responder: _Sock | None = None
        self._pool: dict[int, _Sock] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._closed = False

    def resolve(self, nic_id: str, configured: Address) -> Address | None:
        """Return where to probe NIC ``nic_id``: its configured address (UDP learns nothing)."""
        return configured

    def route(
        self,
        on_events: Callable[[list[ProbeEvent]], None] | None,
        on_icmp: IcmpHandler | None,
    ) -> None:
        """Send future events and ICMP errors to these handlers (None: keep events for
        `take_events`, drop ICMP errors); `prober.pathdisc.TracingEndpoint` routes them
        through path discovery."""
        self.on_events = on_events
        self.on_icmp = on_icmp

    # ---- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Open the responder socket and the initial source-port pool; raise `UdpError`."""
        self._loop = asyncio.get_running_loop()
        self._responder = self._open_socket(self.dport)
        self.dport = self._responder.port
        for port in self._initial_sports:
            self.add_source_port(port)

    def close(self) -> None:
        """Close every socket (idempotent)."""
        self._closed = True
        self._wake.set()
        for st in [*self._pool.values(), *([self._responder] if self._responder else [])]:
            if self._loop is not None:
                self._loop.remove_reader(st.sock.fileno())
            st.sock.close()
        self._pool.clear()
        self._responder = None

    async def start(self, warmup_s: float = 0.5) -> None:
        """`open`, then wait (up to ``warmup_s``) until the kernel stamps received packets.

        Linux turns on RX software stamping lazily (a deferred work item, the first time any
        socket asks): datagrams that arrive before it runs carry no stamp and would fall back
        to the user clock. We send ourselves a datagram until one comes back stamped.
        """
        self.open()
        if self.timestamping:
            await self._warm_up(warmup_s)

    async def _warm_up(self, warmup_s: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + warmup_s
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((self.addr, 0))
                enable_timestamping(probe, None, want_hw=False)
                probe.settimeout(0.05)
                while loop.time() < end:
                    probe.sendto(b"qpmesh-warmup", probe.getsockname())
                    _, anc, _, _ = probe.recvmsg(64, ANC_BUFSIZE)
                    if parse_stamp(anc) is not None:
                        return
                    await asyncio.sleep(0.005)
            except OSError:
                pass
        self.counters["warmup_unstamped"] += 1

    async def __aenter__(self) -> UdpEndpoint:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _open_socket(self, port: int) -> _Sock:
        if self._closed:  # a socket opened now would never be closed (nor read)
            raise UdpError(errno.EBADF, f"UDP endpoint {self.addr} ({self.device}) is closed")
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            if self.device:
                sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, self.device.encode())
            sock.bind((self.addr, port))
            if self.timestamping:
                self.stamp_source = enable_timestamping(sock, self.device, self.want_hw)
            else:
                self.stamp_source = StampSource.USER
                sock.setsockopt(SOL_IP, 11, 1)  # IP_RECVERR still wanted for path discovery
        except OSError as exc:
            sock.close()
            raise UdpError(
                exc.errno, f"UDP socket {self.addr}:{port} ({self.device}): {exc}"
            ) from exc
        st = _Sock(sock, sock.getsockname()[1])
        assert self._loop is not None
        self._loop.add_reader(sock.fileno(), self._on_readable, st)
        return st

    def add_source_port(self, port: int) -> int:
        """Open (if needed) the initiator socket for ``port`` (0: any free) and return its port.

        Raises `UdpError` if the socket cannot be opened, or (EBADF) if the endpoint is closed."""
        if port and port in self._pool:
            return port
        st = self._open_socket(port)
        self._pool[st.port] = st
        return st.port

    @property
    def source_ports(self) -> tuple[int, ...]:
        """Return the source ports of the open initiator sockets."""
        return tuple(self._pool)

    # ---- sending -----------------------------------------------------------------------------

    def now_ns(self) -> int:
        """Return the current time in this NIC's clock."""
        return self.clock(self.realtime())

    def flush(self) -> None:
        """Send every datagram the session has due now."""
        for dgram in self.session.next_datagrams(self.now_ns()):
            self.send(dgram)

    def send(self, dgram: Datagram, ttl: int | None = None) -> bool:
        """Send one datagram from the socket its meta names; return False if the OS refused.

        ``ttl`` sets IP_TTL for this send only (path discovery).
        """
        sport = dgram.meta.sport
        st: _Sock | None = None
        try:
            st = self._pool.get(sport) if sport else self._responder
            if st is None and not sport and self._loop is not None:  # lost by `_renumber`
                st = self._responder = self._open_socket(self.dport)
            if st is None:
                st = self._pool[self.add_source_port(sport)]
            try:
                self._sendto(st.sock, dgram, ttl)
            except OSError as exc:
                # with IP_RECVERR an ICMP error (e.g. a trace's time-exceeded) leaves a
                # pending socket error that the *next* send reports and clears without
                # sending; its details are already queued, so send once more
                if exc.errno not in _PENDING_ICMP_ERRNOS:
                    raise
                self.counters["send_pending_icmp_error"] += 1
                self._sendto(st.sock, dgram, ttl)
        except OSError as exc:
            self.counters[f"send_error_{type(exc).__name__}"] += 1
            if st is not None:
                self._renumber(st)
            self._deliver(self.session.send_refused(dgram.meta.token))
            return False
        if self.timestamping:
            if dgram.meta.wants_tx_stamp:
                st.tokens[st.sent] = dgram.meta.token
                if len(st.tokens) > _MAX_TOKENS:
                    del st.tokens[next(iter(st.tokens))]
                    self.counters["tx_token_evicted"] += 1
            st.sent += 1
        elif dgram.meta.wants_tx_stamp:
            self.stamp_counts[StampSource.USER] += 1
            self._deliver(self.session.on_tx_stamp(dgram.meta.token, self.now_ns()))
        return True

    def _sendto(self, sock: socket.socket, dgram: Datagram, ttl: int | None) -> None:
        """Send ``dgram``; a ``ttl`` rides in an IP_TTL control message of the same system
        call (one call per trace probe instead of set, send, restore). A kernel that refuses
        the control message (EINVAL) gets the socket option around the send instead, from
        then on (counted ``ttl_cmsg_refused``)."""
        if ttl is None:
            sock.sendto(dgram.data, dgram.dest)
            return
        if self.ttl_cmsg:
            try:
                sock.sendmsg([dgram.data], [(SOL_IP, IP_TTL, _TTL.pack(ttl))], 0, dgram.dest)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.ttl_cmsg = False
                self.counters["ttl_cmsg_refused"] += 1
        sock.setsockopt(SOL_IP, IP_TTL, ttl)
        try:
            sock.sendto(dgram.data, dgram.dest)
        finally:
            sock.setsockopt(SOL_IP, IP_TTL, 64)

    def _renumber(self, st: _Sock) -> None:
        """Replace ``st`` by a fresh socket on the same port after a refused send.

        The kernel numbers a datagram for OPT_ID when it builds it, before netfilter or the
        qdisc can refuse it, so a refused send may use up a number that ``st.sent`` never
        counted (measured: an nftables drop, EPERM) and every later TX stamp of the socket would
        be matched to the wrong send, i.e. lost (its probes then never complete). A new socket
        numbers from 0 and old stamps cannot reach it; the stamps already queued are collected
        first. Counted ``socket_renumbered`` (``socket_reopen_failed``: the port is lost until
        a send opens it again).
        """
        if self._closed or not self.timestamping or self._loop is None:
            return
        events: list[ProbeEvent] = []
        self._drain_errqueue(st, events)
        self._deliver(events)
        self._reopen(st)

    def _reopen(self, st: _Sock) -> _Sock | None:
        """Close ``st`` and put a fresh socket on its port in its place (the responder or the
        pool's); return it (counted ``socket_renumbered``), or None when it cannot be opened
        (counted ``socket_reopen_failed``)."""
        assert self._loop is not None
        self._loop.remove_reader(st.sock.fileno())
        st.sock.close()
        is_responder = st is self._responder
        if not is_responder:
            self._pool.pop(st.port, None)
        try:
            new = self._open_socket(st.port)
        except OSError:  # UdpError, or socket() itself (e.g. out of descriptors)
            self.counters["socket_reopen_failed"] += 1
            if is_responder:
                self._responder = None
            return None
        if is_responder:
            self._responder = new
        else:
            self._pool[new.port] = new
        self.counters["socket_renumbered"] += 1
        return new

    # ---- receiving ---------------------------------------------------------------------------

    def _on_readable(self, st: _Sock) -> None:
        events: list[ProbeEvent] = []
        self._drain_errqueue(st, events)
        sock = st.sock
        while True:
            try:
                data, anc, _, src = sock.recvmsg(4096, ANC_BUFSIZE)
            except BlockingIOError:
                break
            except OSError as exc:  # e.g. ECONNREFUSED surfaced by IP_RECVERR: details queued
                self.counters[f"recv_error_{type(exc).__name__}"] += 1
                self._drain_errqueue(st, events)
                continue
            now = self.now_ns()
            stamp = parse_stamp(anc) if self.timestamping else None
            if stamp is None:
                rx, source = now, StampSource.USER
            else:
                rx, source = self.clock(stamp[0]), stamp[1]
            self.stamp_counts[source] += 1
            events += self.session.receive(data, (src[0], src[1]), rx, now)
        self._deliver(events)
        if not self._closed:
            self.flush()

    def _drain_errqueue(self, st: _Sock, events: list[ProbeEvent]) -> None:
        while True:
            try:
                data, anc, _, _ = st.sock.recvmsg(4096, ANC_BUFSIZE, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.counters[f"errqueue_error_{type(exc).__name__}"] += 1
                return
            err = parse_extended_err(anc)
            if err is None:
                self.counters["errqueue_unknown"] += 1
            elif err.origin == SO_EE_ORIGIN_TIMESTAMPING:
                token = st.tokens.pop(err.data, None)
                stamp = parse_stamp(anc)
                if token is not None and stamp is not None:
                    self.stamp_counts[stamp[1]] += 1
                    events += self.session.on_tx_stamp(token, self.clock(stamp[0]))
            elif err.origin == SO_EE_ORIGIN_ICMP:
                self.counters["icmp_errors"] += 1
                if self.on_icmp is not None:
                    self.on_icmp(st.port, err, data, self.now_ns())
            else:
                self.counters["errqueue_other"] += 1

    def _deliver(self, events: list[ProbeEvent]) -> None:
        if not events:
            return
        if self.on_events is not None:
            self.on_events(events)
        else:
            self._events += events

    def take_events(self) -> list[ProbeEvent]:
        """Return and forget the events collected so far (when no ``on_events`` was given)."""
        out, self._events = self._events, []
        return out

    # ---- timer loop --------------------------------------------------------------------------

    def wake(self) -> None:
        """Tell `run` that the session has new work (after ``queue_probe`` and friends)."""
        self._wake.set()

    async def run(self) -> None:
        """Send due probes, report timeouts, until `close`. Spins for near deadlines."""
        while not self._closed:
            self._deliver(self.session.poll(self.now_ns()))
            self.flush()
            deadline = self.session.next_deadline_ns()
            wait = 1.0
            if deadline is not None:
                gap = deadline - self.now_ns()
                if gap <= self.spin_ns:
                    while self.now_ns() < deadline:
                        pass
                    continue
                wait = min(wait, (gap - self.spin_ns) / 1e9)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.0)):
                    await self._wake.wait()
