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

Nothing here raises on bad input from the network: malformed, spoofed, misdirected, duplicate
or late datagrams are counted in ``counters`` (keys: `prober.wire.WIRE_ERROR_REASONS` plus
``misdirected``, ``wrong_sender``, ``mismatch``, ``unmatched``, ``duplicate``, ``inconsistent``,
``incomplete``, ``late_tx_stamp``, ``tx_stamp_missing``, ``overflow``, ``lost``,
``send_refused``).
Time is always passed in; nothing reads a clock.
"""

from __future__ import annotations

import heapq
import struct
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

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
from prober.wire import BODY_LEN, MAGIC, VERSION, Codec, Message, MsgType, WireError, nic_hash

_REPLY_TOKEN_BASE = 1 << 32  # probe tokens are their seq; reply tokens live above 2**32
# the 48-byte body of `prober.wire` (magic, version, type, flags, pair_pos, reserved, sender,
# peer, seq, pair_id, ta, tb): the batched methods pack unauthenticated replies and follow-ups
# with it directly (their fields come from an already validated message); a test checks the
# bytes equal `Codec.encode`
_BODY = struct.Struct("!HBBBBHQQIiqq")
assert _BODY.size == BODY_LEN
_I64 = (1 << 63) - 1
_REPLY, _FOLLOW_UP = MsgType.REPLY, MsgType.FOLLOW_UP
_PROBE = MsgType.PROBE


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
    dest: Address
    msg: Message
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
        """
        if token >= _REPLY_TOKEN_BASE:
            wait = self._await_tx.pop(token, None)
            if wait is None:
                self.counters["late_tx_stamp"] += 1
                return []
            m = wait.msg
            t3 = max(tx_stamp_ns, m.ta) if tx_stamp_ns >= 0 else m.ta
            fu = Message(
                MsgType.FOLLOW_UP, self.nic, m.peer, m.seq, m.pair_id, m.pair_pos, m.ta, t3
            )
            meta = SendMeta(NO_TOKEN, MsgType.FOLLOW_UP, self.nic_id, "", 0, m.seq, m.pair_id,
                            m.pair_pos)  # fmt: skip
            self._outbox.append(Datagram(wait.dest, self.codec.encode(fu), meta))
            return []
        p = self._pending.get(token)
        if p is None or p.t1 is not None:
            self.counters["late_tx_stamp"] += 1
            return []
        p.t1 = tx_stamp_ns
        return self._maybe_complete(token, p)

    # ---- receiving ---------------------------------------------------------------------------

    def receive(
        self, data: bytes | bytearray | memoryview, src: Address, rx_stamp_ns: int, now_ns: int
    ) -> list[ProbeEvent]:
        """Process one datagram from ``src`` received at ``rx_stamp_ns``; return completed results.

        Replies to probes are queued for `next_datagrams`. Never raises on bad data: counts it.
        """
        try:
            msg = self.codec.decode(data)
        except WireError as exc:
            self.counters[exc.reason] += 1
            return []
        if msg.peer != self.nic:
            self.counters["misdirected"] += 1
            return []
        if msg.mtype is MsgType.PROBE:
            self._answer(msg, src, rx_stamp_ns, now_ns)
            return []
        if msg.trace:
            return [TraceReached(msg.seq, msg.sender, rx_stamp_ns)]
        if msg.t3s and msg.mtype is MsgType.FOLLOW_UP:
            # deferred t3s (prober.wire): only for initiators that set DEFER_OK, which this
            # session does not; its body names no probe
            self.counters["unmatched"] += 1
            return []
        p = self._pending.get(msg.seq)
        if p is None:
            self.counters["unmatched"] += 1
            return []
        if msg.sender != p.dst_hash:
            self.counters["wrong_sender"] += 1
            return []
        if (msg.pair_id, msg.pair_pos) != (p.pair_id, p.pair_pos):
            self.counters["mismatch"] += 1
            return []
        # A duplicated probe yields two answers with different t2: keep t2, t3 and t4 from the
        # same answer (a FOLLOW_UP or REPLY whose t2 differs from the one held is a duplicate).
        if p.t2 is not None and msg.ta != p.t2:
            self.counters["duplicate"] += 1
            return []
        if msg.mtype is MsgType.REPLY:
            if p.t4 is not None:
                self.counters["duplicate"] += 1
                return []
            p.t4, p.t2 = rx_stamp_ns, msg.ta
            if msg.t3_final:
                p.t3 = msg.tb
        else:  # FOLLOW_UP (may overtake its REPLY)
            if p.t3 is not None:
                self.counters["duplicate"] += 1
                return []
            p.t2, p.t3 = msg.ta, msg.tb
        return self._maybe_complete(msg.seq, p)

    def _answer(self, msg: Message, src: Address, rx_stamp_ns: int, now_ns: int) -> None:
        t2 = rx_stamp_ns
        if self.one_step or msg.trace:
            reply = Message(MsgType.REPLY, self.nic, msg.sender, msg.seq, msg.pair_id,
                            msg.pair_pos, t2, max(now_ns, t2), True, msg.pad, msg.trace)  # fmt: skip
            token = NO_TOKEN
        else:
            if len(self._await_tx) >= self.max_pending:
                self.counters["overflow"] += 1
                return
            reply = Message(MsgType.REPLY, self.nic, msg.sender, msg.seq, msg.pair_id,
                            msg.pair_pos, t2, 0, pad=msg.pad)  # fmt: skip
            self._reply_token += 1
            token = _REPLY_TOKEN_BASE + self._reply_token
            self._await_tx[token] = _AwaitTx(src, reply, now_ns)
        meta = SendMeta(token, MsgType.REPLY, self.nic_id, "", 0, msg.seq, msg.pair_id,
                        msg.pair_pos)  # fmt: skip
        self._outbox.append(Datagram(src, self.codec.encode(reply), meta))

    def _maybe_complete(self, seq: int, p: _Pending) -> list[ProbeEvent]:
        if p.t1 is None or p.t2 is None or p.t3 is None or p.t4 is None:
            return []
        del self._pending[seq]
        if not (p.t1 <= p.t4 and p.t2 <= p.t3):
            self.counters["inconsistent"] += 1
            return []
        return [ProbeResult(seq, self.nic_id, p.dst, p.sport, p.pair_id, p.pair_pos,
                            p.t1, p.t2, p.t3, p.t4)]  # fmt: skip

    # ---- batched receive / transmit stamps (the lean path of `prober.fastudp`) ------------------

    def receive_many(
        self, batch: Sequence[tuple[bytes | bytearray | memoryview, Address, int]], now_ns: int
    ) -> list[ProbeEvent]:
        """Process datagrams ``(data, src, rx_stamp_ns)`` received by ``now_ns``, in order.

        The same outcome as calling `receive` for each (same `Codec.decode`, so the same
        validation and HMAC check, same counters, same results, same replies queued), with less
        work per datagram: unauthenticated two-step replies are packed directly instead of
        being rebuilt as validated `Message` values.
        """
        events: list[ProbeEvent] = []
        decode = self.codec.decode
        fast = not self.codec.authenticated and not self.one_step
        pending, counters, nic = self._pending, self.counters, self.nic
        for data, src, rx in batch:
            try:
                msg = decode(data)
            except WireError as exc:
                counters[exc.reason] += 1
                continue
            if msg.peer != nic:
                counters["misdirected"] += 1
                continue
            mtype = msg.mtype
            if mtype is _PROBE:
                if fast and not msg.trace and 0 <= rx <= _I64:
                    self._answer_fast(msg, src, rx, now_ns)
                else:
                    self._answer(msg, src, rx, now_ns)
                continue
            if msg.trace:
                events.append(TraceReached(msg.seq, msg.sender, rx))
                continue
            if msg.t3s and mtype is not _REPLY:  # held t3s: see `receive`
                counters["unmatched"] += 1
                continue
            seq = msg.seq
            p = pending.get(seq)
            if p is None:
                counters["unmatched"] += 1
                continue
            if msg.sender != p.dst_hash:
                counters["wrong_sender"] += 1
                continue
            if msg.pair_id != p.pair_id or msg.pair_pos != p.pair_pos:
                counters["mismatch"] += 1
                continue
            if p.t2 is not None and msg.ta != p.t2:
                counters["duplicate"] += 1
                continue
            if mtype is _REPLY:
                if p.t4 is not None:
                    counters["duplicate"] += 1
                    continue
                p.t4, p.t2 = rx, msg.ta
                if msg.t3_final:
                    p.t3 = msg.tb
            else:
                if p.t3 is not None:
                    counters["duplicate"] += 1
                    continue
                p.t2, p.t3 = msg.ta, msg.tb
            if p.t1 is not None and p.t2 is not None and p.t3 is not None and p.t4 is not None:
                events += self._maybe_complete(seq, p)
        return events

    def _answer_fast(self, msg: Message, src: Address, t2: int, now_ns: int) -> None:
        """`_answer` for an unauthenticated two-step reply, packed without a new `Message`."""
        if len(self._await_tx) >= self.max_pending:
            self.counters["overflow"] += 1
            return
        # the reply's fields are the validated probe's, t2 is in range: skip re-validation
        reply = Message._make((_REPLY, self.nic, msg.sender, msg.seq, msg.pair_id, msg.pair_pos,
                               t2, 0, False, msg.pad, False, False, ()))  # fmt: skip
        self._reply_token += 1
        token = _REPLY_TOKEN_BASE + self._reply_token
        self._await_tx[token] = _AwaitTx(src, reply, now_ns)
        data = _BODY.pack(MAGIC, VERSION, 2, 0, msg.pair_pos, 0, self.nic, msg.sender, msg.seq,
                          msg.pair_id, t2, 0)  # fmt: skip
        if msg.pad:
            data += bytes(msg.pad)
        meta = SendMeta(token, _REPLY, self.nic_id, "", 0, msg.seq, msg.pair_id, msg.pair_pos)
        self._outbox.append(Datagram(src, data, meta))

    def on_tx_stamps(self, stamps: Sequence[tuple[int, int]]) -> list[ProbeEvent]:
        """Record many transmit stamps ``(token, tx_stamp_ns)`` in order; return completed results.

        The same outcome as `on_tx_stamp` for each; unauthenticated follow-ups are packed
        directly (their fields come from the reply this session built).
        """
        if self.codec.authenticated:
            out: list[ProbeEvent] = []
            for token, tx in stamps:
                out += self.on_tx_stamp(token, tx)
            return out
        events: list[ProbeEvent] = []
        await_tx, pending, counters, outbox = (
            self._await_tx,
            self._pending,
            self.counters,
            self._outbox,
        )
        for token, tx in stamps:
            if token >= _REPLY_TOKEN_BASE:
                wait = await_tx.pop(token, None)
                if wait is None:
                    counters["late_tx_stamp"] += 1
                    continue
                m = wait.msg
                t3 = max(tx, m.ta) if tx >= 0 else m.ta
                if t3 > _I64:
                    await_tx[token] = wait  # out of range: let the validating path raise as before
                    events += self.on_tx_stamp(token, tx)
                    continue
                data = _BODY.pack(MAGIC, VERSION, 3, 0, m.pair_pos, 0, self.nic, m.peer, m.seq,
                                  m.pair_id, m.ta, t3)  # fmt: skip
                meta = SendMeta(NO_TOKEN, _FOLLOW_UP, self.nic_id, "", 0, m.seq, m.pair_id,
                                m.pair_pos)  # fmt: skip
                outbox.append(Datagram(wait.dest, data, meta))
                continue
            p = pending.get(token)
            if p is None or p.t1 is not None:
                counters["late_tx_stamp"] += 1
                continue
            p.t1 = tx
            if p.t2 is not None and p.t3 is not None and p.t4 is not None:
                events += self._maybe_complete(token, p)
        return events

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
