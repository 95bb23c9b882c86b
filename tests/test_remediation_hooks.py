"""Webhooks (retries, backoff, timeout, bounded queue) against a local HTTP server that fails
and recovers; findings as Alertmanager v2 alerts to a real Alertmanager (Debian's
prometheus-alertmanager, started late: the sender retries); the Alertmanager v4 webhook intake
(fingerprint de-duplication, unknown targets, typed fields) through the API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from contract.documents import EventDoc
from controller.api.app import PREFIX, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.jobs import Job
from controller.live import LiveController
from controller.remediation.alerts import WebhookError, alert_for, labels_for, parse_webhook
from controller.remediation.config import RemediationConfig
from controller.remediation.policy import SEC, PolicyConfig
from controller.remediation.runtime import RemediationRuntime
from controller.remediation.webhook import Delivery, HookSender
from mesh.fabric import FabricShape, build_fabric
from tests.alertservers import ALERTMANAGER, Alertmanager
from tests.waiting import until as _until

pytestmark = pytest.mark.timeout(120)


class FlakyReceiver:
    """A local HTTP receiver: the first ``fail`` requests get 500, the next ``hang`` ones
    never answer (until the client gives up), then 200. Counts what it answered 200."""

    def __init__(self, fail: int = 0, hang: int = 0) -> None:
        self.fail, self.hang = fail, hang
        self.seen = 0
        self.ok: list[tuple[str, Any]] = []
        self.bodies: list[Any] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen += 1
        body = json.loads(await request.read())
        if self.fail > 0:
            self.fail -= 1
            return web.Response(status=500, text="down")
        if self.hang > 0:
            self.hang -= 1
            await asyncio.sleep(3600)
        self.ok.append((request.headers.get("Idempotency-Key", ""), body))
        return web.json_response({"ok": True})


@contextlib.asynccontextmanager
async def serve(recv: FlakyReceiver, path: str = "/hook") -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post(path, recv.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url(path))
    finally:
        await server.close()


async def _no_sleep(_s: float) -> None:
    await asyncio.sleep(0)


async def test_webhook_retries_a_failing_then_hanging_receiver_and_delivers_once() -> None:
    recv = FlakyReceiver(fail=2, hang=1)
    delays: list[float] = []

    async def sleep(s: float) -> None:
        delays.append(s)
        await asyncio.sleep(0)

    sender = HookSender(timeout_s=0.5, retries=5, backoff_s=0.1, backoff_max_s=1.0, sleep=sleep)
    async with serve(recv) as url:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        sender.offer(Delivery(url, {"id": "move_off_nic-1", "kind": "move_off_nic"}, "a-1"))
        assert loop.time() - t0 < 0.1  # offer never waits for the receiver
        assert await sender.drain(30)
        await sender.stop()
    assert [k for k, _ in recv.ok] == ["a-1"]  # delivered exactly once
    assert recv.seen == 4 and sender.stats.retries == 3 and sender.stats.delivered == 1
    assert delays == [0.1, 0.2, 0.4]  # backoff doubles
    assert sender.stats.failed == 0 and "HTTP 500" not in sender.stats.last_error


async def test_webhook_gives_up_after_retries_and_rejects_4xx() -> None:
    recv = FlakyReceiver(fail=100)
    sender = HookSender(timeout_s=1.0, retries=2, backoff_s=0.01, sleep=_no_sleep)
    async with serve(recv) as url:
        sender.offer(Delivery(url, {"n": 1}, "k1"))
        assert await sender.drain(30)
        assert sender.stats.failed == 1 and sender.stats.retries == 2 and recv.seen == 3
        sender.offer(Delivery(url.replace("/hook", "/nope"), {"n": 2}, "k2"))  # 404
        assert await sender.drain(30)
        await sender.stop()
    assert sender.stats.rejected == 1 and not recv.ok


async def test_webhook_queue_is_bounded_and_a_hung_url_does_not_hold_up_others() -> None:
    slow, fine = FlakyReceiver(hang=100), FlakyReceiver()
    sender = HookSender(timeout_s=30.0, retries=0, max_queue=3, sleep=_no_sleep)
    async with serve(slow) as slow_url, serve(fine) as fine_url:
        for i in range(10):
            sender.offer(Delivery(slow_url, {"i": i}, f"s{i}"))
        sender.offer(Delivery(fine_url, {"i": 0}, "f0"))
        # the sender's side of f0 done (the receiver has it before the sender reads the
        # answer and takes it off its queue); a busy CI machine may take seconds
        await _until(lambda: sender.stats.delivered == 1)
        assert [k for k, _ in fine.ok] == ["f0"]  # while the slow URL hangs
        assert sender.pending == 3 and sender.stats.dropped == 7
        await sender.stop()


def test_alert_labels_and_shape() -> None:
    leaf_of = {"nic3": "leaf1"}
    assert labels_for("link_flap", "leaf0-spine1", leaf_of) == {
        "alertname": "QpmeshLinkFlap", "link": "leaf0-spine1", "nic": "", "leaf": "leaf0",
        "action": "replace_link", "severity": "warning", "target": "leaf0-spine1",
    }  # fmt: skip
    lab = labels_for("link_down", "nic3-leaf1", leaf_of)
    assert (lab["alertname"], lab["nic"], lab["leaf"], lab["action"]) == (
        "QpmeshNicDown", "nic3", "leaf1", "move_off_nic"
    )  # fmt: skip
    assert labels_for("nic_down", "nic3", leaf_of)["leaf"] == "leaf1"
    assert labels_for("contention", "leaf1-spine0", leaf_of)["alertname"] == "QpmeshContention"
    a = alert_for("nic_down", "nic3", "silent", 1_700_000_000_123_000_000, leaf_of, 300)
    assert a is not None
    assert a["startsAt"] == "2023-11-14T22:13:20.123Z" and a["endsAt"] == "2023-11-14T22:18:20.123Z"
    assert alert_for("prober_down", "host1", "", 1, leaf_of, 1) is None


def _am(alerts: list[dict[str, Any]], status: str = "firing") -> dict[str, Any]:
    return {"version": "4", "groupKey": "{}:{alertname=\"X\"}", "status": status,
            "receiver": "qpmesh", "alerts": alerts}  # fmt: skip


def test_parse_alertmanager_webhook() -> None:
    alerts = [
        {"status": "firing", "fingerprint": "f1", "labels": {"action": "move_off_nic", "nic": "nic0"}},
        {"status": "resolved", "fingerprint": "f2", "labels": {"action": "move_off_nic", "nic": "nic0"}},
        {"status": "firing", "fingerprint": "f3", "labels": {"alertname": "HighTemp"}},
        {"status": "firing", "labels": {"action": "replace_link", "link": "leaf0-spine1", "job": "j"}},
    ]  # fmt: skip
    reqs, ignored = parse_webhook(_am(alerts))
    assert ignored == 2 and (reqs[0].fingerprint, reqs[0].kind, reqs[0].nic, reqs[0].link) == (
        "f1", "move_off_nic", "nic0", ""
    )  # fmt: skip
    assert reqs[1].job == "j" and len(reqs[1].fingerprint) == 16  # derived from the labels
    for bad in (
        [], {"version": "3", "groupKey": "", "status": "firing", "alerts": []},
        _am([{"labels": {"action": "move_off_nic"}}]),  # no nic
        _am([{"labels": {"action": "move_off_nic", "nic": "a/b"}}]),
        _am([{"labels": {"action": "replace_link", "link": "l", "job": "bad job"}}]),
        _am([{"labels": {"x": 1}}]), _am(["x"]),  # type: ignore[list-item]
    ):  # fmt: skip
        with pytest.raises(WebhookError):
            parse_webhook(bad)


@pytest.mark.skipif(not Path(ALERTMANAGER).exists(), reason="prometheus-alertmanager (.ci/setup)")
async def test_findings_reach_a_real_alertmanager_and_sent_actions_the_webhook(
    tmp_path: Path,
) -> None:
    """Findings as v2 alerts to Debian's prometheus-alertmanager, which is not up yet when the
    first one is sent (the sender retries until it is); the clear resolves the flap alert."""
    am, hook = Alertmanager(tmp_path / "am"), FlakyReceiver()
    base = time.time_ns()  # Alertmanager drops alerts whose end has passed: real times
    try:
        async with serve(hook) as hook_url:
            cfg = RemediationConfig(
                policy=PolicyConfig(min_interval_ns=0), control=True, webhooks=(hook_url,),
                alertmanager=am.url,
            )  # fmt: skip
            sender = HookSender(timeout_s=2.0, retries=40, backoff_s=0.1, backoff_max_s=0.5)
            rt = RemediationRuntime(cfg, "p", leaf_of={"nic0": "leaf0"}, sender=sender)
            rt.jobs.register(Job("train", "acme", (("nic0",),)))
            rt.observe([EventDoc(base, "link_flap", "nic0-leaf0", "3 flaps"),
                        EventDoc(base, "contention", "leaf0-spine1", "q")])  # fmt: skip
            msgs, docs = rt.tick(base + SEC)
            for _ in range(200):  # the first POST finds nobody listening ...
                if sender.stats.retries:
                    break
                await asyncio.sleep(0.02)
            assert sender.stats.retries >= 1, sender.stats
            await asyncio.to_thread(am.start)  # ... then the Alertmanager comes up
            assert await sender.drain(60)
            active = {a["labels"]["alertname"]: a for a in am.alerts(active="true")}
            now = max(time.time_ns(), base + 2 * SEC)
            rt.observe([EventDoc(now, "clear", "nic0-leaf0")])
            await asyncio.sleep(max(0.0, (now - time.time_ns()) / 1e9))  # the end is now
            rt.tick(now)
            assert await sender.drain(60)
            await sender.stop()
            after = {a["labels"]["alertname"] for a in am.alerts(active="true")}
    finally:
        am.stop()
    assert sorted(t for t, _ in msgs) == ["p/remediation/leaf0-spine1", "p/remediation/nic0"]
    # the webhook: one POST per sent action, the action's fields and its status
    assert sorted(k for k, _ in hook.ok) == sorted(d["id"] for d in docs)
    body = next(b for _, b in hook.ok if b["kind"] == "move_off_nic")
    assert body["job"] == "train" and body["status"] == "sent" and body["nic"] == "nic0"
    # the Alertmanager holds both alerts, with qpmesh's labels ...
    assert set(active) == {"QpmeshLinkFlap", "QpmeshContention"}
    flap = active["QpmeshLinkFlap"]
    assert flap["labels"] == {"alertname": "QpmeshLinkFlap", "link": "nic0-leaf0", "nic": "nic0",
                              "leaf": "leaf0", "action": "move_off_nic", "severity": "warning",
                              "target": "nic0-leaf0"}  # fmt: skip
    assert flap["annotations"]["summary"] == "link_flap on nic0-leaf0"
    assert flap["status"]["state"] == "active" and flap["endsAt"] > flap["startsAt"]
    # ... and the clear resolved the flap alert there; the contention is still firing
    assert after == {"QpmeshContention"}


TOK, TEN = "am-operator-token", "am-tenant-token"


async def test_alertmanager_intake_route_deduplicates_by_fingerprint() -> None:
    fab = build_fabric(FabricShape.for_nics(4))
    rt = RemediationRuntime(RemediationConfig(control=True), "p")
    rt.jobs.register(Job("train", "acme", (("nic0",), ("nic1",))))
    tokens = TokenTable({TOK: Principal("operator", "ops"), TEN: Principal("tenant", "acme")})
    app = make_app(ApiHub(LiveController(fab).snapshot()), tokens, jobs=rt.jobs, control=rt.control,
                   actions=rt.log, ask=rt.ask, wall_ns=lambda: 5 * SEC)  # fmt: skip
    payload = _am([{"status": "firing", "fingerprint": "abc123",
                    "labels": {"alertname": "NicErrors", "action": "move_off_nic", "nic": "nic0"}}])  # fmt: skip
    async with TestClient(TestServer(app)) as c:
        op = {"Authorization": f"Bearer {TOK}"}
        r = await c.post(PREFIX + "/alertmanager", json=payload, headers=op)
        assert r.status == 200 and await r.json() == {"accepted": 1, "duplicates": 0,
                                                       "ignored": 0, "unknown": 0}  # fmt: skip
        # an alert about something that does not exist asks for nothing
        ghost = _am([{"fingerprint": "g1", "labels": {"action": "move_off_nic", "nic": "nic999"}},
                     {"fingerprint": "g2", "labels": {"action": "replace_link", "link": "x-y"}},
                     {"fingerprint": "g3", "labels": {"action": "move_off_nic", "nic": "nic1",
                                                      "job": "nope"}}])  # fmt: skip
        r = await c.post(PREFIX + "/alertmanager", json=ghost, headers=op)
        assert await r.json() == {"accepted": 0, "duplicates": 0, "ignored": 0, "unknown": 3}
        for bad in ({"fingerprint": {}}, {"fingerprint": "x" * 65}, {"status": "pending"},
                    {"annotations": {"a": 1}}, {"startsAt": 5}):  # fmt: skip
            alert = {"labels": {"action": "move_off_nic", "nic": "nic0"}, **bad}
            r = await c.post(PREFIX + "/alertmanager", json=_am([alert]), headers=op)
            assert r.status == 400, bad
        msgs, docs = rt.tick(6 * SEC)
        r = await c.post(PREFIX + "/alertmanager", json=payload, headers=op)  # same fingerprint
        assert (await r.json())["duplicates"] == 1
        assert rt.tick(7 * SEC) == ([], [])
        r = await c.post(PREFIX + "/alertmanager", json=payload,
                         headers={"Authorization": f"Bearer {TEN}"})  # fmt: skip
        assert r.status == 403
        r = await c.post(PREFIX + "/alertmanager", json={"version": "4"}, headers=op)
        assert r.status == 400 and "alerts" in (await r.json())["error"]["message"]
        r = await c.get(PREFIX + "/actions", headers=op)
        (act,) = (await r.json())["actions"]
    assert [t for t, _ in msgs] == ["p/remediation/nic0"]
    assert (act["kind"], act["nic"], act["job"], act["status"]) == (
        "move_off_nic", "nic0", "train", "sent"
    )  # fmt: skip
    assert act["finding"] == "alert@abc123" and "NicErrors" in act["reason"]
    assert docs[0]["id"] == act["id"]


def test_alert_request_with_control_off_is_would_have() -> None:
    rt = RemediationRuntime(RemediationConfig(control=False), "p")
    payload = _am([{"fingerprint": "z", "labels": {"action": "replace_link", "link": "leaf0-spine1"}}])  # fmt: skip
    assert rt.ask(payload, 1)["accepted"] == 1
    msgs, docs = rt.tick(2)
    assert msgs == [] and [d["status"] for d in docs] == ["would have"]


def test_alert_requested_actions_are_signed_like_the_policys() -> None:
    from contract.actionsig import ActionSigner, public_from_private, verify_action
    from contract.keys import ED25519_PRIVATE, ED25519_PUBLIC, format_key_file, parse_key_file

    seed = bytes(range(32))
    priv = parse_key_file(format_key_file([("c1", ED25519_PRIVATE, seed)]), "ctl.keys")
    pub = parse_key_file(
        format_key_file([("c1", ED25519_PUBLIC, public_from_private(seed))]), "agent.pub"
    )
    rt = RemediationRuntime(RemediationConfig(control=True), "p", sign=ActionSigner(priv).sign)
    payload = _am([{"fingerprint": "s", "labels": {"action": "move_off_nic", "nic": "nic0"}}])
    rt.ask(payload, 1 * SEC)
    ((topic, signed),) = rt.tick(2 * SEC)[0]
    assert topic == "p/remediation/nic0" and verify_action(signed, pub).nic == "nic0"
