"""RDMA peer discovery through retained presence: the pure table, the presence document,
the endpoint's address-handle bookkeeping (no pyverbs needed) and the MQTT follower against
a private mosquitto. Creating real address handles needs RDMA hardware (not here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.topics import Topics
from mqttlink.settings import BrokerSettings
from prober.config import NicConfig, ProberConfig
from prober.publish import presence_payload
from prober.rdma.peers import (
    PeerAddress,
    PeerDocError,
    RdmaPeerTable,
    ah_plan,
    local_address,
    normalize_gid,
    parse_presence,
    presence_rdma,
)
from prober.rdma.presence import apply_presence, follow_presence, presence_filter
from prober.rdma.transport import QKEY, RdmaEndpoint, rdma_endpoint_factory
from prober.session import ProbeSession
from prober.wire import Codec

GID_A = "fe80::a"
GID_B = "::ffff:10.0.0.2"


def doc(alive: bool = True, /, **nics: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"alive": alive, "t_ns": 1}
    if nics:
        d["rdma"] = nics
    return d


def entry(qpn: int = 0x1234, gid: str = GID_A, qkey: int = QKEY, port: int = 1) -> dict[str, Any]:
    return {"qpn": qpn, "gid": gid, "qkey": qkey, "port": port}


# ---- presence document ----------------------------------------------------------------------


def test_presence_document_roundtrip() -> None:
    addrs = [
        local_address("h1", "nic0", 0x11, "fe80:0000:0000:0000:0000:0000:0000:000a", QKEY, 1),
        local_address("h1", "nic1", 0x22, "00000000000000000000ffff0a000002", QKEY, 2),
    ]
    block = presence_rdma(addrs)
    assert block == {
        "nic0": {"qpn": 0x11, "gid": "fe80::a", "qkey": QKEY, "port": 1},
        "nic1": {"qpn": 0x22, "gid": "::ffff:a00:2", "qkey": QKEY, "port": 2},
    }
    payload = presence_payload(True, 7, block)
    got = json.loads(payload)
    assert got["alive"] is True and got["t_ns"] == 7 and got["rdma"] == block
    assert parse_presence("h1", got) == {a.nic_id: a for a in addrs}
    # a stopped prober (and the last will) announces no queue pairs
    assert json.loads(presence_payload(False, 8, block)) == {"alive": False, "t_ns": 8}
    assert json.loads(presence_payload(True, 9)) == {"alive": True, "t_ns": 9}
    with pytest.raises(PeerDocError, match="duplicate"):
        presence_rdma([addrs[0], addrs[0]])


def test_gid_forms() -> None:
    assert normalize_gid("FE80:0:0:0:0:0:0:A") == "fe80::a"
    assert normalize_gid("fe80000000000000000000000000000a") == "fe80::a"
    assert normalize_gid("::ffff:10.0.0.2") == "::ffff:a00:2"
    for bad in ("", "10.0.0.2", "zz", "::", "0" * 32, "fe80::1::2", 5, None):
        with pytest.raises(PeerDocError):
            normalize_gid(bad)


# ---- the table ------------------------------------------------------------------------------


def test_valid_doc_learns_every_nic() -> None:
    t = RdmaPeerTable()
    assert t.lookup("nic0") is None
    changed = t.update("h1", doc(nic0=entry(), nic1=entry(0x99, GID_B, 5, 2)))
    assert changed == {"nic0", "nic1"}
    assert t.lookup("nic0") == PeerAddress("h1", "nic0", 0x1234, "fe80::a", QKEY, 1)
    n1 = t.lookup("nic1")
    assert n1 is not None and n1.dest == ("::ffff:a00:2", 0x99) and n1.qkey == 5 and n1.port == 2
    assert t.hosts() == {"h1": frozenset({"nic0", "nic1"})} and len(t) == 2
    # the same document again (only t_ns differs): nothing changed, no AH work
    again = doc(nic0=entry(), nic1=entry(0x99, GID_B, 5, 2))
    again["t_ns"] = 99
    assert t.update("h1", again) == frozenset()
    # port defaults to 1, unknown keys are tolerated (forward compatibility)
    assert t.update("h2", doc(nic5={"qpn": 3, "gid": "fe80::5", "qkey": 0, "mtu": 4096})) == {
        "nic5"
    }
    n5 = t.lookup("nic5")
    assert n5 is not None and n5.port == 1
    assert t.counters["malformed"] == 0 and t.counters["updates"] == 3


MALFORMED: list[tuple[object, str]] = [
    ([1, 2], "not a JSON object"),
    ("alive", "not a JSON object"),
    ({"t_ns": 1}, "alive must be"),
    ({"alive": "yes"}, "alive must be"),
    ({"alive": 1}, "alive must be"),
    (doc(True) | {"rdma": [1]}, "rdma must be an object"),
    (doc(True) | {"rdma": "nic0"}, "rdma must be an object"),
    (doc(nic0=5), "entry must be an object"),
    (doc(nic0={"gid": GID_A, "qkey": 1}), "missing qpn"),
    (doc(nic0={"qpn": 5}), "missing gid, qkey"),
    (doc(nic0=entry(qpn=0)), "qpn 0 outside"),
    (doc(nic0=entry(qpn=1)), "qpn 1 outside"),
    (doc(nic0=entry(qpn=1 << 24)), "outside 2..16777215"),
    (doc(nic0=entry(qpn=-5)), "qpn -5"),
    (doc(nic0=entry() | {"qpn": "17"}), "qpn must be an integer"),
    (doc(nic0=entry() | {"qpn": 17.0}), "qpn must be an integer"),
    (doc(nic0=entry() | {"qpn": True}), "qpn must be an integer"),
    (doc(nic0=entry(gid="10.0.0.1")), "neither IPv6"),
    (doc(nic0=entry(gid="::")), "all zeros"),
    (doc(nic0=entry() | {"gid": 42}), "gid must be a string"),
    (doc(nic0=entry(qkey=0x80000000)), "qkey"),
    (doc(nic0=entry(qkey=-1)), "qkey"),
    (doc(nic0=entry(port=0)), "port 0"),
    (doc(nic0=entry(port=256)), "port 256"),
    (doc(nic0=entry() | {"port": None}), "port must be an integer"),
    (doc(**{"": entry()}), "nic id must be"),
    (doc(**{"a/b": entry()}), "contains"),
    (doc(**{"nic 0": entry()}), "contains"),
    (doc(**{"n" * 65: entry()}), "nic id must be"),
]


@pytest.mark.parametrize(("bad", "reason"), MALFORMED)
def test_malformed_docs_are_counted_and_ignored(bad: object, reason: str) -> None:
    t = RdmaPeerTable()
    t.update("h1", doc(nic9=entry(qpn=77)))
    assert t.update("h1", bad) == frozenset()
    assert t.counters["malformed"] == 1
    assert reason in t.last_error and "\n" not in t.last_error, t.last_error
    assert t.last_error.startswith("presence of h1")
    # the host keeps what it had
    n9 = t.lookup("nic9")
    assert n9 is not None and n9.qpn == 77
    assert t.lookup("nic0") is None
    with pytest.raises(PeerDocError, match=reason.split(maxsplit=1)[0]):
        parse_presence("h1", bad)


def test_one_bad_nic_rejects_the_whole_doc() -> None:
    t = RdmaPeerTable()
    assert t.update("h1", doc(nic0=entry(), nic1=entry(qpn=0))) == frozenset()
    assert t.lookup("nic0") is None and "rdma.nic1" in t.last_error


def test_raw_payloads() -> None:
    t = RdmaPeerTable()
    assert t.update_payload("h1", json.dumps(doc(nic0=entry())).encode()) == {"nic0"}
    for bad in (b"{", b"\xff\xfe", b"[" * 100_000, b"null", b"42"):
        assert t.update_payload("h1", bad) == frozenset()
    assert t.counters["malformed"] == 5 and t.lookup("nic0") is not None
    assert t.update_payload("h1", b"") == {"nic0"}  # retained message cleared
    assert t.lookup("nic0") is None


def test_bad_host_is_malformed_not_a_crash() -> None:
    t = RdmaPeerTable()
    assert t.update("", doc(nic0=entry())) == frozenset()
    assert t.update("a+b", doc(nic0=entry())) == frozenset()
    assert t.counters["malformed"] == 2


def test_peer_leaves_and_comes_back() -> None:
    t = RdmaPeerTable()
    t.update("h1", doc(nic0=entry(), nic1=entry(qpn=5)))
    t.update("h2", doc(nic2=entry(qpn=6)))
    # last will / clean stop
    assert t.update("h1", {"alive": False, "t_ns": 0}) == {"nic0", "nic1"}
    assert t.lookup("nic0") is None and t.lookup("nic2") is not None
    assert t.counters["removed_hosts"] == 1
    assert t.update("h1", {"alive": False, "t_ns": 0}) == frozenset()  # already gone
    # a UDP prober (alive, no rdma block) has no RDMA NICs
    assert t.update("h2", {"alive": True, "t_ns": 3}) == {"nic2"}
    assert len(t) == 0
    assert t.update("h1", doc(nic0=entry(qpn=8))) == {"nic0"}
    assert t.remove("h1") == {"nic0"} and t.remove("nope") == frozenset()


def test_host_drops_one_nic() -> None:
    t = RdmaPeerTable()
    t.update("h1", doc(nic0=entry(), nic1=entry(qpn=5)))
    assert t.update("h1", doc(nic1=entry(qpn=5))) == {"nic0"}
    assert t.lookup("nic0") is None and t.hosts() == {"h1": frozenset({"nic1"})}


def test_qpn_change_after_restart_requests_refresh() -> None:
    t = RdmaPeerTable()
    t.update("h1", doc(nic0=entry(qpn=0x100)))
    old = t.lookup("nic0")
    # the prober restarted: new QP, new number, same GID
    assert t.update("h1", doc(nic0=entry(qpn=0x200))) == {"nic0"}
    new = t.lookup("nic0")
    assert new is not None and new.dest == ("fe80::a", 0x200)
    # AH holds GID + flow label, not the QPN: nothing to recreate, sends use the new QPN
    assert ah_plan(old, new, [0xC001, 0xC002]) == ([], [])
    # qkey change is a change too
    assert t.update("h1", doc(nic0=entry(qpn=0x200, qkey=7))) == {"nic0"}


def test_conflicting_nic_id_is_rejected() -> None:
    t = RdmaPeerTable()
    t.update("h1", doc(nic0=entry()))
    assert t.update("h2", doc(nic0=entry(qpn=9), nic3=entry(qpn=10))) == frozenset()
    assert t.counters["conflicts"] == 1 and "already held by h1" in t.last_error
    a = t.lookup("nic0")
    assert a is not None and a.host == "h1" and t.lookup("nic3") is None
    t.update("h1", {"alive": False})
    assert t.update("h2", doc(nic0=entry(qpn=9))) == {"nic0"}


def test_ah_plan() -> None:
    a = PeerAddress("h", "nic0", 5, "fe80::a", 1)
    b = PeerAddress("h", "nic0", 5, "fe80::b", 1)
    sports = [0xC001, 0xC002]
    assert ah_plan(None, a, sports) == ([], [("fe80::a", 0xC001), ("fe80::a", 0xC002)])
    assert ah_plan(a, b, sports) == (
        [("fe80::a", 0xC001), ("fe80::a", 0xC002)],
        [("fe80::b", 0xC001), ("fe80::b", 0xC002)],
    )
    assert ah_plan(a, None, sports) == ([("fe80::a", 0xC001), ("fe80::a", 0xC002)], [])
    assert ah_plan(None, None, sports) == ([], [])


def test_peer_address_validation() -> None:
    with pytest.raises(PeerDocError, match="compressed"):
        PeerAddress("h", "nic0", 5, "FE80::A", 1)
    with pytest.raises(PeerDocError):
        PeerAddress("h", "nic0", 1, "fe80::a", 1)


any_value = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 1 << 33), st.floats(allow_nan=True),
    st.sampled_from(["", "fe80::a", "::", "zz", "00" * 16, "10.0.0.1"]), st.lists(st.integers(), max_size=2),
)  # fmt: skip
entries = st.fixed_dictionaries(
    {}, optional={"qpn": any_value, "gid": any_value, "qkey": any_value, "port": any_value}
)


@given(
    alive=any_value,
    rdma=st.one_of(any_value, st.dictionaries(st.sampled_from(["nic0", "n/1", ""]), entries | any_value, max_size=2)),
)  # fmt: skip
def test_fuzz_never_crashes(alive: object, rdma: object) -> None:
    t = RdmaPeerTable()
    changed = t.update("h1", {"alive": alive, "rdma": rdma})
    got = t.lookup("nic0")
    if changed:
        assert changed == {"nic0"} and got is not None and t.counters["malformed"] == 0
    else:
        assert got is None
        assert t.counters["malformed"] == 1 or alive is False or rdma is None or rdma == {}


# ---- the endpoint's peer bookkeeping (no verbs objects are touched) ------------------------


def _endpoint(table: RdmaPeerTable, sports: tuple[int, ...] = (0xC001, 0xC002)) -> RdmaEndpoint:
    nic = NicConfig("nicL", "10.0.0.9", rdma_device="mlx5_0")
    return RdmaEndpoint(ProbeSession("nicL"), nic, sports=sports, peers=table)


def test_unknown_peer_is_skipped_and_counted() -> None:
    t = RdmaPeerTable()
    ep = _endpoint(t)
    assert ep.resolve("nic0") is None
    assert ep.counters["peer_unknown"] == 1 and ep.session.counters["peer_unknown"] == 1
    t.update("h1", doc(nic0=entry(qpn=0x55, qkey=9)))
    assert ep.resolve("nic0") == ("fe80::a", 0x55)
    assert ep._qkeys[("fe80::a", 0x55)] == 9


def test_refresh_creates_and_retires_address_handles() -> None:
    t = RdmaPeerTable()
    ep = _endpoint(t)
    made: list[tuple[str, int]] = []

    def fake_ah(gid: str, sport: int) -> object:
        made.append((gid, sport))
        return object()

    ep._create_ah = fake_ah  # type: ignore[method-assign]
    ep._v = {}  # "opened"
    f = rdma_endpoint_factory(_cfg())
    f.endpoints.append(ep)
    f.peers = t
    f.on_change(t.update("h1", doc(nic0=entry(qpn=1000))))
    assert made == [("fe80::a", 0xC001), ("fe80::a", 0xC002)]
    assert set(ep._ahs) == set(made)
    # restart with a new QPN: the table asks for a refresh, no AH is rebuilt
    assert ep.refresh_peer("nic0") == (0, 0)
    f.on_change(t.update("h1", doc(nic0=entry(qpn=2000))))
    assert len(made) == 2 and ep.resolve("nic0") == ("fe80::a", 2000)
    # new GID: new AHs, the old ones retired (kept until close)
    f.on_change(t.update("h1", doc(nic0=entry(qpn=2000, gid="fe80::b"))))
    assert set(ep._ahs) == {("fe80::b", 0xC001), ("fe80::b", 0xC002)} and len(ep._retired) == 2
    # peer leaves
    f.on_change(t.update("h1", {"alive": False}))
    assert ep._ahs == {} and len(ep._retired) == 4 and ep.resolve("nic0") is None
    assert ep.counters["ah_created"] == 4 and ep.counters["ah_retired"] == 4


def _cfg() -> ProberConfig:
    nic = NicConfig("nicL", "10.0.0.9", rdma_device="mlx5_0")
    return ProberConfig(host="hL", nics=(nic,), peers=())


def test_factory_presence_block_and_agent_tasks() -> None:
    f = rdma_endpoint_factory(_cfg())
    assert f.hot_path == "per-datagram" and f.port_usable("nicL", 0xC001)
    made = f(_cfg().nics[0], Codec(), (0xC001,), lambda evs: None)
    ep = made.endpoint
    assert isinstance(ep, RdmaEndpoint) and made.discovery is None and made.ticked is None
    assert type(ep.session) is ProbeSession and ep.session.nic_id == "nicL"
    assert ep.peers is f.peers
    assert f.presence_block() == {}  # not opened: no QPN to announce
    ep.qpn, ep.gid = 0x77, "fe80:0000:0000:0000:0000:0000:0000:0009"
    assert f.presence_block() == {"nicL": {"qpn": 0x77, "gid": "fe80::9", "qkey": QKEY, "port": 1}}

    class Pub:
        rdma: Any = None

        def set_presence_rdma(self, block: Any) -> None:
            self.rdma = block

    class AgentStub:
        publisher = Pub()

    agent = AgentStub()
    coros = f.agent_tasks(agent)  # type: ignore[arg-type]
    assert agent.publisher.rdma == f.presence_block() and len(coros) == 1
    for c in coros:
        c.close()
    with pytest.raises(OSError, match="no rdma_device"):
        f(NicConfig("nicX", "1.2.3.4"), ProbeSession("nicX"), (), lambda evs: None)


# ---- the MQTT shell ---------------------------------------------------------------------------


def test_apply_presence_topics() -> None:
    t = RdmaPeerTable()
    topics = Topics("qp/v1")
    assert presence_filter("qp/v1") == "qp/v1/presence/+"
    payload = json.dumps(doc(nic0=entry())).encode()
    assert apply_presence(t, topics, "qp/v1/presence/h1", payload) == {"nic0"}
    assert apply_presence(t, topics, "qp/v1/health/h1", payload) == frozenset()
    assert apply_presence(t, topics, "other/presence/h1", payload) == frozenset()
    assert t.counters["bad_topic"] == 2


async def test_follow_presence_through_mosquitto(mosquitto: tuple[str, int]) -> None:
    """Retained presence of live and dead peers is learnt at connect; changes follow."""
    import aiomqtt

    host, port = mosquitto
    settings = BrokerSettings(host=host, port=port, prefix="qpt/v1", timeout_s=2.0)
    topics = Topics("qpt/v1")
    async with aiomqtt.Client(host, port, identifier="qpt-pub") as pub:
        block1 = presence_rdma([local_address("h1", "nic1", 0x101, "fe80::1", QKEY, 1)])
        await pub.publish(topics.presence("h1"), presence_payload(True, 1, block1), 1, retain=True)
        await pub.publish(topics.presence("h2"), presence_payload(False, 0), 1, retain=True)
        await pub.publish(topics.presence("h3"), b"{oops", 1, retain=True)
        table = RdmaPeerTable()
        seen: list[frozenset[str]] = []
        task = asyncio.create_task(follow_presence(settings, "qpt-follow", table, seen.append))
        try:
            for _ in range(300):
                if table.lookup("nic1") is not None and table.counters["malformed"]:
                    break
                await asyncio.sleep(0.01)
            a = table.lookup("nic1")
            assert a is not None and a.dest == ("fe80::1", 0x101)
            assert table.counters["malformed"] == 1 and seen == [frozenset({"nic1"})]
            # h1 restarts with a new QP number, then dies (its last will)
            block2 = presence_rdma([local_address("h1", "nic1", 0x202, "fe80::1", QKEY, 1)])
            await pub.publish(
                topics.presence("h1"), presence_payload(True, 2, block2), 1, retain=True
            )
            for _ in range(300):
                a = table.lookup("nic1")
                if a is not None and a.qpn == 0x202:
                    break
                await asyncio.sleep(0.01)
            assert a is not None and a.qpn == 0x202
            await pub.publish(topics.presence("h1"), presence_payload(False, 0), 1, retain=True)
            for _ in range(300):
                if table.lookup("nic1") is None:
                    break
                await asyncio.sleep(0.01)
            assert table.lookup("nic1") is None and len(seen) == 3
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_publisher_announces_and_withdraws_qps(
    mosquitto: tuple[str, int], tmp_path: Any
) -> None:
    """Publisher (prober h1) -> retained presence with rdma -> follower table; stop -> removed."""
    from prober.publish import Publisher
    from prober.spool import Spool

    host, port = mosquitto
    settings = BrokerSettings(
        host=host, port=port, prefix="qpe/v1", timeout_s=2.0, drain_on_stop_s=0.1
    )
    pub = Publisher(settings, "h1", Spool(10, 1 << 20, None))
    pub.set_presence_rdma(presence_rdma([local_address("h1", "nic1", 0x31, "fe80::1", QKEY, 1)]))
    table = RdmaPeerTable()
    stop = asyncio.Event()
    ptask = asyncio.create_task(pub.run(stop))
    ftask = asyncio.create_task(follow_presence(settings, "qpe-follow", table, lambda c: None))

    async def until(cond: Any) -> bool:
        for _ in range(500):
            if cond():
                return True
            await asyncio.sleep(0.01)
        return False

    try:
        assert await until(lambda: table.lookup("nic1") is not None)
        a = table.lookup("nic1")
        assert a is not None and a.dest == ("fe80::1", 0x31)
        # re-announced while connected (e.g. after a QP was re-created)
        pub.set_presence_rdma(
            presence_rdma([local_address("h1", "nic1", 0x32, "fe80::1", QKEY, 1)])
        )
        assert await until(lambda: (x := table.lookup("nic1")) is not None and x.qpn == 0x32)
        stop.set()
        await asyncio.wait_for(ptask, 10)
        assert await until(lambda: table.lookup("nic1") is None)
        assert table.counters["malformed"] == 0
    finally:
        stop.set()
        ftask.cancel()
        await asyncio.gather(ptask, ftask, return_exceptions=True)


# ---- the agent hook: unknown peers never enter the session -------------------------------


async def test_agent_skips_unknown_rdma_peers_without_loss() -> None:
    """Through `Agent._queue`: probes to unlearnt peers are skipped (counted), never lost;
    learnt peers are queued with their (gid, qpn) as destination."""
    from prober.agent import Agent, plan_round
    from prober.config import PeerConfig
    from prober.events import ProbeLost
    from prober.publish import Publisher
    from prober.spool import Spool

    local = NicConfig("nicL", "10.0.0.9", rdma_device="mlx5_0")
    peers = (PeerConfig("nicA", "10.0.0.1"), PeerConfig("nicB", "10.0.0.2"))
    cfg = ProberConfig(host="hL", nics=(local,), peers=peers)
    factory = rdma_endpoint_factory(cfg)
    agent = Agent(
        cfg, endpoint_factory=factory, publisher=Publisher(cfg.mqtt, "hL", Spool(10, 1 << 20, None))
    )
    ep: Any = factory(local, agent.codec, agent.plan.ports["nicL"], agent._collect).endpoint
    ep.now_ns = lambda: 1_000
    ep.wake = lambda: None
    agent.endpoints["nicL"] = ep
    agent.sessions["nicL"] = ep.session
    factory.peers.update("hA", doc(nicA=entry(qpn=0x4A, gid="fe80::a")))
    probes = plan_round(agent.plan, agent.peers, 0)
    assert {p.dst for p in probes} == {"nicA", "nicB"}
    agent._queue(probes, 0)
    session = agent.sessions["nicL"]
    sent = session.next_datagrams(10**12)
    assert sent and {d.meta.dst for d in sent} == {"nicA"}
    assert {d.dest for d in sent} == {("fe80::a", 0x4A)}
    assert session.counters["peer_unknown"] == ep.counters["peer_unknown"] == 1
    lost = session.poll(10**15)  # everything times out: only nicA's probes can be lost
    assert lost and all(isinstance(e, ProbeLost) and e.dst == "nicA" for e in lost)
