"""Remediation inside the controller service: findings in, actions out, everything audited.

`RemediationRuntime` holds what the service and its API share: the `JobRegistry` (filled by
``POST /api/v1/jobs`` and by the ranks' MQTT registrations through `RankFeed`), the `Control`
switch (``PUT /api/v1/control``), the `Remediator` (the policy's state) and the `ActionLog`
(``GET /api/v1/actions``). Each tick the service calls `observe` with the tick's findings and
`tick(now_ns)`, which returns the MQTT messages to publish (``send`` actions only: with
Control off nothing is sent and the records say "would have") and the audit records, which
the service hands to the API's event stream (`events_of`), the time series and its log.
`handle` takes the messages of the remediation-ack and jobs topics. No I/O here: the service
publishes the returned messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from contract.remediation import REMEDIATION_ACK, AckDoc, DocumentError, jobs_subscription
from controller.control import Control, ControlChange
from controller.jobfeed import RankFeed
from controller.jobs import JobRegistry
from controller.remediation.audit import ActionLog
from controller.remediation.config import RemediationConfig
from controller.remediation.loop import FindingLike, Remediator
from controller.snapshot import MeshEvent

Message = tuple[str, bytes]
"""(topic, payload) to publish with QoS 1."""


def action_event(doc: dict[str, Any]) -> MeshEvent:
    """Return the event-stream entry of one audit record: kind ``remediation``, the action's
    NIC or link as target, the status first in the detail ("would have: move_off_nic ...")."""
    target = doc.get("nic") or doc.get("link") or "controller"
    job = f" job {doc['job']}" if doc.get("job") else ""
    detail = f"{doc['status']}: {doc['kind']}{job} ({doc['id']}): {doc.get('reason', '')}"
    flows = tuple((str(f[0]), str(f[1]), int(f[2])) for f in doc.get("flows", ()))
    sev = "info" if doc["status"] != "sent" else "warning"
    return MeshEvent(int(doc["t_ns"]), "remediation", str(target), detail, sev, flows)


def ack_event(doc: dict[str, Any], ack: AckDoc) -> MeshEvent:
    """Return the event-stream entry of an acknowledgement of a sent action."""
    target = doc.get("nic") or doc.get("link") or "controller"
    detail = f"ack {ack.outcome} by {ack.receiver}: {doc['kind']} ({ack.action}) {ack.detail}"
    sev = "warning" if ack.outcome == "failed" else "info"
    return MeshEvent(ack.t_ns, "remediation_ack", str(target), detail.strip(), sev)


class RemediationRuntime:
    """The service's remediation state (see the module docstring)."""

    def __init__(
        self,
        config: RemediationConfig | None = None,
        prefix: str = "qpmesh/v1",
        *,
        jobs: JobRegistry | None = None,
        on_control: Callable[[ControlChange], None] | None = None,
    ) -> None:
        self.config = config or RemediationConfig()
        self.prefix = prefix
        self.jobs = jobs or JobRegistry()
        self.control = Control(self.config.control, on_change=on_control)
        self.remediator = Remediator(self.config.policy, prefix)
        self.log = ActionLog()
        self.feed = RankFeed(self.jobs, prefix)
        self.counters: dict[str, int] = {}

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """Return the filters the service subscribes to for acks and rank registrations."""
        return (f"{self.prefix}/{REMEDIATION_ACK}/#", jobs_subscription(self.prefix))

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    def observe(self, findings: Iterable[FindingLike]) -> None:
        """Queue the tick's findings for the policy (kinds it does not act on are dropped)."""
        for f in findings:
            self.remediator.observe(f)

    def tick(self, now_ns: int) -> tuple[list[Message], list[dict[str, Any]]]:
        """Run one policy step; return (messages to publish, audit documents)."""
        out: list[Message] = []
        records = self.remediator.tick_with(
            self.jobs, self.control, now_ns, lambda t, p: out.append((t, p))
        )
        docs = []
        for rec in records:
            job = self.jobs.get(str(rec.get("job", ""))) if rec.get("job") else None
            docs.append(self.log.add(rec, job.tenant if job is not None else ""))
            self._count(f"action_{docs[-1]['status'].replace(' ', '_')}")
        return out, docs

    def handle(self, topic: str, payload: bytes) -> tuple[str, MeshEvent | None] | None:
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
            return "ack", ack_event(doc, ack)
        out = self.feed.apply(topic, payload)
        return None if out == "ignored" else (out, None)
