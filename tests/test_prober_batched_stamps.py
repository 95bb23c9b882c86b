"""Batching loses and mis-stamps nothing: the batched path against the per-datagram path on the
same traffic.

1. Same kernel control messages: datagrams with real SO_TIMESTAMPING stamps are peeked with
   ``socket.recvmsg`` (the per-datagram path's call, `parse_stamp`) and then read with
   ``recvmmsg`` (`prober.mmsg.RecvRing`, the batched path): same payloads, sources and
   stamps. TX stamps from the error queue: `RecvRing.tx_stamp` against `parse_extended_err`
   and `parse_stamp` on the same bytes (OPT_ID counter and stamp).
2. Same recorded traffic: a live loopback exchange through per-datagram endpoints records
   every call into both sessions (datagrams with their kernel stamps, TX stamps, probes
   queued, polls); replaying it into fresh sessions through the batched calls
   (`receive_many`, `on_tx_stamps`) gives identical results (seq, NIC ids, source port,
   pair, t1..t4), identical datagrams (bytes, destination, meta) and identical counters.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from prober.events import ProbeResult
from prober.mmsg import RecvRing, SendRing
from prober.session import ProbeSession
from prober.timestamping import (
    ANC_BUFSIZE,
    SO_EE_ORIGIN_TIMESTAMPING,
    enable_timestamping,
    parse_extended_err,
    parse_stamp,
)
from prober.udp import UdpEndpoint
from prober.wire import Codec

LO = "127.0.0.1"


def _stamped_pair() -> tuple[socket.socket, socket.socket]:
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for s in (tx, rx):
        s.bind((LO, 0))
        enable_timestamping(s, None, want_hw=False)
        s.setblocking(False)
    return tx, rx


def _wait_readable(sock: socket.socket) -> None:
    import select

    select.select([sock], [], [], 1.0)


def test_ring_reads_the_same_stamps_as_recvmsg() -> None:
    tx, rx = _stamped_pair()
    try:
        # warm up: the kernel switches RX software stamping on lazily
        for _ in range(50):
            tx.sendto(b"w", rx.getsockname())
            _wait_readable(rx)
            _, anc, _, _ = rx.recvmsg(64, ANC_BUFSIZE)
            if parse_stamp(anc) is not None:
                break
            time.sleep(0.01)
        while True:  # drop the warm-up TX stamps
            try:
                tx.recvmsg(64, ANC_BUFSIZE, socket.MSG_ERRQUEUE)
            except BlockingIOError:
                break
        payloads = [bytes([i]) * (48 + i) for i in range(20)]
        ring = SendRing(8)
        sent = 0
        while sent < len(payloads):  # through sendmmsg, several calls of at most 8
            sent += ring.send(tx.fileno(), [(p, rx.getsockname()) for p in payloads[sent:]])
        time.sleep(0.05)
        one = RecvRing(1)
        for _ in payloads:
            # the per-datagram path's view (recvmsg, peeked), then the ring consumes the same
            # datagram with the same kernel control messages
            _wait_readable(rx)
            data, anc, _, src = rx.recvmsg(4096, ANC_BUFSIZE, socket.MSG_PEEK)
            assert one.recv(rx.fileno()) == 1
            assert bytes(one.payload(0)) == data
            assert one.source(0) == src
            assert one.stamp(0) == parse_stamp(anc) and one.stamp(0) is not None
            assert one.cmsgs(0) == anc
            (item,), sources = one.received(1, lambda ns: ns + 7, 123, stamped=True)
            assert item == (one.payload(0), src, parse_stamp(anc)[0] + 7)  # type: ignore[index]
        rring = RecvRing(32)
        ring2 = SendRing(32)
        assert ring2.send(tx.fileno(), [(p, rx.getsockname()) for p in payloads]) == 20
        time.sleep(0.05)
        # all 20 in one recvmmsg: payloads and sources exact, stamps ordered like the sends
        n = rring.recv(rx.fileno())
        assert n == 20
        batch, sources = rring.received(n, lambda ns: ns + 7, 123, stamped=True)
        assert [bytes(p) for p, _, _ in batch] == payloads
        assert {s for _, s, _ in batch} == {tx.getsockname()}
        stamps = [rring.stamp(i) for i in range(n)]
        assert all(s is not None for s in stamps)
        assert [rx_ns for _, _, rx_ns in batch] == [s[0] + 7 for s in stamps if s]
        assert [str(s) for s in sources] == ["sw"] * 20
        # TX stamps: 40 queued on the sender's error queue (20 + 20 sends), OPT_ID 0..39 after
        # the warm-up's ids; the ring's fast parser agrees with the reference parsers
        eq = RecvRing(64, errqueue=True)
        got = eq.recv(tx.fileno())
        assert got == 40
        ids = []
        for i in range(got):
            origin, ee_data, ns, source = eq.tx_stamp(i)
            anc = eq.cmsgs(i)
            err = parse_extended_err(anc)
            stamp = parse_stamp(anc)
            assert err is not None and stamp is not None
            assert (
                (origin, ee_data) == (err.origin, err.data) == (SO_EE_ORIGIN_TIMESTAMPING, err.data)
            )
            assert (ns, source) == stamp
            ids.append(ee_data)
        assert ids == list(range(ids[0], ids[0] + 40))
        assert eq.recv(tx.fileno()) == 0  # EAGAIN is a count, not an exception
    finally:
        tx.close()
        rx.close()


class Recorder(ProbeSession):
    """A session that logs every call the endpoint makes (in one shared log, in order)."""

    def __init__(self, nic: str, log: list[tuple[Any, ...]], **kw: Any) -> None:
        super().__init__(nic, **kw)
        self.log = log

    def queue_probe(self, dst: str, dest: Any, sport: int, at_ns: int, pair_id: int = -1,
                    pair_pos: int = 0) -> None:  # fmt: skip
        self.log.append((self.nic_id, "queue_probe", (dst, dest, sport, at_ns, pair_id, pair_pos)))
        super().queue_probe(dst, dest, sport, at_ns, pair_id, pair_pos)

    def queue_pair(
        self, dst: str, dest: Any, sport: int, at_ns: int, spacing_ns: int = 20_000
    ) -> int:
        self.log.append((self.nic_id, "queue_pair", (dst, dest, sport, at_ns, spacing_ns)))
        return super().queue_pair(dst, dest, sport, at_ns, spacing_ns)

    def next_datagrams(self, now_ns: int) -> Any:
        out = super().next_datagrams(now_ns)
        self.log.append((self.nic_id, "next_datagrams", (now_ns,), out))
        return out

    def receive(self, data: Any, src: Any, rx_stamp_ns: int, now_ns: int) -> Any:
        out = super().receive(data, src, rx_stamp_ns, now_ns)
        self.log.append((self.nic_id, "receive", (bytes(data), src, rx_stamp_ns, now_ns), out))
        return out

    def on_tx_stamp(self, token: int, tx_stamp_ns: int) -> Any:
        out = super().on_tx_stamp(token, tx_stamp_ns)
        self.log.append((self.nic_id, "on_tx_stamp", (token, tx_stamp_ns), out))
        return out

    def poll(self, now_ns: int) -> Any:
        out = super().poll(now_ns)
        self.log.append((self.nic_id, "poll", (now_ns,), out))
        return out


async def _record(codec: Codec | None) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []
    got: list[Any] = []
    a = UdpEndpoint(Recorder("nicA", log, codec=codec), LO, dport=0, on_events=got.extend)
    b = UdpEndpoint(Recorder("nicB", log, codec=codec), LO, dport=0)
    async with a, b:
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        ports = [a.add_source_port(0) for _ in range(3)]
        for i in range(30):
            now = a.now_ns()
            a.session.queue_pair("nicB", (LO, b.dport), ports[i % 3], now, 20_000)
            a.session.queue_probe("nicB", (LO, b.dport), ports[(i + 1) % 3], now)
            a.wake()
            await asyncio.sleep(0.002)
        end = time.monotonic() + 5.0
        while sum(isinstance(e, ProbeResult) for e in got) < 90 and time.monotonic() < end:
            await asyncio.sleep(0.01)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(isinstance(e, ProbeResult) for e in got) == 90
    return log


def _replay(log: list[tuple[Any, ...]], batched: bool, codec: Codec | None) -> dict[str, Any]:
    sessions = {n: ProbeSession(n, codec) for n in ("nicA", "nicB")}
    out: dict[str, list[Any]] = {"nicA": [], "nicB": []}
    i = 0
    while i < len(log):
        nic, call, args = log[i][0], log[i][1], log[i][2]
        s = sessions[nic]
        if batched and call in ("receive", "on_tx_stamp"):
            j = i
            while j < len(log) and log[j][0] == nic and log[j][1] == call:
                j += 1
            if call == "receive":
                items = [(e[2][0], e[2][1], e[2][2]) for e in log[i:j]]
                out[nic] += s.receive_many(items, log[j - 1][2][3])
            else:
                out[nic] += s.on_tx_stamps([e[2] for e in log[i:j]])
            i = j
            continue
        res = getattr(s, call)(*args)
        if call in ("receive", "on_tx_stamp", "poll"):
            out[nic] += res
        elif call == "next_datagrams":
            out[nic] += [("sent", d) for d in res]
        i += 1
    return {n: (out[n], dict(sessions[n].counters)) for n in sessions}


def _check_same(codec: Codec | None) -> None:
    log = asyncio.run(_record(codec))
    live = {"nicA": [], "nicB": []}  # what the live per-datagram run produced
    for entry in log:
        if len(entry) == 4:
            res = entry[3]
            live[entry[0]] += [("sent", d) for d in res] if entry[1] == "next_datagrams" else res
    per_datagram, batched = _replay(log, False, codec), _replay(log, True, codec)
    assert per_datagram["nicA"][0] == live["nicA"] and per_datagram["nicB"][0] == live["nicB"]
    assert batched == per_datagram
    results = [e for e in batched["nicA"][0] if isinstance(e, ProbeResult)]
    assert len(results) == 90
    assert {(r.src, r.dst) for r in results} == {("nicA", "nicB")}
    assert len({r.seq for r in results}) == 90
    for r in results:
        assert 0 < r.t1 <= r.t2 <= r.t3 <= r.t4  # one clock on loopback, kernel stamps
    # the replay really went through the batched calls in batches
    assert any(e[1] == "receive" for e in log)


def test_batched_session_calls_give_the_same_records_and_datagrams() -> None:
    _check_same(None)


def test_batched_session_calls_verify_hmac_like_the_per_datagram_path() -> None:
    _check_same(Codec(b"k" * 32))
    # a tampered datagram is refused by both, counted as bad_auth by both
    codec = Codec(b"k" * 32)
    a, b = ProbeSession("nicA", codec), ProbeSession("nicB", Codec(b"k" * 32))
    (probe,) = a.send_probe("nicB", (LO, 1), 50000, 1000)
    bad = bytearray(probe.data)
    bad[-1] ^= 1
    assert b.receive_many([(bytes(bad), (LO, 50000), 2000)], 2000) == []
    c = ProbeSession("nicB", Codec(b"k" * 32))
    assert c.receive(bytes(bad), (LO, 50000), 2000, 2000) == []
    assert b.counters == c.counters == {"bad_auth": 1}
