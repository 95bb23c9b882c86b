"""The action audit trail the API serves: what, why, which finding, when, status, acks.

`ActionLog` keeps the policy's audit records (`controller.remediation.publish.audit_record`)
as API documents (bounded, oldest dropped, thread-safe): each gets a sequence number, a
``status`` (``sent``, ``would have`` when Control was off, ``suppressed`` when rate-limited),
the ``tenant`` owning its job ("" without a job) and the receivers' acknowledgements
(``acks``: ``{receiver, outcome, detail, t_ns}``) as they arrive. `ActionQuery` and
`parse_action_query` are the ``GET /api/v1/actions`` filters. Pure apart from the lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.remediation import AckDoc
from controller.query import int_param, time_range

STATUS = {"send": "sent", "would_have": "would have", "suppressed": "suppressed"}
MAX_LIMIT = 10_000


class ActionQueryError(ValueError):
    """A bad ``/actions`` query (one line)."""


@dataclass(frozen=True, slots=True)
class ActionQuery:
    """Filters: time range [since_ns, until_ns) on the record time, kind, status, job, limit."""

    since_ns: int | None = None
    until_ns: int | None = None
    kind: str | None = None
    status: str | None = None
    job: str | None = None
    limit: int = 200


def _int(q: Mapping[str, str], key: str, lo: int, hi: int) -> int | None:
    return int_param(q, key, lo, hi, ActionQueryError)


def parse_action_query(q: Mapping[str, str]) -> ActionQuery:
    """Return the filters of ``q``; raise `ActionQueryError` on unknown keys, bad integers,
    an unknown status or a limit outside 1..`MAX_LIMIT` (an empty time range matches
    nothing)."""
    unknown = set(q) - {"since_ns", "until_ns", "kind", "status", "job", "limit"}
    if unknown:
        raise ActionQueryError(f"unknown query parameter {sorted(unknown)[0]!r}")
    since, until = time_range(q, ActionQueryError)  # an end not after the start: empty
    status = q.get("status")
    if status is not None and status not in STATUS.values():
        raise ActionQueryError(f"status must be one of {', '.join(STATUS.values())}")
    for key in ("kind", "job"):
        v = q.get(key)
        if v is not None and not (0 < len(v) <= 128):
            raise ActionQueryError(f"{key} must be 1..128 characters")
    limit = _int(q, "limit", 1, MAX_LIMIT)
    return ActionQuery(since, until, q.get("kind"), status, q.get("job"), limit or 200)


def _matches(doc: Mapping[str, Any], q: ActionQuery) -> bool:
    t = int(doc["t_ns"])
    return (
        (q.since_ns is None or t >= q.since_ns)
        and (q.until_ns is None or t < q.until_ns)
        and (q.kind is None or doc["kind"] == q.kind)
        and (q.status is None or doc["status"] == q.status)
        and (q.job is None or doc["job"] == q.job)
    )


class ActionLog:
    """Audit records as API documents, with their acks (see the module docstring)."""

    def __init__(self, limit: int = 10_000) -> None:
        if limit < 1:
            raise ValueError("an action log keeps at least one record")
        self._lock = threading.Lock()
        self._docs: deque[dict[str, Any]] = deque(maxlen=limit)
        self._seq = 0
        self.acks_unmatched = 0
        self.version = 0  # goes up with every change (the API process mirrors the log)

    def add(self, record: Mapping[str, Any], tenant: str = "") -> dict[str, Any]:
        """Log one audit record; return its API document (a copy)."""
        with self._lock:
            self._seq += 1
            doc = {"seq": self._seq, **record, "tenant": tenant, "acks": []}
            doc["status"] = STATUS.get(str(record.get("disposition")), "sent")
            self._docs.append(doc)
            self.version += 1
            return _copy(doc)

    def ack(self, ack: AckDoc) -> dict[str, Any] | None:
        """Attach ``ack`` to the sent record of its action; return that record (a copy), or
        None when no sent record has that id (counted in ``acks_unmatched``). One ack per
        receiver: a repeated ack from the same receiver replaces the earlier one."""
        with self._lock:
            for doc in reversed(self._docs):
                if doc["id"] == ack.action and doc["status"] == "sent":
                    entry = {"receiver": ack.receiver, "outcome": ack.outcome,
                             "detail": ack.detail, "t_ns": ack.t_ns}  # fmt: skip
                    acks = [a for a in doc["acks"] if a["receiver"] != ack.receiver]
                    doc["acks"] = [*acks, entry]
                    self.version += 1
                    return _copy(doc)
            self.acks_unmatched += 1
            return None

    def query(self, q: ActionQuery, tenant: str | None = None) -> dict[str, Any]:
        """Return ``{"actions": [...], "truncated": bool}``: the newest ``q.limit`` records
        passing ``q``, oldest first; ``tenant`` limits them to the actions for that tenant's
        jobs (None: every record, the operator's view)."""
        with self._lock:
            hits = [
                d for d in self._docs
                if _matches(d, q) and (tenant is None or (d["job"] and d["tenant"] == tenant))
            ]  # fmt: skip
            cut = len(hits) > q.limit
            return {"actions": [_copy(d) for d in hits[-q.limit :]], "truncated": cut}

    def restore(self, docs: list[dict[str, Any]]) -> None:
        """Put back the records of a previous run (a restarted controller), oldest first;
        numbering goes on after the highest sequence number among them."""
        with self._lock:
            for d in docs:
                if {"t_ns", "id", "kind", "status", "job"} <= set(d):
                    self._docs.append({**d, "acks": list(d.get("acks", []))})
            self._seq = max([self._seq, *(int(d.get("seq", 0)) for d in self._docs)])
            self.version += 1

    def records(self) -> tuple[dict[str, Any], ...]:
        """Return every kept record (copies), oldest first."""
        with self._lock:
            return tuple(_copy(d) for d in self._docs)


def _copy(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {**doc, "acks": [dict(a) for a in doc["acks"]]}
