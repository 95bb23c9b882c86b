"""Agent: pure helpers, and a real run (two NICs on loopback, UDP, real mosquitto)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import socket
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest

from contract.documents import HealthDoc
from contract.records import MISSING, decode_batch
from contract.signals import Entity, SignalsDoc
from prober.agent import Agent, batch_seq_start, health_doc, plan_peers, plan_round
from prober.config import parse_config
from prober.schedule import ProbePlan
from prober.telemetry.gpu import GpuReading
from prober.telemetry.nic import read_link_up

# a fresh seed per test run: the schedule's source ports (bound on 127.0.0.1) then differ
# from those of another run of these tests on the same machine at the same time
SEED = secrets.randbelow(1 << 30)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeEndpoint:
    """A NIC endpoint as the agent's queueing sees it: a clock ``offset`` ns from the plan's
    (``t`` set by the test), addresses as configured, nothing to wake."""

    def __init__(self, offset: int) -> None:
        self.offset, self.t = offset, 0

    def now_ns(self) -> int:
        return self.t + self.offset

    def resolve(self, nic_id: str, configured: Any) -> Any:
        return configured

    def wake(self) -> None:
        pass


def inner(made: Any) -> Any:
    """The transport endpoint a factory made (behind path discovery, when that is on)."""
    ep = made.endpoint
    return ep.inner if made.discovery is not None else ep


def config(broker: tuple[str, int] = ("127.0.0.1", 1883), **prober: Any) -> Any:
    return parse_config(
        {
            "prober": {"host": "hostA", "port": free_udp_port(), "timeout_ms": 300,
                       "batch_interval_ms": 200, **prober},
            "schedule": {"rate_hz": 20.0, "paths": 4, "cross_peers": 2, "seed": SEED},
            "mqtt": {"host": broker[0], "port": broker[1], "timeout_s": 3.0},
            "telemetry": {"interval_s": 0.5, "gpu": False},
            "signals": {"interval_s": 1.0},
            "nics": [{"id": "nic0", "address": "127.0.0.1", "device": "lo"},
                     {"id": "nic1", "address": "127.0.0.2"}],
            "peers": [{"id": "nic9", "address": "10.9.9.9", "group": "leafX"}],
        },
        "test.toml",
    )  # fmt: skip


def test_batch_seq_start_is_ms_and_monotone_over_restarts() -> None:
    assert batch_seq_start(1_700_000_000_123_456_789) == 1_700_000_000_123
    assert batch_seq_start(10**18 + 10_000_000) > batch_seq_start(10**18) + 9  # 10 ms later


def test_plan_round_one_probe_per_stream() -> None:
    cfg = config()
    peers = plan_peers(cfg)
    assert peers == {"nic0": ("nic1", "nic9"), "nic1": ("nic0", "nic9")}
    plan = ProbePlan(peers, cfg.schedule, start_ns=0)
    probes = plan_round(plan, peers, at_ns=1000)
    assert [(p.src, p.dst) for p in probes] == [("nic0", "nic1"), ("nic0", "nic9"),
                                                ("nic1", "nic0"), ("nic1", "nic9")]  # fmt: skip
    assert all(p.sport in plan.ports[p.src] for p in probes)
    assert [p.at_ns for p in probes] == [1000, 1_001_000, 2_001_000, 3_001_000]


def test_health_doc_pure() -> None:
    doc = health_doc("h", 5, GpuReading(False, reason="no GPU: x"), None, {"nic0": {}}, {"a": 1})
    assert doc["gpu_ok"] is True and doc["gpu_present"] is False and doc["detail"] == "no GPU: x"
    assert doc["t_ns"] == 5 and json.loads(json.dumps(doc)) == doc


@pytest.mark.broker
async def test_agent_probes_and_publishes(mosquitto: tuple[str, int]) -> None:
    cfg = config(mosquitto)
    agent = Agent(cfg)
    batches = []
    health: list[dict[str, Any]] = []
    signals: list[SignalsDoc] = []
    host, port = mosquitto
    async with aiomqtt.Client(host, port, identifier="agent-sub") as sub:
        await sub.subscribe("qpmesh/v1/#", qos=1, timeout=3)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))

        async def collect() -> None:
            async for msg in sub.messages:
                kind = msg.topic.value.split("/")[2]
                if kind == "probes":
                    batches.append(decode_batch(bytes(msg.payload)))  # type: ignore[arg-type]
                elif kind == "health":
                    health.append(json.loads(msg.payload))  # type: ignore[arg-type]
                elif kind == "signals":
                    signals.append(SignalsDoc.decode(bytes(msg.payload)))  # type: ignore[arg-type]
                if len(batches) >= 6 and health and signals:
                    return

        try:
            await asyncio.wait_for(collect(), 15)
            # the compiled path (the default): one timer ticks both NICs, no per-NIC loops
            driver, driven = agent.driver, agent.driven_endpoints()
            # and one C call per tick for both (prober.tick_batch): fails if silently off
            assert agent.hot_path != "compiled" or (
                driver is not None and driver.ticks > 0 and len(driven) == 2 and driver.batched
            )
            # and the schedule's rows go into the engines from the C plan (fails if silently
            # off: `ProbePlan.compile` refused, or the hook still takes Python rows)
            assert agent.hot_path != "compiled" or (
                agent.plan.core is not None and agent._core_targets is agent.plan.core
            )
        finally:
            stop.set()
            stats = await asyncio.wait_for(task, 15)
    assert stats.batches >= 6
    seqs = [b.batch_seq for b in batches]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    b0 = batches[0]
    assert b0.origin == "hostA" and b0.dport == cfg.port and b0.stamp in ("sw", "hw")
    assert b0.nic_ids == ("nic0", "nic1", "nic9")
    ok = [b.select(~b.lost) for b in batches]
    got = sum(len(b) for b in ok)
    assert got >= 10
    for b in ok:
        for t in (b.t1, b.t2, b.t3, b.t4):
            assert (t != MISSING).all()
        rtt = (b.t4 - b.t1) - (b.t3 - b.t2)
        assert ((rtt > 0) & (rtt < 50_000_000)).all()  # loopback: < 50 ms, positive
        pairs = {(b.nic_ids[s], b.nic_ids[d]) for s, d in zip(b.src, b.dst, strict=True)}
        assert pairs <= {("nic0", "nic1"), ("nic1", "nic0")}
        for s, sp in zip(b.src, b.sport, strict=True):
            assert int(sp) in agent.plan.ports[b.nic_ids[s]]
    # nic9 (10.9.9.9) is unreachable: its probes are reported lost, not dropped
    lost = [b.select(b.lost) for b in batches]
    assert any(len(b) and (np.asarray(b.dst) == 2).all() for b in lost)
    assert health[0]["host"] == "hostA" and health[0]["gpu_present"] is False
    assert health[0]["nics"]["nic0"]["device"] == "lo"
    # [signals] interval_s: a window of the host's hardware signals on signals/<host>, its
    # NICs with a device by their fabric id (lo's counters: this test's own probes)
    sig = signals[0]
    assert sig.host == "hostA" and sig.entities(Entity.NIC) == ("nic0",)
    assert 0.5 < sig.interval_s < 5 and (sig.get("nic", "nic0", "rx_packets") or 0) > 0
    assert sig.get("nic", "nic0", "mtu") == 65536  # lo's MTU, a gauge as read


async def test_agent_once_without_broker_keeps_batch_in_spool() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    cfg = config(("127.0.0.1", dead))
    from dataclasses import replace

    cfg = replace(
        cfg, mqtt=replace(cfg.mqtt, timeout_s=0.5, drain_on_stop_s=0.2, backoff_min_s=0.05)
    )
    agent = Agent(cfg)
    stats = await agent.run(asyncio.Event(), once=True)
    assert stats.probes_queued == 8 and stats.results == 4 and stats.lost == 4
    assert stats.batches == 1 and len(agent.publisher.spool) == 1
    assert agent.publisher.errors >= 1


@pytest.mark.broker
def test_cli_once_publishes_one_round(mosquitto: tuple[str, int], tmp_path: Any) -> None:
    import subprocess
    import sys

    port = free_udp_port()
    cfg = tmp_path / "p.toml"
    cfg.write_text(
        f'[prober]\nhost = "hostC"\nport = {port}\ntimeout_ms = 300\n'
        f'[mqtt]\nhost = "{mosquitto[0]}"\nport = {mosquitto[1]}\n'
        '[[nics]]\nid = "nic0"\naddress = "127.0.0.1"\n'
        '[[nics]]\nid = "nic1"\naddress = "127.0.0.3"\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "qpmesh.cli", "prober", "--config", str(cfg), "--once", "--json"],
        check=False, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["probes"] == 4 and doc["results"] == 4 and doc["lost"] == 0
    assert doc["published"] == 1 and doc["spooled"] == 0


def test_clock_hook_becomes_the_endpoint_clock_and_config_knows_no_vclock(tmp_path: Path) -> None:
    from prober.config import ConfigError
    from prober.endpoint import udp_endpoint_factory
    from prober.pathsweep import sweep_flows
    from prober.wire import Codec
    from testbed.vclock import ClockError, VirtualClock, load_clock, write_clock

    doc = {"prober": {"host": "h"}, "nics": [{"id": "nic0", "address": "127.0.0.1"}]}
    cfg = parse_config(doc, "t.toml")
    plain = inner(udp_endpoint_factory(cfg)(cfg.nics[0], Codec(), (), lambda e: None))
    assert plain.clock(1_000_000_000) == 1_000_000_000  # a real host: identity
    clk = tmp_path / "clock.json"
    write_clock(VirtualClock(offset_ns=1000.0, drift=1e-5, t0_ns=0), clk)
    hook = load_clock(clk).apply
    ep = inner(udp_endpoint_factory(cfg, hook)(cfg.nics[0], Codec(), (), lambda e: None))
    assert ep.clock(1_000_000_000) == 1_000_000_000 + 1000 + 10_000
    # the prober's config has no testbed table any more: it is an unknown section
    with pytest.raises(ConfigError, match=r"testbed"):
        parse_config({**doc, "testbed": {"vclock": {"offset_ns": 1.0}}}, "t.toml")
    clk.write_text('{"offset_ns": 0.0, "drift": 0.5, "t0_ns": 0}')
    with pytest.raises(ClockError, match=r"clock\.json"):
        load_clock(clk)
    flows = sweep_flows({"a": ("b", "c")}, {"a": (1, 2)})
    assert flows == [("a", "b", 1), ("a", "c", 1), ("a", "b", 2), ("a", "c", 2)]


def test_path_discovery_wraps_the_endpoint_instead_of_patching_it() -> None:
    """`TracingEndpoint` routes the UDP endpoint's trace results and ICMP errors into path
    discovery through the endpoint's declared `route`, and passes every other event on."""
    from prober.events import ProbeLost, TraceReached
    from prober.pathdisc import PathTracer, TracingEndpoint
    from prober.session import ProbeSession
    from prober.udp import UdpEndpoint

    inner = UdpEndpoint(ProbeSession("nicA"), "127.0.0.1")
    got: list[Any] = []
    tracing = TracingEndpoint(inner, PathTracer(), 4, got.extend)
    assert inner.on_icmp == tracing.discovery.handle_icmp
    lost = ProbeLost(
        seq=7, src="nicA", dst="nicB", sport=50000, pair_id=0, pair_pos=0, t1=1, sent_ns=1
    )
    assert inner.on_events is not None
    inner.on_events([TraceReached(seq=99, sender=1, rx_ns=5), lost])
    assert got == [lost]  # the trace result went to discovery (an unmatched round there)
    assert tracing.discovery.tracer.counters["unmatched"] == 1
    assert tracing.session is inner.session
    assert tracing.resolve("nicB", ("10.0.0.2", 4791)) == ("10.0.0.2", 4791)


def test_the_factory_owns_its_background_tasks() -> None:
    from prober.endpoint import udp_endpoint_factory

    cfg = parse_config({"prober": {"host": "h"}, "nics": [{"id": "nic0", "address": "127.0.0.1"}]})
    assert udp_endpoint_factory(cfg).agent_tasks(object()) == []


def test_a_nic_link_change_publishes_health_at_once() -> None:
    """The controller tells a NIC that lost its link from a dead prober by the health report:
    it goes out when the link changes, not a telemetry interval later."""
    links = {"lo": True}
    agent = Agent(config(), link_reader=links.get)
    sent: list[dict[str, Any]] = []
    agent.publish_health = lambda: sent.append(dict(links))  # type: ignore[method-assign]
    assert agent.check_links() is False  # first reading
    assert agent.check_links() is False and not sent  # nothing changed
    links["lo"] = False
    assert agent.check_links() is True and sent == [{"lo": False}]
    assert agent.check_links() is False and len(sent) == 1


def test_link_reading_of_sysfs_files(tmp_path: Path) -> None:

    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "operstate").write_text("up\n")
    (tmp_path / "eth0" / "carrier").write_text("1\n")
    (tmp_path / "eth1").mkdir()
    (tmp_path / "eth1" / "operstate").write_text("down\n")  # carrier unreadable when down
    assert read_link_up("eth0", tmp_path) is True
    assert read_link_up("eth1", tmp_path) is False
    assert read_link_up("eth9", tmp_path) is None


def test_hot_path_picks_the_session_and_endpoint() -> None:
    """The UDP factory makes each NIC's session and endpoint for its hot path, wraps them in
    path discovery when ``[paths]`` is on and reports what the agent needs to know of them
    (`NicTransport`): the agent asks no endpoint for its class."""
    from prober.endpoint import udp_endpoint_factory
    from prober.fastudp import BatchUdpEndpoint
    from prober.pathdisc import TracingEndpoint
    from prober.session import ProbeSession
    from prober.udp import UdpEndpoint
    from prober.wire import Codec

    nic = {"nics": [{"id": "nic0", "address": "127.0.0.1"}]}
    for hot_path, cls in (("batched", BatchUdpEndpoint), ("per-datagram", UdpEndpoint)):
        for paths in (True, False):
            cfg = parse_config({"prober": {"host": "h", "hot_path": hot_path},
                                "paths": {"enabled": paths}, **nic})  # fmt: skip
            factory = udp_endpoint_factory(cfg)
            assert factory.hot_path == hot_path
            made = factory(cfg.nics[0], Codec(b"k" * 32), (), lambda e: None)
            assert type(inner(made)) is cls and made.ticked is None
            assert type(made.endpoint) is (TracingEndpoint if paths else cls)
            assert (made.discovery is not None) is paths
            session = made.endpoint.session
            assert type(session) is ProbeSession and session.codec.authenticated
            assert session.nic_id == "nic0" and session.timeout_ns == cfg.timeout_ms * 1_000_000


def test_compiled_hot_path_and_its_fallbacks() -> None:
    from prober import compiled
    from prober.endpoint import session_hot_path
    from prober.rdma.transport import rdma_endpoint_factory
    from prober.wire import Codec

    nic = {"nics": [{"id": "nic0", "address": "127.0.0.1"}]}
    cfg = parse_config({"prober": {"host": "h", "hot_path": "compiled"}, **nic})
    assert session_hot_path(cfg, built=True) == "compiled"
    # (probe HMAC does not change it: the engine tags and verifies); the per-datagram config
    # is the A/B switch; no extension built, RDMA: the per-datagram path
    per = parse_config({"prober": {"host": "h", "hot_path": "per-datagram"}, **nic})
    assert session_hot_path(per, built=True) == "per-datagram"
    assert session_hot_path(cfg, built=False) == "per-datagram"
    rdma = parse_config({"prober": {"host": "h", "hot_path": "compiled", "transport": "rdma"},
                         **nic})  # fmt: skip
    assert session_hot_path(rdma, built=True) == "per-datagram"
    assert rdma_endpoint_factory(rdma).hot_path == "per-datagram"
    batched = parse_config({"prober": {"host": "h", "hot_path": "batched"}, **nic})
    assert session_hot_path(batched, built=True) == "batched"
    rdma_batched = parse_config({"prober": {"host": "h", "hot_path": "batched",
                                            "transport": "rdma"}, **nic})  # fmt: skip
    assert rdma_endpoint_factory(rdma_batched).hot_path == "batched"  # as the agent said before
    if compiled.available():
        agent = Agent(cfg)
        assert agent.hot_path == "compiled"
        made = agent._factory(cfg.nics[0], Codec(), (), lambda e: None)
        ep = inner(made)
        assert type(ep) is compiled.CompiledUdpEndpoint and made.ticked is ep
        assert ep.external_ticks  # the agent's one driver ticks it, not its own `run`
        session = ep.session
        assert isinstance(session, compiled.CompiledSession)
        assert session.defer_follow_ups == cfg.defer_follow_ups
        assert session.hold_ns == cfg.follow_up_hold_ms * 1_000_000
        # a real host's clock is the identity the engine knows: no stamp goes through Python
        # (the agent once passed its own identity function: a Python call per stamp)
        from prober.udp import identity_clock

        assert ep.clock is identity_clock


def test_trace_timer_paces_sweeps_like_the_trace_loop() -> None:
    import itertools

    from prober.pathsweep import TraceTimer

    t = TraceTimer(flows=5, gap_s=0.1, refresh_s=2.0, now_s=100.0)
    started: list[int] = []
    idles = []
    now = 100.0
    while now < 104.5:  # a 10 ms tick
        due, idle = t.due(now)
        started += list(due)
        if idle:
            idles.append(round(now, 2))
        now = round(now + 0.01, 2)
    # two sweeps of flows 0..4, 0.1 s apart, the second 2 s after the first began; a third at 104
    assert started == [0, 1, 2, 3, 4] * 3
    assert len(idles) >= 2 and all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(idles))
    late = TraceTimer(flows=10, gap_s=0.1, refresh_s=0.0, now_s=0.0)
    assert list(late.due(0.55)[0]) == [0, 1]  # behind: catches up 2 per step, not in a burst
    assert list(late.due(0.56)[0]) == [2, 3]
    assert list(late.due(0.57)[0]) == [4, 5]
    assert list(late.due(0.58)[0]) == []


def test_driven_queueing_queues_what_the_per_probe_queueing_did() -> None:
    """The driver's hook queues from `ProbePlan.due_rows` (`Agent._queue_rows`): the same
    sessions get the same calls (peer, address, port, time in the NIC's clock, spacing) as
    `Agent._queue` from `ProbePlan.due`, for coded pairs and single probes, with NIC clocks
    that differ from the plan's."""

    class Recorder:
        def __init__(self, nic: str, calls: list[tuple[Any, ...]]) -> None:
            self.nic, self.calls = nic, calls

        def queue_pair(self, dst: str, dest: Any, sport: int, at: int, spacing: int) -> int:
            self.calls.append(("pair", self.nic, dst, dest, sport, at, spacing))
            return 0

        def queue_probe(self, dst: str, dest: Any, sport: int, at: int) -> None:
            self.calls.append(("probe", self.nic, dst, dest, sport, at))

    for coded in (True, False):
        cfg = config()
        cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, coded=coded))
        calls: dict[str, list[tuple[Any, ...]]] = {"old": [], "new": []}
        agents = {}
        for name, recorded in calls.items():
            agent = Agent(cfg, now_ns=lambda: 0)
            agent.endpoints = {"nic0": FakeEndpoint(0), "nic1": FakeEndpoint(5 * 10**9)}  # type: ignore[dict-item]
            agent.sessions = {n: Recorder(n, recorded) for n in ("nic0", "nic1")}  # type: ignore[misc]
            agents[name] = agent
        for tick in range(1, 400):
            plan_now = tick * 10_000_000
            for agent in agents.values():
                for ep in agent.endpoints.values():
                    ep.t = plan_now + 1234  # type: ignore[attr-defined]
            lead = plan_now + 10_000_000
            agents["old"]._queue(agents["old"].plan.due(lead), plan_now)
            agents["new"]._queue_rows(agents["new"].plan.due_rows(lead), plan_now)
        assert len(calls["old"]) > 200 and calls["new"] == calls["old"]
        assert agents["new"].stats.probes_queued == agents["old"].stats.probes_queued
        assert {c[0] for c in calls["new"]} == {"pair" if coded else "probe"}


def test_the_agent_plans_around_a_source_port_another_socket_holds() -> None:
    """A planned source port that another socket of the host holds is not planned (the
    prober's start failed on it: 'Address already in use'); the schedule restarted at run
    keeps the ports the endpoints opened."""
    cfg = config()
    first = Agent(cfg, now_ns=lambda: 0).plan.ports
    nic, port = next((n, ps[0]) for n, ps in sorted(first.items()) if ps)
    addr = next(n.address for n in cfg.nics if n.id == nic)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((addr, port))
        agent = Agent(cfg, now_ns=lambda: 0)
    assert port not in agent.plan.ports[nic] and len(agent.plan.ports[nic]) == len(first[nic])
    assert set(agent.plan.ports[nic]) - set(first[nic]) != set()
    again = ProbePlan(agent.peers, cfg.schedule, start_ns=5, ports=agent.plan.ports)
    assert again.ports == agent.plan.ports


def test_a_late_prober_reports_its_send_slip_in_its_health() -> None:
    """Issue 32: a starved prober says so. The driver's hook that runs 3 s after the plan's
    next probe was due notes 3 s of slip; the next health document carries the worst slip
    since the previous one (`HealthDoc.send_slip_ns`), and the one after that 0."""

    class Recorder:
        def __init__(self) -> None:
            self.counters = {"bad_auth": 0}

        def queue_pair(self, dst: str, dest: Any, sport: int, at: int, spacing: int) -> int:
            return 0

        def queue_probe(self, dst: str, dest: Any, sport: int, at: int) -> None:
            pass

    clock = [0]
    agent = Agent(config(), now_ns=lambda: clock[0])
    agent.endpoints = {"nic0": FakeEndpoint(0), "nic1": FakeEndpoint(0)}  # type: ignore[dict-item]
    agent.sessions = {n: Recorder() for n in ("nic0", "nic1")}  # type: ignore[misc]
    sent: list[dict[str, Any]] = []
    agent.publisher.set_health = sent.append  # type: ignore[method-assign,assignment]
    due = agent.plan.next_at_ns()
    assert due is not None
    clock[0] = due + 3_000_000_000
    agent._driver_hook()
    agent.publish_health()
    agent.publish_health()
    assert [d["send_slip_ns"] for d in sent] == [3_000_000_000, 0]
    assert HealthDoc.decode(json.dumps(sent[0]).encode()).send_slip_ns == 3_000_000_000
