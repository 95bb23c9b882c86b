"""The API app over a simulator-fed live controller: auth, tenant scoping, bad requests,
rate limits, Control, the websocket, and the OpenAPI description matching the routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from contract.documents import EventDoc
from controller.api.app import PREFIX, ROUTES, ApiOptions, api_stats, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.control import Control
from controller.jobs import Job, JobRegistry
from controller.tenancy import Grants
from testbed.sim.demo_runner import DemoRunner, demo_scenario

OPENAPI = Path(__file__).parents[1] / "docs" / "openapi.yaml"
OP, ACME, BETA = "operator-token-1", "acme-tenant-token", "beta-tenant-token"
TOKENS = TokenTable({OP: Principal("operator", "ops"), ACME: Principal("tenant", "acme"),
                     BETA: Principal("tenant", "beta")})  # fmt: skip


def auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


class World:
    """A 16-NIC demo fabric after a scripted flap, published into a hub."""

    def __init__(self) -> None:
        self.runner = DemoRunner(demo_scenario(None, nics=16, seed=1))
        self.hub = ApiHub(self.runner.controller.snapshot())
        for _ in range(24):
            evs = self.runner.step()
            self.hub.publish(self.runner.controller.snapshot(), tuple(evs))
        fab = self.runner.fabric
        self.acme_nics = [n.id for n in fab.nics if n.leaf == "leaf0"][:2]
        self.beta_nic = next(n.id for n in fab.nics if n.leaf == "leaf1")
        # what each tenant holds is the operator's grant, not what its jobs declare
        self.grants = Grants.build({"acme": self.acme_nics, "beta": [self.beta_nic]}, fab)
        self.jobs = JobRegistry((Job("train-1", "acme", tuple((n,) for n in self.acme_nics)),
                                 Job("train-2", "beta", ((self.beta_nic,),))),
                                grants=self.grants)  # fmt: skip
        self.control = Control(False)
        self.now = [0.0]


@pytest.fixture(scope="module")
def world() -> World:
    return World()


@pytest.fixture
async def client(world: World) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    world.now[0] += 1000.0  # fresh buckets' worth of time per test
    app = make_app(world.hub, TOKENS, jobs=world.jobs, control=Control(False),
                   options=ApiOptions(rate_per_s=5.0, burst=200.0, ws_min_interval_s=0.05),
                   clock=lambda: world.now[0], grants=world.grants)  # fmt: skip
    async with TestClient(TestServer(app)) as c:
        yield c


async def get(c: TestClient[Any, Any], path: str, tok: str | None = OP) -> tuple[int, Any]:
    r = await c.get(PREFIX + path, headers=auth(tok) if tok else {})
    assert r.content_type == "application/json", (path, r.status)
    return r.status, await r.json()


async def test_no_or_wrong_token_is_401_json(client: TestClient[Any, Any]) -> None:
    for _, path, _ in ROUTES:
        for headers in ({}, auth("wrong-token-xyz"), {"Authorization": "Basic b3A6b3A="}):
            r = await client.get(PREFIX + path.replace("{nic}", "nic0"), headers=headers)
            assert r.status == 401
            assert (await r.json())["error"]["status"] == 401
            assert r.headers["WWW-Authenticate"] == "Bearer"


async def test_operator_sees_the_fleet_and_the_flap(
    client: TestClient[Any, Any], world: World
) -> None:
    st, snap = await get(client, "/snapshot")
    assert st == 200 and snap["scope"] == "fleet" and snap["nic_count"] == 16
    assert {n["id"] for n in snap["nics"]} == {n.id for n in world.runner.fabric.nics}
    assert snap["running_jobs"] == 2 and snap["control_enabled"] is False
    assert any(n["worst_in_ns"] is not None for n in snap["nics"])
    st, ev = await get(client, "/events?kind=link_flap")
    assert st == 200 and ev["events"] and all(e["kind"] == "link_flap" for e in ev["events"])
    flapped = ev["events"][0]["target"]
    assert ev["events"][0]["related"] == ""  # a flap follows from nothing else
    st, links = await get(client, "/links")
    assert next(lk for lk in links["links"] if lk["id"] == flapped)["flaps"] >= 1
    st, d = await get(client, "/delays")
    assert st == 200 and len(d["pairs"]) > 16 and d["pairs"][0]["paths"]
    st, row = await get(client, "/delays?nic=nic3")
    assert st == 200 and row["pairs"]
    assert all("nic3" in (p["src"], p["dst"]) for p in row["pairs"])
    st, clocks = await get(client, "/clocks")
    assert st == 200 and len(clocks["clocks"]) == 16
    t0 = ev["events"][0]["t_ns"]
    st, win = await get(client, f"/events?since_ns={t0}&until_ns={t0 + 1}")
    assert st == 200 and all(e["t_ns"] == t0 for e in win["events"]) and win["events"]


async def test_tenant_sees_only_its_jobs(client: TestClient[Any, Any], world: World) -> None:
    st, snap = await get(client, "/snapshot", ACME)
    assert st == 200 and snap["scope"] == "tenant" and snap["running_jobs"] == 1
    assert {n["id"] for n in snap["nics"]} == set(world.acme_nics)
    assert all(lk["lower"] in world.acme_nics for lk in snap["links"])
    st, jobs = await get(client, "/jobs", ACME)
    assert [j["id"] for j in jobs["jobs"]] == ["train-1"]
    st, d = await get(client, "/delays", ACME)
    assert all({p["src"], p["dst"]} <= set(world.acme_nics) for p in d["pairs"])
    st, clocks = await get(client, "/clocks", ACME)
    assert {c["nic"] for c in clocks["clocks"]} == set(world.acme_nics)
    st, ev = await get(client, "/events", ACME)
    visible = set(world.acme_nics) | {world.runner.fabric.nic(n).host for n in world.acme_nics}
    visible |= {lk["id"] for lk in snap["links"]}
    assert all(e["target"] in visible for e in ev["events"])
    # another tenant's NIC and a NIC that does not exist answer alike: 404, same message shape
    st_other, other = await get(client, f"/nics/{world.beta_nic}", ACME)
    st_ghost, ghost = await get(client, "/nics/nic999", ACME)
    assert st_other == st_ghost == 404
    assert other["error"]["message"].replace(world.beta_nic, "X") == ghost["error"][
        "message"
    ].replace("nic999", "X")
    st, _ = await get(client, f"/delays?nic={world.beta_nic}", ACME)
    assert st == 404
    st, mine = await get(client, f"/nics/{world.acme_nics[0]}", ACME)
    assert st == 200 and mine["id"] == world.acme_nics[0]
    st, _ = await get(client, f"/nics/{world.beta_nic}", OP)
    assert st == 200


BAD_REQUESTS = [
    ("GET", "/snapshot?x=1", None, 400),
    ("GET", "/nics/nic999", None, 404),
    ("GET", "/nics/%00%ff", None, 404),
    ("GET", "/nics/nic1?verbose=1", None, 400),
    ("GET", "/delays?nic=nope", None, 404),
    ("GET", "/delays?nic=nic1&nic=nic2", None, 400),
    ("GET", "/delays?bogus=1", None, 400),
    ("GET", "/links?x", None, 400),
    ("GET", "/events?since_ns=abc", None, 400),
    ("GET", "/events?since_ns=%2B5", None, 400),  # +5
    ("GET", "/events?since_ns=1_7", None, 400),
    ("GET", "/events?limit=%D9%A3", None, 400),  # an Arabic-Indic three
    ("GET", "/events?limit=5_0", None, 400),
    ("GET", "/events?limit=%205%20", None, 400),
    ("GET", "/events?kind=", None, 400),
    ("GET", "/events?severity=fatal", None, 400),
    ("GET", "/events?limit=-3", None, 400),
    ("GET", "/events?limit=99999999999999999999999", None, 400),
    ("GET", "/clocks?a=b", None, 400),
    ("GET", "/jobs?tenant=acme", None, 400),
    ("GET", "/control?x=1", None, 400),
    ("POST", "/jobs", b"not json", 400),
    ("POST", "/jobs", b'{"id": "j9", "ranks": []}', 400),
    ("POST", "/jobs", b'{"id": "j9", "ranks": [{"nics": ["nic0"]}], "x": 1}', 400),
    ("POST", "/jobs", b'{"id": "j/9", "ranks": [{"nics": ["nic0"]}]}', 400),
    ("POST", "/jobs", b'{"id": "j9", "ranks": [{"rank": "x", "nics": ["nic0"]}]}', 400),
    ("POST", "/jobs", b'{"id": "j9", "ranks": [{"rank": 7, "nics": ["nic0"]}]}', 400),
    ("POST", "/jobs", b'{"id": "j9", "ranks": [{"nics": ["nic0", "nic0"]}]}', 400),
    ("POST", "/jobs", b'{"id": "j9", "id": "j8", "ranks": [{"nics": ["nic0"]}]}', 400),
    ("POST", "/jobs", b'{"id": "j9", "ranks": [{"nics": ["nic0"]}], "tenant": NaN}', 400),
    ("POST", "/jobs", b'{"id": "j9", "ranks": [{"nics": ["nic999"]}]}', 404),
    ("POST", "/jobs", b'{"id": "train-1", "tenant": "acme", "ranks": [{"nics": ["nic0"]}]}', 409),
    ("POST", "/jobs", b'{"id": "j9", "tenant": "acme", "ranks": [{"nics": ["nic9"]}]}', 409),
    ("DELETE", "/jobs/nope", None, 404),
    ("GET", "/actions?status=done", None, 400),
    ("POST", "/alertmanager", b'{"version": "4"}', 409),  # no remediation in this app
    ("GET", "/actions?since_ns=%D9%A3", None, 400),
    ("PUT", "/control", b"not json", 400),
    ("PUT", "/control", b'{"enabled": "yes"}', 400),
    ("PUT", "/control", b'{"enabled": true, "x": 1}', 400),
    ("PUT", "/control", b"[]", 400),
    ("PUT", "/control", b"\xff\xfe", 400),
    ("PUT", "/control", b"x" * 100_000, 413),
    ("GET", "/health?x=1", None, 400),
    ("GET", "/version?x=1", None, 400),
    ("GET", "/ws", None, 400),  # no upgrade
    ("POST", "/tickets?x=1", None, 400),
    ("DELETE", "/snapshot", None, 405),
    ("POST", "/control", b"{}", 405),
    ("GET", "/nope", None, 404),
]


async def test_every_route_answers_bad_requests_with_counted_json_4xx(
    client: TestClient[Any, Any],
) -> None:
    stats = api_stats(client.server.app)
    routes_hit: set[str] = set()
    for method, path, body, want in BAD_REQUESTS:
        headers = {**auth(OP), "Content-Type": "application/json"}
        r = await client.request(method, PREFIX + path, data=body, headers=headers)
        assert r.status == want, (method, path, r.status, await r.text())
        doc = await r.json()
        assert doc["error"]["status"] == want and doc["error"]["message"]
        routes_hit.add(path.split("?")[0])
    served = {p.replace("{nic}", "nic999").replace("{job}", "nope") for _, p, _ in ROUTES}
    assert served <= routes_hit | {"/nics/nic999"}
    assert sum(stats.client_errors.values()) == len(BAD_REQUESTS)
    assert not stats.server_errors


async def test_rate_limit_per_token(world: World) -> None:
    now = [0.0]
    app = make_app(world.hub, TOKENS, jobs=world.jobs,
                   options=ApiOptions(rate_per_s=1.0, burst=3.0), clock=lambda: now[0])  # fmt: skip
    async with TestClient(TestServer(app)) as c:
        codes = [(await c.get(PREFIX + "/version", headers=auth(OP))).status for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = await c.get(PREFIX + "/version", headers=auth(ACME))  # another token: its own bucket
        assert r.status == 200
        r = await c.get(PREFIX + "/version", headers=auth(OP))
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert (await r.json())["error"]["status"] == 429
        now[0] += 1.0
        assert (await c.get(PREFIX + "/version", headers=auth(OP))).status == 200


async def test_control_write_needs_operator_and_is_audited(world: World) -> None:
    ctl = Control(False)
    app = make_app(world.hub, TOKENS, jobs=world.jobs, control=ctl, wall_ns=lambda: 42)
    async with TestClient(TestServer(app)) as c:
        r = await c.put(PREFIX + "/control", json={"enabled": True}, headers=auth(ACME))
        assert r.status == 403 and not ctl.enabled
        r = await c.put(PREFIX + "/control", json={"enabled": True}, headers=auth(OP))
        doc = await r.json()
        assert r.status == 200 and doc["enabled"] is True and ctl.enabled
        assert doc["audit"] == [{"t_ns": 42, "enabled": True, "actor": "ops", "previous": False}]
        r = await c.get(PREFIX + "/control", headers=auth(ACME))
        assert await r.json() == {"available": True, "enabled": True}  # no audit for tenants
    app2 = make_app(world.hub, TOKENS)  # no Control in this source
    async with TestClient(TestServer(app2)) as c:
        r = await c.get(PREFIX + "/control", headers=auth(OP))
        assert await r.json() == {"available": False, "enabled": None}
        r = await c.put(PREFIX + "/control", json={"enabled": True}, headers=auth(OP))
        assert r.status == 409


async def test_websocket_streams_a_snapshot_then_events(world: World) -> None:
    runner = DemoRunner(demo_scenario(None, nics=16, seed=1))
    hub = ApiHub(runner.controller.snapshot())
    app = make_app(hub, TOKENS, options=ApiOptions(ws_min_interval_s=0.05))
    async with TestClient(TestServer(app)) as c:
        ws = await c.ws_connect(PREFIX + "/ws", headers=auth(OP))
        first = await ws.receive_json(timeout=30)
        assert first["type"] == "snapshot" and first["data"]["nic_count"] == 16
        kinds: list[str] = []
        snaps = 0
        for _ in range(24):  # the scripted flap starts at 4 s
            evs = runner.step()
            hub.publish(runner.controller.snapshot(), tuple(evs))
            await asyncio.sleep(0)
        deadline = asyncio.get_running_loop().time() + 30
        while "link_flap" not in kinds and asyncio.get_running_loop().time() < deadline:
            msg = await ws.receive_json(timeout=30)
            if msg["type"] == "event":
                kinds.append(msg["data"]["kind"])
            else:
                snaps += 1
        assert "link_flap" in kinds
        assert snaps < 24  # coalesced: 24 publishes never become 24 snapshots this fast
        await ws.close()
    assert hub.clients == 0


async def test_websocket_tenant_gets_only_its_events(world: World) -> None:
    hub = ApiHub(world.runner.controller.snapshot())
    app = make_app(hub, TOKENS, jobs=world.jobs, options=ApiOptions(ws_min_interval_s=0.05),
                   grants=world.grants)  # fmt: skip
    fab = world.runner.fabric
    async with TestClient(TestServer(app)) as c:
        ws = await c.ws_connect(PREFIX + "/ws", headers=auth(ACME))
        assert (await ws.receive_json(timeout=30))["data"]["scope"] == "tenant"
        hub.publish(None, (EventDoc(1, "nic_down", world.beta_nic, severity="critical"),
                           EventDoc(2, "nic_down", world.acme_nics[0], severity="critical")))  # fmt: skip
        msg = await ws.receive_json(timeout=30)
        assert msg["type"] == "event" and msg["data"]["target"] == world.acme_nics[0]
        assert fab.nic(world.acme_nics[0]).id == msg["data"]["target"]
        await ws.close()


def test_openapi_describes_exactly_the_routes() -> None:
    doc = yaml.safe_load(OPENAPI.read_text())
    described = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    served = {(m, PREFIX + p) for m, p, _ in ROUTES}
    assert described == served
    for p, ops in doc["paths"].items():
        for m, op in ops.items():
            assert "401" in op["responses"], (m, p)
