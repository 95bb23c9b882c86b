"""Path discovery: the pure tracer directly, the adapter on loopback (no hops expire there)."""

from __future__ import annotations

from prober.events import ProbeEvent
from prober.pathdisc import DiscoveredPath, PathChange, PathDiscovery, PathKey, PathTracer
from prober.session import ProbeSession
from prober.udp import UdpEndpoint
from prober.wire import nic_hash

KEY = PathKey("a", "b", 50000)
MS = 1_000_000


def _round(tr: PathTracer, hops: list[str | None], reach: int | None, now: int,
           seq0: int, max_ttl: int = 6) -> list[DiscoveredPath | PathChange]:  # fmt: skip
    seqs = list(range(seq0, seq0 + max_ttl))
    tr.begin(KEY, seqs, now)
    for ttl, router in enumerate(hops, start=1):
        if router is not None:
            tr.on_time_exceeded(seqs[ttl - 1], router)
    if reach is not None:
        for ttl in range(reach, max_ttl + 1):  # every TTL >= reach gets to the host
            tr.on_reached(seqs[ttl - 1], nic_hash("b"))
    return tr.poll(now + 1)


def test_assembles_hops_and_reports_first_path_as_change() -> None:
    tr = PathTracer()
    out = _round(tr, ["10.0.0.1", "10.1.0.1", "10.0.1.1"], 4, 0, 0)
    path, change = out
    assert isinstance(path, DiscoveredPath) and isinstance(change, PathChange)
    assert path.hops == ("10.0.0.1", "10.1.0.1", "10.0.1.1") and path.reached
    assert change.old is None and tr.paths[KEY] == path


def test_same_path_no_change_silent_hop_is_not_a_change() -> None:
    tr = PathTracer()
    _round(tr, ["10.0.0.1", "10.1.0.1", "10.0.1.1"], 4, 0, 0)
    out = _round(tr, ["10.0.0.1", "10.1.0.1", "10.0.1.1"], 4, 10 * MS, 100)
    assert [type(x) for x in out] == [DiscoveredPath]
    # a router not answering (ICMP rate limit) does not finish the round until the timeout
    tr2 = PathTracer(timeout_ns=5 * MS)
    _round(tr2, ["10.0.0.1", "10.1.0.1", "10.0.1.1"], 4, 0, 0)
    assert _round(tr2, ["10.0.0.1", None, "10.0.1.1"], 4, 10 * MS, 100) == []
    (p,) = tr2.poll(20 * MS)
    assert isinstance(p, DiscoveredPath) and p.hops == ("10.0.0.1", None, "10.0.1.1")


def test_spine_change_is_reported() -> None:
    tr = PathTracer()
    _round(tr, ["10.0.0.1", "10.1.0.1", "10.0.1.1"], 4, 0, 0)
    out = _round(tr, ["10.0.0.1", "10.2.0.1", "10.0.1.1"], 4, 10 * MS, 100)
    change = out[1]
    assert isinstance(change, PathChange) and change.old is not None
    assert change.old.hops[1] == "10.1.0.1" and change.new.hops[1] == "10.2.0.1"


def test_unreachable_after_timeout_and_bad_inputs_counted() -> None:
    tr = PathTracer(timeout_ns=5 * MS)
    _round(tr, ["10.0.0.1"], 2, 0, 0)
    assert _round(tr, ["10.0.0.1", "10.1.0.1"], None, 10 * MS, 100) == []
    path, change = tr.poll(30 * MS)
    assert isinstance(path, DiscoveredPath) and not path.reached
    assert path.hops == ("10.0.0.1", "10.1.0.1") and isinstance(change, PathChange)
    tr.on_time_exceeded(999, "1.2.3.4")
    tr.begin(KEY, [500], 0)
    tr.on_reached(500, nic_hash("someone-else"))
    assert tr.counters["unmatched"] == 1 and tr.counters["wrong_sender"] == 1


async def test_adapter_on_loopback_reaches_at_hop_one() -> None:
    """Loopback delivers locally whatever the TTL: every probe reaches, the hop list is empty.

    Real expiring hops need routers: the namespace testbed exercises those.
    """
    seen: list[ProbeEvent] = []
    a = UdpEndpoint(ProbeSession("a"), "127.0.0.1", dport=0)
    b = UdpEndpoint(ProbeSession("b"), "127.0.0.1", dport=0)
    pd = PathDiscovery(a, PathTracer(timeout_ns=500 * MS), max_ttl=4)
    a.on_icmp = pd.handle_icmp
    a.on_events = lambda evs: seen.extend(pd.handle_events(evs))
    try:
        a.open()
        b.open()
        sport = a.add_source_port(0)
        path = await pd.discover("b", ("127.0.0.1", b.dport), sport, timeout_s=2.0)
        assert path is not None and path.reached and path.hops == ()
        assert path.key == PathKey("a", "b", sport)
        assert not a.session.counters and not seen  # trace replies never look like probes
    finally:
        a.close()
        b.close()


async def test_adapter_port_unreachable_counts_as_reached() -> None:
    a = UdpEndpoint(ProbeSession("a"), "127.0.0.1", dport=0)
    b = UdpEndpoint(ProbeSession("b"), "127.0.0.1", dport=0)
    pd = PathDiscovery(a, PathTracer(timeout_ns=500 * MS), max_ttl=2)
    a.on_icmp = pd.handle_icmp
    try:
        a.open()
        b.open()
        dead = b.dport
        b.close()
        sport = a.add_source_port(0)
        path = await pd.discover("b", ("127.0.0.1", dead), sport, timeout_s=2.0)
        assert path is not None and path.reached and path.hops == ()
        assert a.counters["icmp_errors"] >= 1
    finally:
        a.close()
