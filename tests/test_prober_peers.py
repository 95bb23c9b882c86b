"""A prober with nothing listed: its NICs from what it found (groups from the LLDP leaf, listed
entries over them), its neighbours document published before its presence, its peers learned
from the other probers' documents; and two real agents on loopback that find each other
through a real mosquitto and probe each other."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import socket
from collections.abc import Callable
from typing import Any

import aiomqtt
import pytest

from contract.neighbors import LldpNeighbor, NeighborsDoc, NicNeighbors
from contract.records import decode_batch
from contract.topics import Topics
from prober.agent import Agent
from prober.config import DiscoverConfig, NicConfig, PeerConfig, parse_config
from prober.discover.follow import apply_neighbors
from prober.discover.nics import DiscoveredNic
from prober.discover.peers import PeerBook, merge_peers
from prober.discover.resolve import UNPLACED, LocalNics, NoNicsError, discover_config
from prober.publish import Publisher
from prober.spool import Spool
from tests.servers import free_port
from tests.test_prober_publish import HOST, FakeBroker, FakeSleep, settings

SEED = secrets.randbelow(1 << 30)


def found(ifname: str, address: str, selected: bool = True, **kw: Any) -> DiscoveredNic:
    return DiscoveredNic(ifname, selected, "test", address=address, addresses=(address,), **kw)


def leaf(name: str) -> tuple[LldpNeighbor, ...]:
    return (LldpNeighbor(name, "aa:bb:cc:dd:ee:ff", "Ethernet8"),)


FOUND = (
    found("ens1", "10.0.0.1", rdma_device="mlx5_0", rdma_port=1, gid_index=3),
    found("ens2", "10.0.1.1", rdma_device="mlx5_1", rdma_port=1, gid_index=5),
    found("eno1", "192.168.0.9", selected=False),
    found("ens3", "10.0.2.1"),
)


def test_found_nics_take_their_leaf_as_group_and_listed_ones_win() -> None:
    d = DiscoverConfig()
    local = LocalNics("gpu1", d, FOUND, lldp={"ens1": leaf("leaf0"), "ens2": leaf("rack 2")})
    nics = {n.id: n for n in local.nics()}
    assert list(nics) == ["gpu1.ens1", "gpu1.ens2", "gpu1.ens3"]  # eno1 was not selected
    assert nics["gpu1.ens1"] == NicConfig("gpu1.ens1", "10.0.0.1", "ecmp-leaf0", "ens1",
                                          "mlx5_0", 1, 3)  # fmt: skip
    assert nics["gpu1.ens2"].group == "ecmp-rack_2" and nics["gpu1.ens2"].gid_index == 5
    assert nics["gpu1.ens3"].group == UNPLACED  # no LLDP neighbour: leaf unknown
    # a listed NIC replaces the found one with its device (or address), a new one is added
    listed = (NicConfig("a", "10.0.9.9", "g", device="ens2"), NicConfig("b", "10.0.2.1"),
              NicConfig("c", "10.7.0.1"))  # fmt: skip
    ids = [n.id for n in dataclasses.replace(local, explicit=listed).nics()]
    assert ids == ["gpu1.ens1", "a", "b", "c"]
    # the document: NICs with a netdev and an IPv4 address, their neighbours
    doc = local.document(7)
    assert doc.host == "gpu1" and [n.nic for n in doc.nics] == list(nics)
    assert doc.nics[0].neighbors == leaf("leaf0") and doc.nics[2].neighbors == ()


def test_a_silent_neighbour_keeps_the_last_one_seen_a_new_one_replaces_it() -> None:
    local = LocalNics("h", DiscoverConfig(), FOUND, lldp={"ens1": leaf("leaf0")})
    assert local.with_lldp({}) == local  # the link went down: still under leaf0
    moved = local.with_lldp({"ens1": leaf("leaf3")})  # recabled
    assert moved != local and moved.nics()[0].group == "ecmp-leaf3"


def test_discover_config_finds_nics_or_says_why_not() -> None:
    cfg = parse_config({"prober": {"host": "gpu1"}, "discover": {"nics": ["ens*"]}}, "f")
    asked: list[Any] = []

    def find(flt: Any) -> tuple[DiscoveredNic, ...]:
        asked.append(flt)
        return FOUND

    out, local = discover_config(cfg, find=find, lldp=lambda sock: {"ens1": leaf("leaf0")})
    assert asked[0].include == ("ens*",) and local is not None
    assert [n.id for n in out.nics] == ["gpu1.ens1", "gpu1.ens2", "gpu1.ens3"]
    assert out.nics[0].group == "ecmp-leaf0" and local.lldp["ens1"] == leaf("leaf0")
    with pytest.raises(NoNicsError, match=r"no NIC to probe from .*eno1: test"):
        discover_config(cfg, find=lambda flt: (FOUND[2],), lldp=lambda sock: {})
    listed = parse_config({"prober": {"host": "h"}, "nics": [{"id": "n", "address": "10.0.0.1"}]},
                          "f")  # fmt: skip
    assert discover_config(listed, find=find) == (listed, None)  # discovery off: as it was
    clash = parse_config({"prober": {"host": "gpu1"}, "discover": {"nic_id": "{ifname}"},
                          "peers": [{"id": "ens1", "address": "10.9.0.1"}]}, "f")  # fmt: skip
    with pytest.raises(ValueError, match="NIC ids repeat"):
        discover_config(clash, find=find, lldp=lambda sock: {})


def doc(host: str, *nics: tuple[str, str, str]) -> bytes:
    return NeighborsDoc(host, 1, tuple(NicNeighbors(n, "eth0", a, leaf(lf) if lf else ())
                                       for n, a, lf in nics)).encode()  # fmt: skip


def test_peers_are_the_other_hosts_placed_nics() -> None:
    book = PeerBook("me")
    assert book.update("me", doc("me", ("me.0", "10.0.0.1", "leaf0"))) is False  # own: no peer
    assert book.update("b", doc("b", ("b.0", "10.0.0.2", "leaf0"), ("b.1", "10.0.1.2", "")))
    assert book.peers() == (PeerConfig("b.0", "10.0.0.2", "ecmp-leaf0"),)
    assert book.counters["unplaced"] == 1
    assert (
        book.update("b", doc("b", ("b.0", "10.0.0.2", "leaf0"), ("b.1", "10.0.1.2", ""))) is False
    )
    # another host claiming b's NIC: the first host in name order keeps it
    assert book.update("c", doc("c", ("b.0", "10.0.0.3", "leaf1"), ("c.0", "10.0.1.3", "leaf1")))
    assert [p.id for p in book.peers()] == ["b.0", "c.0"] and book.counters["foreign"] == 1
    # a document under another host's topic, or one that does not decode: ignored, counted
    assert book.update("d", doc("c", ("d.0", "10.0.2.4", "leaf2"))) is False
    assert book.update("d", b"{") is False and book.counters["bad"] == 2
    # cleared (the host was removed): forgotten
    assert book.update("c", b"") and [p.id for p in book.peers()] == ["b.0"]
    t = Topics()
    assert apply_neighbors(book, t, "qpmesh/v1/presence/x", b"") is False
    assert book.counters["bad_topic"] == 1
    assert apply_neighbors(book, t, t.neighbors("e"), doc("e", ("e.0", "10.0.3.5", "leaf3")))


def test_listed_peers_lie_over_the_learned_ones() -> None:
    learned = (PeerConfig("a", "10.0.0.1", "g1"), PeerConfig("b", "10.0.0.2", "g1"),
               PeerConfig("me", "10.0.0.3", "g1"))  # fmt: skip
    listed = (PeerConfig("b", "10.0.0.2", "g2", port=5000), PeerConfig("z", "10.0.9.9", "g9"))
    assert merge_peers(listed, learned, ["me"]) == (learned[0], listed[0], listed[1])


async def test_neighbours_go_out_retained_before_presence_and_again_on_change() -> None:
    broker = FakeBroker()
    broker.up = True
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=FakeSleep())
    first = doc(HOST, ("n0", "10.0.0.1", "leaf0"))
    pub.set_neighbors(first)

    def topics() -> list[str]:
        return [t.split("/")[2] for t, _, _ in broker.received]

    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    for _ in range(1000):
        if "presence" in topics():
            break
        await asyncio.sleep(0)
    assert topics()[:2] == ["neighbors", "presence"]
    assert broker.received[0] == (f"qpmesh/v1/neighbors/{HOST}", first, True)
    pub.set_neighbors(first)  # the same again: nothing new to say
    moved = doc(HOST, ("n0", "10.0.0.1", "leaf1"))
    pub.set_neighbors(moved)
    for _ in range(1000):
        if topics().count("neighbors") == 2:
            break
        await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [p for t, p, _ in broker.received if "/neighbors/" in t] == [first, moved]


def _agent(host: str, address: str, port: int, broker: tuple[str, int],
           lldp: Callable[[str], Any]) -> Agent:  # fmt: skip
    cfg = parse_config({
        "prober": {"host": host, "port": port, "timeout_ms": 300, "batch_interval_ms": 200},
        "schedule": {"rate_hz": 20.0, "paths": 2, "seed": SEED},
        "mqtt": {"host": broker[0], "port": broker[1], "timeout_s": 3.0},
        "paths": {"enabled": False},
        "discover": {"nics": ["lo"], "lldp_interval_s": 0.2},
    }, "t.toml")  # fmt: skip
    cfg, local = discover_config(cfg, find=lambda flt: (found("lo", address),), lldp=lldp)
    return Agent(cfg, local=local, lldp_reader=lldp)


@pytest.mark.broker
async def test_two_probers_find_each_other_through_their_neighbours(
    mosquitto: tuple[str, int],
) -> None:
    """Nothing listed: each agent's only peer is the other's NIC, learned from its retained
    neighbours document; a recabled NIC (a new LLDP leaf) is published again and replanned."""
    port = free_port(socket.SOCK_DGRAM)
    cabling = {"hostA": "leaf0", "hostB": "leaf0"}

    def lldp_of(host: str) -> Callable[[str], Any]:
        return lambda sock: {"lo": leaf(cabling[host])}

    a = _agent("hostA", "127.0.0.1", port, mosquitto, lldp_of("hostA"))
    b = _agent("hostB", "127.0.0.2", port, mosquitto, lldp_of("hostB"))
    assert a.cfg.peers == () and a.cfg.nics[0].id == "hostA.lo"
    stop = asyncio.Event()
    tasks = [asyncio.create_task(x.run(stop)) for x in (a, b)]
    seen: dict[str, set[str]] = {}
    neighbors: dict[str, bytes] = {}
    async with aiomqtt.Client(*mosquitto, identifier="peers-sub") as sub:
        await sub.subscribe("qpmesh/v1/#", qos=1, timeout=3)

        async def collect(until: Callable[[], bool]) -> None:
            async for msg in sub.messages:
                kind, host = msg.topic.value.split("/")[2:4]
                payload = bytes(msg.payload)  # type: ignore[arg-type]
                if kind == "probes":
                    batch = decode_batch(payload)
                    ok = ~batch.lost
                    got = {batch.nic_ids[i] for i in batch.dst[ok]}
                    seen.setdefault(host, set()).update(got)
                elif kind == "neighbors":
                    neighbors[host] = payload
                if until():
                    return

        try:
            await asyncio.wait_for(collect(lambda: "hostB.lo" in seen.get("hostA", set())
                                           and "hostA.lo" in seen.get("hostB", set())), 20)  # fmt: skip
            assert a.cfg.peers == (PeerConfig("hostB.lo", "127.0.0.2", "ecmp-leaf0"),)
            before = a.stats.replans
            cabling["hostA"] = "leaf7"  # hostA's NIC recabled to another leaf

            def moved() -> bool:
                d = neighbors.get("hostA")
                return d is not None and b"leaf7" in d and b.cfg.peers[0].group == "ecmp-leaf7"

            await asyncio.wait_for(collect(moved), 10)
            assert a.cfg.nics[0].group == "ecmp-leaf7" and a.stats.replans > before
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
