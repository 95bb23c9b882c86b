"""The compiled hot path (`prober.compiled`, C engine `prober._fastpath`) loses and mis-stamps
nothing: its parser against `prober.wire.Codec` on malformed datagrams, its matching against
`ProbeSession` on crafted answers, and live loopback traffic through it against the
per-datagram path (same seqs, ports, pairs and losses; kernel stamps in order).
"""

from __future__ import annotations

import asyncio
import errno
import random
import socket
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prober import compiled
from prober.drive import CompiledDriver
from prober.events import ProbeLost, ProbeResult, ResultBlock, results_to_batch
from prober.session import ProbeSession
from prober.udp import UdpEndpoint, UdpError
from prober.wire import BODY_LEN, Codec, Message, MsgType, WireError, nic_hash
from tests.loopexchange import events_of, exchange
from tests.wiremutate import mutated

pytestmark = pytest.mark.skipif(not compiled.available(), reason="prober._fastpath not built")

LO = "127.0.0.1"


def _fields(m: Message) -> tuple[Any, ...]:
    return (int(m.mtype), m.sender, m.peer, m.seq, m.pair_id, m.pair_pos, m.ta, m.tb,
            m.t3_final, m.pad, m.trace, m.defer_ok, m.t3s)  # fmt: skip


def _codec_view(data: bytes) -> Any:
    try:
        return _fields(Codec().decode(data))
    except WireError as exc:
        return exc.reason


def _valid_messages() -> list[bytes]:
    c = Codec()
    a, b = nic_hash("a"), nic_hash("b")
    return [
        c.encode(Message(MsgType.PROBE, a, b, 7, 3, 1)),
        c.encode(Message(MsgType.PROBE, a, b, 8, pad=16, trace=True)),
        c.encode(Message(MsgType.REPLY, b, a, 7, 3, 1, 100)),
        c.encode(Message(MsgType.REPLY, b, a, 7, -1, 0, 100, 120, True)),
        c.encode(Message(MsgType.FOLLOW_UP, b, a, 2**32 - 1, 2**31 - 1, 0, 100, 130)),
        Codec(b"k" * 32).encode(Message(MsgType.PROBE, a, b, 1)),
        # deferred follow-ups: DEFER_OK probes, t3 lists in replies and hold-time follow-ups
        c.encode(Message(MsgType.PROBE, a, b, 9, 4, 0, pad=8, defer_ok=True)),
        c.encode(Message(MsgType.REPLY, b, a, 9, 4, 0, 100, t3s=((7, 130), (8, 2**62)))),
        c.encode(Message(MsgType.REPLY, b, a, 9, -1, 0, 100, pad=6, t3s=((2**32 - 1, 5),))),
        c.encode(Message(MsgType.FOLLOW_UP, b, a, 0, t3s=((1, 10), (2, 20), (3, 30)))),
    ]


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(_valid_messages()),
    flips=st.lists(st.tuples(st.integers(0, 90), st.integers(0, 255)), max_size=4),
    cut=st.integers(-8, 100),
    extra=st.binary(max_size=24),
)
def test_c_parser_agrees_with_the_codec_on_mutated_datagrams(
    base: bytes, flips: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    data = mutated(base, flips, cut, extra)
    assert compiled._fastpath.decode(data) == _codec_view(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_c_parser_agrees_with_the_codec_on_random_bytes(data: bytes) -> None:
    assert compiled._fastpath.decode(data) == _codec_view(data)


def test_engine_counts_every_malformed_datagram_and_never_crashes() -> None:
    s = compiled.CompiledSession("nicB")
    rng = random.Random(5)
    valid = _valid_messages()
    n = 20_000
    for i in range(n):
        if i % 2:
            d = bytearray(rng.choice(valid))
            for _ in range(rng.randint(1, 3)):
                d[rng.randrange(len(d))] = rng.randrange(256)
            data = bytes(d[: rng.randint(0, len(d))]) if i % 3 == 0 else bytes(d)
        else:
            data = rng.randbytes(rng.randint(0, 100))
        assert s.receive(data, (LO, 5000), 1000, 1000) in ([],)
    counted = sum(s.counters.values())
    # every datagram is either counted (bad, misdirected, unmatched...) or a probe answered
    assert counted + s.engine.stats()["awaiting_tx"] + s.counters["overflow"] >= n - 50
    assert counted > n * 0.9


# ---- matching against ProbeSession on crafted answers ------------------------------------------


def _answers(a: int, b: int, seq: int) -> list[tuple[str, bytes]]:
    c = Codec()
    return [
        ("reply", c.encode(Message(MsgType.REPLY, b, a, seq, -1, 0, 500))),
        ("dup reply", c.encode(Message(MsgType.REPLY, b, a, seq, -1, 0, 500))),
        ("other t2", c.encode(Message(MsgType.FOLLOW_UP, b, a, seq, -1, 0, 501, 600))),
        ("wrong sender", c.encode(Message(MsgType.FOLLOW_UP, a, a, seq, -1, 0, 500, 600))),
        ("mismatch", c.encode(Message(MsgType.FOLLOW_UP, b, a, seq, 4, 1, 500, 600))),
        ("unmatched", c.encode(Message(MsgType.FOLLOW_UP, b, a, seq + 9, -1, 0, 500, 600))),
        ("misdirected", c.encode(Message(MsgType.FOLLOW_UP, b, b, seq, -1, 0, 500, 600))),
        ("follow-up", c.encode(Message(MsgType.FOLLOW_UP, b, a, seq, -1, 0, 500, 600))),
        ("dup follow-up", c.encode(Message(MsgType.FOLLOW_UP, b, a, seq, -1, 0, 500, 600))),
    ]


async def _compiled_initiator_sees(answers: list[bytes], port: int) -> tuple[Any, Any]:
    s = compiled.CompiledSession("nicA")
    async with compiled.CompiledUdpEndpoint(s, LO, dport=0) as ep:
        sport = ep.add_source_port(0)
        s.queue_probe("nicB", (LO, port), sport, ep.now_ns())
        ep.flush()  # on loopback the TX stamp (t1) is queued during the send and read right after
        assert s.pending == 1
        events: list[Any] = []
        for d in answers:
            events += s.receive(d, (LO, port), 4 * 10**18, 4 * 10**18)
        return events, dict(s.counters)


def test_engine_matching_counts_like_the_python_session() -> None:
    a, b = nic_hash("nicA"), nic_hash("nicB")
    answers = [d for _, d in _answers(a, b, 0)]
    # Python session: probe seq 0, t1 known, then the same answers
    py = ProbeSession("nicA")
    (probe,) = py.send_probe("nicB", (LO, 9), 50000, 1000)
    py.on_tx_stamp(probe.meta.token, 900)
    py_events: list[Any] = []
    for d in answers:
        py_events += py.receive(d, (LO, 9), 2000, 2000)
    # compiled session: the probe really leaves (its t1 is a kernel stamp), same answers
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind((LO, 0))
        events, counters = asyncio.run(_compiled_initiator_sees(answers, sink.getsockname()[1]))
    assert counters == dict(py.counters)
    (block,) = [e for e in events if isinstance(e, ResultBlock)]
    (r,) = block.events()
    (pr,) = py_events
    assert isinstance(r, ProbeResult) and isinstance(pr, ProbeResult)
    assert (r.seq, r.dst, r.pair_id, r.pair_pos, r.t2, r.t3) == (0, "nicB", -1, 0, 500, 600)
    assert r.t4 == 4 * 10**18 and 0 < r.t1 < r.t4


@pytest.mark.parametrize("seed", range(12))
def test_engine_and_python_rules_agree_on_answers_in_any_order(seed: int) -> None:
    """The crafted answers (good, duplicated, spoofed, mismatched, misdirected) in a random
    order and multiplicity: the engine and `ProbeSession` (per datagram or in one batch, the
    same rule) count the same and complete the same probe with the same t2/t3, or none."""
    rng = random.Random(seed)
    a, b = nic_hash("nicA"), nic_hash("nicB")
    pool = [d for _, d in _answers(a, b, 0)]
    answers = [rng.choice(pool) for _ in range(rng.randint(1, 14))]
    py = ProbeSession("nicA")
    (probe,) = py.send_probe("nicB", (LO, 9), 50000, 1000)
    py.on_tx_stamp(probe.meta.token, 900)
    if seed % 2:
        py_events = py.receive_many([(d, (LO, 9), 2000) for d in answers], 2000)
    else:
        py_events = [e for d in answers for e in py.receive(d, (LO, 9), 2000, 2000)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind((LO, 0))
        events, counters = asyncio.run(_compiled_initiator_sees(answers, sink.getsockname()[1]))
    assert counters == dict(py.counters)
    got = [r for e in events if isinstance(e, ResultBlock) for r in e.events()]
    fields = [(r.seq, r.dst, r.pair_id, r.pair_pos, r.t2, r.t3) for r in got]
    assert fields == [(r.seq, r.dst, r.pair_id, r.pair_pos, r.t2, r.t3) for r in py_events
                      if isinstance(r, ProbeResult)]  # fmt: skip


# ---- live traffic: compiled vs per-datagram ----------------------------------------------------


async def _exchange(path: str, plan: list[tuple[int, str, int]]) -> list[Any]:
    """Run ``plan`` (delay_ms, dst, coded) from nicA; return its records as tuples."""
    got: list[Any] = []

    def mk(nic: str, **kw: Any) -> UdpEndpoint:
        if path.startswith("compiled"):
            ep = compiled.CompiledUdpEndpoint(compiled.CompiledSession(nic), LO, dport=0, **kw)
            ep.external_ticks = path == "compiled-driven"  # the agent's way: one shared timer
            return ep
        return UdpEndpoint(ProbeSession(nic), LO, dport=0, **kw)

    a, b = mk("nicA", on_events=got.extend), mk("nicB")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dead:
        dead.bind((LO, 0))
        dead_port = dead.getsockname()[1]  # bound, never read: probes there are lost
        async with a, b:
            if isinstance(a, compiled.CompiledUdpEndpoint) and a.external_ticks:
                assert isinstance(b, compiled.CompiledUdpEndpoint)
                tasks = [asyncio.create_task(CompiledDriver([a, b]).run())]
            else:
                tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
            ports = [a.add_source_port(0) for _ in range(3)]
            now = a.now_ns()
            for i, (delay_ms, dst, coded) in enumerate(plan):
                port = b.dport if dst == "nicB" else dead_port
                at = now + delay_ms * 1_000_000
                if coded:
                    a.session.queue_pair(dst, (LO, port), ports[i % 3], at)
                else:
                    a.session.queue_probe(dst, (LO, port), ports[i % 3], at)
            a.wake()
            loop = asyncio.get_running_loop()
            end = loop.time() + 20
            expected = sum(2 if c else 1 for _, _, c in plan)
            while loop.time() < end:
                await asyncio.sleep(0.1)
                if path == "compiled-driven":  # records wait in the engine for the agent's batch
                    got.extend(a.session.take_events())
                if len(results_to_batch(got, origin="x")) >= expected:
                    break
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            port_index = {p: i for i, p in enumerate(ports)}
    batch = results_to_batch(got, origin="h", nic_ids=("nicA", "nicB", "nicC"))
    out = []
    for i in range(len(batch)):
        out.append((int(batch.seq[i]), batch.nic_ids[int(batch.dst[i])],
                    port_index[int(batch.sport[i])], int(batch.pair[i]), int(batch.pos[i]),
                    bool(batch.lost[i]), int(batch.t1[i]), int(batch.t2[i]), int(batch.t3[i]),
                    int(batch.t4[i])))  # fmt: skip
    return sorted(out)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["compiled", "compiled-driven"])
def test_compiled_and_per_datagram_paths_record_the_same_traffic(path: str) -> None:
    plan = [(i * 3, "nicC" if i % 7 == 3 else "nicB", i % 2 == 0) for i in range(40)]
    per, comp = (
        asyncio.run(_exchange("per-datagram", plan)),
        asyncio.run(_exchange(path, plan)),
    )
    assert len(per) == len(comp) == sum(2 if c else 1 for _, _, c in plan)
    # the same probes (peer, source port, coded pair and position) with the same outcome; the
    # seqs are the same set (the order in which due probes take them differs: the compiled
    # path sends on a 5 ms tick, the per-datagram path at each probe's time)
    assert sorted(r[1:6] for r in comp) == sorted(r[1:6] for r in per)
    assert sorted(r[0] for r in comp) == sorted(r[0] for r in per)
    assert sum(r[5] for r in comp) == sum(2 if c else 1 for _, d, c in plan if d == "nicC")
    for seq, _, _, _, _, lost, t1, t2, t3, t4 in comp:
        assert t1 > 0, seq  # every probe left with its kernel TX stamp
        if not lost:  # one kernel clock on loopback: stamps in order, within a second
            assert t1 <= t2 <= t3 <= t4 < t1 + 1_000_000_000


@pytest.mark.parametrize("initiator", ["compiled", "per-datagram"])
def test_compiled_path_interoperates_with_the_per_datagram_path(initiator: str) -> None:
    async def run() -> list[Any]:
        got: list[Any] = []
        ca = compiled.CompiledUdpEndpoint(compiled.CompiledSession("nicA"), LO, dport=0,
                                          on_events=got.extend)  # fmt: skip
        pa = UdpEndpoint(ProbeSession("nicA"), LO, dport=0, on_events=got.extend)
        cb = compiled.CompiledUdpEndpoint(compiled.CompiledSession("nicB"), LO, dport=0)
        pb = UdpEndpoint(ProbeSession("nicB"), LO, dport=0)
        a, b = (ca, pb) if initiator == "compiled" else (pa, cb)
        async with a, b:
            tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
            await exchange(a, b, got, tasks, polls=200)
        return events_of(got)

    events = asyncio.run(run())
    assert len(events) == 20 and all(isinstance(e, ProbeResult) for e in events)
    assert all(e.t1 <= e.t2 <= e.t3 <= e.t4 for e in events if isinstance(e, ProbeResult))


def test_compiled_session_refuses_what_the_engine_does_not_speak() -> None:
    # (an HMAC-keyed codec it speaks: tests/test_prober_compiled_auth.py)
    # (a `ProbeSession` on a `CompiledUdpEndpoint` is a type error mypy reports)
    with pytest.raises(ValueError, match="two-step"):
        compiled.CompiledSession("nicA", one_step=True)
    with pytest.raises(ValueError, match="timestamps"):
        compiled.CompiledUdpEndpoint(compiled.CompiledSession("nicA"), LO, timestamping=False)


def test_result_block_rows_become_the_same_batch_as_events() -> None:
    import numpy as np

    rows = np.array([[3, 1, 50000, -1, 0, 10, 20, 30, 40, 0, 5],
                     [4, 0, 50001, 2, 1, 11, -(2**63), -(2**63), -(2**63), 1, 6]],
                    dtype=np.int64)  # fmt: skip
    block = ResultBlock("nicA", ("nicC", "nicB"), rows)
    events = block.events()
    assert events[0] == ProbeResult(3, "nicA", "nicB", 50000, -1, 0, 10, 20, 30, 40)
    assert events[1] == ProbeLost(4, "nicA", "nicC", 50001, 2, 1, 11, 6)
    a = results_to_batch([block], origin="h", nic_ids=("nicA",))
    b = results_to_batch(events, origin="h", nic_ids=("nicA",))
    assert a.nic_ids == b.nic_ids
    for col in ("seq", "src", "dst", "sport", "pair", "pos", "t1", "t2", "t3", "t4", "lost"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    with pytest.raises(ValueError):
        ResultBlock("nicA", ("nicB",), rows)  # dst index 1 outside the table
    assert BODY_LEN == 48


async def test_queueing_on_a_closed_compiled_endpoint_opens_no_socket() -> None:
    """The compiled session opens a missing source port on demand; once its endpoint is closed
    that is refused (EBADF) and nothing is queued with a socket behind it."""
    s = compiled.CompiledSession("nicA")
    async with compiled.CompiledUdpEndpoint(s, LO, dport=0) as ep:
        pass
    with pytest.raises(UdpError) as err:
        s.queue_pair("nicB", (LO, 4791), 50_000, ep.now_ns())
    assert err.value.errno == errno.EBADF
    assert ep.source_ports == ()
