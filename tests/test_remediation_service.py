"""Remediation inside ``qpmesh controller``: the [remediation] table, the job feed, the action
audit, and end to end over a real mosquitto: findings -> policy -> the remediation topic, with
Control and jobs from the API and from MQTT."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pytest

from contract.documents import EventDoc
from contract.remediation import AckDoc, ActionDoc, PerfDoc, RankDoc, perf_topic, rank_topic
from contract.topics import Topics
from controller.config import ConfigError, load_config
from controller.dispatch import JsonLog
from controller.jobfeed import RankFeed
from controller.jobs import Job, JobRegistry
from controller.live import LiveConfig, LiveController
from controller.remediation.audit import ActionLog, ActionQuery, ActionQueryError
from controller.remediation.audit import parse_action_query as paq
from controller.remediation.policy import SEC
from controller.remediation.runtime import RemediationRuntime
from controller.service import Broker, run_service
from controller.timeseries.config import TimeseriesConfig
from controller.timeseries.runtime import Observability
from controller.timeseries.writer import TsdbWriter
from mesh.fabric import FabricShape, build_fabric
from tests.servers import free_port

TOKEN = "remediation-operator-token"
ACME = "remediation-acme-token"


def test_remediation_table(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(
        "[remediation]\ncontrol = true\nhold_s = 2\nreplace_count = 3\nmax_actions = 4\n"
        'state_dir = "st"\nwebhooks = ["http://127.0.0.1:9/hook"]\n'
        'alertmanager = "http://127.0.0.1:9093"\n'
    )
    rc = load_config(conf).remediation
    assert rc.control and rc.policy.max_actions == 4 and rc.state_dir == tmp_path / "st"
    move = rc.policy.rule("move_off_nic")
    rep = rc.policy.rule("replace_link")
    assert move is not None and move.hold_ns == 2 * SEC
    assert rep is not None and rep.min_count == 3
    assert rc.webhooks == ("http://127.0.0.1:9/hook",) and rc.alertmanager
    assert not load_config(None).remediation.control  # no table: Control off
    for body, msg in [
        ("control = 1", r"remediation\.control: must be true or false"),
        ("hold_s = -1", r"remediation\.hold_s: must be a number >= 0"),
        ("max_actions = 0", r"remediation\.max_actions"),
        ("webhooks = ['ftp://x']", r"remediation\.webhooks\[0\]: must be an http"),
        ("alertmanager = 'nope'", r"remediation\.alertmanager"),
        ("bogus = 1", r"remediation\.bogus: unknown key"),
    ]:
        conf.write_text(f"[remediation]\n{body}\n")
        with pytest.raises(ConfigError, match=msg) as err:
            load_config(conf)
        assert "\n" not in str(err.value)


def test_rank_feed_builds_and_withdraws_jobs() -> None:
    reg = JobRegistry((Job("theirs", "beta", (("nic9",),)),))
    feed = RankFeed(reg, "p")
    r1 = RankDoc("train", 1, ("nic2", "nic3"), "host1", "acme")
    r0 = RankDoc("train", 0, ("nic0",), "host0", "acme")
    assert feed.apply(rank_topic("p", "train", 1), r1.encode()) == "jobs"
    assert feed.apply(rank_topic("p", "train", 0), r0.encode()) == "jobs"
    job = reg.get("train")
    assert job is not None and job.ranks == (("nic0",), ("nic2", "nic3")) and job.tenant == "acme"
    assert feed.apply("p/jobs/train/rank0/x", b"{}") == "ignored"
    assert feed.apply("p/presence/h", b"{}") == "ignored"
    assert feed.apply(rank_topic("p", "train", 2), b"junk").startswith("bad:")
    assert feed.apply(rank_topic("p", "train", 2), r0.encode()).startswith("bad:")  # wrong rank
    hijack = RankDoc("theirs", 0, ("nic1",), tenant="acme")
    assert feed.apply(rank_topic("p", "theirs", 0), hijack.encode()).startswith("bad:")
    assert reg.get("theirs") == Job("theirs", "beta", (("nic9",),))
    assert feed.apply(rank_topic("p", "train", 0), b"") == "jobs"
    assert reg.get("train") is not None and reg.get("train").ranks == (("nic2", "nic3"),)  # type: ignore[union-attr]
    assert feed.apply(rank_topic("p", "train", 1), b"") == "jobs"
    assert reg.get("train") is None


def _rec(
    i: int, t: int, disposition: str, job: str = "", kind: str = "move_off_nic"
) -> dict[str, Any]:
    return {"t_ns": t, "kind": kind, "disposition": disposition, "id": f"{kind}-{i}",
            "nic": "nic0", "link": "", "job": job, "reason": "r", "finding": "f",
            "issued_at_ns": t, "expires_at_ns": t + 1}  # fmt: skip


def test_action_log_status_acks_tenants_and_queries() -> None:
    log = ActionLog(limit=3)
    log.add(_rec(0, 10, "send", "a"), "acme")
    log.add(_rec(1, 20, "would_have", "b"), "beta")
    log.add(_rec(2, 30, "suppressed"), "")
    assert [d["status"] for d in log.records()] == ["sent", "would have", "suppressed"]
    done = log.ack(AckDoc("move_off_nic-0", "train/rank0", "done", 40, "moved to eth3"))
    assert done is not None and done["acks"][0]["receiver"] == "train/rank0"
    again = log.ack(AckDoc("move_off_nic-0", "train/rank0", "failed", 41))
    assert again is not None and [a["outcome"] for a in again["acks"]] == ["failed"]
    assert log.ack(AckDoc("move_off_nic-1", "x", "done", 42)) is None  # "would have": not sent
    assert log.acks_unmatched == 1
    assert [d["id"] for d in log.query(ActionQuery(), "acme")["actions"]] == ["move_off_nic-0"]
    assert log.query(ActionQuery(), "nobody")["actions"] == []
    assert len(log.query(ActionQuery())["actions"]) == 3
    q = paq({"since_ns": "15", "until_ns": "30"})
    assert [d["id"] for d in log.query(q)["actions"]] == ["move_off_nic-1"]
    assert [d["id"] for d in log.query(paq({"status": "would have"}))["actions"]] == [
        "move_off_nic-1"
    ]
    cut = log.query(paq({"limit": "1"}))
    assert cut["truncated"] and cut["actions"][0]["id"] == "move_off_nic-2"
    log.add(_rec(3, 50, "send"))
    assert [d["seq"] for d in log.records()] == [2, 3, 4]  # bounded, oldest dropped
    for bad in ({"since_ns": "x"}, {"since_ns": "+5"}, {"status": "done"},
                {"limit": "0"}, {"nope": "1"}, {"job": ""}):  # fmt: skip
        with pytest.raises(ActionQueryError):
            paq(bad)


def test_runtime_control_off_is_would_have_and_sends_nothing() -> None:
    rt = RemediationRuntime(prefix="p")
    rt.jobs.register(Job("train", "acme", (("nic0",),)))
    rt.observe([EventDoc(1 * SEC, "link_flap", "nic0-leaf0")])
    msgs, docs = rt.tick(2 * SEC)
    assert msgs == [] and [d["status"] for d in docs] == ["would have"]
    assert docs[0]["tenant"] == "acme" and docs[0]["job"] == "train"
    rt.control.set(True, "ops", 3 * SEC)
    rt.observe([EventDoc(3 * SEC, "link_flap", "nic0-leaf0")])  # the same episode: issued
    assert rt.tick(4 * SEC) == ([], [])


class ScriptedLive(LiveController):
    """The real live controller plus findings a test injects (the detection boundary)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.inject: list[tuple[str, str]] = []
        self.inject_flows: tuple[tuple[str, str, int], ...] = ()

    def tick(self, now_ns: int) -> list[EventDoc]:
        out = super().tick(now_ns)
        out += [EventDoc(now_ns, k, t, "injected", "critical", self.inject_flows)
                for k, t in self.inject]  # fmt: skip
        self.inject.clear()
        return out


@contextlib.asynccontextmanager
async def _controller(
    mosquitto: tuple[str, int], tmp_path: Path, remediation: str, prefix: str = "",
    observability: Observability | None = None,
) -> AsyncIterator[tuple[str, ScriptedLive, Topics, Path]]:  # fmt: skip
    host, port = mosquitto
    api_port = free_port()
    (tmp_path / "tokens.txt").write_text(f"operator ops {TOKEN}\ntenant acme {ACME}\n")
    conf = tmp_path / "c.toml"
    conf.write_text(
        "[fabric]\nleaves = 2\nhosts_per_leaf = 2\nspines = 2\n[controller]\ntick_s = 0.05\n"
        f'[api]\nlisten = "127.0.0.1:{api_port}"\ntoken_file = "tokens.txt"\n'
        '[api.tenants]\nacme = ["nic0", "nic2"]\nbeta = ["host3"]\n'
        f"[remediation]\n{remediation}\n"
    )
    config = load_config(conf)
    live = ScriptedLive(config.fabric, LiveConfig(solve_inline=False))
    topics = Topics(prefix or f"qpmesh/rem{api_port}")
    log_path = tmp_path / "log.jsonl"
    log_file = log_path.open("w")
    svc = asyncio.create_task(
        run_service(
            Broker(host, port, topics),
            config,
            log=JsonLog(log_file),
            live=live,
            observability=observability,
        )
    )
    base = f"http://127.0.0.1:{api_port}/api/v1/"
    try:
        for _ in range(400):  # the service logs "connected" once subscribed
            if '"connected"' in log_path.read_text():
                break
            await asyncio.sleep(0.05)
        yield base, live, topics, log_path
    finally:
        svc.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await svc
        log_file.close()


async def _wait(cond: Any, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not await cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.broker
async def test_controller_remediates_with_control_and_jobs_from_api_and_mqtt(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    op = {"Authorization": f"Bearer {TOKEN}"}
    acme = {"Authorization": f"Bearer {ACME}"}
    bodies: list[bytes] = []  # the time series, as the writer would POST it
    obs = Observability(
        build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, spines=2)),
        TimeseriesConfig("http://unused", interval_s=0.1), None,
        writer=TsdbWriter("http://unused", post=bodies.append),
    )  # fmt: skip
    async with (
        _controller(mosquitto, tmp_path, "control = false\nhold_s = 0\nmin_interval_s = 0",
                    observability=obs) as (base, live, topics, log_path),
        aiohttp.ClientSession() as http,
        aiomqtt.Client(host, port) as mq,
    ):  # fmt: skip
        await mq.subscribe(f"{topics.prefix}/remediation/#", qos=1)
        got: list[ActionDoc] = []

        async def collect() -> None:
            async for msg in mq.messages:
                assert isinstance(msg.payload, bytes)
                got.append(ActionDoc.decode(msg.payload))

        reader = asyncio.create_task(collect())
        ws = await http.ws_connect(base + "ws", headers=op)
        # a tenant registers its job through the API, on the NICs [api.tenants] grants it
        body = {"id": "acme:train", "ranks": [{"nics": ["nic0"]}, {"nics": ["nic2"]}]}
        async with http.post(base + "jobs", json=body, headers=acme) as r:
            assert r.status == 201, await r.text()
            assert (await r.json())["tenant"] == "acme"
        async with http.post(base + "jobs", json={**body, "tenant": "beta"}, headers=acme) as r:
            assert r.status == 403
        async with http.post(base + "jobs", json={**body, "tenant": "acme"}, headers=op) as r:
            assert r.status == 409
        theirs = {"id": "acme:peek", "ranks": [{"nics": ["nic3"]}]}  # beta's NIC: not acme's
        async with http.post(base + "jobs", json=theirs, headers=acme) as r:
            assert r.status == 404
        mine = {"id": "ops", "ranks": [{"nics": ["nic1"]}]}  # granted to nobody: the operator's
        async with http.post(base + "jobs", json=mine, headers=op) as r:
            assert r.status == 201, await r.text()
        async with http.delete(base + "jobs/ops", headers=op) as r:
            assert r.status == 200
        bad = {"id": "x", "ranks": [{"nics": ["nic99"]}]}
        async with http.post(base + "jobs", json=bad, headers=op) as r:
            assert r.status == 404 and "nic99" in (await r.json())["error"]["message"]

        # Control off: the down finding gives a "would have" record and nothing on the topic
        live.inject.append(("nic_down", "nic0"))

        async def would_have() -> bool:
            async with http.get(base + "actions?status=would%20have", headers=op) as r:
                return bool((await r.json())["actions"])

        await _wait(would_have)
        async with http.get(base + "actions", headers=op) as r:
            (rec,) = (await r.json())["actions"]
        assert (rec["kind"], rec["nic"], rec["job"], rec["status"]) == (
            "move_off_nic", "nic0", "acme:train", "would have"
        )  # fmt: skip
        async with http.get(base + "actions", headers=acme) as r:
            assert [a["id"] for a in (await r.json())["actions"]] == [rec["id"]]

        # an operator turns Control on through the API; a second job registers over MQTT
        async with http.put(base + "control", json={"enabled": True}, headers=op) as r:
            assert r.status == 200 and (await r.json())["enabled"] is True
        async with http.put(base + "control", json={"enabled": False}, headers=acme) as r:
            assert r.status == 403
        rank = RankDoc("infer", 0, ("nic3",), "host1", "beta")
        await mq.publish(rank_topic(topics.prefix, "infer", 0), rank.encode(), qos=1, retain=True)

        async def infer_registered() -> bool:
            async with http.get(base + "jobs", headers=op) as r:
                return "infer" in {j["id"] for j in (await r.json())["jobs"]}

        await _wait(infer_registered)
        async with http.get(base + "jobs", headers=acme) as r:
            assert {j["id"] for j in (await r.json())["jobs"]} == {"acme:train"}
        # a rank of beta's job on acme's NIC is refused (and logged), however it arrives
        steal = RankDoc("grab", 0, ("nic0",), "host0", "beta")
        await mq.publish(rank_topic(topics.prefix, "grab", 0), steal.encode(), qos=1)
        # a storm of the same finding: exactly one action goes out
        for _ in range(5):
            live.inject.append(("link_down", "nic3-leaf1"))
            await asyncio.sleep(0.06)
        await _wait(lambda: _true(bool(got)))
        await asyncio.sleep(1.0)  # many ticks later: still one
        assert [(a.kind, a.nic, a.job) for a in got] == [("move_off_nic", "nic3", "infer")]
        ack = AckDoc(got[0].id, "infer/rank0", "done", 1, "moved to nic4")
        await mq.publish(f"{topics.prefix}/remediation-ack/{got[0].id}", ack.encode(), qos=1)

        async def acked() -> bool:
            async with http.get(base + "actions?job=infer", headers=op) as r:
                acts = (await r.json())["actions"]
                return bool(acts and acts[0]["acks"])

        await _wait(acked)
        async with http.get(base + "actions?job=infer", headers=op) as r:
            (sent,) = (await r.json())["actions"]
        assert sent["status"] == "sent" and sent["acks"][0]["outcome"] == "done"
        async with http.get(base + "actions", headers=acme) as r:  # not acme's job
            assert [a["job"] for a in (await r.json())["actions"]] == ["acme:train"]
        # the events stream shows both, "would have" first
        async with http.get(base + "events?kind=remediation", headers=op) as r:
            details = [e["detail"] for e in (await r.json())["events"]]
        assert details[0].startswith("would have: move_off_nic job acme:train")
        assert details[1].startswith("sent: move_off_nic job infer")
        seen: list[str] = []
        with contextlib.suppress(TimeoutError):
            while not any(d.startswith("ack done") for d in seen):
                msg = await ws.receive_json(timeout=10)
                if msg["type"] == "event" and msg["data"]["kind"].startswith("remediation"):
                    seen.append(msg["data"]["detail"])
        assert any(d.startswith("sent: move_off_nic") for d in seen), seen
        assert any(d.startswith("ack done by infer/rank0") for d in seen), seen
        await ws.close()
        # the ranks report their step times; contention on their ring explains a slowdown
        for k, step_s in ((0, 0.1), (1, 0.1), (1, 0.3)):
            d = PerfDoc("acme:train", k, 1, 10, step_s)
            await mq.publish(perf_topic(topics.prefix, "acme:train", k), d.encode(), qos=1)
            await asyncio.sleep(0.1)
        live.inject.append(("clear", "nic0"))  # nic0 was down earlier: back now
        await asyncio.sleep(0.2)
        live.inject_flows = (("nic0", "nic2", 4791),)
        live.inject.append(("contention", "leaf0->spine1"))

        async def explained() -> bool:
            async with http.get(base + "events?kind=job_slowdown", headers=acme) as r:
                return any("ring" in e["detail"] for e in (await r.json())["events"])

        await _wait(explained)  # a tenant sees it: the hop is on its NICs' paths
        async with http.get(base + "events?kind=job_slowdown", headers=acme) as r:
            slow = (await r.json())["events"][-1]
        assert slow["detail"] == ("job acme:train: step time 3.0x; its ring crosses contended link "
                                  "leaf0->spine1 on queue pairs nic0->nic2")  # fmt: skip
        async with http.get(base + "jobs", headers=acme) as r:
            (train,) = (await r.json())["jobs"]
        assert train["perf"]["cause"] == "fabric" and train["perf"]["slowdown"] == 3.0
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await mq.publish(rank_topic(topics.prefix, "infer", 0), b"", qos=1, retain=True)
    series = b"".join(bodies).decode()  # every decision is in the time series too
    assert "qpmesh_remediation,action=move_off_nic,status=would_have,target=nic0 " in series
    assert "qpmesh_remediation,action=move_off_nic,status=sent,target=nic3 " in series
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    statuses = [x["status"] for x in lines if x["msg"] == "action"]
    assert statuses == ["would have", "sent", "sent"]  # the last: report_contention
    assert any(x["msg"] == "control" and x["enabled"] and x["actor"] == "ops" for x in lines)
    refused = [x["reason"] for x in lines if x["msg"] == "bad message" and "grab" in x["topic"]]
    assert refused and "nic0 is not granted to tenant beta" in refused[0], refused


async def _true(v: bool) -> bool:
    return v


def test_restart_resumes_from_the_state_file_without_repeating(tmp_path: Path) -> None:
    from controller.remediation.config import RemediationConfig
    from controller.remediation.policy import PolicyConfig
    from controller.remediation.state import FILE, StateError

    cfg = RemediationConfig(policy=PolicyConfig(min_interval_ns=0), control=True,
                            state_dir=tmp_path / "st")  # fmt: skip
    job = Job("train", "acme", (("nic0",), ("nic2",)))
    first = RemediationRuntime(cfg, "p", jobs=JobRegistry((job,)))
    first.observe([EventDoc(1 * SEC, "link_flap", "nic0-leaf0")])
    msgs, docs = first.tick(2 * SEC)
    assert [t for t, _ in msgs] == ["p/remediation/nic0"]
    assert first.handle(f"p/remediation-ack/{docs[0]['id']}",
                        AckDoc(docs[0]["id"], "train/rank0", "done", 3).encode())  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == [FILE]  # no temporary left
    # a new controller on the same state: the same NIC seen down anew is a new episode, but
    # the job was told already; another NIC of the job still gets its action
    second = RemediationRuntime(cfg, "p", jobs=JobRegistry((job,)))
    assert second.restored == 1
    (old,) = second.log.records()
    assert old["id"] == docs[0]["id"] and old["acks"][0]["outcome"] == "done"
    second.observe([EventDoc(50 * SEC, "nic_down", "nic0")])
    assert second.tick(51 * SEC)[0] == []
    second.observe([EventDoc(52 * SEC, "nic_down", "nic2")])
    msgs2, docs2 = second.tick(53 * SEC)
    assert [t for t, _ in msgs2] == ["p/remediation/nic2"] and docs2[0]["seq"] == 2
    # without the state file the same run repeats the action: the file is what prevents it
    fresh = RemediationRuntime(RemediationConfig(policy=cfg.policy, control=True), "p",
                               jobs=JobRegistry((job,)))  # fmt: skip
    fresh.observe([EventDoc(50 * SEC, "nic_down", "nic0")])
    assert [t for t, _ in fresh.tick(51 * SEC)[0]] == ["p/remediation/nic0"]
    (tmp_path / "st" / FILE).write_text("{not json")
    with pytest.raises(StateError, match="not JSON"):
        RemediationRuntime(cfg, "p")
    (tmp_path / "st" / FILE).write_text('{"version": 1, "issued": []}')
    with pytest.raises(StateError, match="issued must be an object"):
        RemediationRuntime(cfg, "p")


@pytest.mark.broker
async def test_two_controller_runs_on_one_state_send_an_action_once(
    mosquitto: tuple[str, int], tmp_path: Path
) -> None:
    host, port = mosquitto
    rem = 'control = true\nhold_s = 0\nstate_dir = "state"'
    async with aiomqtt.Client(host, port) as mq:
        got: list[ActionDoc] = []
        prefix = f"qpmesh/restart{free_port()}"
        await mq.subscribe(f"{prefix}/remediation/#", qos=1)
        rank = RankDoc("train", 0, ("nic0",), "host0", "acme")
        await mq.publish(rank_topic(prefix, "train", 0), rank.encode(), qos=1, retain=True)

        async def collect() -> None:
            async for msg in mq.messages:
                assert isinstance(msg.payload, bytes)
                got.append(ActionDoc.decode(msg.payload))

        reader = asyncio.create_task(collect())
        op = {"Authorization": f"Bearer {TOKEN}"}
        try:
            await _two_runs(mosquitto, tmp_path, rem, prefix, op, got)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await reader
            await mq.publish(rank_topic(prefix, "train", 0), b"", qos=1, retain=True)


async def _two_runs(mosquitto: tuple[str, int], tmp_path: Path, rem: str, prefix: str,
                op: dict[str, str], got: list[ActionDoc]) -> None:  # fmt: skip
    for run in range(2):
        async with (
            _controller(mosquitto, tmp_path, rem, prefix) as (base, live, _t, log_path),
            aiohttp.ClientSession() as http,
        ):  # fmt: skip

            async def registered(http: aiohttp.ClientSession = http, base: str = base) -> bool:
                async with http.get(base + "jobs", headers=op) as r:
                    return bool((await r.json())["jobs"])

            await _wait(registered)  # from the retained registration
            live.inject.append(("nic_down", "nic0"))
            if run == 0:
                await _wait(lambda: _true(bool(got)))
            await asyncio.sleep(1.0)  # 20 ticks
            async with http.get(base + "actions", headers=op) as r:
                acts = (await r.json())["actions"]
            assert [(a["status"], a["nic"]) for a in acts] == [("sent", "nic0")], acts
    assert [(a.kind, a.nic, a.job) for a in got] == [("move_off_nic", "nic0", "train")]
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert any(x["msg"] == "remediation state restored" and x["ids"] == 1 for x in lines)


def test_a_job_that_leaves_and_comes_back_is_told_again() -> None:
    from controller.remediation.config import RemediationConfig
    from controller.remediation.policy import PolicyConfig

    rt = RemediationRuntime(RemediationConfig(policy=PolicyConfig(min_interval_ns=0),
                                              control=True), "p")  # fmt: skip
    job = Job("demo", "acme", (("nic0", "nic1"),))
    rt.jobs.register(job)
    rt.observe([EventDoc(1 * SEC, "nic_down", "nic0")])
    assert [t for t, _ in rt.tick(3 * SEC)[0]] == ["p/remediation/nic0"]
    rt.observe([EventDoc(4 * SEC, "nic_down", "nic0")])  # still down, same job: told already
    assert rt.tick(5 * SEC)[0] == []
    rt.jobs.unregister("demo")  # the run ends; nic0 never came back clear
    rt.tick(6 * SEC)
    rt.jobs.register(job)  # a new run of the same job on the same NICs
    msgs, docs = rt.tick(7 * SEC)
    assert [t for t, _ in msgs] == ["p/remediation/nic0"] and docs[0]["job"] == "demo"
