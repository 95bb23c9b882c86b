"""Remediation inside the controller service: findings in, actions out, everything audited.

`RemediationRuntime` holds what the service and its API share: the `JobRegistry` (filled by
``POST /api/v1/jobs`` and by the ranks' MQTT registrations through `RankFeed`), the `Control`
switch (``PUT /api/v1/control``), the `Remediator` (the policy's state) and the `ActionLog`
(``GET /api/v1/actions``). Each tick the service calls `observe` with the tick's findings and
`tick(now_ns)`, which returns the MQTT messages to publish (``send`` actions only: with
Control off nothing is sent and the records say "would have") and the audit records, which
the service hands to the API's event stream (`events_of`), the time series and its log.
`handle` takes the messages of the remediation-ack and jobs topics.

Around that, when configured (`RemediationConfig`): every sent action is POSTed as JSON to the
webhooks and every finding becomes an Alertmanager v2 alert (`controller.remediation.alerts`),
both through one `HookSender` (bounded queues, retries, timeouts: never blocking the tick);
`ask(payload, now_ns)` takes an Alertmanager v4 webhook (an operator's alert pipeline asking
for actions; one action per alert fingerprint, ever); with ``state_dir`` the policy state, the
fingerprints and the recent audit records are written after each tick that changed them and
read back at start (`controller.remediation.state`), so a restarted controller does not repeat
what it sent. The service publishes the returned messages; HTTP runs in the sender's tasks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from contract.documents import EventDoc
from contract.remediation import (
    REMEDIATION_ACK,
    AckDoc,
    ActionDoc,
    DocumentError,
    PerfDoc,
    jobs_subscription,
    parse_perf_topic,
)
from controller.attribution import Attribution, AttributionConfig, JobPerf, attribute
from controller.control import Control, ControlChange
from controller.jobfeed import RankFeed
from controller.jobs import JobRegistry
from controller.remediation.alerts import Request, alert_for, parse_webhook, resolve
from controller.remediation.audit import ActionLog
from controller.remediation.config import RemediationConfig
from controller.remediation.loop import Remediator
from controller.remediation.policy import Planned, action_id
from controller.remediation.publish import send_planned
from controller.remediation.state import StateFile, dump_state, load_state
from controller.remediation.webhook import Delivery, HookSender

Message = tuple[str, bytes]
"""(topic, payload) to publish with QoS 1."""
ALERT_HOLD_S = 300.0  # an alert Alertmanager hears nothing more about ends this much later
MAX_FINGERPRINTS = 100_000
KEEP_RECORDS = 500  # audit records kept in the state file


def action_event(doc: dict[str, Any]) -> EventDoc:
    """Return the event-stream entry of one audit record: kind ``remediation``, the action's
    NIC or link as target, the status first in the detail ("would have: move_off_nic ...")."""
    target = doc.get("nic") or doc.get("link") or "controller"
    job = f" job {doc['job']}" if doc.get("job") else ""
    detail = f"{doc['status']}: {doc['kind']}{job} ({doc['id']}): {doc.get('reason', '')}"
    flows = tuple((str(f[0]), str(f[1]), int(f[2])) for f in doc.get("flows", ()))
    sev = "info" if doc["status"] != "sent" else "warning"
    return EventDoc(int(doc["t_ns"]), "remediation", str(target), detail, sev, flows)


def ack_event(doc: dict[str, Any], ack: AckDoc) -> EventDoc:
    """Return the event-stream entry of an acknowledgement of a sent action."""
    target = doc.get("nic") or doc.get("link") or "controller"
    detail = f"ack {ack.outcome} by {ack.receiver}: {doc['kind']} ({ack.action}) {ack.detail}"
    sev = "warning" if ack.outcome == "failed" else "info"
    return EventDoc(ack.t_ns, "remediation_ack", str(target), detail.strip(), sev)


class RemediationRuntime:
    """The service's remediation state (see the module docstring).

    Raises `StateError` at construction when ``state_dir`` holds an unusable state file.
    """

    def __init__(
        self,
        config: RemediationConfig | None = None,
        prefix: str = "qpmesh/v1",
        *,
        jobs: JobRegistry | None = None,
        on_control: Callable[[ControlChange], None] | None = None,
        leaf_of: Mapping[str, str] | None = None,
        sender: HookSender | None = None,
        sign: Callable[[ActionDoc], bytes] | None = None,
    ) -> None:
        self.config = config or RemediationConfig()
        self.prefix = prefix
        self.jobs = jobs or JobRegistry()
        self.control = Control(self.config.control, on_change=on_control)
        # sign: contract.actionsig.ActionSigner.sign (the controller's [auth] action_key_file);
        # None: actions are published unsigned (the service logs a warning)
        self.remediator = Remediator(self.config.policy, prefix, sign=sign)
        self.log = ActionLog()
        self.feed = RankFeed(self.jobs, prefix)
        self.counters: dict[str, int] = {}
        self.leaf_of = dict(leaf_of or {})
        self.sender = sender or HookSender(timeout_s=self.config.webhook_timeout_s,
                                           retries=self.config.webhook_retries)  # fmt: skip
        self.fingerprints: dict[str, int] = {}
        self._asked: list[tuple[Request, int]] = []
        self._alerts: list[dict[str, Any]] = []
        self._firing: dict[str, dict[str, Any]] = {}
        self.restored = 0
        self.attribution_config = AttributionConfig()
        self.perf: dict[str, JobPerf] = {}
        self.attributions: dict[str, Attribution] = {}
        self._recent: deque[EventDoc] = deque(maxlen=2000)
        self._perf_dirty: set[str] = set()
        self._seen_jobs: set[str] = set()
        self.state_error = ""
        self.state_file = StateFile(self.config.state_dir) if self.config.state_dir else None
        if self.state_file is not None:
            doc = self.state_file.read()
            if doc is not None:
                st, self.fingerprints, records = load_state(doc)
                self.remediator.state = st
                self.log.restore(records)
                self.restored = len(st.issued)

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """Return the filters the service subscribes to for acks and rank registrations."""
        return (f"{self.prefix}/{REMEDIATION_ACK}/#", jobs_subscription(self.prefix))

    def _count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def observe(self, findings: Iterable[EventDoc]) -> None:
        """Queue the tick's findings for the policy (kinds it does not act on are dropped) and
        for Alertmanager (when configured)."""
        for f in findings:
            self.remediator.observe(f)
            if f.kind in ("nic_down", "link_down", "link_flap", "clear", "contention"):
                self._recent.append(f)
                self._perf_dirty.update(self.perf)  # a new finding may explain a slowdown
            if not self.config.alertmanager:
                continue
            if f.kind == "clear":
                for key in [k for k in self._firing if k.endswith(f"|{f.target}")]:
                    self._alerts.append(resolve(self._firing.pop(key), f.t_ns))
                continue
            alert = alert_for(f.kind, f.target, f.detail, f.t_ns, self.leaf_of, ALERT_HOLD_S)
            if alert is not None:
                self._alerts.append(alert)
                self._firing[f"{alert['labels']['alertname']}|{f.target}"] = alert

    def ask(self, payload: Any, now_ns: int) -> dict[str, Any]:
        """Take an Alertmanager v4 webhook payload; queue one action request per new alert
        fingerprint for the next tick; return ``{"accepted", "duplicates", "ignored"}``.
        Raises `controller.remediation.alerts.WebhookError` on a malformed payload."""
        reqs, ignored = parse_webhook(payload)
        accepted = dups = 0
        for r in reqs:
            if r.fingerprint in self.fingerprints:
                dups += 1
                continue
            if len(self.fingerprints) >= MAX_FINGERPRINTS:
                oldest = min(self.fingerprints, key=self.fingerprints.__getitem__)
                del self.fingerprints[oldest]
            self.fingerprints[r.fingerprint] = now_ns
            self._asked.append((r, now_ns))
            accepted += 1
        self._count("alert_requests", accepted)
        return {"accepted": accepted, "duplicates": dups, "ignored": ignored}

    def _requested(self, now_ns: int) -> list[Planned]:
        """Return the actions the queued alert requests ask for (Control decides send or
        would have; the fingerprint keeps each id unique)."""
        out = []
        ttl = self.config.policy.ttl_ns
        disp = "send" if self.control.enabled else "would_have"
        for r, _t in self._asked:
            jobs = [r.job] if r.job else (
                sorted(j.id for j in self.jobs.jobs() if r.nic in j.nics) if r.nic else []
            ) or [""]  # fmt: skip
            for job in jobs:
                target = r.nic or r.link
                try:
                    a = ActionDoc(
                        id=action_id(r.kind, target, f"{job}|alert:{r.fingerprint}", 0),
                        kind=r.kind, reason=r.reason, finding=f"alert@{r.fingerprint}",
                        issued_at_ns=now_ns, expires_at_ns=now_ns + ttl, nic=r.nic,
                        link=r.link,
                        job=job,
                    )  # fmt: skip
                except DocumentError:  # parse_webhook checked the labels: not expected
                    self._count("alert_requests_bad")
                    continue
                out.append(Planned(a, disp))
        self._asked = []
        return out

    def tick(self, now_ns: int) -> tuple[list[Message], list[dict[str, Any]]]:
        """Run one policy step (and the alert requests); return (messages to publish, audit
        documents). Sent actions are offered to the webhooks, alerts to Alertmanager."""
        out: list[Message] = []
        self._forget_gone_jobs()
        records = self.remediator.tick_with(
            self.jobs, self.control, now_ns, lambda t, p: out.append((t, p))
        )
        if self._asked:
            asked = send_planned(self._requested(now_ns), lambda t, p: out.append((t, p)),
                                 now_ns, self.prefix, self.remediator.sign)  # fmt: skip
            self.remediator.audit.extend(asked)
            records += asked
        docs = []
        for rec in records:
            job = self.jobs.get(str(rec.get("job", ""))) if rec.get("job") else None
            doc = self.log.add(rec, job.tenant if job is not None else "")
            docs.append(doc)
            self._count(f"action_{doc['status'].replace(' ', '_')}")
            if doc["status"] == "sent":
                body = {k: v for k, v in doc.items() if k not in ("acks", "seq")}
                for url in self.config.webhooks:
                    self.sender.offer(Delivery(url, body, doc["id"]))
        if self._alerts:
            url = self.config.alertmanager.rstrip("/") + "/api/v2/alerts"
            self.sender.offer(Delivery(url, self._alerts, f"alerts-{now_ns}"))
            self._alerts = []
        if docs:
            self.save()
        return out, docs

    def _forget_gone_jobs(self) -> None:
        """Drop the jobs that left the registry since the last tick from the policy's "told to
        move off" memory: a job that comes back under the same id (a new run) is a new job and
        is told again. Only jobs seen registered before are dropped, so a restarted controller
        keeps what its state file says until the retained registrations are back."""
        now = {j.id for j in self.jobs.jobs()}
        gone, self._seen_jobs = self._seen_jobs - now, now
        st = self.remediator.state
        if gone and any(j in gone for js in st.moved.values() for j in js):
            moved = {n: frozenset(js - gone) for n, js in st.moved.items()}
            ids = {d["id"] for d in self.log.records() if d["job"] in gone}
            issued = {i: t for i, t in st.issued.items() if i not in ids}
            self.remediator.state = replace(
                st, moved={n: js for n, js in moved.items() if js}, issued=issued
            )

    def save(self) -> None:
        """Write the state file (if configured and changed); a write that fails is counted
        (``state_write_failed``, ``state_error``) and tried again at the next change."""
        if self.state_file is None:
            return
        recs = self.log.records()[-KEEP_RECORDS:]
        try:
            self.state_file.write(dump_state(self.remediator.state, self.fingerprints, recs))
        except OSError as exc:
            self._count("state_write_failed")
            self.state_error = f"{self.state_file.path}: {exc.strerror or exc}"

    def handle(self, topic: str, payload: bytes) -> tuple[str, EventDoc | None] | None:
        """Apply a message of an ack or jobs topic; return (outcome, event to show or None),
        or None when the topic is not one of ours. Outcomes: ``ack``, ``ack_unmatched``,
        ``jobs``, ``bad:<reason>``. Never raises."""
        if topic.startswith(f"{self.prefix}/{REMEDIATION_ACK}/"):
            try:
                ack = AckDoc.decode(payload)
            except DocumentError as exc:
                return f"bad:{exc}", None
            doc = self.log.ack(ack)
            if doc is None:
                return "ack_unmatched", None
            self.save()
            return "ack", ack_event(doc, ack)
        where = parse_perf_topic(self.prefix, topic)
        if where is not None:
            return self._perf_report(where, payload), None
        out = self.feed.apply(topic, payload)
        return None if out == "ignored" else (out, None)

    def _perf_report(self, where: tuple[str, int], payload: bytes) -> str:
        try:
            doc = PerfDoc.decode(payload)
        except DocumentError as exc:
            return f"bad:{exc}"
        if (doc.job, doc.rank) != where:
            return f"bad:perf report of {doc.job}/rank{doc.rank} on the topic of {where}"
        job = self.jobs.get(doc.job)
        if job is None:
            return "perf_unknown_job"
        self.perf[doc.job] = self.perf.get(doc.job, JobPerf()).with_report(doc, len(job.ranks))
        self._perf_dirty.add(doc.job)
        return "perf"

    def job_events(self, now_ns: int) -> list[EventDoc]:
        """Attribute the slowdowns of the jobs with news (a report, a finding); return an event
        (kind ``job_slowdown``) per job whose explanation changed."""
        out = []
        for job_id in sorted(self._perf_dirty):
            job, perf = self.jobs.get(job_id), self.perf.get(job_id)
            if job is None or perf is None:
                self.perf.pop(job_id, None)
                self.attributions.pop(job_id, None)
                continue
            a = attribute(job, perf, self._recent, now_ns, self.attribution_config)
            self.perf[job_id] = JobPerf(perf.ranks, perf.baseline_s, perf.timeouts)
            old = self.attributions.pop(job_id, None)
            if a is None:
                continue
            self.attributions[job_id] = a
            if old is None or old.text != a.text:
                nics = sorted(job.nics)
                target = a.links[0] if a.links else nics[0]
                sev = "warning" if a.cause == "fabric" else "info"
                out.append(EventDoc(now_ns, "job_slowdown", target, f"job {job_id}: {a.text}",
                                     sev, a.flows))  # fmt: skip
        self._perf_dirty.clear()
        return out

    def job_status(self, job_id: str) -> dict[str, Any] | None:
        """Return the job's step-time figures and its slowdown's attribution for the API
        (None before its first report)."""
        perf = self.perf.get(job_id)
        if perf is None or perf.step_s is None:
            return None
        a = self.attributions.get(job_id)
        base = perf.baseline_s or perf.step_s
        doc: dict[str, Any] = {"step_s": perf.step_s, "baseline_s": base,
                               "slowdown": round(perf.step_s / base, 2),
                               "timeouts": perf.timeouts, "cause": "none", "text": "",
                               "links": [], "flows": []}  # fmt: skip
        if a is not None:
            doc.update(a.to_dict())
        return doc

    def health(self) -> dict[str, Any]:
        """Return the counters and the webhook sender's figures."""
        return {**self.counters, "restored_ids": self.restored,
                "hooks": self.sender.stats.to_dict(), "hooks_pending": self.sender.pending}  # fmt: skip
