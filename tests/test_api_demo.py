"""End to end: ``qpmesh demo --headless --serve`` — the scripted flap in the simulator-fed
controller appears in the API's events and on the websocket while the demo runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import sys

import aiohttp
import pytest

from tests.servers import free_port


@pytest.mark.slow
async def test_demo_serves_the_flap_on_api_and_websocket() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "qpmesh.cli", "demo", "--headless", "--duration", "10",
        "--serve", f"127.0.0.1:{port}", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None and proc.stdout is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        m = re.search(r"API on (\S+) \(operator token: (\S+)\)", line)
        assert m, line
        base, token = m.group(1), m.group(2)  # no --token: a random one, printed
        assert base == f"http://127.0.0.1:{port}/api/v1/"
        hdr = {"Authorization": f"Bearer {token}"}
        ws_kinds: list[str] = []
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "version") as r:
                assert r.status == 401
            async with http.get(base + "control", headers=hdr) as r:  # the demo's own Control
                assert r.status == 200 and (await r.json())["enabled"] is False
            async with http.get(base + "jobs", headers=hdr) as r:
                assert [j["id"] for j in (await r.json())["jobs"]] == ["demo-train"]
            async with http.ws_connect(base + "ws", headers=hdr) as ws:
                while "link_flap" not in ws_kinds:  # the flap starts at 4 s simulated
                    msg = await ws.receive_json(timeout=60)
                    if msg["type"] == "event":
                        ws_kinds.append(msg["data"]["kind"])
                        flap_target = msg["data"]["target"]
            async with http.get(base + "events?kind=link_flap", headers=hdr) as r:
                events = (await r.json())["events"]
            async with http.get(base + "links", headers=hdr) as r:
                links = {lk["id"]: lk for lk in (await r.json())["links"]}
        assert flap_target == "leaf1-spine2"  # the scenario's flapping link
        assert [e["target"] for e in events] == ["leaf1-spine2"]
        assert links["leaf1-spine2"]["flaps"] >= 1
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        result = json.loads(out)
        assert result["api"]["url"] == base
        assert any(e["kind"] == "link_flap" for e in result["events"])
    finally:
        if proc.returncode is None:
            proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()


def test_demo_serve_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from qpmesh.cli import main

    base = ["demo", "--headless", "--duration", "1", "--nics", "8"]
    assert main([*base, "--serve", "no-port"]) == 2
    assert main([*base, "--serve", "127.0.0.1:0", "--token", "short"]) == 2
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([*base, "--serve", f"127.0.0.1:{port}", "--token", "long-enough-1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("qpmesh demo: error: ") for e in err), err


async def test_demo_api_takes_alertmanager_webhooks_and_stamps_on_the_demos_clock() -> None:
    """The demo's Control is available, so its Alertmanager intake is too (it answered 409);
    a Control change is stamped on the simulated clock its events carry."""
    from testbed.demo_serve import DemoApi
    from testbed.sim.demo_runner import DemoRunner, demo_scenario

    runner = DemoRunner(demo_scenario(None, nics=16, seed=1))
    for _ in range(3):
        runner.step()
    api = DemoApi(runner, "127.0.0.1:0", "demo-token-123")
    base = api.start()
    hdr = {"Authorization": "Bearer demo-token-123"}
    hook = {"version": "4", "groupKey": "g", "status": "firing", "alerts": [
        {"fingerprint": "f1", "labels": {"action": "move_off_nic", "nic": "nic12"}},
        {"fingerprint": "f2", "labels": {"action": "move_off_nic", "nic": "nic999"}}]}  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            async with http.put(base + "control", json={"enabled": True}, headers=hdr) as r:
                audit = (await r.json())["audit"]
            assert audit[-1]["t_ns"] == runner.now_ns  # not the wall clock
            async with http.post(base + "alertmanager", json=hook, headers=hdr) as r:
                assert r.status == 200, await r.text()
                assert await r.json() == {"accepted": 1, "duplicates": 0, "ignored": 0,
                                          "unknown": 1}  # fmt: skip
            runner.step()
            async with http.get(base + "actions", headers=hdr) as r:
                acts = (await r.json())["actions"]
        assert [(a["finding"], a["nic"], a["status"]) for a in acts] == [
            ("alert@f1", "nic12", "sent")
        ]
    finally:
        api.stop()
