"""UDP transport on loopback: real sockets, real kernel software timestamps."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator, Callable

import pytest

from prober.events import ProbeEvent, ProbeLost, ProbeResult
from prober.fastudp import BatchUdpEndpoint
from prober.session import ProbeSession
from prober.timestamping import ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, ExtendedErr, StampSource
from prober.udp import UdpEndpoint, UdpError
from prober.wire import Codec

LO = "127.0.0.1"
KEY = b"u" * 32


class Collector:
    def __init__(self) -> None:
        self.events: list[ProbeEvent] = []
        self.changed = asyncio.Event()

    def __call__(self, events: list[ProbeEvent]) -> None:
        self.events += events
        self.changed.set()

    async def wait_for(self, n: int, timeout: float = 5.0) -> list[ProbeEvent]:
        async def _wait() -> None:
            while len(self.events) < n:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(_wait(), timeout)
        return self.events


@pytest.fixture(params=[UdpEndpoint, BatchUdpEndpoint], ids=["per-datagram", "batched"])
def ep_cls(request: pytest.FixtureRequest) -> type[UdpEndpoint]:
    """Both hot paths: today's per-datagram endpoint and the batched one."""
    cls: type[UdpEndpoint] = request.param
    return cls


@contextlib.asynccontextmanager
async def endpoint(
    nic: str,
    collector: Collector | None = None,
    clock: Callable[[int], int] = lambda ns: ns,
    cls: type[UdpEndpoint] = UdpEndpoint,
    **kw: object,
) -> AsyncIterator[UdpEndpoint]:
    session = ProbeSession(nic, Codec(KEY), timeout_ns=300_000_000)
    ep = cls(session, LO, dport=0, clock=clock, on_events=collector, **kw)  # type: ignore[arg-type]
    await ep.start()
    task = asyncio.create_task(ep.run())
    try:
        yield ep
    finally:
        ep.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_loopback_round_trip_has_ordered_software_stamps(ep_cls: type[UdpEndpoint]) -> None:
    got = Collector()
    async with endpoint("nicA", got, cls=ep_cls) as a, endpoint("nicB", cls=ep_cls) as b:
        sport = a.add_source_port(0)
        for _ in range(20):
            a.session.queue_probe("nicB", (LO, b.dport), sport, a.now_ns())
        a.wake()
        events = await got.wait_for(20)
    results = [e for e in events if isinstance(e, ProbeResult)]
    assert len(results) == 20
    for r in results:
        assert (r.src, r.dst, r.sport) == ("nicA", "nicB", sport)
        assert 0 < r.t1 <= r.t2 <= r.t3 <= r.t4  # one clock on loopback: fully ordered
        assert r.rtt_ns < 50_000_000
    assert a.stamp_source is StampSource.SW and b.stamp_source is StampSource.SW
    assert a.stamp_counts[StampSource.SW] >= 40 and not a.stamp_counts[StampSource.USER]
    assert b.stamp_counts[StampSource.SW] >= 40 and not b.stamp_counts[StampSource.USER]
    assert not a.session.counters and not b.session.counters


async def test_coded_pair_keeps_spacing_and_clock_hook_applies(ep_cls: type[UdpEndpoint]) -> None:
    got = Collector()
    offset = 1_000_000_000  # B's virtual clock runs 1 s ahead
    async with (
        endpoint("nicA", got, cls=ep_cls) as a,
        endpoint("nicB", cls=ep_cls, clock=lambda ns: ns + offset) as b,
    ):
        sport = a.add_source_port(0)
        pid = a.session.queue_pair("nicB", (LO, b.dport), sport, a.now_ns(), spacing_ns=20_000)
        a.wake()
        events = await got.wait_for(2)
    r0, r1 = sorted((e for e in events if isinstance(e, ProbeResult)), key=lambda r: r.pair_pos)
    assert (r0.pair_id, r1.pair_id, r0.pair_pos, r1.pair_pos) == (pid, pid, 0, 1)
    # The session releases the second probe no earlier than 20 us after the first (tested on
    # the pure session); kernel TX stamps jitter by microseconds on a busy machine (19,459 ns
    # was seen), so on the wire we check only that the pair stays in order and together.
    assert 0 < r1.t1 - r0.t1 < 5_000_000
    assert offset < r0.t2 - r0.t1 < offset + 50_000_000  # t2 in B's (virtual) clock
    assert offset < r0.t3 - r0.t4 + 50_000_000


async def test_no_listener_gives_icmp_error_and_loss(ep_cls: type[UdpEndpoint]) -> None:
    got = Collector()
    icmp: list[tuple[int, ExtendedErr]] = []
    async with endpoint(
        "nicA", got, cls=ep_cls, on_icmp=lambda p, e, d, n: icmp.append((p, e))
    ) as a:
        async with endpoint("nicB", cls=ep_cls) as b:
            dead = b.dport
        sport = a.add_source_port(0)
        a.session.queue_probe("nicB", (LO, dead), sport, a.now_ns())
        a.wake()
        (lost,) = await got.wait_for(1)
    assert isinstance(lost, ProbeLost) and (lost.dst, lost.sport) == ("nicB", sport)
    assert lost.t1 > 0  # TX stamp arrived before the loss was declared
    (port, err) = icmp[0]
    assert port == sport and err.offender == LO
    assert (err.icmp_type, err.icmp_code) == (ICMP_DEST_UNREACH, ICMP_PORT_UNREACH)


async def test_send_after_icmp_error_is_not_swallowed() -> None:
    """An ICMP error leaves a pending socket error (IP_RECVERR) that the next send reports
    and clears without sending: the endpoint must still send that datagram (regression: a
    trace's time-exceeded ate the next TTL's trace probe, i.e. a silent hop)."""
    import select
    import socket

    def ep_sock(ep: UdpEndpoint, port: int) -> socket.socket:
        return ep._pool[port].sock

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gone:
        gone.bind((LO, 0))
        dead = gone.getsockname()[1]
    live = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    live.bind((LO, 0))
    live.settimeout(2.0)
    ep = UdpEndpoint(ProbeSession("nicA", Codec(KEY)), LO, dport=0)
    await ep.start()
    try:
        sport = ep.add_source_port(0)
        assert ep.send(ep.session.trace_probe("nicB", (LO, dead), sport))
        # block the loop (its reader would consume the error) until port unreachable is back
        select.select([ep_sock(ep, sport)], [], [], 1.0)
        dgram = ep.session.trace_probe("nicC", live.getsockname(), sport)
        assert ep.send(dgram, ttl=3)
        data, _ = live.recvfrom(4096)
        assert data == dgram.data
        assert ep.counters["send_pending_icmp_error"] == 1
    finally:
        ep.close()
        live.close()


async def test_without_timestamping_uses_user_clock(ep_cls: type[UdpEndpoint]) -> None:
    got = Collector()
    async with (
        endpoint("nicA", got, cls=ep_cls, timestamping=False) as a,
        endpoint("nicB", cls=ep_cls) as b,
    ):
        sport = a.add_source_port(0)
        a.session.queue_probe("nicB", (LO, b.dport), sport, a.now_ns())
        a.wake()
        (r,) = await got.wait_for(1)
    assert isinstance(r, ProbeResult) and r.t1 <= r.t4
    assert (
        a.stamp_source is StampSource.USER and a.stamp_counts[StampSource.USER] == 3
    )  # TX, REPLY, FOLLOW_UP


async def test_bad_bind_raises_udp_error() -> None:
    ep = UdpEndpoint(ProbeSession("x"), "192.0.2.77", dport=0)
    with pytest.raises(UdpError):
        ep.open()
    ep.close()


async def test_bind_to_device_lo_and_unknown_device(ep_cls: type[UdpEndpoint]) -> None:
    got = Collector()
    async with (
        endpoint("nicA", got, cls=ep_cls, device="lo") as a,
        endpoint("nicB", cls=ep_cls, device="lo") as b,
    ):
        sport = a.add_source_port(0)
        a.session.queue_probe("nicB", (LO, b.dport), sport, a.now_ns())
        a.wake()
        (r,) = await got.wait_for(1)
    assert isinstance(r, ProbeResult)
    assert a.stamp_source is StampSource.SW  # lo has no hardware clock: fell back
    ep = UdpEndpoint(ProbeSession("x"), LO, dport=0, device="qpm-nodev0")
    with pytest.raises(UdpError):
        ep.open()
    ep.close()


def test_parse_stamp_prefers_hardware_and_parses_icmp_offender() -> None:
    import socket
    import struct

    from prober.timestamping import (
        IP_RECVERR,
        SCM_TIMESTAMPING,
        SO_EE_ORIGIN_ICMP,
        SOL_IP,
        parse_extended_err,
        parse_stamp,
    )

    sw_only = struct.pack("=qqqqqq", 5, 7, 0, 0, 0, 0)
    both = struct.pack("=qqqqqq", 5, 7, 0, 0, 9, 11)
    assert parse_stamp([(socket.SOL_SOCKET, SCM_TIMESTAMPING, sw_only)]) == (
        5_000_000_007,
        StampSource.SW,
    )
    assert parse_stamp([(socket.SOL_SOCKET, SCM_TIMESTAMPING, both)]) == (
        9_000_000_011,
        StampSource.HW,
    )
    assert parse_stamp([(socket.SOL_SOCKET, SCM_TIMESTAMPING, bytes(48))]) is None
    assert parse_stamp([(socket.SOL_SOCKET, SCM_TIMESTAMPING, b"short")]) is None
    ee = struct.pack("=IBBBBII", 113, SO_EE_ORIGIN_ICMP, 11, 0, 0, 0, 0)
    sin = struct.pack("=H2s4s", socket.AF_INET, b"\0\0", socket.inet_aton("10.9.8.7"))
    err = parse_extended_err([(SOL_IP, IP_RECVERR, ee + sin + bytes(8))])
    assert err is not None and err.offender == "10.9.8.7" and err.icmp_type == 11
    assert parse_extended_err([(SOL_IP, IP_RECVERR, b"tiny")]) is None


@pytest.mark.parametrize("cmsg", [True, False], ids=["ttl-cmsg", "ttl-sockopt"])
async def test_trace_probe_ttl_applies_to_that_datagram_only(cmsg: bool) -> None:
    """A trace probe's TTL rides in an IP_TTL control message of its one `sendmsg` (the
    fallback, ``ttl_cmsg`` off: set the option, send, restore): the datagram leaves with that
    TTL, the next one from the same socket with the default, and the cmsg path stays on (a
    kernel refusing it would be counted ``ttl_cmsg_refused``)."""
    import socket

    live = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    live.bind((LO, 0))
    live.settimeout(2.0)
    live.setsockopt(socket.SOL_IP, 12, 1)  # IP_RECVTTL (linux/in.h; not in the socket module)
    ep = UdpEndpoint(ProbeSession("nicA", Codec(KEY)), LO, dport=0)
    ep.ttl_cmsg = cmsg
    await ep.start()

    def received_ttl() -> int:
        _, anc, _, _ = live.recvmsg(4096, 64)
        (ttl,) = [int.from_bytes(d[:4], "little") for lvl, typ, d in anc if typ == socket.IP_TTL]
        return ttl

    try:
        sport = ep.add_source_port(0)
        assert ep.send(ep.session.trace_probe("nicC", live.getsockname(), sport), ttl=3)
        assert received_ttl() == 3
        assert ep.send(ep.session.trace_probe("nicC", live.getsockname(), sport))
        assert received_ttl() == 64
        assert ep.send(ep.session.trace_probe("nicC", live.getsockname(), sport), ttl=7)
        assert received_ttl() == 7
        assert ep.ttl_cmsg is cmsg and ep.counters["ttl_cmsg_refused"] == 0
    finally:
        ep.close()
        live.close()


async def test_a_closed_endpoint_opens_no_socket(ep_cls: type[UdpEndpoint]) -> None:
    """A source port asked for after `close` (a probe queued while the agent shuts down) is
    refused with EBADF instead of opening a socket that nothing would read or close."""
    async with endpoint("nicA", cls=ep_cls) as ep:
        ep.add_source_port(0)
    assert ep.source_ports == ()
    with pytest.raises(UdpError) as err:
        ep.add_source_port(0)
    assert err.value.errno == errno.EBADF
    assert ep.source_ports == ()
