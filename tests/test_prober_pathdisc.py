"""Path discovery: the pure tracer directly, the adapter on loopback (no hops expire there)."""

from __future__ import annotations

from typing import cast

from prober.events import Datagram, ProbeEvent
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


# ---- the TTL cap: one hop past the known length, extended when a trace does not reach ----------

LEAF_SPINE = ["10.0.0.1", "10.1.0.1", "10.0.1.1"]  # reached at TTL 4


def _feed(tr: PathTracer, seqs: list[int], first_ttl: int, hops: list[str | None],
          reach: int | None) -> None:  # fmt: skip
    """Answer the trace probes ``seqs`` (TTL first_ttl, first_ttl + 1, ...) as a path whose
    routers are ``hops`` (TTL 1..) and whose destination is reached from TTL ``reach`` on."""
    for i, seq in enumerate(seqs):
        ttl = first_ttl + i
        if reach is not None and ttl >= reach:
            tr.on_reached(seq, nic_hash("b"))
        elif ttl <= len(hops) and hops[ttl - 1] is not None:
            tr.on_time_exceeded(seq, str(hops[ttl - 1]))


def test_ttl_limit_is_one_hop_past_the_known_length() -> None:
    tr = PathTracer()
    assert tr.ttl_limit(KEY, 8) == 8  # nothing known: every TTL
    _round(tr, LEAF_SPINE, 4, 0, 0, max_ttl=8)
    assert tr.ttl_limit(KEY, 8) == 5  # reached at TTL 4: send 1..5
    assert tr.ttl_limit(KEY, 4) == 4  # never past max_ttl
    other = PathKey("a", "b", 50001)  # same peer, not traced yet: the pair's last length
    assert tr.ttl_limit(other, 8) == 5
    assert tr.ttl_limit(PathKey("a", "c", 50000), 8) == 8  # another peer: unknown
    _round(tr, ["10.0.0.1", "10.1.0.1"], None, 10 * MS, 100, max_ttl=8)
    tr.poll(10 * MS + tr.timeout_ns)
    assert tr.ttl_limit(KEY, 8) == 8  # the flow's last trace did not reach: every TTL again
    assert tr.ttl_limit(other, 8) == 5


def test_capped_round_finds_the_same_path_and_a_path_one_hop_longer() -> None:
    tr = PathTracer()
    _round(tr, LEAF_SPINE, 4, 0, 0, max_ttl=8)
    top = tr.ttl_limit(KEY, 8)
    seqs = list(range(100, 100 + top))
    tr.begin(KEY, seqs, 10 * MS, max_ttl=8)
    _feed(tr, seqs, 1, LEAF_SPINE, 4)
    assert tr.extensions(11 * MS) == []
    assert [type(x) for x in tr.poll(11 * MS)] == [DiscoveredPath]  # same path: no change
    assert tr.paths[KEY].hops == tuple(LEAF_SPINE)
    # one hop more (a reroute through another switch): TTL 4 expires, TTL 5 reaches
    longer = [*LEAF_SPINE, "10.0.2.1"]
    seqs = list(range(200, 200 + tr.ttl_limit(KEY, 8)))
    tr.begin(KEY, seqs, 20 * MS, max_ttl=8)
    _feed(tr, seqs, 1, longer, 5)
    assert tr.extensions(21 * MS) == []  # reached within the cap: nothing to extend
    path, change = tr.poll(21 * MS)
    assert isinstance(path, DiscoveredPath) and path.hops == tuple(longer)
    assert isinstance(change, PathChange) and change.new.hops == tuple(longer)
    assert tr.ttl_limit(KEY, 8) == 6


def test_a_path_that_grew_past_the_cap_is_extended_at_once() -> None:
    """The highest capped TTL expired at a router: the round asks for the rest of the TTLs
    right away (no timeout), then finds the longer path."""
    tr = PathTracer(timeout_ns=500 * MS)
    _round(tr, ["10.0.0.1"], 2, 0, 0, max_ttl=8)  # one router: reached at TTL 2
    grown = ["10.0.0.1", "10.1.0.1", "10.0.1.1", "10.0.2.1"]  # now reached at TTL 5
    top = tr.ttl_limit(KEY, 8)
    assert top == 3
    seqs = list(range(100, 100 + top))
    tr.begin(KEY, seqs, 10 * MS, max_ttl=8)
    _feed(tr, seqs, 1, grown, 5)
    assert tr.poll(10 * MS + 10 * tr.timeout_ns) == []  # never finished before its extension
    (ext,) = tr.extensions(11 * MS)
    assert ext.key == KEY and ext.ttls == range(4, 9)
    assert tr.extensions(11 * MS) == []  # handed out once
    more = list(range(200, 200 + len(ext.ttls)))
    tr.extend(ext, more, 12 * MS)
    _feed(tr, more, 4, grown, 5)
    path, change = tr.poll(13 * MS)
    assert isinstance(path, DiscoveredPath) and path.reached and path.hops == tuple(grown)
    assert isinstance(change, PathChange) and change.old is not None
    assert tr.ttl_limit(KEY, 8) == 6


def test_a_capped_round_with_no_answer_is_extended_after_its_timeout() -> None:
    """Nothing came back (the top hop is silent, or the destination went away): extended once
    the round times out; an unreachable destination is still reported, one timeout later."""
    tr = PathTracer(timeout_ns=5 * MS)
    _round(tr, ["10.0.0.1"], 2, 0, 0, max_ttl=6)
    seqs = list(range(100, 100 + tr.ttl_limit(KEY, 6)))  # TTL 1..3
    tr.begin(KEY, seqs, 10 * MS, max_ttl=6)
    _feed(tr, seqs, 1, ["10.0.0.1"], None)  # TTL 1 answers, 2 and 3 silent
    assert tr.extensions(14 * MS) == [] and tr.poll(14 * MS) == []
    (ext,) = tr.extensions(15 * MS)
    assert ext.ttls == range(4, 7)
    tr.extend(ext, [200, 201, 202], 15 * MS)
    assert tr.poll(19 * MS) == []  # the extension has its own timeout
    path, change = tr.poll(20 * MS)
    assert isinstance(path, DiscoveredPath) and not path.reached
    assert path.hops == ("10.0.0.1",) and isinstance(change, PathChange)
    # a round begun without max_ttl (or with every TTL) is never extended
    tr.begin(KEY, [300], 30 * MS)
    tr.begin(KEY, list(range(400, 406)), 30 * MS, max_ttl=6)
    assert tr.extensions(100 * MS) == []


class _FakeEndpoint:
    """What `PathDiscovery` uses of a `UdpEndpoint`: its session, ``send`` with a TTL, and a
    clock that the test sets."""

    def __init__(self) -> None:
        self.session = ProbeSession("a")
        self.sent: list[tuple[int, int]] = []  # (ttl, seq)
        self.now = 0

    def send(self, dgram: Datagram, ttl: int | None = None) -> bool:
        assert ttl is not None
        self.sent.append((ttl, dgram.meta.seq))
        return True

    def now_ns(self) -> int:
        return self.now


def test_discovery_sends_only_up_to_one_hop_past_and_extends_on_poll() -> None:
    ep = _FakeEndpoint()
    pd = PathDiscovery(cast(UdpEndpoint, ep), PathTracer(timeout_ns=500 * MS), max_ttl=8)
    tr, dest = pd.tracer, ("10.9.0.2", 4791)

    def answer(hops: list[str | None], reach: int) -> None:
        sent, ep.sent = ep.sent, []
        for ttl, seq in sent:
            _feed(tr, [seq], ttl, hops, reach)

    pd.start("b", dest, 50000)
    assert [t for t, _ in ep.sent] == list(range(1, 9))  # first trace: every TTL
    answer(LEAF_SPINE, 4)
    (path, _) = pd.poll()
    assert isinstance(path, DiscoveredPath) and path.hops == tuple(LEAF_SPINE)
    pd.start("b", dest, 50001)  # another port to the same peer: the pair's length + 1
    assert [t for t, _ in ep.sent] == [1, 2, 3, 4, 5]
    answer(LEAF_SPINE, 4)
    pd.poll()
    # the path to the peer grew by three hops: TTL 5 expires, poll sends TTL 6..8 at once
    grown = [*LEAF_SPINE, "10.0.2.1", "10.0.3.1", "10.0.4.1"]
    ep.now = 10 * MS
    pd.start("b", dest, 50000)
    assert [t for t, _ in ep.sent] == [1, 2, 3, 4, 5]
    answer(grown, 7)
    assert pd.poll() == [] and [t for t, _ in ep.sent] == [6, 7, 8]
    answer(grown, 7)
    path, change = pd.poll()
    assert isinstance(path, DiscoveredPath) and path.reached and path.hops == tuple(grown)
    assert isinstance(change, PathChange) and change.old is not None
    assert not tr.counters  # every answer matched its round
