"""The controller-side glue: findings in, actions out, an audit trail kept. Time passed in.

`Remediator` holds the policy's state between steps. The service (or any driver) calls
`observe` with each finding as it is published (a `contract.documents.EventDoc`) and `tick`
on a timer with the registered jobs' NICs, the Control switch and a ``publish(topic,
payload)`` callable (or
`tick_with` the API's `controller.jobs.JobRegistry` and `controller.control.Control`); `tick`
returns this step's audit records (`controller.remediation.publish.audit_record`), which
also stay in `audit` (bounded) for the API and the events pane.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from contract.documents import EventDoc
from contract.remediation import ActionDoc
from controller.control import Control
from controller.jobs import JobRegistry
from controller.remediation.policy import (
    DOWN_KINDS,
    Finding,
    JobNics,
    PolicyConfig,
    PolicyState,
    decide,
    finding,
)
from controller.remediation.publish import send_planned

KINDS = (*DOWN_KINDS, "clear", "contention")


def job_nics(registry: JobRegistry) -> JobNics:
    """Return job id -> NICs of every rank, from the job registry (`controller.jobs`)."""
    return {j.id: j.nics for j in registry.jobs()}


class Remediator:
    """Policy state + pending findings + audit (see the module docstring)."""

    def __init__(self, config: PolicyConfig | None = None, prefix: str = "qpmesh/v1",
                 audit_limit: int = 1000,
                 sign: Callable[[ActionDoc], bytes] | None = None) -> None:  # fmt: skip
        self.config = config or PolicyConfig()
        self.prefix = prefix
        self.sign = sign  # contract.actionsig.ActionSigner.sign; None: actions go out unsigned
        self.state = PolicyState()
        self.pending: list[Finding] = []
        self.audit: deque[dict[str, Any]] = deque(maxlen=audit_limit)

    def observe(self, ev: EventDoc) -> Finding | None:
        """Queue one finding for the next tick; return it, or None when the policy ignores it."""
        if ev.kind not in KINDS:
            return None
        f = finding(ev.kind, ev.target, ev.t_ns, ev.detail, ev.flows)
        self.pending.append(f)
        return f

    def tick(self, jobs: JobNics, control_enabled: bool, now_ns: int,
             publish: Callable[[str, bytes], None]) -> list[dict[str, Any]]:  # fmt: skip
        """Run one policy step; publish the ``send`` actions; return their audit records."""
        d = decide(self.config, self.state, tuple(self.pending), jobs, control_enabled, now_ns)
        self.state, self.pending = d.state, []
        out = send_planned(d.actions, publish, now_ns, self.prefix, self.sign)
        self.audit.extend(out)
        return out

    def tick_with(self, registry: JobRegistry, control: Control, now_ns: int,
                  publish: Callable[[str, bytes], None]) -> list[dict[str, Any]]:  # fmt: skip
        """`tick` with the jobs of ``registry`` and the state of ``control`` (the API's)."""
        return self.tick(job_nics(registry), control.enabled, now_ns, publish)
