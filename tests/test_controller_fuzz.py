"""Malformed MQTT payloads on every topic kind the controller subscribes to (probes, presence,
health, paths; remediation acks and job rank registrations): random bytes, mutated / truncated
/ extended / oversized versions of valid payloads, JSON of the wrong shape and type. Each is
dropped with a ``bad:`` outcome (or, when a mutation happens to stay valid, applied) and
counted per kind; nothing raises; good messages are still ingested afterwards. Then once
through a real mosquitto into a real `run_service`: the service's own per-kind decode-error
counters (its Prometheus metrics) count them and it keeps ingesting."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import urllib.request
from collections import Counter
from pathlib import Path

import aiomqtt
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.documents import PresenceDoc
from contract.records import ProbeBatch, encode_batch
from contract.remediation import AckDoc, RankDoc, ack_topic, rank_topic
from contract.topics import Topics
from controller.config import ServiceConfig
from controller.dispatch import JsonLog, handle_message, message_kind
from controller.live import LiveController
from controller.remediation.runtime import RemediationRuntime
from controller.service import Broker, run_service
from mesh.fabric import Fabric, FabricShape, build_fabric
from prober.agent import health_doc
from prober.telemetry.gpu import GpuReading
from testbed.sim.engine import SimConfig, Simulator
from tests.servers import free_port
from tests.waiting import until

PREFIX = "qpmesh/v1"
ROUTERS = {"10.0.0.254": "leaf0", "172.16.0.9": "spine1", "10.0.1.254": "leaf1"}
FAB = build_fabric(FabricShape(leaves=2, hosts_per_leaf=4, spines=2))


def _host_batch(fab: Fabric, t_s: float, host: str = "host0", seq: int = 1) -> ProbeBatch:
    """One step of the simulator as ``host``'s prober publishes it (its NICs' probes only)."""
    full = Simulator(fab, SimConfig(peers=4, seed=3)).step(t_s, 0.5).batch
    mine = {n.id for n in fab.nics if n.host == host}
    keep = np.array([full.nic_ids[i] in mine for i in full.src])
    cols = {f.name: getattr(full, f.name)[keep] for f in dataclasses.fields(full)
            if isinstance(getattr(full, f.name), np.ndarray)}  # fmt: skip
    return dataclasses.replace(full, origin=host, batch_seq=seq, **cols)


def _valid() -> dict[str, tuple[str, bytes]]:
    """One valid (topic, payload) per kind."""
    t = Topics(PREFIX)
    health = health_doc("host0", 5, GpuReading(False), None,
                        {"nic0": {"counters": {"rx_bytes": 1, "tx_bytes": 2}}}, {})  # fmt: skip
    paths = [{"src": "nic0", "dst": "nic4", "sport": 50000, "reached": True,
              "hops": ["10.0.0.254", "172.16.0.9", "10.0.1.254"]}]  # fmt: skip
    return {
        "probes": (t.probes("host0"), encode_batch(_host_batch(FAB, 0.0))),
        "presence": (t.presence("host0"), PresenceDoc(alive=True, t_ns=5).encode()),
        "health": (t.health("host0"), json.dumps(health).encode()),
        "paths": (t.paths("host0"), json.dumps(paths).encode()),
        "remediation-ack": (
            ack_topic(PREFIX, "a-1"),
            AckDoc("a-1", "train/rank0", "done", 5).encode(),
        ),
        "jobs": (rank_topic(PREFIX, "train", 0), RankDoc("train", 0, ("nic0",)).encode()),
    }


VALID = _valid()
KINDS = tuple(VALID)


class World:
    """A live controller and the remediation runtime, fed like the service feeds them."""

    def __init__(self) -> None:
        self.live = LiveController(FAB)
        self.remediation = RemediationRuntime(prefix=PREFIX)
        self.topics = Topics(PREFIX)
        self.counts: Counter[str] = Counter()

    def feed(self, topic: str, payload: bytes) -> str:
        """What `controller.service.serve_once` does with one message (minus the broker)."""
        mine = self.remediation.handle(topic, payload)
        if mine is not None:
            out = mine[0]
        else:
            out = handle_message(self.live, self.topics, topic, payload, 10**9, ROUTERS)
        if out.startswith("bad:"):
            self.counts[message_kind(self.topics, topic)] += 1
        return out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)


def _mutate(seed: bytes) -> st.SearchStrategy[bytes]:
    """Truncations, byte flips, insertions and extensions of a valid payload."""
    n = len(seed)
    trunc = st.integers(0, max(0, n - 1)).map(lambda k: seed[:k])
    flips = st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 255)), min_size=1,
                     max_size=8).map(lambda fs: _flip(seed, fs))  # fmt: skip
    insert = st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=64)).map(
        lambda a: seed[: a[0]] + a[1] + seed[a[0] :]
    )
    tail = st.binary(min_size=1, max_size=256).map(lambda b: seed + b)
    return trunc | flips | insert | tail


def _flip(seed: bytes, flips: list[tuple[int, int]]) -> bytes:
    b = bytearray(seed)
    for i, v in flips:
        b[i] = v
    return bytes(b)


def _wrong_types(seed: bytes) -> st.SearchStrategy[bytes]:
    """The valid JSON document with one field replaced by any JSON value, or dropped."""
    try:
        doc = json.loads(seed)
    except ValueError:
        return st.nothing()
    obj = doc[0] if isinstance(doc, list) else doc
    keys = sorted(obj)

    def swap(a: tuple[str, object, bool]) -> bytes:
        k, v, drop = a
        o = dict(obj)
        if drop:
            o.pop(k, None)
        else:
            o[k] = v
        return json.dumps([o] if isinstance(doc, list) else o).encode()

    return st.tuples(st.sampled_from(keys), json_values, st.booleans()).map(swap)


NASTY = (b"", b"\x00" * 64, b"[" * 100_000, b'{"a":' * 50_000, b"1e99999", b"NaN", b"\xff\xfe",
         b"null", b"[]", b'"x"', b"{}", b"QPMB" + bytes(200), b"QPMB\x01" + bytes(10),
         b"x" * (2 << 20))  # fmt: skip


def payloads(kind: str) -> st.SearchStrategy[bytes]:
    seed = VALID[kind][1]
    return (
        st.binary(max_size=2048)
        | _mutate(seed)
        | _wrong_types(seed)
        | json_values.map(lambda v: json.dumps(v).encode())
        | st.sampled_from(NASTY)
    )


@pytest.mark.parametrize("kind", KINDS)
def test_malformed_payloads_are_dropped_counted_and_never_raise(kind: str) -> None:
    world = World()
    topic = VALID[kind][0]
    bad = [0]

    @settings(max_examples=300, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(payloads(kind))
    def run(payload: bytes) -> None:
        out = world.feed(topic, payload)  # must not raise
        assert isinstance(out, str) and out
        bad[0] += out.startswith("bad:")

    run()
    for p in NASTY:  # the known-nasty ones, every time
        out = world.feed(topic, p)
        bad[0] += out.startswith("bad:")
        if p not in (b"", b"{}", b"[]"):  # empty presence = gone, {} health = all defaults
            assert out.startswith("bad:"), (p[:20], out)
    assert bad[0] > 50 and world.counts[kind] == bad[0]  # counted, under its own kind
    assert set(world.counts) == {kind}
    # and the controller still takes good messages
    before = world.live.records
    later = encode_batch(_host_batch(FAB, 1.0, seq=10**6))
    assert world.feed(VALID["probes"][0], later) == "probes"
    assert world.live.records > before


def _decode_errors(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("qpmesh_decode_errors_total{"):
            kind = line.split('topic_kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.slow
async def test_garbage_through_mosquitto_is_counted_and_the_service_keeps_ingesting(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    mport = free_port()
    conf = ServiceConfig(fabric=FAB, tick_s=0.2, backoff_s=(0.05, 0.2), router_nodes=ROUTERS,
                         metrics_listen=f"127.0.0.1:{mport}")  # fmt: skip
    live = LiveController(FAB)
    log_path = tmp_path / "log.jsonl"
    with log_path.open("w") as f:
        svc = asyncio.create_task(run_service(Broker(host, port, Topics(PREFIX)), conf,
                                              log=JsonLog(f), live=live))  # fmt: skip
        try:
            rng = np.random.default_rng(7)
            sent: Counter[str] = Counter()  # the bad ones, as the pure handler judges them
            judge = World()
            async with aiomqtt.Client(host, port) as c:
                # the service logs "connected" once its subscriptions are in place
                await until(lambda: '"msg": "connected"' in log_path.read_text(), every_s=0.1)
                for kind in ("probes", "presence", "health", "paths"):
                    topic, seed = VALID[kind]
                    for p in (*NASTY[:-1], seed[: len(seed) // 2], rng.bytes(300),
                              b'{"alive": "yes"}', b'[{"src": 1}]'):  # fmt: skip
                        await c.publish(topic, p, qos=1)
                        sent[kind] += judge.feed(topic, p).startswith("bad:")
                    # a malformed message on another host's topic too
                    await c.publish(topic.replace("host0", "host1"), b"\x00garbage", qos=1)
                    sent[kind] += 1
                assert min(sent.values()) >= 15
                await until(lambda: len(_decode_errors(mport)) >= 4, every_s=0.1)
                await until(
                    lambda: all(_decode_errors(mport).get(k, 0) >= sent[k] for k in sent),
                    every_s=0.1,
                )
                assert not svc.done()
                before = live.records
                for seq, t_s in enumerate((1.0, 1.5, 2.0), start=10**6):
                    await c.publish(VALID["probes"][0],
                                    encode_batch(_host_batch(FAB, t_s, seq=seq)), qos=1)  # fmt: skip
                await until(lambda: live.records > before, every_s=0.1)
            errs = _decode_errors(mport)  # the service's own counters, per kind: exact
            assert {k: errs.get(k) for k in sent} == {k: float(v) for k, v in sent.items()}
            assert not svc.done()
        finally:
            svc.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await svc
