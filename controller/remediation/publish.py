"""The thin adapter that sends the policy's actions: MQTT publish + audit lines.

`send_planned` publishes each ``send`` action on ``<prefix>/remediation/<target>`` (QoS 1),
signed when a signer is given (`contract.actionsig`, docs/security.md), through any
``publish(topic, payload)`` callable (aiomqtt, paho, a test double), and returns
one audit record per planned action (``would_have`` and ``suppressed`` ones included, nothing
sent for them), ready for the event log and the API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from contract.remediation import ActionDoc, action_topic
from controller.remediation.policy import Planned


def audit_record(p: Planned, now_ns: int) -> dict[str, Any]:
    """Return the audit line of one planned action (what, why, which finding, when, how)."""
    return {"t_ns": now_ns, "kind": "remediation", "disposition": p.disposition,
            **p.action.to_dict()}  # fmt: skip


def send_planned(
    planned: Iterable[Planned],
    publish: Callable[[str, bytes], None],
    now_ns: int,
    prefix: str = "qpmesh/v1",
    sign: Callable[[ActionDoc], bytes] | None = None,
) -> list[dict[str, Any]]:
    """Publish the ``send`` actions; return the audit records of all of them.

    ``sign`` (`contract.actionsig.ActionSigner.sign`) makes each payload a signed action the
    recovery agents verify; None publishes the plain `ActionDoc` JSON (unsigned).
    """
    out = []
    for p in planned:
        if p.disposition == "send":
            payload = sign(p.action) if sign is not None else p.action.encode()
            publish(action_topic(prefix, p.action.target), payload)
        out.append(audit_record(p, now_ns))
    return out
