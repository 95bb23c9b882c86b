"""The fleet solver inside the controller service (``[fleet]``): a real mosquitto, a real
3-server NATS cluster, one worker and the solver on the fleet core's stand-in: the solved
windows' events go out on MQTT like the single controller's, probe batches on MQTT are not
read, and the ``[fleet]``/``[nats]`` tables."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiomqtt
import pytest

from contract.topics import Topics
from controller.config import ConfigError, FleetShellConfig, ServiceConfig, load_config
from controller.dispatch import JsonLog
from controller.fleet.plane import Plane
from controller.fleet.workerloop import WorkerLoop
from controller.service import Broker, run_service
from mesh.fabric import FabricShape, build_fabric
from mqttlink.reconnect import stop_tasks
from natslink.errors import NatsUnavailable
from natslink.link import Link, connect
from natslink.settings import NatsSettings
from natslink.streams import ensure_stream
from tests.fleetstub import StubSolver, StubWorker, batch
from tests.natscluster import Cluster, nats_cluster

__all__ = ["nats_cluster"]


def test_fleet_tables(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    fabric = "[fabric]\nleaves = 2\n"
    f.write_text(fabric + '[controller]\ntick_s = 5\n[nats]\nservers = ["nats://n1:4222"]\n'
                 '[fleet]\npartitions = 16\nid = "solver-a"\n')  # fmt: skip
    cfg = load_config(f)
    assert cfg.fleet is not None and cfg.fleet.member == "solver-a"
    assert cfg.fleet.plane.partitions == 16 and cfg.fleet.plane.window_ns == 5_000_000_000
    assert cfg.nats is not None and cfg.nats.servers == ("nats://n1:4222",)
    for text, msg in [
        ("[fleet]\npartitions = 4\n", "fleet: needs a [nats] table"),
        ('[nats]\nservers = ["nats://a:1"]\n[fleet]\npartitions = 0\n', "fleet.partitions"),
        ('[nats]\nservers = ["nats://a:1"]\n[fleet]\ngrace_s = -1\n', "fleet.grace_s"),
        ('[nats]\nservers = ["nats://a:1"]\n[fleet]\nid = "a.b"\n', "fleet: invalid fleet id"),
    ]:
        f.write_text(fabric + text)
        with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            load_config(f)
    # a learned fabric (no shape keys, no file), with a cabling plan: the fleet follows it
    (tmp_path / "plan.json").write_text(json.dumps(build_fabric(FabricShape(leaves=2)).to_dict()))
    f.write_text('[fabric]\nplan = "plan.json"\n[nats]\nservers = ["nats://a:1"]\n'
                 "[fleet]\npartitions = 4\n")  # fmt: skip
    learned = load_config(f)
    assert learned.fleet is not None and learned.learn is not None
    assert learned.learn.plan is not None and not learned.fabric.nics


async def _publish(link: Link, subject: str, payload: bytes, msg_id: str) -> None:
    for _ in range(100):  # a new R3 stream may still elect its leader
        try:
            await link.publish(subject, payload, msg_id=msg_id)
            return
        except NatsUnavailable:
            await asyncio.sleep(0.2)
    raise AssertionError("the stream never answered")


@pytest.mark.slow
@pytest.mark.broker
async def test_solver_in_the_service_publishes_windows_on_mqtt(
    nats_cluster: Cluster, mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    topics = Topics("qpmesh/test")
    plane = Plane(partitions=8, window_ns=2_000_000_000, grace_ns=500_000_000,
                  solver_wait_ns=1_000_000_000, max_bytes=64 << 20, duplicate_window_s=60)  # fmt: skip
    settings = NatsSettings(servers=nats_cluster.urls, timeout_s=2.0, connect_timeout_s=1.0,
                            backoff_min_s=0.1, backoff_max_s=0.5)  # fmt: skip
    fab = build_fabric(FabricShape.for_nics(16))
    config = ServiceConfig(fabric=fab, tick_s=0.1, nats=settings,
                           fleet=FleetShellConfig(plane, "solver-1"))  # fmt: skip
    log_path = tmp_path / "log.jsonl"
    log_file = log_path.open("w")
    log = JsonLog(log_file)
    solver = StubSolver()
    svc = asyncio.create_task(run_service(Broker(host, port, topics), config, log=log,
                                          fleet_core=lambda live: solver))  # fmt: skip
    worker = WorkerLoop(
        plane, settings, "w1", lambda p: StubWorker(plane.window_ns, plane.grace_ns), log=log
    )
    wtask = asyncio.create_task(worker.run())
    try:
        async with connect(settings, "t") as link:
            for _ in range(150):
                try:
                    await ensure_stream(link, plane.probe_stream_spec(settings.subjects))
                    break
                except NatsUnavailable:
                    await asyncio.sleep(0.2)
            async with aiomqtt.Client(host, port) as client:
                await client.subscribe(topics.subscription("events"), qos=1)
                for _ in range(300):  # MQTT connected, the solver active, partitions owned
                    text = log_path.read_text()
                    if ('"connected", "broker"' in text and "solver active" in text
                            and text.count("partition consuming") >= plane.partitions):  # fmt: skip
                        break
                    await asyncio.sleep(0.1)
                await client.publish(topics.probes("h1"), b"ignored in fleet mode", qos=1)
                sent: set[tuple[str, int]] = set()
                got: list[dict[str, object]] = []

                async def collect() -> None:
                    async for msg in client.messages:
                        assert isinstance(msg.payload, bytes)
                        got.append(json.loads(msg.payload))
                        if sum(int(str(e["detail"]).split()[0]) for e in got) >= len(sent) > 0:
                            return

                collector = asyncio.create_task(collect())
                for seq in range(1, 13):
                    for h in ("h1", "h2", "h3"):
                        await _publish(link, settings.subjects.probes(h),
                                       batch(h, seq, time.time_ns()), f"{h}:{seq}")  # fmt: skip
                        sent.add((h, seq))
                    await asyncio.sleep(0.25)
                await asyncio.wait_for(collector, 30)
        assert all(e["kind"] == "fleet_window" for e in got)
        assert sum(solver.counts.values()) == len(sent) and max(solver.counts.values()) == 1
        lines = [json.loads(x) for x in log_path.read_text().splitlines()]
        assert any(x["msg"] == "event" and x["kind"] == "fleet_window" for x in lines)
        assert any(x["msg"] == "solver active" for x in lines)
        assert not any(x["msg"] == "bad message" for x in lines)  # MQTT probes: not read
    finally:
        await stop_tasks((svc, wtask))
        log_file.close()
