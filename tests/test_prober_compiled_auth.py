"""Probe HMAC in the compiled engine (`prober._fastpath`, `prober.compiled`): its own SHA-256 and
HMAC against the published vectors, its parser against the keyed `prober.wire.Codec`, the tag
of every message it sends against the codec's (every type, t3 lists, padding), bad tags
counted ``bad_auth`` and never answered or matched, a key rotation, and live loopback traffic
authenticated both ways between the compiled and the per-datagram paths.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
import socket
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prober import compiled
from prober.drive import CompiledDriver
from prober.events import ProbeLost, ProbeResult
from prober.session import ProbeSession
from prober.udp import UdpEndpoint
from prober.wire import FLAG_AUTH, TAG_LEN, Codec, Message, MsgType, WireError, nic_hash
from tests.loopexchange import events_of, exchange
from tests.wiremutate import mutated

pytestmark = pytest.mark.skipif(not compiled.available(), reason="prober._fastpath not built")

LO = "127.0.0.1"
OLD = bytes(range(32))
NEW = bytes(range(100, 132))
OTHER = b"\xee" * 32
HOLD = 250_000_000


# ---- SHA-256 / HMAC-SHA256 known answers -------------------------------------------------------

# RFC 4231 section 4: (key, data, HMAC-SHA256); case 5's tag is truncated to 128 bits there
RFC4231 = [
    (b"\x0b" * 20, b"Hi There",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50,
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50,
     "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (b"\x0c" * 20, b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (b"\xaa" * 131,
     b"This is a test using a larger than block-size key and a larger than block-size data. "
     b"The key needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]  # fmt: skip

# FIPS 180-4 examples (and the padding edges around one 64-byte block)
SHA256 = [
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "data", "want"), RFC4231, ids=[f"case{i}" for i in range(1, 8)])
def test_hmac_sha256_matches_rfc4231(key: bytes, data: bytes, want: str) -> None:
    tag = compiled._fastpath.hmac_sha256(key, data)
    assert tag.hex()[: len(want)] == want


@pytest.mark.parametrize(("data", "want"), SHA256, ids=["empty", "abc", "448bit", "million-a"])
def test_sha256_matches_fips_180_examples(data: bytes, want: str) -> None:
    assert compiled._fastpath.sha256(data).hex() == want


def test_hmac_and_sha256_agree_with_hashlib_at_every_block_edge() -> None:
    rng = random.Random(4231)
    for n in (*range(0, 200), 1000, 4096, 8192 + 48 + 64 * 12 + 1):
        data = rng.randbytes(n)
        assert compiled._fastpath.sha256(data) == hashlib.sha256(data).digest(), n
        key = rng.randbytes(rng.choice((16, 32, 63, 64, 65, 200)))
        assert compiled._fastpath.hmac_sha256(key, data) == hmac.digest(key, data, "sha256"), n


# ---- the parser against the keyed codec --------------------------------------------------------


def _fields(m: Message) -> tuple[Any, ...]:
    return (int(m.mtype), m.sender, m.peer, m.seq, m.pair_id, m.pair_pos, m.ta, m.tb,
            m.t3_final, m.pad, m.trace, m.defer_ok, m.t3s)  # fmt: skip


def _codec_view(codec: Codec, data: bytes) -> Any:
    try:
        return _fields(codec.decode(data))
    except WireError as exc:
        return exc.reason


def _messages() -> list[Message]:
    a, b = nic_hash("a"), nic_hash("b")
    return [
        Message(MsgType.PROBE, a, b, 7, 3, 1),
        Message(MsgType.PROBE, a, b, 8, pad=16, trace=True),
        Message(MsgType.PROBE, a, b, 9, 4, 0, pad=8, defer_ok=True),
        Message(MsgType.REPLY, b, a, 7, 3, 1, 100),
        Message(MsgType.REPLY, b, a, 7, -1, 0, 100, 120, True),
        Message(MsgType.REPLY, b, a, 9, 4, 0, 100, t3s=((7, 130), (8, 2**62))),
        Message(MsgType.REPLY, b, a, 9, -1, 0, 100, pad=6, t3s=((2**32 - 1, 5),)),
        Message(MsgType.FOLLOW_UP, b, a, 2**32 - 1, 2**31 - 1, 0, 100, 130),
        Message(MsgType.FOLLOW_UP, b, a, 0, t3s=((1, 10), (2, 20), (3, 30))),
    ]


_TAGGED = [
    c.encode(m)
    for c in (Codec(NEW), Codec(OLD), Codec(OTHER), Codec(b"k" * 100), Codec())
    for m in _messages()
]
ROTATION = Codec(NEW, (OLD,))


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(_TAGGED),
    flips=st.lists(st.tuples(st.integers(0, 140), st.integers(0, 255)), max_size=3),
    cut=st.integers(-8, 160),
    extra=st.binary(max_size=24),
)
def test_keyed_c_parser_agrees_with_the_keyed_codec(
    base: bytes, flips: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    data = mutated(base, flips, cut, extra)
    got = compiled._fastpath.decode(data, (NEW, OLD))
    assert got == _codec_view(ROTATION, data)
    # without keys the engine is the unauthenticated codec: tagged datagrams are bad_auth
    assert compiled._fastpath.decode(data) == _codec_view(Codec(), data)


def test_keyed_c_parser_takes_every_key_of_the_set_and_only_those() -> None:
    for m in _messages():
        for key, ok in ((NEW, True), (OLD, True), (OTHER, False), (None, False)):
            data = Codec(key).encode(m)
            want = _fields(m) if ok else "bad_auth"
            assert compiled._fastpath.decode(data, (NEW, OLD)) == want
            assert compiled._fastpath.decode(data, (OLD, NEW)) == want


# ---- what the engine sends: the codec's bytes, tag included ------------------------------------


def _sock() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((LO, 0))
    return s


def _drain(s: socket.socket) -> list[bytes]:
    out = []
    s.setblocking(False)
    while True:
        try:
            out.append(s.recvfrom(4096)[0])
        except BlockingIOError:
            return out


class _Nic:
    """One engine with one real loopback socket; TX stamps are handed in (`feed_tx`)."""

    def __init__(self, name: str, keys: tuple[bytes, ...] | None, responder: bool,
                 defer: bool = False, pad: int = 0) -> None:  # fmt: skip
        self.hash = nic_hash(name)
        self.engine = compiled._fastpath.Engine(
            self.hash, 10**9, 1024, pad, defer=defer, hold_ns=HOLD, stamp_followups=False,
            keys=keys,
        )  # fmt: skip
        self.sock = _sock()
        self.port = self.sock.getsockname()[1]
        self.index = self.engine.add_socket(self.sock.fileno(), self.port, responder)
        self.keys = 0

    def stamp(self, n: int, t: int) -> None:
        for _ in range(n):
            assert self.engine.feed_tx(self.index, self.keys, t, t)
            self.keys += 1

    def counters(self) -> dict[str, int]:
        return {k: v for k, v in self.engine.take_counters().items() if isinstance(k, str)}

    def rows(self) -> Any:
        raw = self.engine.take()
        return np.frombuffer(raw or b"", dtype=np.int64).reshape(-1, compiled._NCOL)


def _sealed_like_the_codec(data: bytes, key: bytes) -> Message:
    """Check ``data`` carries AUTH and the codec's tag, and is byte for byte what the codec
    makes of the same message; return the message."""
    assert data[4] & FLAG_AUTH
    assert data[-TAG_LEN:] == hmac.digest(key, data[:-TAG_LEN], "sha256")[:TAG_LEN]
    m = Codec(key).decode(data)
    assert Codec(key).encode(m) == data
    return m


@pytest.mark.parametrize("pad", [0, 37])
@pytest.mark.parametrize("defer", [False, True])
def test_engine_tags_every_message_it_sends_as_the_codec_does(defer: bool, pad: int) -> None:
    """A sends a probe and a coded pair to B, then one more; B answers (a FOLLOW_UP per reply,
    or with deferral the held t3s in the next REPLY and a hold-time FOLLOW_UP). Every datagram
    on the wire is the codec's, tagged with the send key; A completes every probe from them."""
    a = _Nic("nicA", (NEW, OLD), False, defer, pad)
    b = _Nic("nicB", (NEW, OLD), True, defer)
    seen: list[Message] = []
    try:
        a.engine.queue(1000, 0, b.hash, LO, b.port, a.port, -1, 0, -1)
        a.engine.queue(1000, 0, b.hash, LO, b.port, a.port, 5, 0, 0)  # a coded pair
        a.engine.send_due(1000)
        a.stamp(3, 1000)
        for t in (2000, 3000):
            probes = _drain(b.sock)
            for d in probes:
                m = _sealed_like_the_codec(d, NEW)
                seen.append(m)
                b.engine.feed(d, (LO, a.port), t + m.seq, t)
            b.engine.send_due(t)  # the replies
            b.stamp(len(probes), t + 100)
            b.engine.send_due(t)  # a FOLLOW_UP per reply (none when deferring)
            if t == 2000:  # one more probe: its reply carries the held t3s
                a.engine.queue(t, 0, b.hash, LO, b.port, a.port, -1, 0, -1)
                a.engine.send_due(t)
                a.stamp(1, t)
            else:
                b.engine.flush_held(t, True)  # the hold-time FOLLOW_UP
            for d in _drain(a.sock):
                seen.append(_sealed_like_the_codec(d, NEW))
                a.engine.feed(d, (LO, b.port), t + 500, t + 500)
        kinds = {(m.mtype, bool(m.t3s), m.pad) for m in seen}
        want = {(MsgType.PROBE, False, pad), (MsgType.REPLY, False, pad)}
        if defer:
            want |= {(MsgType.REPLY, True, pad), (MsgType.FOLLOW_UP, True, 0)}
        else:
            want |= {(MsgType.FOLLOW_UP, False, 0)}
        assert kinds == want
        assert all(m.defer_ok == defer for m in seen if m.mtype is MsgType.PROBE)
        rows = a.rows()
        assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3] and not rows[:, 9].any()
        assert "bad_auth" not in a.counters() and "bad_auth" not in b.counters()
    finally:
        a.sock.close()
        b.sock.close()


def test_engine_refuses_a_pad_that_leaves_no_room_for_the_tag() -> None:
    slot = compiled._fastpath.SLOT
    compiled._fastpath.Engine(1, 10**9, 16, slot - 48)  # unauthenticated: fits
    compiled._fastpath.Engine(1, 10**9, 16, slot - 48 - TAG_LEN, keys=(NEW,))
    with pytest.raises(ValueError, match="pad"):
        compiled._fastpath.Engine(1, 10**9, 16, slot - 48 - TAG_LEN + 1, keys=(NEW,))
    with pytest.raises(ValueError, match="at least 16"):
        compiled._fastpath.Engine(1, 10**9, 16, keys=(b"short",))
    with pytest.raises(ValueError, match="at most"):
        compiled._fastpath.Engine(1, 10**9, 16, keys=(NEW,) * 5)


# ---- bad tags: counted, never answered, never a record ----------------------------------------


def _forgeries(m: Message) -> list[bytes]:
    """``m`` untagged, tagged with a key outside the set, a flipped bit in the body, in a t3
    list or padding, in the tag, and its tag cut short."""
    good = Codec(NEW).encode(m)
    out = [Codec().encode(m), Codec(OTHER).encode(m), good[:-1], good[: len(good) - TAG_LEN]]
    for pos in (9, 30, len(good) - TAG_LEN - 1, len(good) - 1):
        d = bytearray(good)
        d[pos] ^= 0x04
        out.append(bytes(d))
    return out


def test_bad_tags_are_bad_auth_never_answered_and_counted_like_the_python_session() -> None:
    b = _Nic("nicB", (OLD, NEW), True)  # B mid-rotation: sends with OLD, takes both
    py = ProbeSession("nicB", Codec(OLD, (NEW,)))
    a = nic_hash("nicA")
    try:
        probe = Message(MsgType.PROBE, a, b.hash, 3, pad=20)
        bad = _forgeries(probe)
        good = [Codec(NEW).encode(probe), Codec(OLD).encode(probe)]  # either key of the set
        with _sock() as sink:
            for i, d in enumerate(bad + good):
                b.engine.feed(d, sink.getsockname(), 1000 + i, 1000 + i)
                py.receive(d, sink.getsockname(), 1000 + i, 1000 + i)
            b.engine.send_due(2000)
            replies = _drain(sink)
        # only the two well-tagged probes are answered, with the send key (OLD)
        assert [_sealed_like_the_codec(d, OLD).mtype for d in replies] == [MsgType.REPLY] * 2
        assert len(py.next_datagrams(2000)) == 2
        counts = b.counters()
        assert counts == dict(py.counters)
        assert counts["bad_auth"] + counts.get("truncated", 0) == len(bad)
        assert counts["bad_auth"] >= len(bad) - 1  # the tag cut to nothing leaves 48+20 bytes
    finally:
        b.sock.close()


def test_replies_with_bad_tags_never_complete_a_probe() -> None:
    a = _Nic("nicA", (NEW,), False)
    b_hash = nic_hash("nicB")
    try:
        with _sock() as sink:
            port = sink.getsockname()[1]
            a.engine.queue(1000, 0, b_hash, LO, port, a.port, -1, 0, -1)
            a.engine.send_due(1000)
            a.stamp(1, 1000)
            reply = Message(MsgType.REPLY, b_hash, a.hash, 0, ta=2000)
            follow = Message(MsgType.FOLLOW_UP, b_hash, a.hash, 0, ta=2000, tb=2100)
            for d in _forgeries(reply) + _forgeries(follow):
                a.engine.feed(d, (LO, port), 3000, 3000)
            assert a.engine.pending == 1 and len(a.rows()) == 0
            # (a 48-byte body with its tag cut short is too short for a tag: truncated)
            assert a.counters() == {"bad_auth": 12, "truncated": 4}
            a.engine.feed(Codec(NEW).encode(reply), (LO, port), 3000, 3000)
            a.engine.feed(Codec(NEW).encode(follow), (LO, port), 3001, 3001)
            (row,) = a.rows()
            assert [int(x) for x in row[5:10]] == [1000, 2000, 2100, 3000, 0]
    finally:
        a.sock.close()


def test_an_unkeyed_engine_counts_tagged_datagrams_bad_auth() -> None:
    s = compiled.CompiledSession("nicB")
    probe = Codec(NEW).encode(Message(MsgType.PROBE, nic_hash("nicA"), s.nic, 1))
    assert s.receive(probe, (LO, 9), 10, 10) == []
    assert s.counters["bad_auth"] == 1 and s.engine.stats()["awaiting_tx"] == 0


def test_compiled_session_takes_the_codecs_keys() -> None:
    assert Codec().keys == ()
    assert Codec(NEW).keys == (NEW,)
    assert Codec(NEW, (OLD, NEW)).keys == (NEW, OLD)
    s = compiled.CompiledSession("nicA", Codec(NEW, (OLD,)))
    assert s.codec.authenticated
    with pytest.raises(ValueError, match="two-step"):
        compiled.CompiledSession("nicA", Codec(NEW), one_step=True)


# ---- live: compiled <-> per-datagram, authenticated both ways ---------------------------------


async def _live(initiator: str, responder: str, codec_a: Codec, codec_b: Codec) -> tuple[Any, ...]:
    """nicA (``initiator`` path) sends 10 coded pairs to nicB; return (events, A's counters,
    B's counters). Compiled endpoints run as in the agent: one `CompiledDriver` ticks them
    (deferred follow-ups on, held t3s flushed on its grid)."""
    got: list[Any] = []

    def mk(path: str, nic: str, codec: Codec, **kw: Any) -> UdpEndpoint:
        if path == "compiled":
            session = compiled.CompiledSession(nic, codec, timeout_ns=500_000_000)
            ep = compiled.CompiledUdpEndpoint(session, LO, dport=0, **kw)
            ep.external_ticks = True
            return ep
        return UdpEndpoint(ProbeSession(nic, codec, timeout_ns=500_000_000), LO, dport=0, **kw)

    a = mk(initiator, "nicA", codec_a, on_events=got.extend)
    b = mk(responder, "nicB", codec_b)
    async with a, b:
        driven = [e for e in (a, b) if isinstance(e, compiled.CompiledUdpEndpoint)]
        tasks = [asyncio.create_task(CompiledDriver(driven).run())]
        tasks += [asyncio.create_task(e.run()) for e in (a, b) if e not in driven]
        await exchange(a, b, got, tasks, drained=driven)
    events = events_of(got)
    return events, a.session.counters, b.session.counters


PAIRS = [("compiled", "per-datagram"), ("per-datagram", "compiled"), ("compiled", "compiled")]


@pytest.mark.parametrize(("initiator", "responder"), PAIRS)
def test_live_authenticated_exchange_completes_every_probe(initiator: str, responder: str) -> None:
    # mid-rotation: A already sends with NEW, B still with OLD, both take both
    events, ca, cb = asyncio.run(
        _live(initiator, responder, Codec(NEW, (OLD,)), Codec(OLD, (NEW,)))
    )
    assert len(events) == 20 and all(isinstance(e, ProbeResult) for e in events)
    assert all(e.t1 <= e.t2 <= e.t3 <= e.t4 for e in events if isinstance(e, ProbeResult))
    assert ca["bad_auth"] == cb["bad_auth"] == 0
    if (initiator, responder) == ("compiled", "compiled"):  # tagged t3 lists went live too
        assert cb["t3_held"] == 20 and ca["t3_received"] == 20


@pytest.mark.parametrize(("initiator", "responder"), PAIRS[:2])
def test_live_wrong_key_is_bad_auth_and_every_probe_lost(initiator: str, responder: str) -> None:
    events, ca, cb = asyncio.run(_live(initiator, responder, Codec(OTHER), Codec(OLD, (NEW,))))
    assert len(events) == 20 and all(isinstance(e, ProbeLost) for e in events)
    assert cb["bad_auth"] == 20 and ca["bad_auth"] == 0  # never answered
