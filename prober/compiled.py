"""The compiled UDP hot path: `CompiledSession` + `CompiledUdpEndpoint` over `prober._fastpath`.

The per-datagram work of `prober.session.ProbeSession` and `prober.fastudp` moves into one C
`Engine` per NIC (``prober/_fastpath.c``, built by ``pip install -e .``): ``recvmmsg`` with the
SO_TIMESTAMPING control messages, the wire checks of `prober.wire.Codec.decode` (same order,
same counter reasons), answering probes (REPLY, then the FOLLOW_UP once the reply's TX stamp
is read), matching replies and follow-ups to pending probes, ``sendmmsg``, TX stamps from the
error queue (read right after each send: software stamps are queued during the send, so
follow-ups and t1 need no further wake-up), and probe timeouts. Python gets completed records
and losses as `prober.events.ResultBlock` rows (columns, no per-record object) and keeps the
schedule, the timers (`prober.fastudp.BatchUdpEndpoint.run`), the sockets' setup and path
discovery: trace probes and their replies, and ICMP errors, are handed back ("deferred") and
handled by the Python session and endpoint as before.

Deferred follow-ups (``defer_follow_ups``, the default; wire format in `prober.wire`): the
engine's probes set DEFER_OK, and a reply's t3 to a probe that set it is held per initiator
NIC and carried in the next REPLY to that NIC, or after ``hold_ns`` (`Engine.poll`, on the
endpoint's ``poll_ns`` grid) sent as one FOLLOW_UP with all of that NIC's held t3s; closing the
endpoint sends what is held. One datagram per answered probe instead of two. The session
counts (health ``counters.sessions``) ``follow_ups_sent``, ``t3_held``, ``t3_carried`` (in
replies), ``t3_flushed`` (in hold-time follow-ups) and ``t3_received`` (held t3s that
completed a probe here).

Follow-ups leave without a TX stamp of their own (a per-message ``SO_TIMESTAMPING`` control
message of 0): nobody needs the follow-up's send time, and the kernel then neither clones it
to the error queue nor counts it in OPT_ID (checked at first use by `opt_id_counts_unstamped`;
a kernel that counts every send is handled too).

Probe authentication (``[auth] key_file``, docs/security.md): with an HMAC-keyed codec the
engine tags and verifies exactly as `prober.wire.Codec` does (AUTH flag, a 16-byte
HMAC-SHA256 tag over everything before it, t3 lists and padding included): the codec's send
key tags every datagram the engine makes, every key of the set verifies (a rotation), the
tag is compared in constant time, and a datagram with a missing or wrong tag is counted
``bad_auth`` and is neither answered nor matched. SHA-256 and HMAC are the engine's own code
(no library); each key's padded blocks are hashed once, so a tag costs 2 SHA-256 blocks for
a probe. Python-made datagrams (trace probes and replies) use the codec itself.

What the engine does not do, and the fallback: one-step sessions and endpoints without
kernel stamps use the Python paths (`available` says whether the extension was built;
`prober.agent` picks). Runtime errors are counted, never raised.
"""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from prober.events import Address, Datagram, ProbeEvent, ResultBlock
from prober.fastudp import BatchUdpEndpoint
from prober.session import ProbeSession, Received
from prober.timestamping import (
    SO_EE_ORIGIN_ICMP,
    SO_TIMESTAMPING,
    SW_FLAGS,
    enable_timestamping,
    parse_extended_err,
)
from prober.udp import _Sock, identity_clock
from prober.wire import WIRE_ERROR_REASONS, Codec, nic_hash

try:
    from prober import _fastpath
except ImportError:  # not built (no compiler at install time): the Python paths remain
    _fastpath = None  # type: ignore[assignment]

_NCOL = 11
_IP_MTU_DISCOVER = 10  # linux/in.h
_IP_PMTUDISC_DO = 2
BUSY_BATCH = 16
"""A drain that read at least this many datagrams and stamps means a heavy load: the next
readiness is served at once instead of on the next tick (see `CompiledUdpEndpoint`)."""
_SESSION_KEYS = frozenset(WIRE_ERROR_REASONS) | {
    "misdirected", "wrong_sender", "mismatch", "unmatched", "duplicate", "inconsistent",
    "incomplete", "late_tx_stamp", "tx_stamp_missing", "overflow", "lost", "send_refused",
    "follow_ups_sent", "t3_held", "t3_carried", "t3_flushed", "t3_received",
}  # fmt: skip
_STAMP_KEYS = {"stamp_hw": "hw", "stamp_sw": "sw", "stamp_user": "user"}
DEFAULT_HOLD_NS = 250_000_000
"""How long a responder holds a deferred t3 for a REPLY to carry (see `prober.wire`)."""


def _earliest(a: int | None, b: int | None) -> int | None:
    """Return the earlier of two optional times (None: nothing due)."""
    if a is None:
        return b
    return a if b is None or a < b else b


def available() -> bool:
    """Return True when the C extension `prober._fastpath` is importable (it was built)."""
    return _fastpath is not None


@functools.cache
def opt_id_counts_unstamped() -> bool | None:
    """Return whether this kernel's OPT_ID counter also counts sends made without a TX stamp
    (a per-message ``SO_TIMESTAMPING`` of 0): False on current kernels (only stamped sends
    are counted), True on kernels that count every send, None when per-message stamp flags
    are refused (then follow-ups keep their stamp). Checked once per process on loopback."""
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        enable_timestamping(tx, None, want_hw=False)
        dest = rx.getsockname()
        zero = (socket.SOL_SOCKET, SO_TIMESTAMPING, (0).to_bytes(4, "little"))
        try:
            tx.sendmsg([b"u"], [zero], 0, dest)
        except OSError:
            return None
        tx.sendto(b"s", dest)
        tx.settimeout(1.0)
        for _ in range(100):
            try:
                _, anc, _, _ = tx.recvmsg(64, 512, socket.MSG_ERRQUEUE)
            except (BlockingIOError, TimeoutError):
                time.sleep(0.005)
                continue
            err = parse_extended_err(anc)
            if err is not None:
                return bool(err.data == 1)
        return None
    except OSError:
        return None
    finally:
        tx.close()
        rx.close()


class CompiledSession:
    """One NIC's `prober.session.Session` whose probes, replies, follow-ups, matching and
    timeouts run in the C engine (``engine``); needs a `CompiledUdpEndpoint` to carry it.

    The engine is this session's rule set, tested equal to `ProbeSession`'s
    (tests/test_prober_compiled*.py); what it hands back (trace probes and their replies, for
    path discovery) goes through ``python``, a `ProbeSession` of the same NIC and codec, whose
    ``counters`` are this session's (the engine's counts are merged into them, same keys). A
    session made of the two, not a `ProbeSession` subclass: no Python rule is overridden.

    Arguments as `ProbeSession`'s, plus ``defer_follow_ups`` (set DEFER_OK on probes and
    honour it as a responder, see the module docstring) and ``hold_ns`` (how long a held t3
    waits for a REPLY to carry it; default min(250 ms, timeout_ns / 4)). An HMAC-keyed
    ``codec`` is handed to the engine (its send key tags, all its keys verify). Raises
    `ValueError` for a one-step session (use `ProbeSession`), a ``pad`` that leaves no room
    for the tag in the engine's 2,048-byte slot, a ``hold_ns`` over half of ``timeout_ns``
    (held t3s must reach initiators before their timeout) and what `ProbeSession` refuses,
    `RuntimeError` when the extension is not built.
    Completed results and losses come out of `take_events` (and `poll`, `receive`) as
    `ResultBlock`s.
    """

    def __init__(
        self,
        nic_id: str,
        codec: Codec | None = None,
        *,
        timeout_ns: int = 1_000_000_000,
        one_step: bool = False,
        max_pending: int = 65536,
        seq_start: int = 0,
        pad: int = 0,
        defer_follow_ups: bool = True,
        hold_ns: int | None = None,
    ) -> None:
        if _fastpath is None:
            raise RuntimeError("prober._fastpath is not built (pip install -e . with a compiler)")
        self.python = ProbeSession(nic_id, codec, timeout_ns=timeout_ns, max_pending=max_pending,
                                   pad=pad)  # fmt: skip
        if one_step:
            raise ValueError("the compiled path speaks the two-step protocol")
        if hold_ns is None:
            hold_ns = min(DEFAULT_HOLD_NS, timeout_ns // 4)
        if not 0 <= hold_ns <= timeout_ns // 2:
            raise ValueError(f"hold_ns {hold_ns} must be in 0..timeout_ns/2 ({timeout_ns // 2})")
        self.nic_id = nic_id
        self.nic = self.python.nic
        self.codec = self.python.codec
        self.timeout_ns = timeout_ns
        self.defer_follow_ups = defer_follow_ups
        self.hold_ns = hold_ns
        mode = opt_id_counts_unstamped()
        self.engine = _fastpath.Engine(
            self.nic, timeout_ns, max_pending, pad, seq_start,
            stamp_followups=mode is None, unstamped_count=bool(mode),
            defer=defer_follow_ups, hold_ns=hold_ns, keys=self.codec.keys or None,
        )  # fmt: skip
        self._dst_index: dict[str, int] = {}
        self._dsts: list[str] = []
        self._dst_hashes: list[int] = []
        self._dsts_frozen: tuple[str, ...] = ()
        self._transport_counters: Counter[str] | None = None
        self._stamp_counts: Counter[str] | None = None
        self._ensure_port: Callable[[int], int] | None = None
        self._open_ports: Mapping[int, object] = {}

    # ---- counters ------------------------------------------------------------------------------

    @property
    def counters(self) -> Counter[str]:
        """Return the protocol counters (the engine's counts merged in)."""
        self.sync_counters()
        return self.python.counters

    def attach(
        self,
        transport_counters: Counter[str],
        stamp_counts: Counter[str],
        ensure_port: Callable[[int], int],
        open_ports: Mapping[int, object] | None = None,
    ) -> None:
        """Route the engine's transport counts (send/receive errors) and stamp sources into the
        endpoint's counters; ``ensure_port(sport)`` opens a source port's socket on demand, for
        a port not in ``open_ports`` (the endpoint's live map of open source ports: the plan's
        ports are opened at start, so queueing a probe costs no call for them)."""
        self._transport_counters = transport_counters
        self._stamp_counts = stamp_counts
        self._ensure_port = ensure_port
        self._open_ports = open_ports if open_ports is not None else {}

    def sync_counters(self) -> None:
        """Move the engine's counts since the last call into the Python counters."""
        counters = self.python.counters
        for key, n in self.engine.take_counters().items():
            if isinstance(key, tuple):  # (kind, errno): a send or receive error
                kind, err = key
                name = f"{kind}_{type(OSError(err, '')).__name__}"
                if self._transport_counters is not None:
                    self._transport_counters[name] += n
            elif key in _SESSION_KEYS:
                counters[key] += n
            elif key in _STAMP_KEYS:
                if self._stamp_counts is not None:
                    self._stamp_counts[_STAMP_KEYS[key]] += n
            elif self._transport_counters is not None:
                self._transport_counters[key] += n

    # ---- initiator ------------------------------------------------------------------------------

    def _dst(self, dst: str) -> tuple[int, int]:
        i = self._dst_index.get(dst)
        if i is None:
            i = self._dst_index[dst] = len(self._dsts)
            self._dsts.append(dst)
            self._dst_hashes.append(nic_hash(dst))
            self._dsts_frozen = tuple(self._dsts)
        return i, self._dst_hashes[i]

    def queue_probe(
        self, dst: str, dest: Address, sport: int, at_ns: int, pair_id: int = -1, pair_pos: int = 0
    ) -> None:
        """Schedule one probe (see `ProbeSession.queue_probe`); the engine sends it."""
        i, h = self._dst(dst)
        if self._ensure_port is not None and sport not in self._open_ports:
            self._ensure_port(sport)
        self.engine.queue(at_ns, i, h, dest[0], dest[1], sport, pair_id, pair_pos, -1)

    def queue_pair(
        self, dst: str, dest: Address, sport: int, at_ns: int, spacing_ns: int = 20_000
    ) -> int:
        """Schedule a coded pair (see `ProbeSession.queue_pair`); return its id (numbered by
        the engine, which `prober._fastpath.queue_rows` also numbers from)."""
        if spacing_ns < 0:
            raise ValueError("spacing_ns must be >= 0")
        i, h = self._dst(dst)
        if self._ensure_port is not None and sport not in self._open_ports:
            self._ensure_port(sport)
        pair_id: int = self.engine.queue(at_ns, i, h, dest[0], dest[1], sport, -2, 0, spacing_ns)
        return pair_id

    def dst_entry(self, dst: str) -> tuple[int, int]:
        """Return (the engine's index of ``dst``, its wire hash), registering ``dst`` (the
        stream table of `prober._fastpath.queue_rows`)."""
        return self._dst(dst)

    def send_probe(self, dst: str, dest: Address, sport: int, now_ns: int) -> list[Datagram]:
        """Queue one probe for ``now_ns``; the endpoint's next flush sends it. Returns the
        Python-made datagrams due (trace replies), like `next_datagrams`."""
        self.queue_probe(dst, dest, sport, now_ns)
        return self.next_datagrams(now_ns)

    def trace_probe(self, dst: str, dest: Address, sport: int) -> Datagram:
        """Return a path-discovery probe (`ProbeSession.trace_probe`, made in Python)."""
        return self.python.trace_probe(dst, dest, sport)

    def next_datagrams(self, now_ns: int) -> list[Datagram]:
        """Return the datagrams the Python side made (trace replies); the engine sends probes,
        replies and follow-ups itself (`CompiledUdpEndpoint.flush`)."""
        return self.python.next_datagrams(now_ns)

    @property
    def python_due(self) -> bool:
        """Return True when the Python side has datagrams to send (trace replies)."""
        return self.python.next_send_ns() is not None

    @property
    def pending(self) -> int:
        """Return how many probes are awaiting their reply or stamps."""
        return int(self.engine.pending)

    def next_send_ns(self) -> int | None:
        """Return when the next datagram is due (0: something is waiting now), or None."""
        return _earliest(self.python.next_send_ns(), self.engine.next_send_ns())

    def next_timeout_ns(self) -> int | None:
        """Return the earliest time `poll` has work: a probe timeout still to report or the
        hold deadline of the oldest held t3 (deferred follow-ups: ``poll`` sends it then), or
        None when there is neither. An endpoint's own timer (`BatchUdpEndpoint.run`, used
        without `prober.drive.CompiledDriver`) thus flushes held t3s on time, not on its 1 s
        idle wake-up, after a short initiator timeout."""
        engine = _earliest(self.engine.next_timeout_ns(), self.engine.next_flush_ns())
        return _earliest(engine, self.python.next_timeout_ns())

    def next_deadline_ns(self) -> int | None:
        """Return the earliest time something is due (a queued probe or a timeout), or None."""
        return _earliest(self.next_send_ns(), self.next_timeout_ns())

    # ---- datagrams, stamps, results -------------------------------------------------------------

    def take_events(self) -> list[ProbeEvent]:
        """Return the engine's completed results and losses since the last call (one
        `ResultBlock`, or nothing)."""
        raw = self.engine.take()
        if raw is None:
            return []
        rows = np.frombuffer(raw, dtype=np.int64).reshape(-1, _NCOL)
        return [ResultBlock(self.nic_id, self._dsts_frozen, rows)]

    def receive(
        self, data: bytes | bytearray | memoryview, src: Address, rx_stamp_ns: int, now_ns: int
    ) -> list[ProbeEvent]:
        """Process one datagram through the engine (as if received on a socket); replies are
        sent by the endpoint's next flush. Returns completed results and trace events."""
        return self.receive_many(((data, src, rx_stamp_ns),), now_ns)

    def receive_many(self, batch: Sequence[Received], now_ns: int) -> list[ProbeEvent]:
        """`receive` for each datagram ``(data, src, rx_stamp_ns)`` of ``batch`` in order."""
        events: list[ProbeEvent] = []
        for data, src, rx in batch:
            deferred = self.engine.feed(bytes(data), src, rx, now_ns)
            for d, s, t in deferred or ():  # trace datagrams: the Python rules
                events += self.python.receive(d, s, t, now_ns)
        return events + self.take_events()

    def on_tx_stamp(self, token: int, tx_stamp_ns: int) -> list[ProbeEvent]:
        """Record the TX stamp of a datagram the Python side made (the engine reads the stamps
        of its own); see `ProbeSession.on_tx_stamp`."""
        return self.python.on_tx_stamp(token, tx_stamp_ns)

    def on_tx_stamps(self, stamps: Sequence[tuple[int, int]]) -> list[ProbeEvent]:
        """`on_tx_stamp` for each of ``stamps`` in order."""
        return self.python.on_tx_stamps(stamps)

    def send_refused(self, token: int) -> list[ProbeEvent]:
        """Record that a Python-made datagram could not be sent (`ProbeSession.send_refused`;
        the engine counts its own refused sends)."""
        return self.python.send_refused(token)

    def poll_python(self, now_ns: int) -> list[ProbeEvent]:
        """Return the timeouts of the Python side (`ProbeSession.poll`), without the engine's."""
        return self.python.poll(now_ns)

    def poll(self, now_ns: int) -> list[ProbeEvent]:
        """Return the losses (and results) due by ``now_ns`` as a `ResultBlock` (see
        `ProbeSession.poll`); stale replies still awaiting their TX stamp are dropped."""
        self.engine.poll(now_ns)
        return self.python.poll(now_ns) + self.take_events()


class CompiledUdpEndpoint(BatchUdpEndpoint):
    """Carry a `CompiledSession` over UDP: same sockets, options and timers as
    `prober.fastudp.BatchUdpEndpoint`; the datagram loop runs in the session's engine.

    ``external_ticks``: a `prober.drive.CompiledDriver` ticks it (the agent's way: one timer
    for every NIC; `run` is then not used); without, its own readiness callback and timer
    (`BatchUdpEndpoint.run`). Other arguments as `BatchUdpEndpoint`'s. Raises `ValueError`
    without ``timestamping`` (the engine needs kernel stamps; use the Python paths).
    """

    def __init__(
        self, session: CompiledSession, addr: str, *, external_ticks: bool = False, **kwargs: Any
    ) -> None:
        if not kwargs.get("timestamping", True):
            raise ValueError("the compiled path needs kernel timestamps")
        super().__init__(session, addr, **kwargs)
        self.csession = session
        self.engine = session.engine
        self._index: dict[int, int] = {}  # fd -> the engine's socket index
        self._by_port: dict[int, int] = {}  # source port -> the engine's socket index
        self._resp_index = -1
        self._replacing: int | None = None  # engine index a new socket replaces
        self._delivery_at: float | None = None  # loop time of the next hand-over of records
        self._busy = False  # the last drain read a full batch: drain at once, not per tick
        self.external_ticks = external_ticks  # (may be set until `open`)
        self._next_poll = 0
        self.engine.set_clock(None if self.clock is identity_clock else self.clock)
        session.attach(self.counters, self.stamp_counts, self.add_source_port, self._pool)

    def open(self) -> None:
        """Open the sockets (see `UdpEndpoint.open`); one readiness callback watches them all
        (the engine's epoll set), not one per socket. With ``external_ticks`` no callback at
        all: the driver calls `tick` on the shared grid and `run` is not used."""
        super().open()
        assert self._loop is not None
        if not self.external_ticks:
            self._loop.add_reader(self.engine.epoll_fd, self._on_engine_ready)

    def _open_socket(self, port: int) -> _Sock:
        st = self._open_engine_socket(port)
        # DF on every datagram (48-byte probes never need fragmenting, RoCE sets DF too): the
        # kernel then numbers the IP ID 0 instead of hashing a fresh one per datagram
        with contextlib.suppress(OSError):
            st.sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
        return st

    def tick(self, now_ns: int) -> None:
        """One tick of the shared timer (``external_ticks``): probe timeouts every ``poll_ns``,
        then `Engine.tick` (drain what is ready, send what is due, read the TX stamps) and
        whatever it handed back to Python. Completed records and losses stay in the engine
        until the agent takes them for its batch (`CompiledSession.take_events`): one
        `ResultBlock` per NIC and batch instead of one per NIC every ``poll_ns``."""
        if self._closed:
            return
        if now_ns >= self._next_poll:
            self._next_poll = now_ns + self.poll_ns
            self.engine.poll(now_ns)  # timeouts become lost rows, held in the engine
            events = self.csession.poll_python(now_ns)  # Python-side (trace) probes
            if events:
                self._deliver(events)
        deferred = self.engine.tick(now_ns)
        if deferred or self.csession.python_due:
            self._after_engine(deferred)
            if self.csession.python_due:
                self.flush()
        else:
            self._renumber_refused()

    @property
    def closed(self) -> bool:
        """Return True once `close` ran."""
        return self._closed

    @property
    def host_clock(self) -> bool:
        """Return True when this NIC's clock is the host's realtime clock unmapped (the
        identity clock over `time.time_ns`): `prober._fastpath.tick_all` reads that clock
        itself, once for all such NICs."""
        return self.clock is identity_clock and self.realtime is time.time_ns

    def poll_python(self, now_ns: int) -> None:
        """The Python half of `tick`'s ``poll_ns`` step, for a driver that ran the engine's
        half in `prober._fastpath.tick_all`: timeouts of Python-made (trace) probes."""
        events = self.csession.poll_python(now_ns)
        if events:
            self._deliver(events)

    def after_tick_all(self, deferred: list[Any] | None, renumber: bool) -> None:
        """What `tick` does with `Engine.tick`'s result, for a NIC `tick_all` ticked: hand the
        trace datagrams and ICMP errors to Python, send what the Python side queued, replace
        sockets whose send was refused."""
        if deferred or self.csession.python_due:
            self._after_engine(deferred)
            if self.csession.python_due:
                self.flush()
        elif renumber:
            self._renumber_refused()

    def next_send_ns(self) -> int | None:
        """Return when this NIC's next probe is due (its clock), or None."""
        return self.csession.next_send_ns()

    def _open_engine_socket(self, port: int) -> _Sock:
        if self._replacing is not None:
            st = super()._open_socket(port)
            assert self._loop is not None
            self._loop.remove_reader(st.sock.fileno())  # the engine's epoll set watches it
            self._index[st.sock.fileno()] = self._replacing
            return st
        responder = self._responder is None and not self._index
        st = super()._open_socket(port)
        assert self._loop is not None
        self._loop.remove_reader(st.sock.fileno())  # the engine's epoll set watches it
        i = self.engine.add_socket(st.sock.fileno(), st.port, responder, 14 if responder else 10)
        self._index[st.sock.fileno()] = i
        if responder:
            self._resp_index = i
        else:
            self._by_port[st.port] = i
        return st

    def close(self) -> None:
        """Send the held t3s (deferred follow-ups), close every socket (idempotent), stop `run`."""
        if not self._closed:
            self.engine.flush_held(self.now_ns(), True)
        if self._loop is not None and not self._closed:
            self._loop.remove_reader(self.engine.epoll_fd)  # (a no-op while a drain is due)
        super().close()
        self.engine.forget_sockets()
        self._index.clear()
        self._by_port.clear()

    # ---- refused sends: fresh sockets ---------------------------------------------------------

    def _renumber(self, st: _Sock) -> None:
        """Replace ``st`` by a fresh socket on the same port after a refused send (see
        `prober.udp.UdpEndpoint._renumber`), through the engine: what the old socket still
        holds (TX stamps numbered before the refusal, received datagrams) is read first, and
        the engine's numbering of the new socket starts at 0. Counted ``socket_renumbered``
        (``socket_reopen_failed``: the port's datagrams are refused until a restart)."""
        i = self._index.get(st.sock.fileno())
        if self._closed or self._loop is None or i is None:
            return
        self._after_engine(self.engine.drain(i, self.now_ns()), renumber=False)
        del self._index[st.sock.fileno()]
        self._replacing = i
        try:
            new = self._reopen(st)
        finally:
            self._replacing = None
        self.engine.replace_socket(i, -1 if new is None else new.sock.fileno())

    def _renumber_refused(self) -> None:
        todo = self.engine.take_renumber()
        if not todo:
            return
        by_index = {i: fd for fd, i in self._index.items()}
        for _ in range(64):  # each replacement sends what waited, which may be refused again
            if not todo:
                return
            for i in todo:
                st = self._sock_by_fd(by_index.get(i, -1))
                if st is not None:
                    self._renumber(st)
                    by_index = {i: fd for fd, i in self._index.items()}
            todo = self.engine.take_renumber()

    def _sock_by_fd(self, fd: int) -> _Sock | None:
        for st in (*self._pool.values(), *([self._responder] if self._responder else [])):
            if st.sock.fileno() == fd:
                return st
        return None

    # ---- receiving / sending -----------------------------------------------------------------

    def _on_engine_ready(self) -> None:
        """Readable. Under a heavy load (the last drain read a full batch, `BUSY_BATCH`) drain
        now: batches are big anyway. Otherwise drain on the next tick of the shared grid: at
        most one drain per NIC per tick (``tick_ns``) whatever the datagram rate, because with
        ~80 sockets per NIC the datagrams of a light load mostly arrive one by one, and a
        wake-up per datagram cost more than the datagram. A probe is then answered up to one
        tick later; every stamp is still the kernel's."""
        loop = self._loop
        if loop is None or self._closed:
            return
        if self._busy:
            self._after_engine(self.engine.drain_ready(self.now_ns()))
            self._busy = self.engine.last_drained >= BUSY_BATCH
            return
        loop.remove_reader(self.engine.epoll_fd)
        tick_s = self.tick_ns / 1e9
        t = loop.time()
        loop.call_at(math.ceil(t / tick_s) * tick_s, self._drain_tick)

    def _drain_tick(self) -> None:
        if self._closed or self._loop is None:
            return
        self._after_engine(self.engine.drain_ready(self.now_ns()))
        self._busy = self.engine.last_drained >= BUSY_BATCH
        if not self._closed:
            self._loop.add_reader(self.engine.epoll_fd, self._on_engine_ready)

    def _on_readable(self, st: _Sock) -> None:
        i = self._index.get(st.sock.fileno())
        if i is None:
            return
        deferred = self.engine.drain(i, self.now_ns())
        self._after_engine(deferred)

    def _after_engine(self, deferred: list[Any] | None, renumber: bool = True) -> None:
        if renumber:
            self._renumber_refused()
        s = self.csession
        # records wait in the engine for `poll` (every poll_ns) or the agent's batch: one
        # ResultBlock per 10 ms instead of one per readiness callback
        events: list[ProbeEvent] = []
        if deferred:
            now = self.now_ns()
            for item in deferred:
                if isinstance(item[0], bytes):  # a trace probe or trace reply: Python session
                    data, src, rx = item
                    events += s.python.receive(data, src, rx, now)
                else:  # an error-queue entry other than a TX stamp (ICMP errors)
                    port, payload, cmsgs = item
                    err = parse_extended_err(cmsgs)
                    if err is None:
                        self.counters["errqueue_unknown"] += 1
                    elif err.origin == SO_EE_ORIGIN_ICMP:
                        self.counters["icmp_errors"] += 1
                        if self.on_icmp is not None:
                            self.on_icmp(port, err, payload, now)
                    else:
                        self.counters["errqueue_other"] += 1
        self._deliver(events)
        if s.python_due and not self.external_ticks:
            self._schedule_flush()
        if self.external_ticks:
            return  # `tick` hands the records over every poll_ns
        if self._delivery_at is None and self.engine.held and self._loop is not None:
            # completed records are handed over at most every poll_ns, on the tick grid
            tick_s = self.tick_ns / 1e9
            at = math.ceil((self._loop.time() + self.poll_ns / 1e9) / tick_s) * tick_s
            self._delivery_at = at
            self._loop.call_at(at, self._deliver_held)

    def _deliver_held(self) -> None:
        self._delivery_at = None
        if not self._closed:
            self._deliver(self.csession.take_events())

    def flush(self) -> None:
        """Send every probe due now (and what the Python side queued), one ``sendmmsg`` per
        socket in the engine."""
        deferred = self.engine.send_due(self.now_ns())
        s = self.csession
        if s.python_due:
            for d in s.next_datagrams(0):
                self.send(d)
        self._after_engine(deferred)

    def send(self, dgram: Datagram, ttl: int | None = None) -> bool:
        """Send one Python-made datagram (trace probes, trace replies) like `UdpEndpoint.send`;
        the engine is told, so its OPT_ID numbering of the socket stays right."""
        ok = super().send(dgram, ttl)
        if ok:
            sport = dgram.meta.sport
            i = self._by_port.get(sport) if sport else self._resp_index
            if i is not None and i >= 0:
                self.engine.note_sent(i)
        return ok


def tick_all(engines: tuple[Any, ...], poll_ns: int, spin_ns: int) -> list[Any] | None:
    """Tick every engine once (`prober._fastpath.tick_all`, see `prober.drive`); return the
    (index, deferred, renumber, error) of those Python has work for, or None."""
    assert _fastpath is not None
    work: list[Any] | None = _fastpath.tick_all(engines, poll_ns, spin_ns)
    return work


def queue_rows(
    engines: tuple[Any, ...],
    table: list[tuple[int, int, int, int, int] | None],
    rows: list[tuple[int, int, int]],
    offsets: list[int],
    plan_now_ns: int,
    spacing_ns: int,
    coded: bool,
) -> tuple[int, list[tuple[int, int]] | None]:
    """Queue the schedule's due ``rows`` into the engines in one call
    (`prober._fastpath.queue_rows`); return (probes queued, (engine, source port) pairs that
    have no socket yet, or None)."""
    assert _fastpath is not None
    out: tuple[int, list[tuple[int, int]] | None] = _fastpath.queue_rows(
        engines, table, rows, offsets, plan_now_ns, spacing_ns, coded
    )
    return out


def queue_plan(
    plan: Any,
    engines: tuple[Any, ...],
    until_ns: int,
    plan_now_ns: int,
    offset_ns: int,
    spacing_ns: int,
    coded: bool,
) -> tuple[int, list[tuple[int, int]] | None]:
    """Queue what the compiled ``plan`` (`prober.schedule.ProbePlan.core`) has due by
    ``until_ns`` into the engines of its targets (``plan.set_targets``) in one call
    (`prober._fastpath.queue_plan`: `queue_rows` of its `due_rows`, every NIC ``offset_ns``
    from the plan's clock); return (probes queued, (engine, source port) pairs that have no
    socket yet, or None)."""
    assert _fastpath is not None
    out: tuple[int, list[tuple[int, int]] | None] = _fastpath.queue_plan(
        plan, engines, until_ns, plan_now_ns, offset_ns, spacing_ns, coded
    )
    return out


def compiled_ok() -> bool:
    """Return True when the compiled path can run here (extension built, kernel stamps and
    the error queue usable on loopback)."""
    if _fastpath is None:
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, SW_FLAGS)
    except OSError:
        return False
    return True
