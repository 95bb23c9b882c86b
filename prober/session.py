"""Sans-I/O probe session for one NIC: initiator and responder roles in one object.

The transport (UDP, RDMA, a fake link in tests) drives it:

1. ``queue_probe`` / ``queue_pair`` (or ``send_probe`` for "now") schedule probes;
2. ``next_datagrams(now_ns)`` returns every `Datagram` due: probes, replies, follow-ups.
   Call it after every ``queue_*``, ``receive`` and ``on_tx_stamp`` and when
   ``next_deadline_ns()`` passes;
3. ``on_tx_stamp(meta.token, tx_ns)`` feeds back each transmit stamp (t1 for a probe, t3 for a
   reply: the responder then queues a FOLLOW_UP, see `prober.wire`);
4. ``receive(data, src, rx_stamp_ns, now_ns)`` takes any datagram and returns `ProbeResult`
   events; ``poll(now_ns)`` returns `ProbeLost` for probes past their timeout.

``receive_many`` and ``on_tx_stamps`` are ``receive`` and ``on_tx_stamp`` over a batch (the
batched transports' calls): the same rule functions, applied in order. The rules exist once
here; `prober.compiled` runs the same rules in C, tested equal to these
(tests/test_prober_compiled*.py). `Session` is what transports and the agent need of either.

Nothing here raises on bad input from the network: malformed, spoofed, misdirected, duplicate
or late datagrams are counted in ``counters`` (keys: `prober.wire.WIRE_ERROR_REASONS` plus
``misdirected``, ``wrong_sender``, ``mismatch``, ``unmatched``, ``duplicate``, ``inconsistent``,
``incomplete``, ``late_tx_stamp``, ``tx_stamp_missing``, ``overflow``, ``lost``,
``send_refused``).
Time is always passed in; nothing reads a clock.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from contract.records import MISSING
from prober.events import (
    NO_TOKEN,
    Address,
    Datagram,
    ProbeEvent,
    ProbeLost,
    ProbeResult,
    SendMeta,
    TraceReached,
)
from prober.wire import (
    FLAG_T3_FINAL,
    FLAG_TRACE,
    BadFieldError,
    Codec,
    Message,
    MsgType,
    WireError,
    nic_hash,
)

_REPLY_TOKEN_BASE = 1 << 32  # probe tokens are their seq; reply tokens live above 2**32
_I64 = (1 << 63) - 1
_PROBE, _REPLY, _FOLLOW_UP = MsgType.PROBE, MsgType.REPLY, MsgType.FOLLOW_UP

Received = tuple[bytes | bytearray | memoryview, Address, int]
"""One datagram as a transport hands it over: (data, source address, receive stamp ns)."""


class Session(Protocol):
    """What a transport endpoint and the agent need of one NIC's probe session.

    Two implementations: `ProbeSession` (the protocol rules, in Python) and
    `prober.compiled.CompiledSession` (the same rules in the C engine, tested equal to these;
    what the engine hands back, trace probes and their replies, goes through a `ProbeSession`).
    See `ProbeSession` for what each call means; ``take_events`` returns the results and losses
    a session holds instead of returning them from the calls (the compiled engine holds them
    until the agent's batch; a `ProbeSession` holds none).
    """

    @property
    def nic_id(self) -> str: ...
    @property
    def codec(self) -> Codec: ...
    @property
    def timeout_ns(self) -> int: ...
    @property
    def counters(self) -> Counter[str]: ...
    @property
    def pending(self) -> int: ...
    def queue_probe(self, dst: str, dest: Address, sport: int, at_ns: int, pair_id: int = -1,
                    pair_pos: int = 0) -> None: ...  # fmt: skip
    def queue_pair(self, dst: str, dest: Address, sport: int, at_ns: int,
                   spacing_ns: int = 20_000) -> int: ...  # fmt: skip
    def next_datagrams(self, now_ns: int) -> list[Datagram]: ...
    def next_send_ns(self) -> int | None: ...
    def next_timeout_ns(self) -> int | None: ...
    def next_deadline_ns(self) -> int | None: ...
    def trace_probe(self, dst: str, dest: Address, sport: int) -> Datagram: ...
    def receive(self, data: bytes | bytearray | memoryview, src: Address, rx_stamp_ns: int,
                now_ns: int) -> list[ProbeEvent]: ...  # fmt: skip
    def receive_many(self, batch: Sequence[Received], now_ns: int) -> list[ProbeEvent]: ...
    def on_tx_stamp(self, token: int, tx_stamp_ns: int) -> list[ProbeEvent]: ...
    def on_tx_stamps(self, stamps: Sequence[tuple[int, int]]) -> list[ProbeEvent]: ...
    def send_refused(self, token: int) -> list[ProbeEvent]: ...
    def poll(self, now_ns: int) -> list[ProbeEvent]: ...
    def take_events(self) -> list[ProbeEvent]: ...


@dataclass(slots=True)
class _Pending:
    dst: str
    dst_hash: int
    sport: int
    pair_id: int
    pair_pos: int
    sent_ns: int
    t1: int | None = None
    t2: int | None = None
    t3: int | None = None
    t4: int | None = None


@dataclass(slots=True)
class _Queued:
    at_ns: int
    order: int
    dst: str
    dest: Address
    sport: int
    pair_id: int
    pair_pos: int
    spacing_ns: int = -1  # first of a coded pair: queue the second this long after sending

    def __lt__(self, other: _Queued) -> bool:
        return (self.at_ns, self.order) < (other.at_ns, other.order)


@dataclass(slots=True)
class _AwaitTx:
    """A two-step REPLY sent, waiting for its TX stamp (t3) to make the FOLLOW_UP."""

    dest: Address
    peer: int  # the initiator NIC's hash
    seq: int
    pair_id: int
    pair_pos: int
    t2: int
    created_ns: int


class ProbeSession:
    """Probe protocol state for one NIC (``nic_id``), both initiator and responder.

    ``timeout_ns``: a probe without a complete reply (REPLY plus t3 plus its own t1) this long
    after being handed out is reported lost. ``one_step``: reply with a user-space t3 (``now_ns``
    at receive) instead of waiting for a TX stamp and sending a FOLLOW_UP; use it when the
    transport has no transmit stamps. ``max_pending`` bounds memory under floods.
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
    ) -> None:
        if timeout_ns <= 0 or max_pending <= 0:
            raise ValueError("timeout_ns and max_pending must be positive")
        self.nic_id = nic_id
        self.nic = nic_hash(nic_id)
        self.codec = codec if codec is not None else Codec()
        self.timeout_ns = timeout_ns
        self.one_step = one_step
        self.max_pending = max_pending
        self.pad = pad
        self.counters: Counter[str] = Counter()
        self._seq = seq_start & 0xFFFFFFFF
        self._pair = 0
        self._order = 0
        self._queue: list[_Queued] = []
        self._outbox: list[Datagram] = []
        self._pending: dict[int, _Pending] = {}
        self._deadlines: deque[tuple[int, int, int]] = deque()  # (deadline, seq, sent_ns)
        self._await_tx: dict[int, _AwaitTx] = {}
        self._reply_token = 0
        self._trace_seq = 0
        self._hashes: dict[str, int] = {}

    # ---- initiator: scheduling and sending -------------------------------------------------

    def queue_probe(
        self, dst: str, dest: Address, sport: int, at_ns: int, pair_id: int = -1, pair_pos: int = 0
    ) -> None:
        """Schedule one probe to NIC ``dst`` at ``dest`` from UDP ``sport`` at ``at_ns``."""
        self._order += 1
        heapq.heappush(
            self._queue, _Queued(at_ns, self._order, dst, dest, sport, pair_id, pair_pos)
        )

    def queue_pair(
        self, dst: str, dest: Address, sport: int, at_ns: int, spacing_ns: int = 20_000
    ) -> int:
        """Schedule a coded pair (two probes ``spacing_ns`` apart, same path); return its id.

        The second probe is due ``spacing_ns`` after the first is actually handed out (by
        `next_datagrams`), so a late first probe does not shrink the spacing.
        """
        if spacing_ns < 0:
            raise ValueError("spacing_ns must be >= 0")
        pair_id = self._pair
        self._pair = (self._pair + 1) & 0x7FFFFFFF
        self._order += 1
        first = _Queued(at_ns, self._order, dst, dest, sport, pair_id, 0, spacing_ns)
        heapq.heappush(self._queue, first)
        return pair_id

    def send_probe(self, dst: str, dest: Address, sport: int, now_ns: int) -> list[Datagram]:
        """Queue one probe for ``now_ns`` and return everything due (see `next_datagrams`)."""
        self.queue_probe(dst, dest, sport, now_ns)
        return self.next_datagrams(now_ns)

    def next_datagrams(self, now_ns: int) -> list[Datagram]:
        """Return (and forget) every datagram due at ``now_ns``: replies first, then probes."""
        out, self._outbox = self._outbox, []
        while self._queue and self._queue[0].at_ns <= now_ns:
            q = heapq.heappop(self._queue)
            dgram = self._make_probe(q, now_ns)
            if dgram is not None:
                out.append(dgram)
            if q.spacing_ns >= 0:
                self._order += 1
                second = _Queued(now_ns + q.spacing_ns, self._order, q.dst, q.dest, q.sport,
                                 q.pair_id, 1)  # fmt: skip
                heapq.heappush(self._queue, second)
        return out

    def _make_probe(self, q: _Queued, now_ns: int) -> Datagram | None:
        if len(self._pending) >= self.max_pending:
            self.counters["overflow"] += 1
            return None
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFFFFFF
        dst_hash = self._hashes.get(q.dst)
        if dst_hash is None:
            dst_hash = self._hashes[q.dst] = nic_hash(q.dst)
        msg = Message(MsgType.PROBE, self.nic, dst_hash, seq, q.pair_id, q.pair_pos, pad=self.pad)
        self._pending[seq] = _Pending(q.dst, dst_hash, q.sport, q.pair_id, q.pair_pos, now_ns)
        self._deadlines.append((now_ns + self.timeout_ns, seq, now_ns))
        meta = SendMeta(seq, MsgType.PROBE, self.nic_id, q.dst, q.sport, seq, q.pair_id, q.pair_pos)
        return Datagram(q.dest, self.codec.encode(msg), meta)

    def trace_probe(self, dst: str, dest: Address, sport: int) -> Datagram:
        """Return a path-discovery PROBE (TRACE flag) to ``dst``; its seq is in ``meta.seq``.

        Trace probes have their own sequence space, are not tracked for loss, and the responder
        answers them with a one-step REPLY that `receive` turns into `TraceReached`. The
        caller sends it with a limited IP TTL (see `prober.pathdisc`).
        """
        seq = self._trace_seq
        self._trace_seq = (seq + 1) & 0xFFFFFFFF
        msg = Message(MsgType.PROBE, self.nic, nic_hash(dst), seq, pad=self.pad, trace=True)
        meta = SendMeta(NO_TOKEN, MsgType.PROBE, self.nic_id, dst, sport, seq)
        return Datagram(dest, self.codec.encode(msg), meta)

    def next_deadline_ns(self) -> int | None:
        """Return the earliest time something is due (a queued probe or a timeout), or None."""
        times = []
        if self._queue:
            times.append(self._queue[0].at_ns)
        if self._deadlines:
            times.append(self._deadlines[0][0])
        if self._outbox:
            times.append(0)
        return min(times) if times else None

    def next_send_ns(self) -> int | None:
        """Return when the next datagram is due (0: something is waiting now), or None."""
        if self._outbox:
            return 0
        return self._queue[0].at_ns if self._queue else None

    def next_timeout_ns(self) -> int | None:
        """Return the earliest probe timeout still to report, or None."""
        return self._deadlines[0][0] if self._deadlines else None

    @property
    def pending(self) -> int:
        """Return how many probes are awaiting their reply or stamps."""
        return len(self._pending)

    # ---- transmit stamps ---------------------------------------------------------------------

    def on_tx_stamp(self, token: int, tx_stamp_ns: int) -> list[ProbeEvent]:
        """Record the transmit stamp of the datagram whose meta had ``token``.

        For a probe this is t1 (may complete it: the result is returned); for a reply it is t3
        and a FOLLOW_UP is queued (fetch it with `next_datagrams`). Unknown tokens are counted.
        Raises `prober.wire.BadFieldError` for a reply's t3 outside 0..2**63-1.
        """
        events: list[ProbeEvent] = []
        self._tx_stamp(token, tx_stamp_ns, events)
        return events

    def on_tx_stamps(self, stamps: Sequence[tuple[int, int]]) -> list[ProbeEvent]:
        """`on_tx_stamp` for each of ``stamps`` ``(token, tx_stamp_ns)`` in order (the batched
        transports' call); return the results completed."""
        events: list[ProbeEvent] = []
        tx_stamp = self._tx_stamp
        for token, tx in stamps:
            tx_stamp(token, tx, events)
        return events

    def _tx_stamp(self, token: int, tx_stamp_ns: int, events: list[ProbeEvent]) -> None:
        """The transmit-stamp rule (`on_tx_stamp`); completed results go to ``events``."""
        if token >= _REPLY_TOKEN_BASE:
            wait = self._await_tx.pop(token, None)
            if wait is None:
                self.counters["late_tx_stamp"] += 1
                return
            t2 = wait.t2
            t3 = max(tx_stamp_ns, t2) if tx_stamp_ns >= 0 else t2
            if t3 > _I64:
                raise BadFieldError(f"t3 {t3} out of range")
            # every other field is the validated probe's (see `_answer`): no `Message` needed
            data = self.codec.encode_fields(
                _FOLLOW_UP, 0, self.nic, wait.peer, wait.seq, wait.pair_id, wait.pair_pos, t2, t3
            )
            meta = SendMeta(NO_TOKEN, _FOLLOW_UP, self.nic_id, "", 0, wait.seq, wait.pair_id,
                            wait.pair_pos)  # fmt: skip
            self._outbox.append(Datagram(wait.dest, data, meta))
            return
        p = self._pending.get(token)
        if p is None or p.t1 is not None:
            self.counters["late_tx_stamp"] += 1
            return
        p.t1 = tx_stamp_ns
        self._complete(token, p, events)

    # ---- receiving ---------------------------------------------------------------------------

    def receive(
        self, data: bytes | bytearray | memoryview, src: Address, rx_stamp_ns: int, now_ns: int
    ) -> list[ProbeEvent]:
        """Process one datagram from ``src`` received at ``rx_stamp_ns``; return completed results.

        Replies to probes are queued for `next_datagrams`. Never raises on bad data: counts it
        (a receive stamp outside 0..2**63-1 on a probe raises `prober.wire.BadFieldError`: the
        transport's clock is broken, not the datagram).
        """
        events: list[ProbeEvent] = []
        self._receive(data, src, rx_stamp_ns, now_ns, events)
        return events

    def receive_many(self, batch: Sequence[Received], now_ns: int) -> list[ProbeEvent]:
        """`receive` for each datagram ``(data, src, rx_stamp_ns)`` of ``batch`` in order, all
        received by ``now_ns`` (the batched transports' call); return the results completed."""
        events: list[ProbeEvent] = []
        receive = self._receive
        for data, src, rx in batch:
            receive(data, src, rx, now_ns, events)
        return events

    def _receive(
        self,
        data: bytes | bytearray | memoryview,
        src: Address,
        rx_stamp_ns: int,
        now_ns: int,
        events: list[ProbeEvent],
    ) -> None:
        """The receive rule (`receive`); completed results and trace answers go to ``events``."""
        try:
            msg = self.codec.decode(data)
        except WireError as exc:
            self.counters[exc.reason] += 1
            return
        if msg.peer != self.nic:
            self.counters["misdirected"] += 1
            return
        mtype = msg.mtype
        if mtype is _PROBE:
            self._answer(msg, src, rx_stamp_ns, now_ns)
            return
        if msg.trace:
            events.append(TraceReached(msg.seq, msg.sender, rx_stamp_ns))
            return
        if msg.t3s and mtype is _FOLLOW_UP:
            # deferred t3s (prober.wire): only for initiators that set DEFER_OK, which this
            # session does not; its body names no probe
            self.counters["unmatched"] += 1
            return
        seq = msg.seq
        p = self._pending.get(seq)
        if p is None:
            self.counters["unmatched"] += 1
            return
        if msg.sender != p.dst_hash:
            self.counters["wrong_sender"] += 1
            return
        if msg.pair_id != p.pair_id or msg.pair_pos != p.pair_pos:
            self.counters["mismatch"] += 1
            return
        # A duplicated probe yields two answers with different t2: keep t2, t3 and t4 from the
        # same answer (a FOLLOW_UP or REPLY whose t2 differs from the one held is a duplicate).
        if p.t2 is not None and msg.ta != p.t2:
            self.counters["duplicate"] += 1
            return
        if mtype is _REPLY:
            if p.t4 is not None:
                self.counters["duplicate"] += 1
                return
            p.t4, p.t2 = rx_stamp_ns, msg.ta
            if msg.t3_final:
                p.t3 = msg.tb
        else:  # FOLLOW_UP (may overtake its REPLY)
            if p.t3 is not None:
                self.counters["duplicate"] += 1
                return
            p.t2, p.t3 = msg.ta, msg.tb
        self._complete(seq, p, events)

    def _answer(self, probe: Message, src: Address, t2: int, now_ns: int) -> None:
        """Queue the REPLY to ``probe`` (received at ``t2``): one-step (t3 = ``now_ns``, no
        FOLLOW_UP) for trace probes and one-step sessions, else two-step (the FOLLOW_UP waits
        for the reply's TX stamp, `on_tx_stamp`). Raises `BadFieldError` for stamps outside
        0..2**63-1."""
        one_step = self.one_step or probe.trace
        if not one_step and len(self._await_tx) >= self.max_pending:
            self.counters["overflow"] += 1
            return
        t3 = (now_ns if now_ns > t2 else t2) if one_step else 0
        if not (0 <= t2 <= _I64 and t3 <= _I64):
            raise BadFieldError(f"receive stamp {t2} (t3 {t3}) out of range")
        # the reply's other fields are the decoded (validated) probe's: packed without a
        # `Message`, which would validate them again
        if one_step:
            flags = FLAG_T3_FINAL | (FLAG_TRACE if probe.trace else 0)
            token = NO_TOKEN
        else:
            flags = 0
            self._reply_token += 1
            token = _REPLY_TOKEN_BASE + self._reply_token
            self._await_tx[token] = _AwaitTx(src, probe.sender, probe.seq, probe.pair_id,
                                             probe.pair_pos, t2, now_ns)  # fmt: skip
        data = self.codec.encode_fields(_REPLY, flags, self.nic, probe.sender, probe.seq,
                                        probe.pair_id, probe.pair_pos, t2, t3, probe.pad)  # fmt: skip
        meta = SendMeta(token, _REPLY, self.nic_id, "", 0, probe.seq, probe.pair_id,
                        probe.pair_pos)  # fmt: skip
        self._outbox.append(Datagram(src, data, meta))

    def _complete(self, seq: int, p: _Pending, events: list[ProbeEvent]) -> None:
        """Report ``p`` (probe ``seq``) to ``events`` once it has all four stamps."""
        if p.t1 is None or p.t2 is None or p.t3 is None or p.t4 is None:
            return
        del self._pending[seq]
        if not (p.t1 <= p.t4 and p.t2 <= p.t3):
            self.counters["inconsistent"] += 1
            return
        events.append(ProbeResult(seq, self.nic_id, p.dst, p.sport, p.pair_id, p.pair_pos,
                                  p.t1, p.t2, p.t3, p.t4))  # fmt: skip

    def take_events(self) -> list[ProbeEvent]:
        """Return []: this session hands every result and loss out from the call that made it
        (`Session.take_events` is for sessions that hold them)."""
        return []

    # ---- refused sends -----------------------------------------------------------------------

    def send_refused(self, token: int) -> list[ProbeEvent]:
        """Record that the transport could not send the datagram whose meta had ``token``.

        A refused probe (the OS said no: a netfilter drop, no route, a full queue) is a lost
        probe on its path, reported now rather than at its timeout: returns its `ProbeLost`
        (``t1`` `MISSING`, ``sent_ns`` the hand-out time). A refused reply is dropped (its
        FOLLOW_UP will not follow); anything else returns []. Counted ``send_refused``.
        """
        if token == NO_TOKEN:
            return []
        self.counters["send_refused"] += 1
        if token >= _REPLY_TOKEN_BASE:
            self._await_tx.pop(token, None)
            return []
        p = self._pending.pop(token, None)
        if p is None:
            return []
        self.counters["lost"] += 1
        return [ProbeLost(token, self.nic_id, p.dst, p.sport, p.pair_id, p.pair_pos, MISSING,
                          p.sent_ns)]  # fmt: skip

    # ---- timeouts ----------------------------------------------------------------------------

    def poll(self, now_ns: int) -> list[ProbeEvent]:
        """Return `ProbeLost` for every probe whose timeout passed by ``now_ns``.

        A probe that got its REPLY but not all stamps (its FOLLOW_UP or its own TX stamp went
        missing) is counted ``incomplete`` and dropped: it is neither a loss of the probe nor a
        usable measurement.
        Replies still waiting for their TX stamp after ``timeout_ns`` are dropped and counted
        ``tx_stamp_missing``.
        """
        events: list[ProbeEvent] = []
        while self._deadlines and self._deadlines[0][0] <= now_ns:
            _, seq, sent_ns = self._deadlines.popleft()
            p = self._pending.get(seq)
            if p is None or p.sent_ns != sent_ns:
                continue
            del self._pending[seq]
            if p.t4 is not None:
                self.counters["incomplete"] += 1
                continue
            t1 = p.t1 if p.t1 is not None else MISSING
            events.append(ProbeLost(seq, self.nic_id, p.dst, p.sport, p.pair_id, p.pair_pos,
                                    t1, p.sent_ns))  # fmt: skip
            self.counters["lost"] += 1
        if self._await_tx:
            cutoff = now_ns - self.timeout_ns
            stale = []
            for t, w in self._await_tx.items():  # insertion order == creation order
                if w.created_ns > cutoff:
                    break
                stale.append(t)
            for t in stale:
                del self._await_tx[t]
                self.counters["tx_stamp_missing"] += 1
        return events
