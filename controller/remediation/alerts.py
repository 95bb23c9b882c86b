"""Alertmanager conventions, both ways (pure): findings -> v2 alerts, v4 webhooks -> requests.

Out: `alert_for(finding, leaf_of, now_ns, hold_s)` returns the Alertmanager v2 alert of a
finding (``POST /api/v2/alerts`` takes a list of them): ``labels`` ``alertname``
(`ALERTNAMES`: ``QpmeshLinkFlap``, ``QpmeshNicDown``, ``QpmeshLinkDown``,
``QpmeshContention``), ``link``, ``nic``, ``leaf``, ``action`` (what the policy does about
it: ``move_off_nic``, ``replace_link`` (a switch link), ``report_contention``),
``severity``; ``annotations`` ``summary``; ``startsAt`` the finding time, ``endsAt`` ``hold_s``
later (Alertmanager resolves it then unless it is posted again); a ``clear`` finding resolves
the alert of its target (``endsAt`` = now) through `resolve`. Times are RFC 3339 UTC.

In: `parse_webhook(doc)` reads an Alertmanager webhook payload (``version`` "4",
``groupKey``, ``status``, ``alerts[]`` with ``status``, ``labels``, ``fingerprint``) into the
`Request`s it asks for: a firing alert whose labels name an ``action`` (one of
`contract.remediation.ACTION_KINDS`) and its ``nic`` (NIC actions) or ``link`` (the others),
optionally ``job``. Resolved alerts and alerts without an action label ask for nothing (they
are counted as ignored). Raises `WebhookError` (one line) on a malformed payload.
`known_only` leaves out the alerts that name a NIC, link or job that does not exist (the API
does this before it hands a webhook on: an alert about ``nic999`` never becomes an action).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from contract.remediation import ACTION_KINDS, NIC_ACTIONS, DocumentError, action_topic

ALERTNAMES = {
    "link_flap": "QpmeshLinkFlap",
    "nic_down": "QpmeshNicDown",
    "link_down": "QpmeshLinkDown",
    "contention": "QpmeshContention",
}
_MAX_ALERTS = 1000
MAX_FINGERPRINT = 64
STATUSES = ("firing", "resolved")
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class WebhookError(ValueError):
    """A malformed Alertmanager webhook payload (one line)."""


def rfc3339(t_ns: int) -> str:
    """Return ``t_ns`` (Unix ns) as RFC 3339 UTC with milliseconds."""
    dt = datetime.fromtimestamp(t_ns / 1e9, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _split(target: str) -> tuple[str, str]:
    """Return (nic, link) of a finding target: ``nic3`` -> (nic3, ""), ``nic3-leaf1`` ->
    (nic3, nic3-leaf1), ``leaf0-spine1`` -> ("", leaf0-spine1)."""
    head = target.split("-", 1)[0]
    nic = head if head.startswith("nic") and head[3:].isdigit() else ""
    return nic, (target if "-" in target else "")


def labels_for(kind: str, target: str, leaf_of: Mapping[str, str]) -> dict[str, str]:
    """Return the alert labels of a finding ``kind`` on ``target`` (see the module docstring);
    ``leaf_of`` maps NIC ids to their leaf. Raises KeyError for a kind without an alert."""
    nic, link = _split(target)
    # a NIC's own link down: the NIC is cut off
    name = ALERTNAMES["nic_down"] if kind == "link_down" and nic else ALERTNAMES[kind]
    leaf = leaf_of.get(nic, "") or next((p for p in target.split("-") if p.startswith("leaf")), "")
    if kind == "contention":
        action = "report_contention"
    elif nic:
        action = "move_off_nic"
    else:
        action = "replace_link"
    sev = "warning" if kind in ("contention", "link_flap") else "critical"
    return {"alertname": name, "link": link, "nic": nic, "leaf": leaf, "action": action,
            "severity": sev, "target": target}  # fmt: skip


def alert_for(
    kind: str, target: str, detail: str, t_ns: int, leaf_of: Mapping[str, str], hold_s: float
) -> dict[str, Any] | None:
    """Return the v2 alert of a finding, None when its kind raises no alert."""
    if kind not in ALERTNAMES:
        return None
    labels = labels_for(kind, target, leaf_of)
    return {
        "labels": labels,
        "annotations": {"summary": f"{kind} on {target}", "description": detail},
        "startsAt": rfc3339(t_ns),
        "endsAt": rfc3339(t_ns + round(hold_s * 1e9)),
    }


def resolve(alert: Mapping[str, Any], now_ns: int) -> dict[str, Any]:
    """Return ``alert`` ended at ``now_ns`` (posting it resolves the alert)."""
    return {**alert, "endsAt": rfc3339(now_ns)}


@dataclass(frozen=True, slots=True)
class Request:
    """An action an operator's alert asked for, keyed by the alert's fingerprint."""

    fingerprint: str
    kind: str
    nic: str
    link: str
    job: str
    reason: str


def _fingerprint(alert: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    fp = alert.get("fingerprint")
    if isinstance(fp, str) and fp:
        return fp
    text = "|".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _str_map(v: Any, what: str) -> dict[str, str]:
    if not isinstance(v, dict) or not all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()
    ):
        raise WebhookError(f"{what} must map strings to strings")
    return v


def _opt_str(doc: Mapping[str, Any], key: str, what: str, max_len: int | None = None) -> None:
    v = doc.get(key)
    if key in doc and not isinstance(v, str):
        raise WebhookError(f"{what}{key} must be a string")
    if max_len is not None and isinstance(v, str) and len(v) > max_len:
        raise WebhookError(f"{what}{key} must be at most {max_len} characters")


def parse_webhook(doc: Any) -> tuple[list[Request], int]:
    """Return (the requests of a v4 webhook payload, alerts ignored); raise `WebhookError`.

    Strict on the fields it reads (docs/openapi.yaml states the same): ``version`` "4",
    ``groupKey`` a string, ``status`` and each alert's ``status`` firing or resolved,
    ``receiver``/``startsAt``/``endsAt`` strings, ``fingerprint`` a string of at most
    `MAX_FINGERPRINT` characters, ``labels``/``annotations`` string maps; other keys (what
    Alertmanager adds, e.g. ``groupLabels``, ``generatorURL``) are ignored."""
    if not isinstance(doc, dict):
        raise WebhookError("body must be an Alertmanager webhook object")
    if doc.get("version") != "4":
        raise WebhookError(f'version must be "4", got {doc.get("version")!r}')
    alerts = doc.get("alerts")
    if not isinstance(alerts, list) or len(alerts) > _MAX_ALERTS:
        raise WebhookError(f"alerts must be a list of at most {_MAX_ALERTS}")
    if not isinstance(doc.get("groupKey"), str):
        raise WebhookError("groupKey must be a string")
    if doc.get("status") not in STATUSES:
        raise WebhookError("status must be firing or resolved")
    _opt_str(doc, "receiver", "")
    out: list[Request] = []
    ignored = 0
    for i, a in enumerate(alerts):
        w = f"alerts[{i}]."
        if not isinstance(a, dict) or "labels" not in a:
            raise WebhookError(f"alerts[{i}] must be an object with labels")
        labels = _str_map(a["labels"], f"{w}labels")
        if "annotations" in a:
            _str_map(a["annotations"], f"{w}annotations")
        for key in ("startsAt", "endsAt"):
            _opt_str(a, key, w)
        _opt_str(a, "fingerprint", w, MAX_FINGERPRINT)
        status = a.get("status", doc["status"])
        if status not in STATUSES:
            raise WebhookError(f"{w}status must be firing or resolved")
        kind = labels.get("action", "")
        if status != "firing" or kind not in ACTION_KINDS:
            ignored += 1
            continue
        nic, link, job = labels.get("nic", ""), labels.get("link", ""), labels.get("job", "")
        if (kind in NIC_ACTIONS and not nic) or (kind not in NIC_ACTIONS and not link):
            raise WebhookError(f"alerts[{i}]: action {kind} needs a "
                               f"{'nic' if kind in NIC_ACTIONS else 'link'} label")  # fmt: skip
        try:
            action_topic("", nic or link)
        except DocumentError:
            raise WebhookError(f"alerts[{i}]: bad nic/link label {nic or link!r}") from None
        if job and not _JOB.match(job):
            raise WebhookError(f"alerts[{i}]: bad job label {job!r}")
        name = labels.get("alertname", "alert")
        reason = f"asked by alert {name} ({doc['groupKey']})"[:300]
        out.append(Request(_fingerprint(a, labels), kind, nic, link, job, reason))
    return out, ignored


def unknown_target(req: Request, nics: Container[str], links: Container[str],
                   jobs: Container[str]) -> str | None:  # fmt: skip
    """Return the first id of ``req`` (its NIC, link, job) that is not among the known ones,
    None when all are known: an alert about something that does not exist asks for
    nothing."""
    for ident, known in ((req.nic, nics), (req.link, links), (req.job, jobs)):
        if ident and ident not in known:
            return ident
    return None


def known_only(doc: Any, nics: Container[str], links: Container[str],
               jobs: Container[str]) -> tuple[dict[str, Any], int]:  # fmt: skip
    """Return (webhook payload ``doc`` without the firing action alerts that name an unknown
    NIC, link or job, how many were left out). Raises `WebhookError` as `parse_webhook`."""
    parse_webhook(doc)
    kept, dropped = [], 0
    for a in doc["alerts"]:
        reqs, _ = parse_webhook({**doc, "alerts": [a]})
        if reqs and unknown_target(reqs[0], nics, links, jobs) is not None:
            dropped += 1
        else:
            kept.append(a)
    return {**doc, "alerts": kept}, dropped
