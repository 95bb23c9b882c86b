"""Remediation actions and their acknowledgements: the documents between controller and jobs.

The controller's remediation policy issues `ActionDoc`s; receivers (a job's recovery agent, an
operator's tooling) answer each with an `AckDoc`. Both validate on construction and have
``encode() -> bytes`` / ``decode(payload)``; both raise only `DocumentError` with a one-line
reason naming the document and the key. Decoding ignores keys it does not know.

Topics (under the topic prefix, default ``qpmesh/v1``):

- ``<prefix>/remediation/<target>``: an `ActionDoc`, ``target`` being the NIC the action is
  about (``move_off_nic``, ``may_move_back``: a job's agent follows the topics of its NICs) or
  the link (``replace_link``, ``report_contention``: operators follow ``remediation/#``);
- ``<prefix>/remediation-ack/<action id>``: an `AckDoc` per receiver and action;
- ``<prefix>/jobs/<job>/rank<k>``: a `RankDoc`, retained: the NICs one rank of a job uses (the
  recovery agent registers its rank; an empty retained payload unregisters it). The controller
  builds its job registry from these (and from ``POST /api/v1/jobs``);
- ``<prefix>/jobs/<job>/rank<k>/perf``: a `PerfDoc` now and then: the rank's recent step time
  and its collective timeouts (the controller attributes a job's slowdown to the fabric).

`ActionDoc`: ``{"id", "kind", "nic", "link", "job", "reason", "finding", "issued_at_ns",
"expires_at_ns"[, "flows"]}``: ``id`` is stable for one episode of one finding (receivers
de-duplicate on it), ``nic``/``link``/``job`` are "" where they do not apply, times are
nanoseconds of the controller's clock (wall clock, Unix epoch), ``flows`` lists the affected
queue pairs of a contention report as [src NIC, dst NIC, sport].

`RankDoc`: ``{"job", "rank", "host", "nics"[, "tenant"]}``: ``nics`` the NIC ids the rank
uses, preferred first; ``tenant`` the job's owner (default ``default``).

`PerfDoc`: ``{"job", "rank", "t_ns", "steps", "step_s", "timeouts", "nic"}``: ``steps``
done so far, ``step_s`` the median step time (s) over the last ``window`` steps, ``timeouts``
the collective timeouts so far, ``nic`` the NIC the rank uses now.

`AckDoc`: ``{"action", "receiver", "outcome", "detail", "t_ns"}`` with ``outcome`` one of
`OUTCOMES` (``done``: acted; ``ignored``: not for me or Control off; ``failed``: tried and
could not; ``expired``: arrived after ``expires_at_ns``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from contract.jsondoc import DocumentError, check, decode_object, encode_json
from contract.jsondoc import field as read

ACTION_KINDS = ("move_off_nic", "may_move_back", "replace_link", "report_contention")
NIC_ACTIONS = ("move_off_nic", "may_move_back")
OUTCOMES = ("done", "ignored", "failed", "expired")
REMEDIATION = "remediation"
REMEDIATION_ACK = "remediation-ack"
JOBS = "jobs"
DEFAULT_TENANT = "default"
_LEVEL = re.compile(r"^[^/+#\x00$][^/+#\x00]*$")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

__all__ = [
    "ACTION_KINDS",
    "NIC_ACTIONS",
    "OUTCOMES",
    "REMEDIATION",
    "REMEDIATION_ACK",
    "AckDoc",
    "ActionDoc",
    "DocumentError",
    "PerfDoc",
    "RankDoc",
    "ack_topic",
    "action_subscription",
    "action_topic",
    "jobs_subscription",
    "parse_perf_topic",
    "parse_rank_topic",
    "perf_topic",
    "rank_topic",
]


def _level(value: str, what: str, key: str) -> None:
    check(bool(_LEVEL.match(value)), what, key, "a topic level without / + # $", value)


def action_topic(prefix: str, target: str) -> str:
    """Return ``<prefix>/remediation/<target>``; raise `DocumentError` on a bad target."""
    _level(target, "remediation topic", "target")
    return f"{prefix}/{REMEDIATION}/{target}"


def action_subscription(prefix: str, targets: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Return the filters following ``targets`` (NICs or links), or all actions if empty."""
    if not targets:
        return (f"{prefix}/{REMEDIATION}/#",)
    return tuple(action_topic(prefix, t) for t in targets)


def ack_topic(prefix: str, action_id: str) -> str:
    """Return ``<prefix>/remediation-ack/<action id>``; raise `DocumentError` on a bad id."""
    check(bool(_ID.match(action_id)), "remediation ack topic", "action", "an action id", action_id)
    return f"{prefix}/{REMEDIATION_ACK}/{action_id}"


def rank_topic(prefix: str, job: str, rank: int) -> str:
    """Return ``<prefix>/jobs/<job>/rank<rank>``; raise `DocumentError` on a bad job or rank."""
    _level(job, "job topic", "job")
    check(isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0, "job topic",
          "rank", "an integer >= 0", rank)  # fmt: skip
    return f"{prefix}/{JOBS}/{job}/rank{rank}"


def jobs_subscription(prefix: str) -> str:
    """Return the filter of every rank registration: ``<prefix>/jobs/#``."""
    return f"{prefix}/{JOBS}/#"


def parse_rank_topic(prefix: str, topic: str) -> tuple[str, int] | None:
    """Return (job, rank) of a rank registration topic, None for any other topic."""
    head = f"{prefix}/{JOBS}/"
    if not topic.startswith(head):
        return None
    parts = topic[len(head) :].split("/")
    if len(parts) != 2 or not parts[0] or not parts[1].startswith("rank"):
        return None
    digits = parts[1][4:]
    if not digits.isdigit() or len(digits) > 9:
        return None
    return parts[0], int(digits)


def perf_topic(prefix: str, job: str, rank: int) -> str:
    """Return ``<prefix>/jobs/<job>/rank<rank>/perf``; raise `DocumentError` on a bad job."""
    return rank_topic(prefix, job, rank) + "/perf"


def parse_perf_topic(prefix: str, topic: str) -> tuple[str, int] | None:
    """Return (job, rank) of a perf report topic, None for any other topic."""
    if not topic.endswith("/perf"):
        return None
    return parse_rank_topic(prefix, topic[: -len("/perf")])


@dataclass(frozen=True, slots=True)
class ActionDoc:
    """One remediation action (see the module docstring for the fields)."""

    id: str
    kind: str
    reason: str
    finding: str
    issued_at_ns: int
    expires_at_ns: int
    nic: str = ""
    link: str = ""
    job: str = ""
    flows: tuple[tuple[str, str, int], ...] = ()

    def __post_init__(self) -> None:
        w = "remediation action"
        check(isinstance(self.id, str) and bool(_ID.match(self.id)), w, "id",
              "1-128 of [A-Za-z0-9_.:-]", self.id)  # fmt: skip
        check(self.kind in ACTION_KINDS, w, "kind", f"one of {', '.join(ACTION_KINDS)}", self.kind)
        for key in ("reason", "finding", "nic", "link", "job"):
            check(isinstance(getattr(self, key), str), w, key, "a string", getattr(self, key))
        for key in ("issued_at_ns", "expires_at_ns"):
            v = getattr(self, key)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 0, w, key,
                  "an integer >= 0", v)  # fmt: skip
        check(self.expires_at_ns > self.issued_at_ns, w, "expires_at_ns",
              "after issued_at_ns", self.expires_at_ns)  # fmt: skip
        if self.kind in NIC_ACTIONS:
            check(bool(self.nic), w, "nic", f"a NIC id for {self.kind}", self.nic)
            _level(self.nic, w, "nic")
        else:
            check(bool(self.link), w, "link", f"a link id for {self.kind}", self.link)
            _level(self.link, w, "link")
        for fl in self.flows:
            ok = (
                isinstance(fl, tuple) and len(fl) == 3 and isinstance(fl[0], str)
                and isinstance(fl[1], str) and isinstance(fl[2], int) and not isinstance(fl[2], bool)
            )  # fmt: skip
            check(ok, w, "flows", "[src NIC, dst NIC, sport] triples", fl)

    @property
    def target(self) -> str:
        """Return the topic target: the NIC for NIC actions, else the link."""
        return self.nic if self.kind in NIC_ACTIONS else self.link

    def expired(self, now_ns: int) -> bool:
        """Return True when ``now_ns`` is at or past ``expires_at_ns``."""
        return now_ns >= self.expires_at_ns

    def to_dict(self) -> dict[str, Any]:
        """Return the plain JSON object of this action."""
        d: dict[str, Any] = {
            "id": self.id, "kind": self.kind, "nic": self.nic, "link": self.link,
            "job": self.job, "reason": self.reason, "finding": self.finding,
            "issued_at_ns": self.issued_at_ns, "expires_at_ns": self.expires_at_ns,
        }  # fmt: skip
        if self.flows:
            d["flows"] = [list(f) for f in self.flows]
        return d

    def encode(self) -> bytes:
        """Return the compact JSON of this action."""
        return encode_json(self.to_dict())

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> ActionDoc:
        """Return the action in ``payload``; raise `DocumentError` (one line)."""
        w = "remediation action"
        d = decode_object(payload, w)
        flows_raw = d.get("flows", [])
        check(isinstance(flows_raw, list), w, "flows", "a list", flows_raw)
        flows = []
        for fl in flows_raw:
            check(isinstance(fl, list) and len(fl) == 3, w, "flows", "[src, dst, sport]", fl)
            flows.append((fl[0], fl[1], fl[2]))
        return cls(
            id=read(d, "id", str, w),
            kind=read(d, "kind", str, w),
            reason=read(d, "reason", str, w, ""),
            finding=read(d, "finding", str, w, ""),
            issued_at_ns=read(d, "issued_at_ns", int, w),
            expires_at_ns=read(d, "expires_at_ns", int, w),
            nic=read(d, "nic", str, w, ""),
            link=read(d, "link", str, w, ""),
            job=read(d, "job", str, w, ""),
            flows=tuple(flows),
        )


@dataclass(frozen=True, slots=True)
class AckDoc:
    """A receiver's answer to one action: ``outcome`` in `OUTCOMES`, ``detail`` free text."""

    action: str
    receiver: str
    outcome: str
    t_ns: int
    detail: str = ""

    def __post_init__(self) -> None:
        w = "remediation ack"
        check(isinstance(self.action, str) and bool(_ID.match(self.action)), w, "action",
              "an action id", self.action)  # fmt: skip
        check(isinstance(self.receiver, str) and bool(self.receiver), w, "receiver",
              "a non-empty string", self.receiver)  # fmt: skip
        check(self.outcome in OUTCOMES, w, "outcome", f"one of {', '.join(OUTCOMES)}", self.outcome)
        check(isinstance(self.t_ns, int) and not isinstance(self.t_ns, bool) and self.t_ns >= 0,
              w, "t_ns", "an integer >= 0", self.t_ns)  # fmt: skip
        check(isinstance(self.detail, str), w, "detail", "a string", self.detail)

    def to_dict(self) -> dict[str, Any]:
        """Return the plain JSON object of this ack."""
        return {"action": self.action, "receiver": self.receiver, "outcome": self.outcome,
                "detail": self.detail, "t_ns": self.t_ns}  # fmt: skip

    def encode(self) -> bytes:
        """Return the compact JSON of this ack."""
        return encode_json(self.to_dict())

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> AckDoc:
        """Return the ack in ``payload``; raise `DocumentError` (one line)."""
        w = "remediation ack"
        d = decode_object(payload, w)
        return cls(
            action=read(d, "action", str, w),
            receiver=read(d, "receiver", str, w),
            outcome=read(d, "outcome", str, w),
            t_ns=read(d, "t_ns", int, w),
            detail=read(d, "detail", str, w, ""),
        )


@dataclass(frozen=True, slots=True)
class RankDoc:
    """One rank of a job and the NICs it uses (see the module docstring)."""

    job: str
    rank: int
    nics: tuple[str, ...]
    host: str = ""
    tenant: str = DEFAULT_TENANT

    def __post_init__(self) -> None:
        w = "rank registration"
        check(isinstance(self.job, str) and bool(_ID.match(self.job)), w, "job", "a job id",
              self.job)  # fmt: skip
        check(isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= 0,
              w, "rank", "an integer >= 0", self.rank)  # fmt: skip
        check(isinstance(self.nics, tuple) and bool(self.nics) and all(
            isinstance(n, str) and bool(_LEVEL.match(n)) for n in self.nics), w, "nics",
            "a non-empty list of NIC ids", self.nics)  # fmt: skip
        check(isinstance(self.host, str), w, "host", "a string", self.host)
        check(isinstance(self.tenant, str) and bool(_ID.match(self.tenant)), w, "tenant",
              "a tenant name", self.tenant)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Return the plain JSON object of this registration."""
        return {"job": self.job, "rank": self.rank, "host": self.host, "nics": list(self.nics),
                "tenant": self.tenant}  # fmt: skip

    def encode(self) -> bytes:
        """Return the compact JSON of this registration."""
        return encode_json(self.to_dict())

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> RankDoc:
        """Return the registration in ``payload``; raise `DocumentError` (one line)."""
        w = "rank registration"
        d = decode_object(payload, w)
        nics = d.get("nics")
        check(isinstance(nics, list), w, "nics", "a list of NIC ids", nics)
        return cls(
            job=read(d, "job", str, w),
            rank=read(d, "rank", int, w),
            nics=tuple(nics or ()),
            host=read(d, "host", str, w, ""),
            tenant=read(d, "tenant", str, w, DEFAULT_TENANT),
        )


@dataclass(frozen=True, slots=True)
class PerfDoc:
    """A rank's recent step time and collective timeouts (see the module docstring)."""

    job: str
    rank: int
    t_ns: int
    steps: int
    step_s: float
    timeouts: int = 0
    nic: str = ""
    window: int = 1

    def __post_init__(self) -> None:
        w = "perf report"
        check(isinstance(self.job, str) and bool(_ID.match(self.job)), w, "job", "a job id",
              self.job)  # fmt: skip
        for key in ("rank", "t_ns", "steps", "timeouts"):
            v = getattr(self, key)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 0, w, key,
                  "an integer >= 0", v)  # fmt: skip
        check(isinstance(self.window, int) and not isinstance(self.window, bool)
              and self.window >= 1, w, "window", "an integer >= 1", self.window)  # fmt: skip
        ok = isinstance(self.step_s, float | int) and not isinstance(self.step_s, bool)
        check(ok and 0 < float(self.step_s) < 1e6, w, "step_s", "a duration > 0 s", self.step_s)
        check(isinstance(self.nic, str), w, "nic", "a string", self.nic)

    def to_dict(self) -> dict[str, Any]:
        """Return the plain JSON object of this report."""
        return {"job": self.job, "rank": self.rank, "t_ns": self.t_ns, "steps": self.steps,
                "step_s": self.step_s, "timeouts": self.timeouts, "nic": self.nic,
                "window": self.window}  # fmt: skip

    def encode(self) -> bytes:
        """Return the compact JSON of this report."""
        return encode_json(self.to_dict())

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> PerfDoc:
        """Return the report in ``payload``; raise `DocumentError` (one line)."""
        w = "perf report"
        d = decode_object(payload, w)
        return cls(
            job=read(d, "job", str, w),
            rank=read(d, "rank", int, w),
            t_ns=read(d, "t_ns", int, w),
            steps=read(d, "steps", int, w),
            step_s=read(d, "step_s", float, w),
            timeouts=read(d, "timeouts", int, w, 0),
            nic=read(d, "nic", str, w, ""),
            window=read(d, "window", int, w, 1),
        )
