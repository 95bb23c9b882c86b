"""A restarted controller starts with the paths its predecessor learned (issue 32: the chaos
run's flap right after the controller's kill was localized nowhere), and fresh paths win."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from contract.documents import TracedPath
from contract.neighbors import LldpNeighbor, NeighborsDoc, NicNeighbors
from contract.topics import Topics
from controller.config import EMPTY_FABRIC, ServiceConfig, load_config
from controller.dispatch import JsonLog
from controller.keptpaths import FILE, KeptPaths, load, save
from controller.remediation.config import RemediationConfig
from controller.service import Broker, run_service
from controller.topology import LearnConfig, TopologyLearner
from mesh.fabric import FabricShape, build_fabric
from tests.fabricobs import by_router_id, neighbors, router_ids, traces
from tests.waiting import until

SPINE0 = ["10.0.0.254", "172.16.0.9", "10.0.1.254"]
SPINE1 = ["10.0.0.254", "172.16.0.10", "10.0.1.254"]
OWNERS = {"nic0": "host0", "nic1": "host0", "nic2": "host1"}


def _path(hops: list[str | None], sport: int = 50000, reached: bool = True) -> TracedPath:
    return TracedPath("nic0", "nic2", sport, tuple(hops), reached)


def test_kept_paths_are_saved_and_loaded_with_their_times(tmp_path: Path) -> None:
    kept = KeptPaths()
    assert not kept.due(0)
    n = kept.add("host0", [_path(SPINE0), _path(SPINE1, 50001)], OWNERS, 1_000)
    assert n == 2 and kept.due(1_000)
    save(tmp_path, kept, 1_000)
    assert not kept.due(1_000)
    kept.add("host0", [_path(SPINE1)], OWNERS, 2_000)  # the flow re-hashed onto spine1
    assert not kept.due(2_000) and kept.due(1_000 + 5_000_000_000)  # at most every 5 s
    save(tmp_path, kept, 3_000)
    kept.add("host0", [_path(SPINE1)], OWNERS, 4_000)  # traced again, unchanged
    assert not kept.due(3_000 + 5_000_000_000) and kept.due(3_000 + 60_000_000_000)
    got = dict(((p.src, p.dst, p.sport), (p.hops, t)) for p, t in load(tmp_path, 3_000))
    assert got == {("nic0", "nic2", 50000): (tuple(SPINE1), 2_000),
                   ("nic0", "nic2", 50001): (tuple(SPINE1), 1_000)}  # fmt: skip


def test_incomplete_foreign_stale_and_torn_paths_are_not_restored(tmp_path: Path) -> None:
    kept = KeptPaths()
    kept.add("host0", [_path(SPINE0)], OWNERS, 10)
    assert kept.add("host0", [_path(SPINE1, reached=False)], OWNERS, 20) == 0  # a fault
    assert kept.add("host0", [_path([SPINE0[0], None, SPINE0[2]])], OWNERS, 20) == 0  # silent hop
    assert kept.add("host1", [_path(SPINE1, 50002)], OWNERS, 20) == 0  # not host1's NIC
    save(tmp_path, kept, 20)
    assert [(p.hops, t) for p, t in load(tmp_path, 20)] == [(tuple(SPINE0), 10)]
    assert load(tmp_path, 10 + 600_000_000_001) == []  # older than the bound: stale
    assert load(tmp_path, 10 + 30, max_age_ns=20) == []
    with (tmp_path / FILE).open("a") as f:
        f.write('{"t_ns": 5, "src": "nic0"\n{"t_ns": true, "src": "nic0", "dst": "nic2", '
                '"sport": 1, "hops": [], "reached": true}\n')  # fmt: skip
    assert len(load(tmp_path, 20)) == 1
    assert load(tmp_path / "none", 20) == []


def test_the_learner_keeps_restored_paths_only_where_nothing_fresher_came() -> None:
    learner = TopologyLearner()
    nic = NicNeighbors("nic0", "eth0", "10.0.0.1", (LldpNeighbor("leaf0"),))
    doc = NeighborsDoc("host0", 0, (nic,))
    assert learner.neighbors("host0", doc) is None
    learner.paths("host0", [_path(SPINE1)], 5_000)  # came after the restart
    restored = [(_path(SPINE0), 1_000), (_path(SPINE0, 50001), 1_000)]
    assert learner.restore(restored) == 1
    hops = {(e["sport"], tuple(e["hops"])) for e in learner.traced()}
    assert hops == {(50000, tuple(SPINE1)), (50001, tuple(SPINE0))}
    learner.paths("host0", [_path(SPINE1, 50001)], 6_000)  # the next sweep replaces it
    assert {tuple(e["hops"]) for e in learner.traced()} == {tuple(SPINE1)}


def _config(tmp_path: Path, state: Path) -> ServiceConfig:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[fabric]\nleaves = 2\nhosts_per_leaf = 2\nspines = 2\n[paths]\nmodel = false\n'
                   '[paths.routers]\n"10.0.0.254" = "leaf0"\n"172.16.0.9" = "spine0"\n'
                   '"172.16.0.10" = "spine1"\n"10.0.1.254" = "leaf1"\n')  # fmt: skip
    conf = load_config(cfg)
    return ServiceConfig(fabric=conf.fabric, backoff_s=(0.01, 0.01), tick_s=0.1,
                         router_nodes=conf.router_nodes, model_paths=False,
                         remediation=RemediationConfig(state_dir=state))  # fmt: skip


def _spine_of(live_paths: tuple[np.ndarray, np.ndarray, np.ndarray], conf: ServiceConfig) -> str:
    fwd, _, known = live_paths
    assert bool(known[0]), "the flow has no path"
    return [conf.fabric.hop_name(int(h)) for h in fwd[0] if h >= 0][1]


FLOW = (np.array([0]), np.array([2]), np.array([50000]))


async def test_a_restarted_controller_starts_with_its_predecessors_paths(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    state = tmp_path / "state"
    state.mkdir()
    conf = _config(tmp_path, state)
    topics = Topics(f"qpmesh-kp-{secrets.token_hex(3)}")
    doc = [{"src": "nic0", "dst": "nic2", "sport": 50000, "reached": True, "hops": SPINE0}]
    with (tmp_path / "log1.jsonl").open("w") as f:
        svc = asyncio.create_task(run_service(Broker(host, port, topics), conf, log=JsonLog(f)))
        try:
            await until(lambda: "connected" in (tmp_path / "log1.jsonl").read_text(), 30)
            async with aiomqtt.Client(host, port) as prober:
                await prober.publish(topics.paths("host0"), json.dumps(doc).encode(), qos=1)
            await until((state / FILE).exists, 30)
        finally:
            svc.cancel()
            with pytest.raises(asyncio.CancelledError):
                await svc
    with socket.socket() as s:  # the successor, before any message: nothing listens here
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with (tmp_path / "log2.jsonl").open("w") as f:
        live = await asyncio.wait_for(
            run_service(Broker("127.0.0.1", closed, topics), conf, log=JsonLog(f), max_attempts=1),
            30,
        )
    assert _spine_of(live.paths(*FLOW), conf) == "leaf0->spine0"
    assert '"learned paths restored", "n": 1' in (tmp_path / "log2.jsonl").read_text()
    # a fresh path of the same flow (the hash moved it) replaces the kept one, also on disk
    fresh = [{**doc[0], "hops": SPINE1}]
    with (tmp_path / "log3.jsonl").open("w") as f:
        svc = asyncio.create_task(run_service(Broker(host, port, topics), conf, log=JsonLog(f)))
        try:
            await until(lambda: "connected" in (tmp_path / "log3.jsonl").read_text(), 30)
            async with aiomqtt.Client(host, port) as prober:
                await prober.publish(topics.paths("host0"), json.dumps(fresh).encode(), qos=1)
            await until(
                lambda: [p.hops for p, _ in load(state, time.time_ns())] == [tuple(SPINE1)], 30
            )
        finally:
            svc.cancel()
            with pytest.raises(asyncio.CancelledError):
                await svc
    with (tmp_path / "log4.jsonl").open("w") as f:
        live = await asyncio.wait_for(
            run_service(Broker("127.0.0.1", closed, topics), conf, log=JsonLog(f), max_attempts=1),
            30,
        )
    assert _spine_of(live.paths(*FLOW), conf) == "leaf0->spine1"


def test_a_learned_fabric_comes_back_from_the_kept_paths_and_the_retained_neighbours(
    tmp_path: Path,
) -> None:
    plan = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, spines=2))
    names = {rid: sw for sw, rid in router_ids(plan).items() if sw.startswith("spine")}
    docs = {d.host: d for d in neighbors(plan)}
    cfg = LearnConfig(plan=plan, names=names, relearn_ns=0)
    first, kept = TopologyLearner(cfg), KeptPaths()
    for host, d in docs.items():
        first.neighbors(host, d)
    for host in docs:
        mine = [p for p in traces(plan, by_router_id(plan)) if plan.nic(p.src).host == host]
        first.paths(host, mine, 10)
        kept.add(host, mine, first.owners, 10)
    save(tmp_path, kept, 10)
    successor = TopologyLearner(cfg)
    assert successor.restore(load(tmp_path, 20)) == len(kept.paths)
    for host, d in docs.items():  # the retained neighbours documents, right after subscribing
        successor.neighbors(host, d)
    change = successor.relearn(30, EMPTY_FABRIC)
    assert change is not None and change.plan is not None and change.plan.matches_plan
    bare = TopologyLearner(cfg)  # without the kept paths: no spine is known yet
    for host, d in docs.items():
        bare.neighbors(host, d)
    change = bare.relearn(30, EMPTY_FABRIC)
    assert change is None or change.plan is None or not change.plan.matches_plan
