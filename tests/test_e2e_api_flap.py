"""End to end, every part real: mosquitto, victoria-metrics, a `qpmesh controller` process with
``[api]`` and ``[timeseries]``, the simulator publishing each host's probe batches over MQTT
in real time (stamps moved to now, so the controller runs on its own wall clock), and
``qpmesh tui --api`` in tmux. A link flap injected in the simulator appears in the API's
events, on its websocket, in the time series and on the TUI's screen. Processes are stopped by
PID, the tmux session (unique name) is killed by name, also on failure."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import aiomqtt
import pytest

from contract.origin import split_by_host
from contract.records import encode_batch
from contract.topics import Topics
from controller.dispatch import nic_hosts
from mesh.fabric import FabricShape, build_fabric
from prober.agent import health_doc
from prober.telemetry.gpu import GpuReading
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelKnobs
from tests.servers import free_port
from tests.test_timeseries_vm import VM, VictoriaMetrics
from tests.waiting import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.broker,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
    pytest.mark.skipif(not Path(VM).exists(), reason="needs victoria-metrics"),
]
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "e2e-operator-token"
PREFIX = "qpmesh/e2e"
FLAP = "leaf1-spine1"


def _capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


async def test_a_flap_reaches_api_websocket_time_series_and_tui(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    vm = VictoriaMetrics(tmp_path / "vm-data", tmp_path / "vm.log")
    vm.start()
    api_port = free_port()
    conf = tmp_path / "controller.toml"
    conf.write_text(
        "[fabric]\nleaves = 3\nspines = 2\nhosts_per_leaf = 3\nnics_per_host = 1\n"
        "[controller]\ntick_s = 0.2\n"
        f'[api]\nlisten = "127.0.0.1:{api_port}"\noperator_token = "{TOKEN}"\n'
        "ws_min_interval_s = 0.1\n"
        f'[timeseries]\nurl = "{vm.url}"\ninterval_s = 1.0\n'
    )
    log = tmp_path / "controller.log"
    procs: list[subprocess.Popen[bytes]] = []
    session = f"qpmesh-e2e-{uuid.uuid4().hex[:10]}"
    try:
        with log.open("wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "qpmesh.cli", "controller", "--config", str(conf),
                 "--broker", f"mqtt://{host}:{port}", "--prefix", PREFIX],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        base = f"http://127.0.0.1:{api_port}/api/v1/"
        hdr = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=hdr) as http:

            async def api_up() -> bool:
                assert procs[0].poll() is None, log.read_text()[-3000:]
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "health") as r:
                        return r.status == 200
                return False

            await until(api_up, 60, every_s=0.25)
            # the TUI attached over the API, in a real terminal
            cmd = (f"env -u COLUMNS -u LINES {sys.executable} -m qpmesh.cli tui --api "
                   f"http://127.0.0.1:{api_port} --token {TOKEN}; echo TUI-EXITED $?; sleep 120")  # fmt: skip
            subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "50",
                            "-c", str(ROOT), cmd], check=True)  # fmt: skip
            subprocess.run(["tmux", "resize-window", "-t", session, "-x", "150", "-y", "50"],
                           check=True)  # fmt: skip
            await until(lambda: "● live" in _capture(session), 60, every_s=0.25)
            ws = await http.ws_connect(base + "ws")
            # the simulator, each host's batches on its own topic, in real time from now
            fab = build_fabric(FabricShape(leaves=3, spines=2, hosts_per_leaf=3))
            flap = Fault(FaultKind.FLAP, FLAP, 3.0, 9.0, down_s=1.0, up_s=2.0)
            sim = Simulator(fab, SimConfig(peers=4, seed=3, model=ModelKnobs.ideal_model()),
                            faults=(flap,))  # fmt: skip
            topics = Topics(PREFIX)
            shift = time.time_ns() - EPOCH_NS
            start = time.monotonic()
            ws_events: list[tuple[str, str]] = []

            async def read_ws() -> None:
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        doc = msg.json()
                        if doc["type"] == "event":
                            ws_events.append((doc["data"]["kind"], doc["data"]["target"]))

            reader = asyncio.create_task(read_ws())
            async with aiomqtt.Client(host, port) as client:
                # each host's prober reports its NIC's byte counters twice, 1 s apart:
                # 12.5 GB received in 1 s = 100 Gb/s per NIC, the header's throughput
                first = time.time_ns()
                for k in range(2):
                    stamp = first + k * 1_000_000_000  # the prober's clock: exactly 1 s on
                    for nic in fab.nics:
                        nics = {nic.id: {"counters": {"rx_bytes": k * 12_500_000_000,
                                                      "tx_bytes": 0}}}  # fmt: skip
                        doc = health_doc(nic.host, stamp, GpuReading(False), None, nics, {})
                        await client.publish(topics.health(nic.host), json.dumps(doc), qos=1)
                    if not k:
                        await asyncio.sleep(1.0)
                t = 0.0
                while t < 16.0:
                    st = sim.step(t, 0.5)
                    b = st.batch
                    b = dataclasses.replace(b, t1=b.t1 + shift, t2=b.t2 + shift,
                                            t3=b.t3 + shift, t4=b.t4 + shift)  # fmt: skip
                    for h, hb in split_by_host(b, nic_hosts(fab)).items():
                        await client.publish(topics.probes(h), encode_batch(hb), qos=1)
                    t = st.t1_s
                    await asyncio.sleep(max(0.0, start + t - time.monotonic()))
                    if ("link_flap", FLAP) in ws_events:
                        break
                await until(lambda: ("link_flap", FLAP) in ws_events, 60, every_s=0.25)
            reader.cancel()
            await ws.close()
            async with http.get(base + "snapshot") as r:
                snap = await r.json()
            assert snap["throughput_bps"] == pytest.approx(100e9)
            assert snap["control_enabled"] is False and snap["running_jobs"] == 0
            # the API's event log
            async with http.get(base + "events?kind=link_flap") as r:
                events = (await r.json())["events"]
            assert {e["target"] for e in events} == {FLAP}
            async with http.get(base + "links") as r:
                links = {lk["id"]: lk for lk in (await r.json())["links"]}
            assert links[FLAP]["flaps"] >= 1
        # the TUI attached over the API shows it in its events pane, and the controller's
        # throughput, Control and jobs in its header
        await until(lambda: f"link_flap {FLAP}" in _capture(session), 60, every_s=0.25)
        screen = _capture(session)
        assert "Control Disabled" in screen and "Running jobs 0" in screen, screen
        assert "Avg NIC throughput 100.0 Gb/s" in screen, screen
        # and the time series has it (the controller writes every 1 s interval)

        def in_vm() -> bool:
            rows = vm.export('{__name__=~"qpmesh_event.*", kind="link_flap"}')
            return any(r["metric"].get("target") == FLAP for r in rows)

        await until(in_vm, 60, every_s=1.0)
        flaps = vm.export(f'{{__name__="qpmesh_link_flaps", link="{FLAP}"}}')
        assert flaps and max(max(r["values"]) for r in flaps) >= 1
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(15)
        vm.stop()
