"""Service: config validation, message dispatch, and an end-to-end run on a real mosquitto."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from contract.origin import split_by_host
from contract.records import encode_batch
from contract.topics import TopicError, Topics
from controller.admission import Outcome
from controller.config import ConfigError, ServiceConfig, load_config
from controller.dispatch import JsonLog, handle_message, nic_hosts
from controller.live import LiveConfig, LiveController
from controller.service import Broker, run_service
from controller.service_cli import parse_broker
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import flow_paths
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator


def test_topics_layout() -> None:
    t = Topics()
    assert t.probes("host3") == "qpmesh/v1/probes/host3"
    assert t.presence("host3") == "qpmesh/v1/presence/host3"
    assert t.events("link_flap") == "qpmesh/v1/events/link_flap"
    assert t.subscription("probes", "ctl") == "$share/ctl/qpmesh/v1/probes/#"
    assert t.parse("qpmesh/v1/health/host1") == ("health", "host1")
    for bad in ("qpmesh/v1/nope/x", "other/probes/x", "qpmesh/v1/probes/a/b"):
        with pytest.raises(TopicError):
            t.parse(bad)
    with pytest.raises(TopicError):
        Topics("a/+/b")
    with pytest.raises(TopicError):
        t.probes("a/b")


def test_config_validation(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[fabric]\nleaves = 2\nhosts_per_leaf = 2\nspines = 2\n[controller]\ntick_s = 0.5\n"
    )
    sc = load_config(cfg)
    assert len(sc.fabric.nics) == 4 and sc.tick_s == 0.5
    fab_json = tmp_path / "fab.json"
    fab_json.write_text(json.dumps(build_fabric(FabricShape(leaves=3)).to_dict()))
    cfg.write_text('[fabric]\nfile = "fab.json"\n[sync]\nwindow_s = 5\n')
    sc = load_config(cfg)
    assert len(sc.fabric.leaves) == 3 and sc.live.sync.window_ns == 5_000_000_000
    # the clock-trust gate's knobs reach ClockSyncConfig (defaults where unset)
    assert sc.live.sync.max_unc_ns == 1000.0 and sc.live.sync.min_span_ns == 1_000_000_000
    cfg.write_text("[sync]\nmax_unc_ns = 250\nmin_span_s = 0.5\nwarmup_bins = 2\n")
    sy = load_config(cfg).live.sync
    assert (sy.max_unc_ns, sy.min_span_ns, sy.warmup_bins) == (250.0, 500_000_000, 2)
    cfg.write_text("[sync]\ncoded_tol_hw_ns = 40\nquant_hw_ns = 3.2\nbins = 16\n")
    sy = load_config(cfg).live.sync
    assert (sy.coded_tol_hw_ns, sy.quant_hw_ns, sy.bins) == (40, 3.2, 16)
    cfg.write_text("[thresholds]\nsilent_ns = 0\n")
    assert load_config(cfg).brain.silent_ns == 0
    cfg.write_text("[thresholds.loss]\nmin_probes = 7\n")
    assert load_config(cfg).brain.loss.min_probes == 7
    for text, msg in (
        ("[fabric]\nleaves = 'x'\n", r"c\.toml: fabric\.leaves: must be an integer"),
        ("[fabric]\nleaves = 0\n", r"c\.toml: fabric: "),
        ("[nope]\n", r"c\.toml: nope: unknown section"),
        ("[sync]\nwindo_s = 1\n", r"c\.toml: sync\.windo_s: unknown key"),
        ("[fabric]\nfile = 'missing.json'\n", "cannot read fabric file"),
        ("[fabric\n", r"c\.toml"),
        ("[thresholds]\nnope = 1\n", r"c\.toml: thresholds\.nope: unknown key"),
        ("[thresholds]\nsilent_ns = -1\n", r"c\.toml: thresholds: silent_ns must be >= 0"),
        ("[thresholds.loss]\nnot_a_field = 1\n", r"thresholds\.loss\.not_a_field: unknown key"),
        # strict types, no coercion: bool("false") would be True, int("3") would pass
        ('[sync]\nuse_uncoded = "false"\n', r"c\.toml: sync\.use_uncoded: must be true or false"),
        ('[controller]\nmax_events = "3"\n', r"c\.toml: controller\.max_events: must be"),
        ("[controller]\ntick_s = true\n", r"c\.toml: controller\.tick_s: must be"),
        (
            "[fabric]\nleaves = 2\n[paths]\nrouters = {'10.0.0.1' = 'nope'}\n",
            r"paths\.routers\.10\.0\.0\.1: unknown",
        ),
        # no [fabric] shape: learned, so the routers are named in [fabric.routers]
        ("[paths]\nrouters = {'10.0.0.1' = 'spine0'}\n", r"c\.toml: paths\.routers: a learned"),
        ("[fabric]\nplan = 'missing.json'\n", "cannot read fabric file"),
        ("[fabric]\nrouters = {'10.0.0.1' = 'a b'}\n", r"fabric\.routers\.10\.0\.0\.1: must be a"),
        ("[fabric]\nrelearn_s = -1\n", r"c\.toml: fabric\.relearn_s: must be 0\.\.3600"),
        ("[fabric]\nleaves = 2\nplan = 'p.json'\n", r"c\.toml: fabric\.plan: unknown key"),
        ("[fleet]\npartitions = 4\n", r"c\.toml: fleet: needs a \[nats\] table"),
        ("[sync]\nmax_unc_ns = 0\n", r"c\.toml: sync\.max_unc_ns: must be a number of ns > 0"),
        ("[sync]\nmax_unc_ns = inf\n", r"c\.toml: sync\.max_unc_ns: must be"),
        ('[sync]\nmax_unc_ns = "1000"\n', r"c\.toml: sync\.max_unc_ns: must be"),
        ("[sync]\nmin_span_s = -1\n", r"c\.toml: sync\.min_span_s: must be a number of s >= 0"),
        ("[sync]\nwarmup_bins = 0\n", r"c\.toml: sync\.warmup_bins: must be an integer in"),
        ("[sync]\nwarmup_bins = 2.5\n", r"c\.toml: sync\.warmup_bins: must be"),
        ("[sync]\nbins = 0\n", r"c\.toml: sync\.bins: must be an integer in 1\.\.1024"),
        ("[sync]\ncoded_tol_hw_ns = -1\n", r"c\.toml: sync\.coded_tol_hw_ns: must be an"),
        ("[sync]\nquant_hw_ns = -0.5\n", r"c\.toml: sync\.quant_hw_ns: must be a number"),
        ("[sync]\nwindow_s = 1e-10\n", r"c\.toml: sync: window and solve period must be > 0"),
    ):
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=msg) as err:
            load_config(cfg)
        assert "\n" not in str(err.value)
    assert parse_broker("mqtt://127.0.0.1:1884") == ("127.0.0.1", 1884)
    with pytest.raises(ConfigError):
        parse_broker("tcp://x:1")


def test_handle_message_dispatch() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    live = LiveController(fab)
    t = Topics()
    st = Simulator(fab, SimConfig(peers=4)).step(0.0, 0.5)
    host0 = np.isin(st.batch.src, [n.index for n in fab.nics_of_host("host0")])
    payload = encode_batch(replace(st.batch.select(host0), origin="host0"))
    assert handle_message(live, t, t.probes("host0"), payload, EPOCH_NS) == "probes"
    assert handle_message(live, t, t.probes("host0"), payload, EPOCH_NS) == "duplicate"
    assert handle_message(live, t, t.probes("host0"), b"junk", EPOCH_NS).startswith("bad:")
    assert handle_message(live, t, t.presence("host1"), b'{"alive": "x"}', EPOCH_NS).startswith(
        "bad:"
    )
    assert handle_message(live, t, t.presence("host1"), b'{"alive": false}', EPOCH_NS) == "presence"
    assert handle_message(live, t, t.health("host2"), b'{"gpu_ok": false, "detail": "xid"}', 1) == (
        "health"
    )
    assert handle_message(live, t, "elsewhere/x", b"", EPOCH_NS) == "ignored"
    assert live.alive["host1"] is False and not live.gpu_state["host2"].ok


_WILL_CLIENT = """
import asyncio, json, sys, aiomqtt
async def main():
    host, port, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    will = aiomqtt.Will(topic, json.dumps({"alive": False, "t_ns": 0}), qos=1, retain=True)
    async with aiomqtt.Client(host, port, will=will, identifier="will-host0") as c:
        await c.publish(topic, json.dumps({"alive": True, "t_ns": 0}), qos=1, retain=True)
        print("ready", flush=True)
        await asyncio.sleep(60)
asyncio.run(main())
"""


@pytest.mark.broker
async def test_service_end_to_end(mosquitto: tuple[str, int], tmp_path: Path) -> None:
    host, port = mosquitto
    fab = build_fabric(FabricShape.for_nics(16))
    topics = Topics("qpmesh/test")
    sim = Simulator(fab, SimConfig(peers=4, seed=7))
    steps = list(sim.run(2.0, 0.5))
    t0 = time.monotonic_ns()

    def clock() -> int:  # the simulator's timebase, advancing in real time
        return EPOCH_NS + 2_000_000_000 + (time.monotonic_ns() - t0)

    live = LiveController(fab, LiveConfig(solve_inline=False))  # solves in a worker thread
    log_path = tmp_path / "log.jsonl"
    log_file = log_path.open("w")
    config = ServiceConfig(fabric=fab, tick_s=0.1)
    svc = asyncio.create_task(
        run_service(
            Broker(host, port, topics),
            config,
            log=JsonLog(log_file),
            live=live,
            clock=clock,
        )
    )
    prober = subprocess.Popen(
        [sys.executable, "-c", _WILL_CLIENT, host, str(port), topics.presence("host0")],
        stdout=subprocess.PIPE,
    )
    try:
        assert prober.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(prober.stdout.readline), 20)
        assert line.strip() == b"ready"
        async with aiomqtt.Client(host, port) as client:
            await client.subscribe(topics.subscription("events"), qos=1)
            # wait until the service subscribed (it logs "connected")
            for _ in range(200):
                if "connected" in log_path.read_text():
                    break
                await asyncio.sleep(0.05)
            expected = 0
            for st in steps:  # as each host's prober publishes them
                for h, b in split_by_host(st.batch, nic_hosts(fab)).items():
                    await client.publish(topics.probes(h), encode_batch(b), qos=1)
                    expected += len(b)
            # a replayed batch must not count twice
            h, b = next(iter(split_by_host(steps[0].batch, nic_hosts(fab)).items()))
            await client.publish(topics.probes(h), encode_batch(b), qos=1)
            prober.kill()  # abrupt death: the broker publishes the last-will
            prober.wait(timeout=10)
            got: list[dict[str, object]] = []

            async def collect() -> None:
                async for msg in client.messages:
                    assert isinstance(msg.payload, bytes)
                    got.append(json.loads(msg.payload))
                    if any(e["kind"] == "prober_down" and e["target"] == "host0" for e in got):
                        return

            await asyncio.wait_for(collect(), 20)
            # prober_down may come from the host's silence before the will is handled
            for _ in range(200):
                if live.records >= expected and live.solves and not live.alive["host0"]:
                    break
                await asyncio.sleep(0.05)
        assert live.records == expected
        assert live.solves >= 1 and np.isfinite(live.snapshot().clock_offset_ns).any()
        assert live.verdicts()[Outcome.DUPLICATE] == 1
        assert live.alive["host0"] is False
        assert str(got[-1]["kind"]) == "prober_down"
    finally:
        if prober.poll() is None:
            prober.kill()
            prober.wait(timeout=10)
        svc.cancel()
        with pytest.raises(asyncio.CancelledError):
            await svc
        log_file.close()
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert any(x["msg"] == "event" and x["kind"] == "prober_down" for x in lines)


async def test_service_backs_off_and_retries_when_broker_unreachable(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a free port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fab = build_fabric(FabricShape.for_nics(16))
    log_path = tmp_path / "log.jsonl"
    with log_path.open("w") as f:
        live = await asyncio.wait_for(
            run_service(
                Broker("127.0.0.1", port), ServiceConfig(fabric=fab, backoff_s=(0.01, 0.02)),
                log=JsonLog(f), live=LiveController(fab), max_attempts=3,
            ),
            30,
        )  # fmt: skip
    assert live.records == 0
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    errors = [x for x in lines if x["msg"] == "broker error"]
    assert [x["retry_in_s"] for x in errors] == [0.01, 0.02, 0.02]


def test_discovered_paths_override_model_paths_forward_and_reply(tmp_path: Path) -> None:
    fabric = build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, spines=2))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[fabric]\nleaves = 2\nhosts_per_leaf = 2\nspines = 2\n"
        '[paths.routers]\n"10.0.0.254" = "leaf0"\n"172.16.0.9" = "spine1"\n"10.0.1.254" = "leaf1"\n'
    )
    conf = load_config(cfg)
    assert conf.router_nodes["172.16.0.9"] == "spine1"
    bad = tmp_path / "b.toml"
    bad.write_text('[paths.routers]\n"1.2.3.4" = "spine9"\n')
    with pytest.raises(ConfigError):
        load_config(bad)
    live = LiveController(fabric, LiveConfig())
    t = Topics()
    doc = [
        {"src": "nic0", "dst": "nic2", "sport": 50000, "reached": True,
         "hops": ["10.0.0.254", "172.16.0.9", "10.0.1.254"]},
        {"src": "nic0", "dst": "nic3", "sport": 50000, "reached": True,
         "hops": ["10.0.0.254", None, "10.0.1.254"]},  # silent hop: ignored
    ]  # fmt: skip
    out = handle_message(live, t, t.paths("host0"), json.dumps(doc).encode(), 0, conf.router_nodes)
    assert out == "paths"
    src, dst, sp = np.array([0]), np.array([2]), np.array([50000])
    fwd, rev, known = live.paths(src, dst, sp)
    names = [fabric.hop_name(int(h)) for h in fwd[0] if h >= 0]
    assert names == ["nic0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->nic2"]
    back = [fabric.hop_name(int(h)) for h in rev[0] if h >= 0]
    assert back == ["nic2->leaf1", "leaf1->spine1", "spine1->leaf0", "leaf0->nic0"]
    assert known[0]
    # the trace with a silent hop was not learnt: the model's path stands for nic0 -> nic3
    model = flow_paths(fabric, np.array([0]), np.array([3]), sp)
    assert (live.paths(np.array([0]), np.array([3]), sp)[0] == model).all()
    assert handle_message(live, t, t.paths("host0"), b"{}", 0, conf.router_nodes).startswith("bad:")


async def test_model_paths_off_leaves_undiscovered_flows_unknown(tmp_path: Path) -> None:
    import socket

    cfg = tmp_path / "c.toml"
    cfg.write_text('[fabric]\nleaves = 2\nhosts_per_leaf = 2\nspines = 2\n[paths]\nmodel = false\n'
                   '[paths.routers]\n"10.0.0.254" = "leaf0"\n"172.16.0.9" = "spine0"\n'
                   '"10.0.1.254" = "leaf1"\n')  # fmt: skip
    conf = load_config(cfg)
    assert conf.model_paths is False and load_config(None).model_paths is True
    bad = tmp_path / "b.toml"
    bad.write_text('[paths]\nmodel = "no"\n')
    with pytest.raises(ConfigError):
        load_config(bad)
    with socket.socket() as s:  # nothing listening: the service returns its live state
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = ServiceConfig(fabric=conf.fabric, backoff_s=(0.01, 0.01), router_nodes=conf.router_nodes,
                         model_paths=False)  # fmt: skip
    with (tmp_path / "log.jsonl").open("w") as f:
        live = await asyncio.wait_for(
            run_service(Broker("127.0.0.1", port), conf, log=JsonLog(f), max_attempts=1), 30
        )
    t = Topics()
    doc = [{"src": "nic0", "dst": "nic2", "sport": 50000, "reached": True,
            "hops": ["10.0.0.254", "172.16.0.9", "10.0.1.254"]}]  # fmt: skip
    handle_message(live, t, t.paths("host0"), json.dumps(doc).encode(), 0, conf.router_nodes)
    src, dst = np.array([0, 0]), np.array([2, 3])
    fwd, rev, known = live.paths(src, dst, np.array([50000, 50000]))
    assert known.tolist() == [True, False]  # nic0 -> nic3 was never traced: no model guess
    assert (fwd[1] == -1).all() and (rev[1] == -1).all()
    assert [conf.fabric.hop_name(int(h)) for h in fwd[0] if h >= 0][1] == "leaf0->spine0"


def test_a_failing_clock_solve_is_logged_and_counted_never_fatal() -> None:
    import asyncio
    import io

    from controller.dispatch import JsonLog
    from controller.live import LiveController
    from controller.service import Wiring, _solver

    fab = build_fabric(FabricShape(leaves=1, hosts_per_leaf=2, spines=1))
    live = LiveController(fab)
    installed: list[object] = []

    def boom() -> None:
        raise FloatingPointError("singular network solve")

    live.start_solve = lambda now_ns: boom  # type: ignore[method-assign,assignment,return-value]
    live.install_clock = lambda state: installed.append(state) or True  # type: ignore[method-assign,func-returns-value]
    counters: dict[str, int] = {}
    out = io.StringIO()

    async def main() -> bool:
        w = Wiring(Broker("127.0.0.1", 1), ServiceConfig(fab, tick_s=0.001), live, lambda: 5,
                   JsonLog(out), counters)  # fmt: skip
        task = asyncio.create_task(_solver(w))
        for _ in range(5000):  # until three solves failed (bounded: no wall-clock assertion)
            if counters.get("solve_failed", 0) >= 3:
                break
            await asyncio.sleep(0.001)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(main()), "the solver task died with its solve"
    assert counters["solve_failed"] >= 3 and installed == []
    assert "clock solve failed" in out.getvalue() and "singular network solve" in out.getvalue()
