"""Two ProbeSessions joined by a fake link (no sockets): the protocol end to end."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.records import MISSING, decode_batch, encode_batch
from prober.events import Datagram, ProbeEvent, ProbeLost, ProbeResult, results_to_batch
from prober.session import ProbeSession
from prober.wire import Codec, Message, MsgType, nic_hash

A, B = ("10.0.0.1", 5000), ("10.0.0.2", 4791)
KEY = b"s" * 32
US = 1_000


@dataclass
class Link:
    """A fake link: each datagram is delayed, maybe dropped/duplicated/corrupted, reordered."""

    a: ProbeSession
    b: ProbeSession
    delay_ns: int = 10 * US
    drop: float = 0.0
    dup: float = 0.0
    corrupt: float = 0.0
    reorder: bool = False
    seed: int = 0
    clock_b_offset: int = 5_000_000  # B's clock reads 5 ms ahead of A's
    tx_delay_ns: int = 2 * US  # TX stamp is known this long after the send
    now: int = 1_000_000
    events: list[ProbeEvent] = field(default_factory=list)
    _rng: random.Random = field(init=False)
    _flight: list[tuple[int, int, ProbeSession, bytes, tuple[str, int]]] = field(init=False)
    _stamps: list[tuple[int, ProbeSession, int, int]] = field(init=False)
    _n: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._flight = []
        self._stamps = []

    def clock(self, s: ProbeSession) -> int:
        return self.now + (self.clock_b_offset if s is self.b else 0)

    def _send(self, src: ProbeSession, dgrams: list[Datagram]) -> None:
        dst = self.b if src is self.a else self.a
        src_addr = A if src is self.a else B
        for d in dgrams:
            if d.meta.wants_tx_stamp:
                self._stamps.append(
                    (self.now + self.tx_delay_ns, src, d.meta.token, self.clock(src) + US)
                )
            copies = 0 if self._rng.random() < self.drop else 1
            copies += 1 if self._rng.random() < self.dup else 0
            for _ in range(copies):
                data = d.data
                if self._rng.random() < self.corrupt:
                    b = bytearray(data)
                    b[self._rng.randrange(len(b))] ^= 1 << self._rng.randrange(8)
                    data = bytes(b)
                jitter = self._rng.randrange(50 * US) if self.reorder else 0
                self._n += 1
                self._flight.append(
                    (self.now + self.delay_ns + jitter, self._n, dst, data, src_addr)
                )

    def pump(self, s: ProbeSession) -> None:
        self._send(s, s.next_datagrams(self.clock(s)))

    def run_until(self, end: int, step: int = US) -> None:
        while self.now < end:
            self.now += step
            for when, s, tok, stamp in sorted(self._stamps, key=lambda x: x[0]):
                if when <= self.now:
                    self.events += s.on_tx_stamp(tok, stamp)
            self._stamps = [x for x in self._stamps if x[0] > self.now]
            due = sorted(f for f in self._flight if f[0] <= self.now)
            self._flight = [f for f in self._flight if f[0] > self.now]
            for _, _, s, data, src in due:
                self.events += s.receive(data, src, self.clock(s), self.clock(s))
            for s in (self.a, self.b):
                self.pump(s)
                self.events += s.poll(self.clock(s))


def _pair(key: bytes | None = None, **kw: object) -> tuple[ProbeSession, ProbeSession]:
    a = ProbeSession("nicA", Codec(key), timeout_ns=500 * US, **kw)  # type: ignore[arg-type]
    b = ProbeSession("nicB", Codec(key), timeout_ns=500 * US, **kw)  # type: ignore[arg-type]
    return a, b


def test_clean_round_trip_four_stamps_two_step() -> None:
    a, b = _pair()
    link = Link(a, b)
    a.queue_probe("nicB", B, 50001, link.now)
    link.pump(a)
    link.run_until(link.now + 200 * US)
    (r,) = link.events
    assert isinstance(r, ProbeResult)
    assert (r.src, r.dst, r.sport, r.pair_id) == ("nicA", "nicB", 50001, -1)
    assert r.t1 < r.t4 and r.t2 < r.t3
    assert r.t2 - r.t1 == pytest.approx(5_000_000 + 10 * US, abs=2 * US)  # offset + delay
    assert r.rtt_ns == pytest.approx(18 * US, abs=2 * US)  # both TX stamps 1 µs after hand-off
    assert a.pending == 0 and not a.counters and not b.counters


def test_one_step_needs_no_follow_up() -> None:
    a, b = _pair(one_step=True)
    link = Link(a, b)
    link._send(a, a.send_probe("nicB", B, 50002, link.now))
    link.run_until(link.now + 100 * US)
    (r,) = link.events
    assert isinstance(r, ProbeResult) and r.t3 >= r.t2
    assert not any(d for d in b.next_datagrams(link.clock(b)))  # no FOLLOW_UP pending


def test_coded_pair_spacing_and_ids() -> None:
    a, b = _pair()
    link = Link(a, b)
    pid = a.queue_pair("nicB", B, 50003, link.now + US, spacing_ns=20 * US)
    link.run_until(link.now + 300 * US)
    res = sorted((e for e in link.events if isinstance(e, ProbeResult)), key=lambda r: r.pair_pos)
    assert [(r.pair_id, r.pair_pos) for r in res] == [(pid, 0), (pid, 1)]
    assert res[1].t1 - res[0].t1 == pytest.approx(20 * US, abs=US)


def test_loss_reported_with_path_after_timeout() -> None:
    a, b = _pair()
    link = Link(a, b, drop=1.0)
    a.queue_probe("nicB", B, 50004, link.now)
    link.pump(a)
    link.run_until(link.now + 400 * US)
    assert link.events == []
    link.run_until(link.now + 200 * US)
    (lost,) = link.events
    assert isinstance(lost, ProbeLost)
    assert (lost.src, lost.dst, lost.sport) == ("nicA", "nicB", 50004)
    assert lost.t1 != MISSING  # the TX stamp arrived even though the packet was lost
    assert a.counters["lost"] == 1 and a.pending == 0


def test_lossy_reordering_duplicating_corrupting_link_never_raises() -> None:
    a, b = _pair(KEY)
    link = Link(a, b, drop=0.1, dup=0.2, corrupt=0.1, reorder=True, seed=3)
    for i in range(300):
        a.queue_pair("nicB", B, 50000 + i % 7, link.now + i * 30 * US, spacing_ns=20 * US)
    link.run_until(link.now + 300 * 30 * US + 2_000 * US, step=2 * US)
    done = [e for e in link.events if isinstance(e, ProbeResult)]
    lost = [e for e in link.events if isinstance(e, ProbeLost)]
    seqs = [e.seq for e in link.events]
    assert len(seqs) == len(set(seqs))  # each probe reported once
    assert len(done) + len(lost) + a.counters["incomplete"] == 600
    assert 300 < len(done) < 600 and lost
    assert a.counters["bad_auth"] + b.counters["bad_auth"] > 0  # corruption caught by the tag
    assert a.counters["duplicate"] + b.counters["unmatched"] + a.counters["unmatched"] > 0
    assert all(r.t1 <= r.t4 and r.t2 <= r.t3 for r in done) and not a.counters["inconsistent"]
    assert a.pending == 0


def test_wrong_hmac_and_spoofs_are_counted() -> None:
    a = ProbeSession("nicA", Codec(KEY))
    for data in (Codec(b"z" * 32).encode(Message(MsgType.PROBE, 1, a.nic, 1)), b"", b"\x00" * 99):
        assert a.receive(data, B, 1, 1) == []
    assert a.next_datagrams(10) == []
    assert a.counters["bad_auth"] == 1 and a.counters["truncated"] == 1
    assert sum(a.counters.values()) == 3
    # a valid reply for a seq we never sent, and one from the wrong NIC
    a.queue_probe("nicB", B, 1, 0)
    (d,) = a.next_datagrams(0)
    codec = Codec(KEY)
    evil = Message(MsgType.REPLY, nic_hash("nicC"), a.nic, d.meta.seq, ta=5, tb=6, t3_final=True)
    assert a.receive(codec.encode(evil), B, 9, 9) == []
    unknown = Message(MsgType.REPLY, nic_hash("nicB"), a.nic, 999, ta=5, tb=6, t3_final=True)
    assert a.receive(codec.encode(unknown), B, 9, 9) == []
    other = Message(MsgType.PROBE, nic_hash("nicB"), nic_hash("nicZ"), 1)
    assert a.receive(codec.encode(other), B, 9, 9) == []
    assert a.counters["wrong_sender"] == 1 and a.counters["unmatched"] == 1
    assert a.counters["misdirected"] == 1


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=120), st.integers(-(2**40), 2**62))
def test_session_counts_garbage_never_raises(data: bytes, stamp: int) -> None:
    s = ProbeSession("nicA")
    s.queue_probe("nicB", B, 1, 0)
    s.next_datagrams(0)
    assert s.receive(data, B, stamp, 0) == []
    s.on_tx_stamp(stamp, stamp)
    s.poll(stamp)


def test_overflow_bounds_pending() -> None:
    s = ProbeSession("nicA", max_pending=4)
    for i in range(10):
        s.queue_probe("nicB", B, 1, i)
    assert len(s.next_datagrams(100)) == 4 and s.counters["overflow"] == 6


def test_results_to_batch_round_trips_through_records() -> None:
    a, b = _pair()
    link = Link(a, b, drop=0.3, seed=1)
    for i in range(40):
        a.queue_pair("nicB", B, 50000 + i, link.now + i * 50 * US, spacing_ns=20 * US)
    link.run_until(link.now + 3_000 * US)
    batch = results_to_batch(link.events, origin="hostA", nic_ids=["nicB"])
    assert len(batch) == 80 - a.counters["incomplete"] and batch.nic_ids == ("nicB", "nicA")
    back = decode_batch(encode_batch(batch))
    lost = np.array([isinstance(e, ProbeLost) for e in link.events])
    assert np.array_equal(back.lost, lost) and lost.any() and not lost.all()
    assert np.all(back.t4[back.lost] == MISSING)
    assert np.all(back.src == 1) and np.all(back.dst == 0)
    assert set(back.pair.tolist()) <= set(range(40)) and set(back.pos.tolist()) == {0, 1}
    assert len(results_to_batch([], origin="x")) == 0


@settings(max_examples=400, deadline=None)
@given(
    key=st.sampled_from([None, KEY]),
    one_step=st.booleans(),
    trace=st.booleans(),
    pad=st.integers(0, 64),
    pair=st.sampled_from([(-1, 0), (0, 0), (7, 1), (2**31 - 1, 1)]),
    seq=st.integers(0, 2**32 - 1),
    t2=st.integers(0, 2**62),
    late=st.integers(-5, 10**6),
)
def test_replies_and_follow_ups_are_the_codecs_bytes(
    key: bytes | None, one_step: bool, trace: bool, pad: int, pair: tuple[int, int], seq: int,
    t2: int, late: int,
) -> None:  # fmt: skip
    """The responder packs its REPLY and FOLLOW_UP from the validated probe's fields, without a
    `Message` per datagram: the bytes are those of `Codec.encode` of the validated message."""
    codec = Codec(key)
    b = ProbeSession("nicB", codec, one_step=one_step)
    a_hash = nic_hash("nicA")
    probe = Message(MsgType.PROBE, a_hash, b.nic, seq, pair[0], pair[1], pad=pad, trace=trace)
    now = t2 + max(late, 0)
    assert b.receive(codec.encode(probe), A, t2, now) == []
    (reply,) = b.next_datagrams(now)
    step1 = one_step or trace
    t3 = max(now, t2) if step1 else 0
    want = Message(MsgType.REPLY, b.nic, a_hash, seq, pair[0], pair[1], t2, t3, step1, pad, trace)
    assert reply.data == codec.encode(want) and reply.dest == A
    assert reply.meta.wants_tx_stamp is not step1
    if step1:
        return
    assert b.on_tx_stamp(reply.meta.token, t2 + late) == []
    (fu,) = b.next_datagrams(now)
    t3 = max(t2 + late, t2) if t2 + late >= 0 else t2
    want_fu = Message(MsgType.FOLLOW_UP, b.nic, a_hash, seq, pair[0], pair[1], t2, t3)
    assert fu.data == codec.encode(want_fu) and fu.dest == A and not fu.meta.wants_tx_stamp


def test_out_of_range_stamps_raise_and_change_nothing() -> None:
    """A receive stamp outside int64 (a broken transport clock, not bad data) raises
    `BadFieldError` before the session queues or awaits anything."""
    from prober.wire import BadFieldError

    codec = Codec()
    b = ProbeSession("nicB", codec)
    probe = codec.encode(Message(MsgType.PROBE, nic_hash("nicA"), b.nic, 1))
    for rx in (-1, 2**63):
        with pytest.raises(BadFieldError):
            b.receive(probe, A, rx, 0)
        with pytest.raises(BadFieldError):
            b.receive_many([(probe, A, rx)], 0)
    assert b.next_datagrams(0) == [] and b.pending == 0 and not b.counters
    b.receive(probe, A, 2**63 - 10, 0)
    (reply,) = b.next_datagrams(0)
    with pytest.raises(BadFieldError):
        b.on_tx_stamp(reply.meta.token, 2**63)  # t3 past int64
    assert b.next_datagrams(0) == []
