"""Deferred follow-ups in the compiled engine (`prober.wire` DEFER_OK / CARRIES_T3): the same
four stamps per probe as with a FOLLOW_UP per reply, the hold-time flush with time passed in,
the flush on close, and counts that fail when deferral is silently off.

The rig: real engines with real loopback sockets (datagrams really leave through
``sendmmsg``), without kernel stamps: the test reads every datagram, feeds it to the engine
it is for with the receive stamp it chooses (``Engine.feed``) and hands each send its TX
stamp (``Engine.feed_tx``, as if read from the error queue). So both runs see the same
traffic with the same stamps, and nothing waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import numpy as np
import pytest

from prober import compiled
from prober.wire import Codec, Message, MsgType, nic_hash
from tests.loopexchange import events_of, exchange

pytestmark = pytest.mark.skipif(not compiled.available(), reason="prober._fastpath not built")

LO = "127.0.0.1"
HOLD = 250_000_000
MS = 1_000_000
CODEC = Codec()


def _sock() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((LO, 0))
    s.settimeout(2.0)
    return s


def _read(s: socket.socket, n: int) -> list[tuple[bytes, tuple[str, int]]]:
    """Read exactly ``n`` datagrams (loopback delivers during the send), then check none more."""
    out = [s.recvfrom(4096) for _ in range(n)]
    s.setblocking(False)
    try:
        extra = s.recvfrom(4096)
    except BlockingIOError:
        extra = None
    s.settimeout(2.0)
    assert extra is None, f"unexpected datagram {CODEC.decode(extra[0])}"
    return out


class _Nic:
    def __init__(self, name: str, defer: bool, responder: bool) -> None:
        self.name, self.hash = name, nic_hash(name)
        self.engine = compiled._fastpath.Engine(
            self.hash, 10**9, 1024, defer=defer, hold_ns=HOLD, stamp_followups=False
        )
        self.sock = _sock()
        self.port = self.sock.getsockname()[1]
        self.index = self.engine.add_socket(self.sock.fileno(), self.port, responder)
        self.keys = 0  # OPT_ID keys the engine gave this socket's stamped sends

    def stamp_sends(self, stamps: list[int], now: int) -> None:
        for t in stamps:
            assert self.engine.feed_tx(self.index, self.keys, t, now)
            self.keys += 1

    def counters(self) -> dict[str, int]:
        return {k: v for k, v in self.engine.take_counters().items() if isinstance(k, str)}


def _t(who: int, seq: int, leg: int) -> int:
    """The stamp of leg (1..4) of probe ``seq`` of initiator ``who``: distinct, in order."""
    return 10**12 + who * 10**10 + seq * 10**6 + leg * 1000


def _drain(s: socket.socket) -> list[tuple[bytes, tuple[str, int]]]:
    """Every datagram waiting on ``s`` (loopback delivers during the send)."""
    out = []
    s.setblocking(False)
    while True:
        try:
            out.append(s.recvfrom(4096))
        except BlockingIOError:
            break
    return out


class _Rig:
    """Initiators A and C probing responder B; ``pump`` moves every datagram on, stamped."""

    def __init__(self, defer: bool) -> None:
        self.inits = [_Nic("nicA", defer, False), _Nic("nicC", defer, False)]
        self.b = _Nic("nicB", defer, True)
        self.sent = [0, 0]  # probes each initiator sent (its seqs start at 0)
        self.seen: dict[str, Any] = {"follow_ups": 0, "carrying_replies": 0, "defer_ok": set()}

    def probe_pair(self, who: int, now: int) -> None:
        ini = self.inits[who]
        ini.engine.queue(now, 0, self.b.hash, LO, self.b.port, ini.port, self.sent[who], 0, 0)
        ini.engine.send_due(now)
        ini.stamp_sends([_t(who, self.sent[who] + k, 1) for k in (0, 1)], now)
        self.sent[who] += 2

    def pump(self, now: int) -> None:
        order = []
        for data, src in _drain(self.b.sock):
            m = CODEC.decode(data)
            self.seen["defer_ok"].add(m.defer_ok)
            who = 0 if m.sender == self.inits[0].hash else 1
            self.b.engine.feed(data, src, _t(who, m.seq, 2), now)
            order.append((who, m.seq))
        self.b.engine.send_due(now)  # the replies (carrying what B holds for that NIC)
        self.b.stamp_sends([_t(who, seq, 3) for who, seq in order], now)
        self.b.engine.send_due(now)  # a FOLLOW_UP per reply (none when deferring)
        for who, ini in enumerate(self.inits):
            for data, _ in _drain(ini.sock):
                m = CODEC.decode(data)
                if m.mtype is MsgType.FOLLOW_UP:
                    self.seen["follow_ups"] += 1
                elif m.t3s:
                    self.seen["carrying_replies"] += 1
                ini.engine.feed(data, (LO, self.b.port), _t(who, m.seq, 4), now)

    def records(self, now: int) -> list[tuple[int, ...]]:
        out = []
        for who, ini in enumerate(self.inits):
            ini.engine.poll(now)
            raw = ini.engine.take()
            rows = np.frombuffer(raw or b"", dtype=np.int64).reshape(-1, compiled._NCOL)
            out += [(who, int(r[0]), *(int(x) for x in r[5:10])) for r in rows]
        return sorted(out)

    def close(self) -> None:
        for n in (*self.inits, self.b):
            n.sock.close()


def _run(defer: bool, gaps_ms: list[int]) -> tuple[list[tuple[int, ...]], dict[str, Any]]:
    """A sends a coded pair every round, C every other round; ``gaps_ms`` between rounds.
    B's poll (hold-time flush) runs on a 10 ms grid, as the endpoint's ``poll_ns``. Returns
    the records (initiator, seq, t1..t4, lost) and what was seen on the wire and counted."""
    rig = _Rig(defer)
    rounds = [sum(gaps_ms[:r]) * MS for r in range(len(gaps_ms) + 1)]
    end = rounds[-1] + HOLD + 10 * MS
    try:
        for t in range(0, end + 1, 10 * MS):
            if t in rounds:
                r = rounds.index(t)
                rig.probe_pair(0, t)
                if r % 2 == 0:
                    rig.probe_pair(1, t)
            rig.b.engine.poll(t)
            rig.pump(t)
        rig.seen["responder"] = rig.b.counters()
        rig.seen["initiators"] = [i.counters() for i in rig.inits]
        return rig.records(end + 2 * 10**9), rig.seen
    finally:
        rig.close()


GAPS = [100, 100, 120, 400, 80, 100, 300, 100, 100, 20]  # 400 and 300: longer than the hold


def test_deferred_follow_ups_give_the_same_four_stamps_as_a_follow_up_per_reply() -> None:
    plain, seen_plain = _run(False, GAPS)
    deferred, seen = _run(True, GAPS)
    n = 2 * (len(GAPS) + 1) + 2 * ((len(GAPS) + 2) // 2)
    assert len(plain) == len(deferred) == n
    assert deferred == plain  # the same probes, the same four stamps each, nothing lost
    for who, seq, t1, t2, t3, t4, lost in deferred:
        assert (t1, t2, t3, t4, lost) == (*(_t(who, seq, leg) for leg in (1, 2, 3, 4)), 0)
    # the per-reply path: a FOLLOW_UP per reply, probes without DEFER_OK
    assert seen_plain["follow_ups"] == seen_plain["responder"]["follow_ups_sent"] == n
    assert seen_plain["defer_ok"] == {False} and seen_plain["carrying_replies"] == 0
    # deferred: the t3s rode in replies, or left in one FOLLOW_UP per initiator after a hold
    c = seen["responder"]
    assert seen["defer_ok"] == {True}
    assert c["t3_held"] == n and c["t3_carried"] + c["t3_flushed"] == n
    assert c["t3_carried"] > n / 2 and seen["carrying_replies"] > 0
    assert seen["follow_ups"] == c["follow_ups_sent"] <= 8  # 4 hold-time flushes + the end
    assert sum(i["t3_received"] for i in seen["initiators"]) == n


def test_held_t3s_leave_as_one_follow_up_after_the_hold_time() -> None:
    rig = _Rig(True)
    try:
        rig.probe_pair(0, 0)
        rig.probe_pair(0, 5 * MS)
        rig.pump(5 * MS)  # four replies answered at 5 ms: four t3s held for A, taken at 5 ms
        assert rig.b.counters()["t3_held"] == 4
        rig.b.engine.poll(5 * MS + HOLD - 1)
        assert _drain(rig.inits[0].sock) == []  # not yet
        assert rig.b.engine.flush_held(5 * MS + HOLD - 1) == 0
        rig.b.engine.poll(5 * MS + HOLD)
        ((data, _),) = _drain(rig.inits[0].sock)
        m = CODEC.decode(data)
        assert m.mtype is MsgType.FOLLOW_UP and (m.seq, m.ta, m.tb, m.pair_id) == (0, 0, 0, -1)
        assert m.t3s == tuple((seq, _t(0, seq, 3)) for seq in range(4))
        assert rig.b.counters() == {"follow_ups_sent": 1, "t3_flushed": 4}
        rig.b.engine.poll(10 * HOLD)
        assert _drain(rig.inits[0].sock) == []  # sent once
    finally:
        rig.close()


def test_flush_held_sends_everything_whatever_its_age() -> None:
    rig = _Rig(True)
    try:
        rig.probe_pair(0, 0)
        rig.probe_pair(1, 0)
        rig.pump(0)
        assert rig.b.engine.flush_held(1, True) == 2  # one FOLLOW_UP per initiator NIC
        for who in (0, 1):
            ((data, _),) = _drain(rig.inits[who].sock)
            assert CODEC.decode(data).t3s == ((0, _t(who, 0, 3)), (1, _t(who, 1, 3)))
    finally:
        rig.close()


def test_a_probe_without_defer_ok_gets_a_follow_up_per_reply_from_a_deferring_responder() -> None:
    rig = _Rig(True)
    plain = _Nic("nicP", False, False)  # an initiator that does not set DEFER_OK
    try:
        plain.engine.queue(0, 0, rig.b.hash, LO, rig.b.port, plain.port, -1, 0, -1)
        plain.engine.send_due(0)
        ((data, src),) = _drain(rig.b.sock)
        assert not CODEC.decode(data).defer_ok
        rig.b.engine.feed(data, src, 100, 0)
        rig.b.engine.send_due(0)
        rig.b.stamp_sends([150], 0)
        rig.b.engine.send_due(0)
        got = [CODEC.decode(d) for d, _ in _drain(plain.sock)]
        assert [m.mtype for m in got] == [MsgType.REPLY, MsgType.FOLLOW_UP]
        assert (got[1].ta, got[1].tb, got[1].t3s) == (100, 150, ())
    finally:
        rig.close()
        plain.sock.close()


async def _close_sends_what_is_held() -> tuple[Message, Message, dict[str, int]]:
    responder = compiled.CompiledUdpEndpoint(compiled.CompiledSession("nicB"), LO, dport=0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a:
        a.bind((LO, 0))
        a.setblocking(False)
        loop = asyncio.get_running_loop()
        async with responder:
            task = asyncio.create_task(responder.run())
            probe = Message(MsgType.PROBE, nic_hash("nicA"), nic_hash("nicB"), 42, defer_ok=True)
            a.sendto(CODEC.encode(probe), (LO, responder.dport))
            reply = CODEC.decode(await asyncio.wait_for(loop.sock_recv(a, 4096), 10))
            for _ in range(100):  # its TX stamp is read after the send: then it is held
                if responder.session.counters["t3_held"]:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the reply's t3 was never held")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # closed (well before the 250 ms hold): the held t3 left as a FOLLOW_UP
        held = CODEC.decode(await asyncio.wait_for(loop.sock_recv(a, 4096), 10))
        return reply, held, dict(responder.session.counters)


def test_closing_the_endpoint_sends_the_held_t3s() -> None:
    reply, held, counters = asyncio.run(_close_sends_what_is_held())
    assert reply.mtype is MsgType.REPLY and reply.seq == 42 and not reply.t3s
    assert held.mtype is MsgType.FOLLOW_UP and len(held.t3s) == 1
    ((seq, t3),) = held.t3s
    assert seq == 42 and t3 >= reply.ta > 0  # the reply's kernel TX stamp, not after t2
    assert counters["t3_held"] == counters["t3_flushed"] == counters["follow_ups_sent"] == 1


# ---- live loopback: mixed fleets ---------------------------------------------------------------


async def _live(initiator: str, responder: str, defer: bool = True) -> tuple[list[Any], Any]:
    """10 coded pairs 30 ms apart from nicA to nicB over loopback; returns A's results and
    B's session counters (after B closed: held t3s flushed)."""
    from prober.session import ProbeSession
    from prober.udp import UdpEndpoint

    got: list[Any] = []

    def mk(kind: str, nic: str, **kw: Any) -> Any:
        if kind == "compiled":
            s = compiled.CompiledSession(nic, defer_follow_ups=defer)
            return compiled.CompiledUdpEndpoint(s, LO, dport=0, **kw)
        return UdpEndpoint(ProbeSession(nic), LO, dport=0, **kw)

    a, b = mk(initiator, "nicA", on_events=got.extend), mk(responder, "nicB")
    async with a, b:
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        await exchange(a, b, got, tasks, spacing_ns=30 * MS, polls=500)
    events = events_of(got)
    return events, b.session.counters  # a CompiledSession's: the engine's counts merged in


@pytest.mark.parametrize(
    ("initiator", "responder", "defer"),
    [("compiled", "compiled", True), ("compiled", "compiled", False),
     ("compiled", "per-datagram", True), ("per-datagram", "compiled", True)],
)  # fmt: skip
def test_live_mixed_fleets_complete_every_probe(
    initiator: str, responder: str, defer: bool
) -> None:
    from prober.events import ProbeResult

    events, counters = asyncio.run(_live(initiator, responder, defer))
    assert len(events) == 20 and all(isinstance(e, ProbeResult) for e in events)
    assert all(e.t1 <= e.t2 <= e.t3 <= e.t4 for e in events if isinstance(e, ProbeResult))
    if responder == "compiled":
        if initiator == "compiled" and defer:  # held t3s rode in replies or hold-time follow-ups
            assert counters["t3_held"] == 20
            assert counters["follow_ups_sent"] < 10 and counters["t3_carried"] > 0
        else:  # no DEFER_OK (per-datagram initiator, or deferral off): a FOLLOW_UP per reply
            assert counters["follow_ups_sent"] == 20 and not counters["t3_held"]


def test_python_sessions_count_held_t3_follow_ups_as_unmatched_and_keep_their_probe() -> None:
    from prober.session import ProbeSession

    held = CODEC.encode(Message(MsgType.FOLLOW_UP, nic_hash("nicB"), nic_hash("nicA"), 0,
                                t3s=((0, 999),)))  # fmt: skip
    for many in (False, True):
        s = ProbeSession("nicA")
        (probe,) = s.send_probe("nicB", (LO, 9), 50000, 1000)  # seq 0, as the body's
        s.on_tx_stamp(probe.meta.token, 900)
        got = (
            s.receive_many([(held, (LO, 9), 2000)], 2000)
            if many
            else s.receive(held, (LO, 9), 2000, 2000)
        )
        assert got == [] and s.counters["unmatched"] == 1 and s.pending == 1


def test_the_held_table_is_bounded_and_falls_back_to_a_follow_up_per_reply() -> None:
    b = _Nic("nicB", True, True)
    sink = _sock()  # where the replies go (not read: what overflows its buffer is dropped)
    limit, extra = 4096, 50

    def answer(sender: int) -> None:
        probe = CODEC.encode(Message(MsgType.PROBE, sender, b.hash, 7, defer_ok=True))
        b.engine.feed(probe, (LO, sink.getsockname()[1]), 10, 0)
        b.engine.send_due(0)
        b.stamp_sends([20], 0)

    try:
        for i in range(limit + extra):  # as many initiators, each answered once: all held
            answer(1000 + i)
        c = b.counters()
        assert c["t3_held"] == limit and c["follow_ups_sent"] == extra  # beyond: not deferred
        assert b.engine.stats()["held_initiators"] == limit
        assert b.engine.poll(HOLD) is None and b.counters()["follow_ups_sent"] == limit
        answer(1)  # a new initiator: the ones nothing is held for are forgotten
        assert b.counters()["t3_held"] == 1 and b.engine.stats()["held_initiators"] == 1
    finally:
        b.sock.close()
        sink.close()


# ---- an endpoint's own timer: next_timeout_ns covers the hold deadline -------------------------


def test_a_responder_only_session_wakes_for_its_oldest_held_t3() -> None:
    """Without `prober.drive.CompiledDriver` an endpoint wakes at ``next_timeout_ns`` (else at
    most every 1 s): a responder with nothing of its own pending must still wake when its
    oldest held t3 is due, not after a short initiator timeout."""
    b = compiled.CompiledSession("nicB", timeout_ns=10**9, hold_ns=HOLD)
    bsock = _sock()
    bport = bsock.getsockname()[1]
    bidx = b.engine.add_socket(bsock.fileno(), bport, True)
    inits = [_Nic("nicA", True, False), _Nic("nicC", True, False)]
    keys = [0]  # OPT_ID keys of B's stamped sends (its replies)
    try:
        assert b.next_timeout_ns() is None and b.engine.next_timeout_ns() is None

        def answer(who: int, seq: int, now: int) -> None:  # a coded pair from `who`, answered
            ini = inits[who]
            ini.engine.queue(now, 0, b.nic, LO, bport, ini.port, seq, 0, 0)
            ini.engine.send_due(now)
            ini.stamp_sends([_t(who, seq + k, 1) for k in (0, 1)], now)
            for data, src in _drain(bsock):
                b.engine.feed(data, src, _t(who, CODEC.decode(data).seq, 2), now)
            b.engine.send_due(now)  # the two replies; their t3s are held once stamped
            for k in (0, 1):
                assert b.engine.feed_tx(bidx, keys[0], _t(who, seq + k, 3), now)
                keys[0] += 1
            b.engine.send_due(now)
            _drain(ini.sock)

        answer(0, 0, 5 * MS)  # A's t3s held since 5 ms
        assert b.engine.next_timeout_ns() is None  # B probes nobody: no timeout of its own
        assert b.next_timeout_ns() == 5 * MS + HOLD
        answer(1, 0, 40 * MS)  # C's later: the oldest still decides
        assert b.next_timeout_ns() == 5 * MS + HOLD
        b.engine.poll(5 * MS + HOLD)  # A's flushed, C's still held
        assert b.next_timeout_ns() == 40 * MS + HOLD
        b.engine.poll(40 * MS + HOLD)
        assert b.next_timeout_ns() is None  # nothing held: no wake-up for it
        counts = b.engine.take_counters()
        assert counts["t3_held"] == counts["t3_flushed"] == 4
    finally:
        bsock.close()
        for n in inits:
            n.sock.close()


def test_next_timeout_ns_is_the_probe_timeout_when_nothing_is_held() -> None:
    a = compiled.CompiledSession("nicA", timeout_ns=10**9, hold_ns=HOLD)
    sock, peer = _sock(), _sock()
    try:
        idx = a.engine.add_socket(sock.fileno(), sock.getsockname()[1], False)
        a.engine.queue(7 * MS, 0, nic_hash("nicB"), LO, peer.getsockname()[1],
                       sock.getsockname()[1], 0, 0, 0)  # fmt: skip
        a.engine.send_due(7 * MS)
        assert a.engine.feed_tx(idx, 0, 7 * MS, 7 * MS)
        timeout = a.engine.next_timeout_ns()
        assert timeout is not None and a.next_timeout_ns() == timeout  # unchanged
        assert a.engine.next_flush_ns() is None
    finally:
        sock.close()
        peer.close()
