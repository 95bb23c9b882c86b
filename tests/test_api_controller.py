"""``qpmesh controller`` with ``[api]``: config validation, and end to end — mosquitto, the
simulator publishing probe batches over MQTT, the real service: a link flap injected in the
simulator appears in the API's events and on its websocket."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
import aiomqtt
import pytest

from contract.origin import split_by_host
from contract.records import encode_batch
from contract.topics import Topics
from controller.config import ConfigError, load_config
from controller.dispatch import JsonLog, nic_hosts
from controller.service import Broker, live_state, run_service
from mesh.fabric import FabricShape, build_fabric
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelKnobs
from tests.servers import free_port
from tests.waiting import until as _until

TOKEN = "controller-operator-token"


def test_api_table_validation(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("operator ops op-token-123\ntenant acme acme-token-1\n")
    conf.write_text('[api]\nlisten = "127.0.0.1:0"\ntoken_file = "tokens.txt"\nburst = 5\n')
    api = load_config(conf).api
    assert api is not None and api.port == 0 and api.options.burst == 5
    assert api.tokens.lookup("acme-token-1") is not None
    assert load_config(None).api is None
    for body, msg in [
        ('[api]\nlisten = "nope"\noperator_token = "abcdefgh1"', "api.listen"),
        ('[api]\nlisten = "127.0.0.1:1"', "api.listen: the API needs"),
        ('[api]\nlisten = "127.0.0.1:1"\noperator_token = "short"', "api.operator_token"),
        ('[api]\nlisten = "127.0.0.1:1"\ntoken_file = "missing.txt"', "api.token_file"),
        ('[api]\nlisten = "127.0.0.1:1"\noperator_token = "abcdefgh1"\nrate_per_s = 0', "api.rate_per_s"),
        ('[api]\nlisten = "127.0.0.1:1"\noperator_token = "abcdefgh1"\nbogus = 1', "bogus"),
        ('[api]\noperator_token = "abcdefgh1"', "api.listen: is required"),
    ]:  # fmt: skip
        conf.write_text(body + "\n")
        with pytest.raises(ConfigError, match=msg):
            load_config(conf)


@pytest.mark.broker
@pytest.mark.slow
async def test_flap_reaches_api_events_and_websocket(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    api_port = free_port()
    # three leaves: with two, every path over leaf0-spine1 also crosses leaf1-spine1 and the
    # flap could not be told apart from its sibling
    shape = FabricShape(leaves=3, spines=2, hosts_per_leaf=3, nics_per_host=1)
    fab = build_fabric(shape)
    conf = tmp_path / "c.toml"
    # [ingest] coalesce_ms = 0: each batch is ingested as it arrives. A queued one waits for
    # the controller's clock to pass its deadline, and this clock only moves when the test
    # has seen the batch ingested and a tick run on it.
    conf.write_text(
        f"[fabric]\nleaves = 3\nspines = 2\nhosts_per_leaf = 3\nnics_per_host = 1\n"
        f"[ingest]\ncoalesce_ms = 0\n"
        f'[controller]\ntick_s = 0.05\n[api]\nlisten = "127.0.0.1:{api_port}"\n'
        f'operator_token = "{TOKEN}"\nws_min_interval_s = 0.05\n'
    )
    config = load_config(conf)
    flap = Fault(FaultKind.FLAP, "leaf1-spine1", 3.0, 8.0, down_s=1.0, up_s=2.0)
    sim = Simulator(fab, SimConfig(peers=4, seed=3, model=ModelKnobs.ideal_model()), faults=(flap,))
    sim_t = [0.0]

    def clock() -> int:  # the controller's clock follows the simulated time fed so far
        return EPOCH_NS + round(sim_t[0] * 1e9)

    topics = Topics("qpmesh/apitest")
    log_path = tmp_path / "log.jsonl"
    log_file = log_path.open("w")
    live = live_state(config)
    ticks: list[int] = []  # the service's ticks, each once its events are out
    svc = asyncio.create_task(run_service(Broker(host, port, topics), config,
                                          log=JsonLog(log_file), clock=clock, live=live,
                                          on_tick=ticks.append))  # fmt: skip
    base = f"http://127.0.0.1:{api_port}/api/v1/"
    hdr = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):  # the API serves as soon as the service starts
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "health", headers=hdr) as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.05)
            ws = await http.ws_connect(base + "ws", headers=hdr)
            assert (await ws.receive_json(timeout=30))["type"] == "snapshot"
            async with aiomqtt.Client(host, port) as client:
                # the service logs "connected" once its subscriptions are in place
                await _until(lambda: '"msg": "connected"' in log_path.read_text())
                t, sent = 0.0, 0
                while t < 14.0:
                    st = sim.step(t, 0.5)
                    for h, b in split_by_host(st.batch, nic_hosts(fab)).items():
                        await client.publish(topics.probes(h), encode_batch(b), qos=1)
                        sent += len(b)
                    t = st.t1_s
                    # the clock moves on once the batch is ingested and a tick ran on it
                    await _until(lambda: live.records >= sent)  # noqa: B023
                    n = len(ticks)
                    await _until(lambda: len(ticks) > n)  # noqa: B023
                    sim_t[0] = t
            kinds: list[tuple[str, str]] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            with contextlib.suppress(TimeoutError):
                while ("link_flap", "leaf1-spine1") not in kinds and loop.time() < deadline:
                    msg = await ws.receive_json(timeout=20)
                    if msg["type"] == "event":
                        kinds.append((msg["data"]["kind"], msg["data"]["target"]))
            await ws.close()
            async with http.get(base + "events?kind=link_flap", headers=hdr) as r:
                events = (await r.json())["events"]
            async with http.get(base + "events", headers=hdr) as r:
                every = (await r.json())["events"]
            async with http.get(base + "health", headers=hdr) as r:
                health = await r.json()
            async with http.get(base + "events?kind=x&limit=0", headers=hdr) as r:
                assert r.status == 400
        assert ("link_flap", "leaf1-spine1") in kinds, (kinds, every, health)
        assert events and {e["target"] for e in events} == {"leaf1-spine1"}
    finally:
        svc.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await svc
        log_file.close()
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert any(x["msg"] == "api serving" for x in lines)
