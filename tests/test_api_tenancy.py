"""Tenancy the operator grants: two tenants probe every route of the API for each other.

The probe list is checked against the app's routes (`controller.api.app.ROUTES`, which
another test keeps equal to docs/openapi.yaml), so a new route without a probe fails here.
Every probe is sent twice by tenant acme: naming beta's NIC / link / job, and naming one
that does not exist; both answers must be the same (status and body, the name aside), and
no answer may name anything of beta's (its NICs, hosts, NIC links, jobs), not even in free
text (event details, action reasons, a job's slowdown text).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from contract.documents import EventDoc
from contract.remediation import RankDoc, rank_topic
from controller.api.app import PREFIX, ROUTES, ApiOptions, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.jobfeed import RankFeed
from controller.jobs import Job, JobError, JobRegistry
from controller.remediation.runtime import RemediationRuntime
from controller.tenancy import Grants, TenancyError
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.demo_runner import DemoRunner, demo_scenario

OP, ACME, BETA = "operator-token-1", "acme-tenant-token", "beta-tenant-token"
TOKENS = TokenTable({OP: Principal("operator", "ops"), ACME: Principal("tenant", "acme"),
                     BETA: Principal("tenant", "beta")})  # fmt: skip
# what acme names: beta's (first) or nothing's (second); answers must not tell them apart
SUBJECTS = {
    "{nic}": ("nic8", "nic999"),
    "{link}": ("nic8-leaf1", "nic999-leaf9"),
    "{host}": ("host8", "host999"),
    "{job}": ("beta:train", "beta:ghost"),
}


@dataclass(frozen=True)
class Probe:
    method: str
    path: str
    body: Any = None


PROBES: dict[tuple[str, str], tuple[Probe, ...]] = {
    ("GET", "/snapshot"): (Probe("GET", "/snapshot"),),
    ("GET", "/nics/{nic}"): (Probe("GET", "/nics/{nic}"),),
    ("GET", "/delays"): (Probe("GET", "/delays"), Probe("GET", "/delays?nic={nic}")),
    ("GET", "/links"): (Probe("GET", "/links"),),
    ("GET", "/events"): (
        Probe("GET", "/events"),
        Probe("GET", "/events?target={nic}"),
        Probe("GET", "/events?target={link}"),
        Probe("GET", "/events?target={host}"),
    ),
    ("GET", "/clocks"): (Probe("GET", "/clocks"),),
    ("GET", "/jobs"): (Probe("GET", "/jobs"),),
    ("POST", "/jobs"): (
        Probe("POST", "/jobs", {"id": "acme:peek", "ranks": [{"nics": ["{nic}"]}]}),
        Probe("POST", "/jobs", {"id": "acme:peek", "ranks": [{"nics": ["nic0", "{nic}"]}]}),
        Probe("POST", "/jobs", {"id": "{job}", "ranks": [{"nics": ["nic0"]}]}),
        Probe("POST", "/jobs", {"id": "{job}", "tenant": "beta", "ranks": [{"nics": ["nic0"]}]}),
    ),
    ("DELETE", "/jobs/{job}"): (Probe("DELETE", "/jobs/{job}"),),
    ("GET", "/actions"): (Probe("GET", "/actions"), Probe("GET", "/actions?job={job}")),
    ("POST", "/alertmanager"): (
        Probe(
            "POST",
            "/alertmanager",
            {
                "version": "4",
                "groupKey": "g",
                "status": "firing",
                "alerts": [{"labels": {"action": "move_off_nic", "nic": "{nic}"}}],
            },
        ),
    ),
    ("GET", "/control"): (Probe("GET", "/control"),),
    ("PUT", "/control"): (Probe("PUT", "/control", {"enabled": True}),),
    ("GET", "/health"): (Probe("GET", "/health"),),
    ("GET", "/version"): (Probe("GET", "/version"),),
    ("GET", "/ws"): (Probe("WS", "/ws"),),
    ("POST", "/tickets"): (Probe("POST", "/tickets"), Probe("TICKET-WS", "/ws")),
}


class World:
    """A 16-NIC demo after its scripted flap; acme holds host0-1 (leaf0), beta host8-9
    (leaf1); events, actions and job figures that name beta's things are planted."""

    def __init__(self) -> None:
        self.runner = DemoRunner(demo_scenario(None, nics=16, seed=1))
        fab = self.fab = self.runner.fabric
        self.hub = ApiHub(self.runner.controller.snapshot())
        for _ in range(24):
            self.hub.publish(self.runner.controller.snapshot(), tuple(self.runner.step()))
        self.grants = Grants.build({"acme": ["host0", "host1"], "beta": ["host8", "host9"]}, fab)
        assert self.grants.nics_of("beta") == {"nic8", "nic9"}
        self.jobs = JobRegistry((Job("acme:train", "acme", (("nic0",), ("nic1",))),
                                 Job("beta:train", "beta", (("nic8",), ("nic9",)))),
                                grants=self.grants)  # fmt: skip
        self.rem = RemediationRuntime(jobs=self.jobs)
        for job, tenant, nic in (("acme:train", "acme", "nic0"), ("beta:train", "beta", "nic8")):
            self.rem.log.add({
                "t_ns": 5, "disposition": "would_have", "id": f"move_off_nic-{nic}",
                "kind": "move_off_nic", "nic": nic, "link": "", "job": job,
                "reason": f"{nic} is down; flows to nic8 and beta:train moved",
                "finding": f"nic_down@{nic}@1", "issued_at_ns": 5, "expires_at_ns": 9,
                "flows": [["nic0", "nic8", 1], ["nic0", "nic1", 2]],
            }, tenant)  # fmt: skip
        t = self.hub.snapshot().t_ns
        self.planted = (
            EventDoc(t, "nic_down", "nic8", "all of probes across nic8-leaf1 lost", "critical"),
            EventDoc(t, "link_flap", "nic8-leaf1", "link flapped 3 times", "critical"),
            EventDoc(t, "prober_down", "host8", "presence lost", "warning"),
            EventDoc(t, "contention", "leaf1->spine0", "queueing delay on leaf1->spine0",
                     flows=(("nic8", "nic0", 1),)),
            EventDoc(t, "contention", "nic0-leaf0",
                     "queueing delay on nic0-leaf0; or nic8-leaf1: every known path crosses both",
                     flows=(("nic0", "nic8", 1), ("nic0", "nic1", 2)), related="nic8-leaf1"),
            EventDoc(t, "remediation", "nic0", "would have: report_contention job beta:train "
                     "(report_contention-1): contention on nic0-leaf0"),
        )  # fmt: skip
        self.hub.publish(None, self.planted)
        self.now = [0.0]
        self.served: Served | None = None

    def publish_planted(self) -> None:
        """Publish the planted events again (a websocket then has them to send)."""
        self.hub.publish(self.hub.snapshot(), self.planted)
        if self.served is not None:
            self.served.publish(self.hub.snapshot(), self.planted)

    def status(self, job: str) -> dict[str, object] | None:
        """Each job's perf, naming beta's NIC and a link acme does not see."""
        return {"step_s": 3.0, "baseline_s": 1.0, "slowdown": 3.0, "timeouts": 0,
                "cause": "fabric", "links": ["leaf1-spine0", "nic0-leaf0"],
                "text": f"job {job}: its ring crosses contended link leaf1-spine0 on nic0->nic8",
                "flows": [{"src": "nic0", "dst": "nic8", "sport": 1},
                          {"src": "nic0", "dst": "nic1", "sport": 2}]}  # fmt: skip

    def forbidden(self) -> frozenset[str]:
        """Every id acme must never read: beta's NICs, hosts, NIC links and jobs, and the
        NICs, hosts and links of the fabric outside acme's grant."""
        mine = self.grants.nics_of("acme")
        nics = {n.id for n in self.fab.nics} - mine
        hosts = {n.host for n in self.fab.nics if n.id not in mine}
        links = {lk.id for lk in self.fab.links if lk.lower in nics}
        return frozenset(nics | hosts | links | {"beta:train", "beta:ghost"})


WORD = re.compile(r"[A-Za-z0-9_.:>-]+")


def leaks(doc: Any, forbidden: frozenset[str]) -> set[str]:
    """Return the forbidden ids named anywhere in ``doc`` (keys, values, free text)."""
    text = json.dumps(doc)
    out = set()
    for w in WORD.findall(text):
        for part in (w.rstrip(".,:;"), *w.rstrip(".,:;").split("->")):
            if part in forbidden:
                out.add(part)
    return out


@pytest.fixture(scope="module")
def world() -> World:
    return World()


class Served:
    """The world served as ``qpmesh controller`` serves it: `ApiRuntime` (its own API
    process, mirrors of the jobs, Control and action log) on a loop in a thread, where the
    calls from the API process are applied."""

    def __init__(self, world: World) -> None:
        from controller.api.config import ApiConfig
        from controller.api.runtime import ApiRuntime

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        cfg = ApiConfig("127.0.0.1", 0, TOKENS,
                        ApiOptions(rate_per_s=100.0, burst=1000.0, ws_min_interval_s=0.01))  # fmt: skip
        self.api = ApiRuntime(cfg, world.hub.snapshot(), jobs=world.jobs,
                              control=world.rem.control, actions=world.rem.log,
                              ask=world.rem.ask, job_status=world.status)  # fmt: skip
        url = asyncio.run_coroutine_threadsafe(self.api.start(), self.loop).result(120)
        self.base = url.removesuffix(PREFIX + "/")
        self.publish(world.hub.snapshot(), tuple(e for _, e in world.hub.events()))

    def publish(self, snap: Any, events: tuple[EventDoc, ...]) -> None:
        """Hand the API process a snapshot and events (on the runtime's loop)."""
        self.loop.call_soon_threadsafe(self.api.publish, snap, events)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.api.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Remote:
    """The client calls the probes make, sent to a served API at ``base``."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    def request(self, method: str, path: str, **kw: Any) -> Any:
        return self.session.request(method, self.base + path, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)

    def ws_connect(self, path: str, **kw: Any) -> Any:
        return self.session.ws_connect(self.base + path, **kw)


@pytest.fixture(scope="module")
def served(world: World) -> Iterator[Served]:
    s = Served(world)
    world.served = s
    try:
        yield s
    finally:
        world.served = None
        s.close()


@pytest.fixture(params=["app", "api-process"])
async def client(world: World, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The app in this process, or the controller's API process (as ``qpmesh controller``
    serves it): every probe runs against both."""
    world.now[0] += 1000.0
    if request.param == "app":
        app = make_app(world.hub, TOKENS, jobs=world.jobs, control=world.rem.control,
                       actions=world.rem.log, ask=world.rem.ask, job_status=world.status,
                       options=ApiOptions(rate_per_s=100.0, burst=1000.0,
                                          ws_min_interval_s=0.01),
                       clock=lambda: world.now[0], grants=world.grants)  # fmt: skip
        async with TestClient(TestServer(app)) as c:
            yield c
        return
    served = request.getfixturevalue("served")
    async with aiohttp.ClientSession() as session:
        remote = Remote(session, served.base)
        op = {"Authorization": f"Bearer {OP}"}
        for _ in range(600):  # the planted events reached the API process
            r = await remote.get(PREFIX + "/events?kind=prober_down", headers=op)
            if (await r.json())["events"]:
                break
            await asyncio.sleep(0.05)
        yield remote


def _fill(value: Any, sub: dict[str, str]) -> Any:
    text = json.dumps(value)
    for k, v in sub.items():
        text = text.replace(k, v)
    return json.loads(text)


def _unfill(doc: Any, sub: dict[str, str]) -> Any:
    text = json.dumps(doc)
    for k, v in sub.items():
        text = text.replace(v, k)
    return json.loads(text)


async def _ws_messages(c: TestClient[Any, Any], world: World, url: str, headers: dict[str, str],
                       ) -> list[Any]:  # fmt: skip
    ws = await c.ws_connect(url, headers=headers)
    got = [await ws.receive_json(timeout=30)]
    world.publish_planted()
    deadline = asyncio.get_running_loop().time() + 2.0
    while asyncio.get_running_loop().time() < deadline:
        try:
            got.append(await ws.receive_json(timeout=0.3))
        except TimeoutError:
            break
    await ws.close()
    return got


async def _send(c: TestClient[Any, Any], world: World, probe: Probe, sub: dict[str, str],
                ) -> tuple[int, Any]:  # fmt: skip
    path = _fill(probe.path, sub)
    headers = {"Authorization": f"Bearer {ACME}"}
    if probe.method == "WS":
        return 101, await _ws_messages(c, world, PREFIX + path, headers)
    if probe.method == "TICKET-WS":
        r = await c.post(PREFIX + "/tickets", headers=headers)
        ticket = (await r.json())["ticket"]
        return 101, await _ws_messages(c, world, f"{PREFIX}{path}?ticket={ticket}", {})
    body = None if probe.body is None else json.dumps(_fill(probe.body, sub))
    if body is not None:
        headers["Content-Type"] = "application/json"
    r = await c.request(probe.method, PREFIX + path, data=body, headers=headers)
    doc = await r.json()
    if probe.path == "/tickets":
        doc.pop("ticket", None)
    return r.status, doc


def test_every_route_has_a_probe() -> None:
    assert set(PROBES) == {(m, p) for m, p, _ in ROUTES}


def _probes() -> Iterator[tuple[str, Probe]]:
    for key, probes in PROBES.items():
        for k, p in enumerate(probes):
            yield f"{key[0]} {key[1]} #{k}", p


@pytest.mark.parametrize("probe", [p for _, p in _probes()], ids=[i for i, _ in _probes()])
async def test_a_tenant_reads_nothing_of_another_and_cannot_tell_it_from_nothing(
    client: TestClient[Any, Any], world: World, probe: Probe
) -> None:
    theirs = {k: v[0] for k, v in SUBJECTS.items()}
    ghost = {k: v[1] for k, v in SUBJECTS.items()}
    st_theirs, doc_theirs = await _send(client, world, probe, theirs)
    st_ghost, doc_ghost = await _send(client, world, probe, ghost)
    assert st_theirs == st_ghost, (probe, doc_theirs, doc_ghost)
    if probe.method not in ("WS", "TICKET-WS"):  # websocket streams differ in timing only
        assert _unfill(doc_theirs, theirs) == _unfill(doc_ghost, ghost), probe
    # the name it sent may come back ("no NIC 'nic8'"), nothing else
    forbidden = world.forbidden() - set(theirs.values()) - set(ghost.values())
    for doc in (doc_theirs, doc_ghost):
        assert not leaks(doc, forbidden), (probe, leaks(doc, forbidden), doc)
    # nothing was registered, unregistered or asked for on beta's behalf
    assert {j.id for j in world.jobs.jobs()} == {"acme:train", "beta:train"}


async def test_the_operator_sees_what_acme_does_not(client: TestClient[Any, Any]) -> None:
    """The leak check is not blind: the same probes read beta's things with an operator
    token."""
    r = await client.get(PREFIX + "/nics/nic8", headers={"Authorization": f"Bearer {OP}"})
    assert r.status == 200
    r = await client.get(PREFIX + "/events", headers={"Authorization": f"Bearer {OP}"})
    assert {"nic8", "nic8-leaf1"} <= leaks(await r.json(), frozenset({"nic8", "nic8-leaf1"}))
    r = await client.get(PREFIX + "/actions", headers={"Authorization": f"Bearer {OP}"})
    assert "beta:train" in leaks(await r.json(), frozenset({"beta:train"}))


async def test_a_tenant_registers_on_its_own_nics_only(
    client: TestClient[Any, Any], world: World
) -> None:
    headers = {"Authorization": f"Bearer {ACME}"}
    body = {"id": "acme:eval", "ranks": [{"nics": ["nic1"]}, {"nics": ["nic0", "nic1"]}]}
    r = await client.post(PREFIX + "/jobs", json=body, headers=headers)
    assert r.status == 201, await r.text()
    assert (await r.json())["ranks"] == [{"rank": 0, "nics": ["nic1"]},
                                         {"rank": 1, "nics": ["nic0", "nic1"]}]  # fmt: skip
    r = await client.post(PREFIX + "/jobs", json=body, headers=headers)
    assert r.status == 409  # its own id, in its own namespace: no one else's is confirmed
    r = await client.delete(PREFIX + "/jobs/acme:eval", headers=headers)
    assert r.status == 200
    # the operator cannot put acme's job on beta's NIC either, nor squat acme's namespace
    op = {"Authorization": f"Bearer {OP}"}
    r = await client.post(PREFIX + "/jobs", headers=op,
                          json={"id": "x", "tenant": "acme", "ranks": [{"nics": ["nic8"]}]})  # fmt: skip
    assert r.status == 409 and "not granted" in (await r.json())["error"]["message"]
    r = await client.post(PREFIX + "/jobs", headers=op,
                          json={"id": "acme:x", "tenant": "beta", "ranks": [{"nics": ["nic8"]}]})  # fmt: skip
    assert r.status == 403


def test_a_rank_on_mqtt_cannot_put_a_job_on_another_tenants_nic() -> None:
    fab = build_fabric(FabricShape.for_nics(16, nics_per_leaf=8))
    grants = Grants.build({"acme": ["host0"], "beta": ["nic8"]}, fab)
    reg = JobRegistry(grants=grants)
    feed = RankFeed(reg, "qpmesh/v1")
    doc = RankDoc("train", 0, ("nic8",), host="host0", tenant="acme")
    out = feed.apply(rank_topic("qpmesh/v1", "train", 0), doc.encode())
    assert out.startswith("bad:") and "not granted" in out and not reg.jobs()
    ok = RankDoc("train", 0, ("nic0",), host="host0", tenant="acme")
    assert feed.apply(rank_topic("qpmesh/v1", "train", 0), ok.encode()) == "jobs"
    with pytest.raises(JobError, match="namespace"):
        Job("acme:x", "beta", (("nic8",),))


def test_grants_are_checked_against_the_fabric() -> None:
    fab = build_fabric(FabricShape.for_nics(16, nics_per_leaf=8))
    g = Grants.build({"acme": ["host0", "nic3"]}, fab)
    assert g.nics_of("acme") == {"nic0", "nic3"} and g.owner("nic3") == "acme"
    assert g.owner("nic4") is None and g.nics_of("beta") == frozenset()
    # a tenant's jobs on its NICs only; the operator's (a tenant holding none) on nobody's
    assert g.may_use("acme", "nic3") and not g.may_use("acme", "nic4")
    assert g.may_use("default", "nic4") and not g.may_use("default", "nic3")
    assert all(Grants().may_use(t, "nic3") for t in ("acme", "default"))  # no grants: any
    for bad, match in (({"acme": ["nic99"]}, "no NIC or host"),
                       ({"acme": ["nic1"], "beta": ["host1"]}, "already granted"),
                       ({"ac:me": ["nic1"]}, "bad tenant name")):  # fmt: skip
        with pytest.raises(TenancyError, match=match):
            Grants.build(bad, fab)


def test_free_text_keeps_a_queue_pair_of_its_own_nics_and_hides_one_with_another_tenants(
    world: World,
) -> None:
    from controller.api.views import tenant_scope

    scope = tenant_scope(world.fab, world.grants.nics_of("acme"))
    text = "ring crosses nic0-leaf0 on queue pairs nic0->nic1, nic0->nic8"
    assert (
        scope.redact(world.fab, text)
        == "ring crosses nic0-leaf0 on queue pairs nic0->nic1, (hidden)"
    )
