"""A controller with no fabric: it learns one from neighbours documents and traced paths, checks
it against a plan, applies each change through its one door as one ``topology`` event, and
detection keeps working on the new fabric (simulated probes, real Brain); the service learns
through a real mosquitto."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from contract.documents import EventDoc, PathsDoc, PresenceDoc, TracedPath
from contract.neighbors import LldpNeighbor, NeighborsDoc, NicNeighbors
from contract.origin import claimed_nics, neighbors_origin_error, split_by_host
from contract.records import encode_batch
from contract.topics import Topics
from controller.brain import Brain
from controller.clocksync import ClockState
from controller.config import EMPTY_FABRIC, load_config
from controller.dispatch import JsonLog, handle_message
from controller.live import LiveController
from controller.refabric import TOPOLOGY
from controller.service import Broker, ServiceConfig, run_service
from controller.topology import LearnConfig, TopologyLearner, relearn_live
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.model import hop_direction, hop_link
from sync import ClockModels
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, SimStep, Simulator
from testbed.sim.model import ModelKnobs
from tests.fabricobs import by_router_id, neighbors, router_ids, traces

PLAN = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, spines=2))
RID = router_ids(PLAN)
SPINES = {rid: sw for sw, rid in RID.items() if sw.startswith("spine")}
DOCS = {d.host: d for d in neighbors(PLAN)}


def learner(**kw: object) -> TopologyLearner:
    cfg = LearnConfig(plan=PLAN, names=SPINES, relearn_ns=0)
    return TopologyLearner(dataclasses.replace(cfg, **kw))  # type: ignore[arg-type]


def feed(t: TopologyLearner, docs: dict[str, NeighborsDoc], paths: list[TracedPath],
         now: int = 0) -> None:  # fmt: skip
    for host, d in docs.items():
        assert t.neighbors(host, d) is None
    for host in docs:
        t.paths(host, [p for p in paths if PLAN.nic(p.src).host == host], now)


def test_learns_the_plan_and_relearns_only_on_news() -> None:
    t = learner()
    feed(t, DOCS, traces(PLAN, by_router_id(PLAN)))
    change = t.relearn(1, EMPTY_FABRIC)
    assert change is not None and change.plan is not None and change.plan.matches_plan
    assert change.note() == "matches the plan"
    fab = change.learned.fabric
    assert {lk.id for lk in fab.links} == {lk.id for lk in PLAN.links}
    assert dict(t.owners) == {n.id: n.host for n in PLAN.nics}
    assert t.relearn(2, fab) is None  # nothing new
    again = {h: dataclasses.replace(d, t_ns=99) for h, d in DOCS.items()}  # republished
    feed(t, again, traces(PLAN, by_router_id(PLAN)), 3)
    assert t.relearn(4, fab) is None
    # relearn_ns spaces relearns: news within it waits
    slow = learner(relearn_ns=10)
    feed(slow, DOCS, [])
    first = slow.relearn(100, EMPTY_FABRIC)
    assert first is not None
    slow.neighbors("host0", DOCS["host0"])
    slow.neighbors("host9", NeighborsDoc("host9", 0, (NicNeighbors("nic9", "e", "10.9.0.1",
                                         (LldpNeighbor("leaf2"),)),)))  # fmt: skip
    assert slow.relearn(105, first.learned.fabric) is None
    later = slow.relearn(111, first.learned.fabric)
    assert later is not None and later.changes == (
        "nic9 (10.9.0.1, host9, under leaf2) is not in the last fabric",)  # fmt: skip
    assert later.plan is not None and not later.plan.matches_plan


def test_origins_and_what_a_fault_cannot_unlearn() -> None:
    t = learner()
    feed(t, DOCS, traces(PLAN, by_router_id(PLAN)))
    fab = t.relearn(1, EMPTY_FABRIC)
    assert fab is not None
    # a document under another host's topic, or claiming another host's NIC: untrusted
    assert t.neighbors("host1", DOCS["host0"]) == (
        "untrusted: neighbours of 'host0' published on the topic of 'host1'")  # fmt: skip
    stolen = NeighborsDoc("host1", 0, DOCS["host1"].nics + DOCS["host0"].nics)
    why = t.neighbors("host1", stolen)
    assert why is not None and "NIC 'nic0' is a NIC of 'host0'" in why
    assert neighbors_origin_error(DOCS["host0"], "host0", {}) is None  # unclaimed NICs: fine
    assert claimed_nics({"b": DOCS["host0"], "a": DOCS["host0"]}) == {"nic0": "a"}
    # paths from a host that does not own their source NIC are not kept
    p = next(p for p in traces(PLAN, by_router_id(PLAN)) if len(p.hops) == 3)
    assert t.paths("host5", [p], 2) == 0 and t.counters["paths_foreign"] == 1
    # a trace cut by a fault (not reached, a silent hop) does not replace a complete one
    host = PLAN.nic(p.src).host
    assert t.paths(host, [dataclasses.replace(p, reached=False)], 2) == 0
    assert t.paths(host, [dataclasses.replace(p, hops=(p.hops[0], None, p.hops[2]))], 2) == 0
    assert t.relearn(3, fab.learned.fabric) is None
    # spine1 taken out: its flows are traced again elsewhere, the rest ages out
    gone = traces(PLAN, by_router_id(PLAN), skip_link=("leaf0-spine1", "leaf1-spine1",
                                                       "leaf2-spine1"))  # fmt: skip
    aged = learner(path_max_age_ns=50)
    feed(aged, DOCS, traces(PLAN, by_router_id(PLAN)), 0)
    first = aged.relearn(10, EMPTY_FABRIC)
    assert first is not None
    feed(aged, DOCS, gone, 40)
    assert aged.relearn(45, first.learned.fabric) is None  # old paths still vouch for spine1
    feed(aged, DOCS, gone, 60)
    change = aged.relearn(70, first.learned.fabric)
    assert change is not None and change.plan is not None
    assert change.changes == ("spine spine1 was not seen: no traced path crossed it",)
    assert "spine spine1 was not seen" in change.note()
    # a host whose retained document was cleared is forgotten
    assert aged.neighbors("host5", NeighborsDoc.decode(b"")) is None
    dropped = aged.relearn(80, change.learned.fabric)
    assert dropped is not None and "nic5" in dropped.changes[0]


def _traced(step: SimStep, seen: set[tuple[str, str, int]]) -> dict[str, list[TracedPath]]:
    """The simulator's true paths of flows not traced yet, as the probers' traces: one router
    id per switch, per host."""
    out: dict[str, list[TracedPath]] = {}
    b = step.batch
    for i in range(len(b)):
        key = (b.nic_ids[b.src[i]], b.nic_ids[b.dst[i]], int(b.sport[i]))
        if key in seen:
            continue
        seen.add(key)
        nodes = []
        for h in step.hops_fwd[i][step.hops_fwd[i] >= 0]:
            lk = PLAN.links[hop_link(int(h))]
            nodes.append(lk.upper if hop_direction(int(h)) == "up" else lk.lower)
        hops = tuple(RID[n] for n in nodes[:-1])
        out.setdefault(PLAN.nic(key[0]).host, []).append(TracedPath(*key, hops, True))
    return out


def _run(
    seconds: float, news: dict[float, list[tuple[str, NeighborsDoc]]], fault: Fault
) -> tuple[list[EventDoc], LiveController]:
    """Probe ``PLAN`` in the simulator (its true paths traced as the probers would), learn the
    fabric as the service does (model paths off), hand the learner ``news`` at those times."""
    t = learner()
    for host, d in DOCS.items():
        if host != "host5":
            t.neighbors(host, d)
    live = LiveController(EMPTY_FABRIC, owners=t.owners)
    live.use_model_paths(False)
    sim = Simulator(PLAN, SimConfig(model=ModelKnobs.ideal_model(), seed=4, peers=8), [fault])
    seen: set[tuple[str, str, int]] = set()
    events: list[EventDoc] = []
    for st in sim.run(seconds, 0.5):
        now = EPOCH_NS + int(st.t1_s * 1e9)
        for host, paths in _traced(st, seen).items():
            t.paths(host, paths, now)
        for host, d in news.get(st.t1_s, []):
            assert t.neighbors(host, d) is None
        done = relearn_live(live, t, now, Brain)
        events += [done[1]] if done else []
        live.admit(st.batch, now)
        events += live.tick(now)
    return events, live


def test_a_host_added_live_is_one_topology_event_and_detection_goes_on() -> None:
    flap = Fault(FaultKind.FLAP, "leaf1-spine0", 14.0, 6.0, down_s=1.0, up_s=1.0)
    events, live = _run(22.0, {6.0: [("host5", DOCS["host5"])]}, flap)
    topo = [e for e in events if e.kind == TOPOLOGY]
    assert [round((e.t_ns - EPOCH_NS) / 1e9, 1) for e in topo] == [0.5, 6.0]
    assert topo[0].detail.startswith("first fabric: 5 NICs on 5 hosts, 3 leaves, 2 spines")
    assert "differs from the plan: nic5 (10.0.2.2, host5) was not seen" in topo[0].detail
    assert topo[1].detail.startswith("nic5 (10.0.2.2, host5, under leaf2) is not in the last")
    assert "matches the plan" in topo[1].detail and "restarted" in topo[1].detail
    assert [n.id for n in live.fabric.nics] == [n.id for n in PLAN.nics]
    found = {(e.kind, e.target) for e in events if e.t_ns >= EPOCH_NS + 14_000_000_000}
    assert found & {("link_flap", "leaf1-spine0"), ("link_down", "leaf1-spine0")}, found
    # the learned paths were refilled: the flap was placed on its link, not on a host
    assert not {e for e in found if e[0] == "prober_down"}


def test_a_recabled_nic_is_one_topology_event_and_detection_goes_on() -> None:
    moved = NeighborsDoc("host4", 0, (NicNeighbors("nic4", "nic4", "10.0.2.1",
                                                   (LldpNeighbor("leaf1"),)),))  # fmt: skip
    down = Fault(FaultKind.NIC_DOWN, "nic1", 12.0, 6.0)
    events, live = _run(20.0, {6.0: [("host4", moved)]}, down)
    topo = [e for e in events if e.kind == TOPOLOGY]
    assert len(topo) == 2, [e.detail for e in topo]
    assert topo[1].detail.startswith("nic4 (10.0.2.1) is cabled to leaf1, the last fabric says "
                                     "leaf2")  # fmt: skip
    assert "differs from the plan: nic4 (10.0.2.1) is cabled to leaf1, the plan says leaf2" in (
        topo[1].detail)  # fmt: skip
    assert live.fabric.nic("nic4").leaf == "leaf1"
    assert ("nic_down", "nic1") in {(e.kind, e.target) for e in events}


def test_the_door_keeps_what_is_keyed_by_id() -> None:
    small = build_fabric(FabricShape(leaves=2, hosts_per_leaf=1, spines=1))
    live = LiveController(small)
    live.presence("host1", True, 5, since_ns=3)
    live.gpu("host0", False, "xid 79", 6)
    rates = live.rates
    live.tick(10)
    live._hist_v[0] = [1.0, 2.0]  # the last tick's worst delays of nic0, nic1
    bigger = build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, spines=1))  # nic1 -> nic2
    ev = live.replace_fabric(bigger, 20, note="a note")
    assert ev == live.events[-1] and ev.kind == TOPOLOGY and ev.target == "fabric"
    # NICs are lined up by address: small's nic1 (10.0.1.1) is bigger's nic2, on host2
    assert ev.detail.startswith("nic1 (10.0.1.1) is on host host2, the last fabric says host1")
    assert "; a note; clock sync, flows and detection restarted" in ev.detail
    assert live.alive == {"host1": True} and live.gpu_state["host0"].detail == "xid 79"
    assert live.rates is rates
    assert live.solver.host_state().alive_since.tolist() == [0, 3, 0, 0]  # host1: by id
    hist = live._hist_v[0]  # by NIC id: nic0 and nic1 kept theirs, nic2 and nic3 are new
    assert hist[:2].tolist() == [1.0, 2.0] and np.isnan(hist[2:]).all()
    assert live.snapshot().fabric is bigger and len(live.snapshot().nic_health) == 4
    # a solve of the old fabric's window is refused once the fabric changed
    z = np.zeros(2)
    old = ClockModels(0, z, z.copy(), z.copy(), z.copy(), np.ones(2, bool))
    assert live.install_clock(ClockState(old, 0.0, 10, 0)) is False
    z4 = np.zeros(4)
    new = ClockModels(0, z4, z4.copy(), z4.copy(), z4.copy(), np.ones(4, bool))
    assert live.install_clock(ClockState(new, 0.0, 19, 0)) is False  # started before it
    assert live.install_clock(ClockState(new, 0.0, 21, 0)) is True


def test_dispatch_reads_neighbours_and_judges_origins_by_claims() -> None:
    topics = Topics()
    t = learner()
    live = LiveController(EMPTY_FABRIC, owners=t.owners)
    assert handle_message(live, topics, topics.neighbors("host0"), DOCS["host0"].encode(), 1,
                          topology=t) == "neighbors"  # fmt: skip
    # no learner: neighbours documents are not the controller's business
    plain = LiveController(PLAN)
    assert handle_message(plain, topics, topics.neighbors("host0"), b"{}", 1) == "ignored"
    # presence of a host that claimed its NICs is taken before the fabric is relearned
    alive = PresenceDoc(True, 1).encode()
    assert (
        handle_message(live, topics, topics.presence("host0"), alive, 2, topology=t) == "presence"
    )
    assert handle_message(live, topics, topics.presence("host3"), alive, 2, topology=t) == (
        "bad:untrusted: host 'host3' is not in the fabric")  # fmt: skip
    out = handle_message(live, topics, topics.neighbors("host1"), DOCS["host0"].encode(), 2,
                         topology=t)  # fmt: skip
    assert out.startswith("bad:untrusted: neighbours of 'host0'")
    assert handle_message(live, topics, topics.neighbors("host1"), b"[", 2, topology=t).startswith(
        "bad:neighbors")  # fmt: skip
    # a batch of host0's claimed NIC passes admission (its records wait for the fabric)
    sim = Simulator(PLAN, SimConfig(model=ModelKnobs.ideal_model(), seed=1, peers=2))
    batch = split_by_host(sim.step(0.0, 0.5).batch, {n.id: n.host for n in PLAN.nics})["host0"]
    assert handle_message(live, topics, topics.probes("host0"), encode_batch(batch), 3,
                          topology=t) == "probes"  # fmt: skip
    other = dataclasses.replace(batch, origin="host1", batch_seq=batch.batch_seq + 1)
    assert handle_message(live, topics, topics.probes("host1"), encode_batch(other), 3,
                          topology=t).startswith("bad:untrusted: NIC 'nic0'")  # fmt: skip
    # paths go to the learner (and onto the fabric once it is learned)
    mine = [p for p in traces(PLAN, by_router_id(PLAN)) if p.src == "nic0"]
    assert handle_message(live, topics, topics.paths("host0"), PathsDoc(tuple(mine)).encode(), 4,
                          topology=t) == "paths"  # fmt: skip
    assert t.counters["paths"] == len(mine)


def test_learned_configs(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN.to_dict()))
    c = tmp_path / "c.toml"
    c.write_text("")
    got = load_config(c)
    assert got.learn == LearnConfig() and got.fabric is EMPTY_FABRIC
    c.write_text('[fabric]\nplan = "plan.json"\nrelearn_s = 0.5\npath_max_age_s = 60\n'
                 '[fabric.routers]\n"100.64.0.4" = "spine0"\n')  # fmt: skip
    learn = load_config(c).learn
    assert learn is not None and learn.plan is not None
    assert [n.id for n in learn.plan.nics] == [n.id for n in PLAN.nics]
    assert (learn.relearn_ns, learn.path_max_age_ns) == (500_000_000, 60_000_000_000)
    assert dict(learn.names) == {"100.64.0.4": "spine0"}
    c.write_text("[fabric]\nleaves = 2\n")
    assert load_config(c).learn is None  # declared, as before


@pytest.mark.broker
async def test_the_service_learns_through_the_broker(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    """Retained neighbours documents, traced paths and probe batches in; a ``topology`` event
    that matches the plan out on ``events/topology``, the log's ``topology`` line, and no
    batch refused (their origins are judged by what each host claimed)."""
    host, port = mosquitto
    topics = Topics("qpmesh/test")
    import aiomqtt

    async with aiomqtt.Client(host, port) as client:  # retained before the controller starts
        for h, d in DOCS.items():
            await client.publish(topics.neighbors(h), d.encode(), qos=1, retain=True)
    t0 = time.monotonic_ns()

    def clock() -> int:
        return EPOCH_NS + (time.monotonic_ns() - t0)

    log_path = tmp_path / "log.jsonl"
    log_file = log_path.open("w")
    config = ServiceConfig(fabric=EMPTY_FABRIC, tick_s=0.1,
                           learn=LearnConfig(plan=PLAN, names=SPINES, relearn_ns=0))  # fmt: skip
    svc = asyncio.create_task(run_service(Broker(host, port, topics), config,
                                          log=JsonLog(log_file), clock=clock))  # fmt: skip
    sim = Simulator(PLAN, SimConfig(model=ModelKnobs.ideal_model(), seed=2, peers=4))
    try:
        async with aiomqtt.Client(host, port) as client:
            await client.subscribe(topics.subscription("events"), qos=1)
            for _ in range(200):
                if "connected" in log_path.read_text():
                    break
                await asyncio.sleep(0.05)
            paths = traces(PLAN, by_router_id(PLAN))
            for h in DOCS:
                mine = tuple(p for p in paths if PLAN.nic(p.src).host == h)
                await client.publish(topics.paths(h), PathsDoc(mine).encode(), qos=1)
            for st in sim.run(1.0, 0.5):
                for h, b in split_by_host(st.batch, {n.id: n.host for n in PLAN.nics}).items():
                    await client.publish(topics.probes(h), encode_batch(b), qos=1)

            async def topology() -> EventDoc:
                async for msg in client.messages:
                    assert isinstance(msg.payload, bytes)
                    ev = EventDoc.decode(msg.payload)
                    if ev.kind == TOPOLOGY and "matches the plan" in ev.detail:
                        return ev
                raise AssertionError("no event")

            ev = await asyncio.wait_for(topology(), 20)
            assert ev.target == "fabric"
    finally:
        svc.cancel()
        with pytest.raises(asyncio.CancelledError):
            await svc
        log_file.close()
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    learned = [x for x in lines if x["msg"] == "topology"]
    assert learned[-1]["matches_plan"] is True and learned[-1]["plan_differences"] == []
    assert (learned[-1]["nics"], learned[-1]["links"]) == (6, 12)
    assert not [x for x in lines if x["msg"] == "bad message"], lines
