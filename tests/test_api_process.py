"""The API in its own process: what crosses the pipe (pure), and a real API process fed by
this one — reads, writes applied here with the API's checks and tenant scoping, events and
the websocket, a clean stop, and no orphan when the controller process is killed."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from contract.documents import EventDoc
from controller.api import feed
from controller.api.app import ApiOptions, chunked_dumps, fleet_base_text, with_control
from controller.api.auth import Principal, TokenTable
from controller.api.config import ApiConfig
from controller.api.runtime import ApiRuntime
from controller.api.views import Scope, snapshot_view
from controller.control import Control
from controller.jobs import Job, JobRegistry
from controller.remediation.audit import ActionLog, ActionQuery
from controller.tenancy import Grants
from mesh.snapshot import PairPaths
from testbed.sim.demo_runner import DemoRunner, demo_scenario

OP, ACME = "operator-token-1", "acme-tenant-token"
TOKENS = TokenTable({OP: Principal("operator", "ops"), ACME: Principal("tenant", "acme")})


@pytest.fixture(scope="module")
def runner() -> DemoRunner:
    r = DemoRunner(demo_scenario(None, nics=16, seed=1))
    for _ in range(12):
        r.step()
    return r


def test_fleet_text_is_the_documents_json_with_control_and_jobs_spliced_in(
    runner: DemoRunner,
) -> None:
    snap = runner.controller.snapshot()
    base = fleet_base_text(snap)
    for ctl, jobs in [(None, None), (True, 3), (False, 0)]:
        want = json.dumps(snapshot_view(snap, Scope.fleet(), control=ctl, jobs=jobs))
        assert with_control(base, ctl, jobs) == want
    doc = {"a": [1, {"b": [2.5, None]}], "c": "x", "d": [], "e": {"f": 1}}
    assert chunked_dumps(doc) == json.dumps(doc)
    with pytest.raises(ValueError):
        with_control('{"t_ns": 1}', True, 1)


def test_snapshot_crosses_without_its_fabric_and_pair_paths_keep_their_flows(
    runner: DemoRunner,
) -> None:
    snap = runner.controller.snapshot()
    fields = pickle.loads(pickle.dumps(feed.pack_snapshot(snap, snap.fabric), protocol=5))
    assert "fabric" not in fields
    back = feed.unpack_snapshot(fields, snap.fabric)
    assert back.fabric is snap.fabric and back.t_ns == snap.t_ns
    assert np.array_equal(back.owd_ns, snap.owd_ns, equal_nan=True)
    assert isinstance(back.path_owd, PairPaths) and dict(back.path_owd) == dict(snap.path_owd)
    other = feed.pack_snapshot(snap, runner.fabric.__class__.__new__(runner.fabric.__class__))
    assert other["fabric"] is snap.fabric  # another fabric travels with its snapshot


def test_mirror_takes_states_and_keeps_the_action_log_until_a_new_one_comes() -> None:
    job = Job("j1", "acme", (("nic0",),))
    log = ActionLog()
    log.add({"t_ns": 1, "id": "a1", "kind": "move_off_nic", "job": "j1", "disposition": "send"},
            "acme")  # fmt: skip
    m = feed.Mirror(feed.SharedState((job,), (True, ()), log.records(), {"j1": {"step_s": 1}}))
    assert m.jobs.tenant_nics("acme") == {"nic0"} and m.control is not None
    assert m.control.enabled and m.job_status("j1") == {"step_s": 1}
    m.apply(feed.SharedState((), (False, ()), None, {}))
    assert m.jobs.jobs() == () and not m.control.enabled and m.job_status("j1") is None
    assert [d["id"] for d in m.query(ActionQuery())["actions"]] == ["a1"]  # unchanged log
    assert feed.Mirror(feed.SharedState()).control is None


class Served:
    """An `ApiRuntime` (its API process) on a free port, fed from the demo runner."""

    def __init__(self, runner: DemoRunner) -> None:
        self.jobs = JobRegistry(grants=Grants.build({"acme": ["nic3"]}, runner.fabric))
        self.control = Control(False)
        self.asked: list[Any] = []
        self.actions = ActionLog()
        cfg = ApiConfig("127.0.0.1", 0, TOKENS, ApiOptions(ws_min_interval_s=0.05))
        self.api = ApiRuntime(cfg, runner.controller.snapshot(), jobs=self.jobs,
                              control=self.control, actions=self.actions, ask=self.ask)  # fmt: skip

    def ask(self, payload: Any, now_ns: int) -> dict[str, object]:
        self.asked.append(payload)
        return {"accepted": 1, "duplicates": 0, "ignored": 0}


async def _get(http: aiohttp.ClientSession, url: str, tok: str = OP) -> tuple[int, Any]:
    async with http.get(url, headers={"Authorization": f"Bearer {tok}"}) as r:
        return r.status, await r.json()


async def test_api_process_serves_reads_and_applies_writes_here(runner: DemoRunner) -> None:
    s = Served(runner)
    url = await s.api.start()
    proc = s.api.process
    assert proc is not None and proc.proc is not None and proc.proc.pid != os.getpid()
    hdr = {"Authorization": f"Bearer {OP}"}
    try:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(url + "ws", headers=hdr)
            assert (await ws.receive_json(timeout=30))["type"] == "snapshot"
            evs = runner.step()
            snap = runner.controller.snapshot()
            ev = EventDoc(snap.t_ns, "link_flap", "leaf0-spine0", "test flap")
            s.api.publish(snap, (*evs, ev))
            for _ in range(200):  # the new snapshot reaches the other process
                status, doc = await _get(http, url + "snapshot")
                if doc["t_ns"] == snap.t_ns:
                    break
                await asyncio.sleep(0.05)
            assert status == 200 and doc["t_ns"] == snap.t_ns and doc["nic_count"] == 16
            assert doc["control_enabled"] is False and doc["running_jobs"] == 0
            got = []
            while "link_flap" not in got:
                msg = await ws.receive_json(timeout=30)
                got.append(msg["data"]["kind"] if msg["type"] == "event" else "snapshot")
            status, doc = await _get(http, url + "events?kind=link_flap")
            assert [e["target"] for e in doc["events"]] == ["leaf0-spine0"]
            # writes: applied in this process, answered with the state after them
            nic = runner.fabric.nics[3].id
            body = {"id": "train-1", "tenant": "acme", "ranks": [{"nics": [nic]}]}
            async with http.post(url + "jobs", json=body, headers=hdr) as r:
                assert r.status == 201
            assert [j.id for j in s.jobs.jobs()] == ["train-1"]
            async with http.post(url + "jobs", json=body, headers=hdr) as r:
                assert r.status == 409  # the registry here said duplicate
            status, doc = await _get(http, url + "snapshot", ACME)  # scoped at once
            assert status == 200 and [n["id"] for n in doc["nics"]] == [nic]
            assert (await _get(http, url + f"nics/{runner.fabric.nics[0].id}", ACME))[0] == 404
            async with http.put(url + "control", json={"enabled": True}, headers=hdr) as r:
                assert r.status == 200 and (await r.json())["enabled"] is True
            assert s.control.enabled and s.control.audit()[-1].actor == "ops"
            async with http.put(url + "control", json={"enabled": False},
                                headers={"Authorization": f"Bearer {ACME}"}) as r:  # fmt: skip
                assert r.status == 403
            hook = {"version": "4", "groupKey": "g", "status": "firing", "alerts": []}
            async with http.post(url + "alertmanager", json=hook, headers=hdr) as r:
                assert r.status == 200 and (await r.json())["accepted"] == 1
            assert s.asked == [hook]
            s.actions.add({"t_ns": 5, "id": "a1", "kind": "move_off_nic", "job": "train-1",
                           "disposition": "would_have"}, "acme")  # fmt: skip
            s.api.publish(None, ())
            for _ in range(200):
                status, doc = await _get(http, url + "actions", ACME)
                if doc["actions"]:
                    break
                await asyncio.sleep(0.05)
            assert [a["id"] for a in doc["actions"]] == ["a1"]
            async with http.delete(url + "jobs/train-1", headers=hdr) as r:
                assert r.status == 200
            assert s.jobs.jobs() == ()
            assert (await _get(http, url + "health"))[1]["source"]["ws_clients"] == 1
            await ws.close()
    finally:
        await s.api.stop()
    assert proc.exit_code() == 0  # stopped cleanly, not killed


PARENT = textwrap.dedent("""
    import sys, time
    from controller.api.app import ApiOptions
    from controller.api.auth import Principal, TokenTable
    from controller.api.config import ApiConfig
    from controller.api.process import ApiProcess
    from controller.api.feed import SharedState
    from mesh.fabric import FabricShape, build_fabric
    from mesh.snapshot import MeshSnapshot
    fab = build_fabric(FabricShape(leaves=2, spines=2, hosts_per_leaf=2, nics_per_host=1))
    cfg = ApiConfig("127.0.0.1", 0, TokenTable({"operator-xyz": Principal("operator", "o")}),
                    ApiOptions())
    p = ApiProcess(cfg, fab, MeshSnapshot.blank(fab), SharedState, handle=lambda op, a: None)
    p.start()
    p.wait_ready(60)
    print(p.proc.pid, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def parent() -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                         env=env)  # fmt: skip
    yield p
    if p.poll() is None:
        p.kill()
        p.wait(10)


def test_api_process_dies_with_a_killed_controller(parent: subprocess.Popen[str]) -> None:
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(child)
    if alive:  # never leave it behind, even when the test fails
        os.kill(child, signal.SIGKILL)
    assert not alive


async def test_a_killed_api_process_is_replaced_at_the_next_publish(runner: DemoRunner) -> None:
    """The replacement serves the controller's snapshot and every event published before,
    also the ones published while it was starting."""
    s = Served(runner)
    await s.api.start()
    try:
        first = s.api.process
        assert first is not None and first.proc is not None
        s.api.publish(None, (EventDoc(1, "link_flap", "leaf0-spine0", "before"),))
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
        s.api.publish(runner.controller.snapshot(), ())
        s.api.publish(None, (EventDoc(2, "loss", "leaf1-spine1", "while starting"),))
        for _ in range(1200):
            if s.api.restarts:
                break
            await asyncio.sleep(0.05)
        assert s.api.restarts == 1 and s.api.process is not first
        async with aiohttp.ClientSession() as http:
            status, doc = await _get(http, s.api.url + "snapshot")
            assert status == 200 and doc["t_ns"] == runner.controller.snapshot().t_ns
            for _ in range(600):  # the events are queued to the new process after it serves
                status, ev = await _get(http, s.api.url + "events")
                if len(ev["events"]) >= 2:
                    break
                await asyncio.sleep(0.05)
        assert [(e["kind"], e["target"]) for e in ev["events"]] == [
            ("link_flap", "leaf0-spine0"),
            ("loss", "leaf1-spine1"),
        ]
    finally:
        await s.api.stop()


class Broken(JobRegistry):
    """A registry with a bug: registering raises what no handler expects."""

    def register(self, job: Job) -> None:
        raise RuntimeError("boom in the registry")


async def test_the_api_process_logs_its_tracebacks_as_json_lines_of_the_controller(
    runner: DemoRunner, capfd: pytest.CaptureFixture[str]
) -> None:
    logged: list[str] = []
    cfg = ApiConfig("127.0.0.1", 0, TOKENS, ApiOptions())
    api = ApiRuntime(cfg, runner.controller.snapshot(), jobs=Broken(), log=logged.append)
    url = await api.start()
    try:
        async with aiohttp.ClientSession() as http:
            body = {"id": "j1", "ranks": [{"nics": ["nic0"]}]}
            async with http.post(url + "jobs", json=body,
                                 headers={"Authorization": f"Bearer {OP}"}) as r:  # fmt: skip
                assert r.status == 500
                assert (await r.json())["error"]["message"] == "internal error: RuntimeError"
        for _ in range(200):
            if any("Traceback" in m for m in logged):
                break
            await asyncio.sleep(0.05)
    finally:
        await api.stop()
    (line,) = [m for m in logged if "Traceback" in m]
    assert line.startswith("ERROR controller.api.app: API POST /api/v1/jobs failed")
    assert "boom in the registry" in line
    err = capfd.readouterr().err
    assert "Traceback" not in err  # nothing in plain text on the controller's stderr
    for ln in err.splitlines():
        json.loads(ln)
