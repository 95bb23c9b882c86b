"""``qpmesh controller``'s service with probers' signals documents through a real broker: a
job registered over MQTT (its ranks), its step times reported, every host's signals every
window; a PCIe fault on one of the job's NICs while the job runs 1.6x slower comes out as an
``anomaly`` event and a ``root_cause`` event naming that NIC on ``<prefix>/events/<kind>``,
in the live state's events (`LiveController.record_events`) and in the JSON-lines log.

Time is the test's: the service's clock is a value the test moves a window at a time, once
every host's document of the window is in (so no window is judged half-read)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest

from contract.remediation import PerfDoc, RankDoc, perf_topic, rank_topic
from contract.topics import Topics
from controller.config import ServiceConfig
from controller.crosslayer import CrossLayer
from controller.dispatch import JsonLog
from controller.live import LiveController
from controller.service import Broker, run_service
from controller.timeseries.config import TimeseriesConfig
from controller.timeseries.runtime import Observability
from controller.timeseries.writer import TsdbWriter
from tests.test_crosslayer_live import CFG, FABRIC, S, host_doc, hosts, job

T0 = 1_800_000_000 * S


async def test_signals_through_the_broker_become_anomaly_and_root_cause_events(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    topics = Topics("qpmesh/xl")
    now = [T0]
    xl = CrossLayer(FABRIC, CFG)
    live = LiveController(FABRIC)
    log_path = tmp_path / "log.jsonl"
    log_file = log_path.open("w")
    bodies: list[bytes] = []  # the time series, as the writer would POST them
    obs = Observability(FABRIC, TimeseriesConfig("http://unused", interval_s=60), None,
                        writer=TsdbWriter("http://unused", post=bodies.append))  # fmt: skip
    svc = asyncio.create_task(
        run_service(Broker(host, port, topics), ServiceConfig(fabric=FABRIC, tick_s=0.02),
                    log=JsonLog(log_file), live=live, clock=lambda: now[0], crosslayer=xl,
                    observability=obs)
    )  # fmt: skip
    the_job = job()
    bad = the_job.ranks[2][0]
    rng = np.random.default_rng(7)
    got: list[dict[str, Any]] = []
    try:
        async with aiomqtt.Client(host, port) as client:
            await client.subscribe(topics.subscription("events"), qos=1)
            for _ in range(400):
                if "connected" in log_path.read_text():
                    break
                await asyncio.sleep(0.05)
            for k, nics in enumerate(the_job.ranks):
                rank = RankDoc(the_job.id, k, nics)
                await client.publish(rank_topic(topics.prefix, the_job.id, k), rank.encode(),
                                     qos=1, retain=True)  # fmt: skip
            for w in range(30):
                t = T0 + (w + 1) * 10 * S
                now[0] = t - 5 * S  # documents arrive between two windows
                step_s = 0.16 if w >= 20 else 0.1
                for k in range(len(the_job.ranks)):
                    perf = PerfDoc(the_job.id, k, t, 10 * (w + 1), step_s)
                    await client.publish(perf_topic(topics.prefix, the_job.id, k), perf.encode(),
                                         qos=1)  # fmt: skip
                for h in hosts():
                    doc = host_doc(h, t, rng, bad if w >= 20 else "")
                    await client.publish(topics.signals(h), doc.encode(), qos=1)
                for _ in range(3000):  # every host's document of this window is in (<= 30 s busy)
                    if all(xl.docs.get(h, (0,))[0] == t - 5 * S for h in hosts()):
                        break
                    await asyncio.sleep(0.01)
                now[0] = t
                for _ in range(3000):  # the ticker ran this window
                    if xl.windows == w + 1:
                        break
                    await asyncio.sleep(0.01)
                assert xl.windows == w + 1

            async def collect() -> None:
                async for msg in client.messages:
                    assert isinstance(msg.payload, bytes)
                    got.append(json.loads(msg.payload))
                    if {"anomaly", "root_cause"} <= {e["kind"] for e in got}:
                        return

            await asyncio.wait_for(collect(), 20)
    finally:
        svc.cancel()
        with pytest.raises(asyncio.CancelledError):
            await svc
        log_file.close()
    anomaly = next(e for e in got if e["kind"] == "anomaly")
    assert anomaly["target"] == bad and "pcie_replay_timeout" in anomaly["detail"]
    cause = next(e for e in got if e["kind"] == "root_cause")
    assert cause["target"] == bad and cause["detail"].startswith(
        f"job {the_job.id}: step time 1.6x"
    )
    rc = xl.cause(the_job.id)
    assert rc is not None and (rc.cause, rc.target) == ("pcie", bad)
    kinds = {(e.kind, e.target) for e in live.snapshot().events}
    assert {("anomaly", bad), ("root_cause", bad)} <= kinds  # recorded through the live door
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert any(x["msg"] == "event" and x["kind"] == "root_cause" for x in lines)
    # the dashboard's series went to the time-series writer (docs/grafana/qpmesh-crosslayer.json)
    assert obs.timeseries is not None and obs.timeseries.writer.flush(10)
    body = b"".join(bodies)
    assert f"qpmesh_anomaly,entity={bad},kind=nic,signal=pcie_replay_timeout".encode() in body
    causes = [ln for ln in body.decode().splitlines() if ln.startswith("qpmesh_rootcause,")]
    assert any(f"target={bad}" in ln and "cause=pcie" in ln and "job=train" in ln for ln in causes)
    assert b"qpmesh_signal,entity=nic0,host=host0,kind=nic rdma_tx_bytes=" in body
