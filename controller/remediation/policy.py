"""The remediation policy: findings + jobs' NICs + Control + time -> actions. Pure.

`decide(config, state, findings, jobs, control_enabled, now_ns)` returns a `Decision`: the
next `PolicyState` and the `Planned` actions of this step, each with its disposition:

- ``send``: publish it (Control on);
- ``would_have``: Control is off; logged and shown, nothing sent;
- ``suppressed``: rate-limited this step; it stays wanted and goes out when the budget allows
  (reported once per id, not every step).

The table (`DEFAULT_RULES`, one `Rule` per row; the configuration may replace it):

| finding                        | action             | condition                                 |
|--------------------------------|--------------------|-------------------------------------------|
| nic_down / link_down / link_flap on a NIC link | move_off_nic per job using the NIC | the NIC stayed bad for ``hold_ns`` (a shorter flap moves nothing); a flap finding acts at once |
| link_down / link_flap / nic_down on any link  | replace_link       | ``min_count`` such findings within ``window_ns`` |
| contention on a hop            | report_contention per affected job (or one with no job) | always |
| clear of a NIC a job was moved off | may_move_back per moved job | no new down for ``hold_ns`` |
| clear of a NIC that was down or lossy and moved nothing | may_move_back per job on it ("usable") | at once: an agent stuck on it re-forms in place instead of waiting for a verdict |

Idempotence and de-duplication: an action's id is a hash of (kind, target, job, episode), the
episode being the time its finding first appeared, so the same finding seen again (another
window, another controller instance) maps to the same id, and an id is issued at most once.
Rate limits: one action per (kind, target, job) per ``min_interval_ns``, and at most
``max_actions`` per ``budget_window_ns`` overall, so a storm of findings never becomes a storm
of actions. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from contract.remediation import ActionDoc

SEC = 1_000_000_000
DOWN_KINDS = ("nic_down", "link_down", "link_flap")
DISPOSITIONS = ("send", "would_have", "suppressed")

JobNics = Mapping[str, frozenset[str]]
"""job id -> the NICs its ranks use (from the job registry)."""


class PolicyError(ValueError):
    """A policy configuration or rule is invalid (one-line reason)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """A controller finding as the policy sees it.

    ``kind``: nic_down, link_down, link_flap, contention, clear; ``target``: NIC, link or hop
    name; ``nic``: the NIC concerned when the target is a NIC or a NIC link ("" otherwise);
    ``flows``: affected queue pairs (src NIC, dst NIC, sport) of a contention finding.
    """

    kind: str
    target: str
    t_ns: int
    nic: str = ""
    detail: str = ""
    flows: tuple[tuple[str, str, int], ...] = ()

    @property
    def ref(self) -> str:
        """Return the reference actions cite: ``kind@target@t_ns``."""
        return f"{self.kind}@{self.target}@{self.t_ns}"


def nic_of(target: str) -> str:
    """Return the NIC a finding target concerns: ``nic3`` for ``nic3`` or ``nic3-leaf1``."""
    head = target.split("-", 1)[0]
    return head if head.startswith("nic") and head[3:].isdigit() else ""


def finding(kind: str, target: str, t_ns: int, detail: str = "",
            flows: tuple[tuple[str, str, int], ...] = ()) -> Finding:  # fmt: skip
    """Return a `Finding` with its NIC derived from ``target`` (a controller `EventDoc`'s
    kind/target/t_ns/detail/flows map one to one)."""
    return Finding(kind, target, t_ns, nic_of(target), detail, flows)


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the policy table (see the module docstring)."""

    findings: tuple[str, ...]
    action: str
    hold_ns: int = 0
    min_count: int = 1
    window_ns: int = 0

    def __post_init__(self) -> None:
        if self.action not in (
            "move_off_nic",
            "may_move_back",
            "replace_link",
            "report_contention",
        ):
            raise PolicyError(f"rule: unknown action {self.action!r}")
        if self.hold_ns < 0 or self.min_count < 1 or self.window_ns < 0:
            raise PolicyError(f"rule {self.action}: hold/window must be >= 0, count >= 1")


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule(("nic_down", "link_down", "link_flap"), "move_off_nic", hold_ns=1 * SEC),
    Rule(
        ("nic_down", "link_down", "link_flap"), "replace_link", min_count=10, window_ns=3600 * SEC
    ),
    Rule(("contention",), "report_contention"),
    Rule(("clear",), "may_move_back", hold_ns=60 * SEC),
)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Rules, action lifetime and rate limits (nanoseconds)."""

    rules: tuple[Rule, ...] = DEFAULT_RULES
    ttl_ns: int = 120 * SEC
    min_interval_ns: int = 30 * SEC
    max_actions: int = 20
    budget_window_ns: int = 60 * SEC

    def __post_init__(self) -> None:
        if self.ttl_ns <= 0 or self.min_interval_ns < 0 or self.budget_window_ns <= 0:
            raise PolicyError("ttl must be > 0, min interval >= 0, budget window > 0")
        if self.max_actions < 1:
            raise PolicyError("max_actions must be >= 1")

    def rule(self, action: str) -> Rule | None:
        """Return the rule issuing ``action``, or None when the table has none."""
        return next((r for r in self.rules if r.action == action), None)


@dataclass(frozen=True, slots=True)
class Planned:
    """An action and what to do with it (`DISPOSITIONS`)."""

    action: ActionDoc
    disposition: str


@dataclass(frozen=True)
class PolicyState:
    """Everything the policy remembers between steps (frozen; `decide` returns a new one).

    ``down``: NIC -> (first bad t_ns, finding ref, acts at once); ``history``: link/NIC ->
    recent down finding times; ``moved``: NIC -> jobs told to move off it; ``stable``: NIC ->
    (clear t_ns, ref) while waiting to allow a move back; ``wanted``: actions not yet issued;
    ``issued``: id -> issue time; ``last``: (kind, target, job) -> last issue time; ``sent``:
    issue times inside the budget window; ``reported``: suppressed ids already reported;
    ``bad``: finding targets down now (a repeat of their finding is not a new down);
    ``troubled``: NIC -> (first t_ns, ref) of a down or loss finding not yet cleared.
    """

    down: Mapping[str, tuple[int, str, bool]] = field(default_factory=dict)
    history: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    moved: Mapping[str, frozenset[str]] = field(default_factory=dict)
    stable: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    wanted: tuple[ActionDoc, ...] = ()
    issued: Mapping[str, int] = field(default_factory=dict)
    last: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    sent: tuple[int, ...] = ()
    reported: frozenset[str] = frozenset()
    bad: frozenset[str] = frozenset()
    troubled: Mapping[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """The next state and this step's planned actions, in issue order."""

    state: PolicyState
    actions: tuple[Planned, ...]


def action_id(kind: str, target: str, job: str, episode_ns: int) -> str:
    """Return the stable id of an action: ``<kind>-<16 hex>`` of (kind, target, job, episode)."""
    h = hashlib.sha256(f"{kind}|{target}|{job}|{episode_ns}".encode()).hexdigest()[:16]
    return f"{kind}-{h}"


def _make(cfg: PolicyConfig, kind: str, *, nic: str = "", link: str = "", job: str = "",
          episode_ns: int, now_ns: int, reason: str, ref: str,
          flows: tuple[tuple[str, str, int], ...] = ()) -> ActionDoc:  # fmt: skip
    target = nic or link
    return ActionDoc(
        id=action_id(kind, target, job, episode_ns), kind=kind, reason=reason, finding=ref,
        issued_at_ns=now_ns, expires_at_ns=now_ns + cfg.ttl_ns, nic=nic, link=link, job=job,
        flows=flows,
    )  # fmt: skip


def _jobs_on(jobs: JobNics, nic: str) -> list[str]:
    return sorted(j for j, nics in jobs.items() if nic in nics)


def _absorb(cfg: PolicyConfig, st: PolicyState, f: Finding, jobs: JobNics, now_ns: int,
            wanted: list[ActionDoc]) -> PolicyState:  # fmt: skip
    """Fold one finding into the state; append the actions it asks for at once."""
    down, history, stable = dict(st.down), dict(st.history), dict(st.stable)
    bad, troubled = set(st.bad), dict(st.troubled)
    if f.nic and f.kind in (*DOWN_KINDS, "loss"):
        troubled.setdefault(f.nic, (f.t_ns, f.ref))
    if f.kind in DOWN_KINDS:
        rep = cfg.rule("replace_link")
        link = f.target
        if (
            rep is not None
            and f.kind in rep.findings
            and (f.kind == "link_flap" or link not in bad)
        ):
            times = tuple(t for t in history.get(link, ()) if t > f.t_ns - rep.window_ns)
            times += (f.t_ns,)
            history[link] = times
            if len(times) >= rep.min_count:
                wanted.append(_make(
                    cfg, "replace_link", link=link, episode_ns=times[0], now_ns=now_ns, ref=f.ref,
                    reason=f"{link} went down {len(times)} times in {rep.window_ns / SEC:g} s: "
                    "replace the cable/transceiver",
                ))  # fmt: skip
                history[link] = ()
        move = cfg.rule("move_off_nic")
        if f.nic and move is not None and f.kind in move.findings:
            stable.pop(f.nic, None)
            if f.nic not in down:
                down[f.nic] = (f.t_ns, f.ref, f.kind == "link_flap")
            elif f.kind == "link_flap":
                t0, ref, _ = down[f.nic]
                down[f.nic] = (t0, ref, True)
        bad.add(link)
    elif f.kind == "clear":
        bad.discard(f.target)
        nic = f.nic
        if nic:
            down.pop(nic, None)
            back = cfg.rule("may_move_back")
            if back is not None and st.moved.get(nic):
                stable[nic] = (f.t_ns, f.ref)
            if back is not None and troubled.pop(nic, None) is not None:
                for job in _jobs_on(jobs, nic):
                    if job in st.moved.get(nic, ()):
                        continue  # moved off: it may move back after the hold (above)
                    wanted.append(_make(
                        cfg, "may_move_back", nic=nic, job=job, episode_ns=f.t_ns,
                        now_ns=now_ns, ref=f.ref,
                        reason=f"{nic} recovered and job {job} was not moved: {nic} is usable",
                    ))  # fmt: skip
    elif f.kind == "contention" and cfg.rule("report_contention") is not None:
        nics = {n for fl in f.flows for n in fl[:2]}
        affected = sorted({j for j, js in jobs.items() if js & nics}) or [""]
        for job in affected:
            wanted.append(_make(
                cfg, "report_contention", link=f.target, job=job, episode_ns=f.t_ns,
                now_ns=now_ns, ref=f.ref, flows=f.flows,
                reason=f"contention on {f.target}" + (f" affects job {job}" if job else ""),
            ))  # fmt: skip
    return replace(
        st, down=down, history=history, stable=stable, bad=frozenset(bad), troubled=troubled
    )


def _due(cfg: PolicyConfig, st: PolicyState, jobs: JobNics, now_ns: int,
         wanted: list[ActionDoc]) -> PolicyState:  # fmt: skip
    """Append the actions whose hold time has passed (moves off, moves back)."""
    moved, stable = {k: set(v) for k, v in st.moved.items()}, dict(st.stable)
    move, back = cfg.rule("move_off_nic"), cfg.rule("may_move_back")
    if move is not None:
        for nic, (t0, ref, at_once) in sorted(st.down.items()):
            if not at_once and now_ns - t0 < move.hold_ns:
                continue
            for job in _jobs_on(jobs, nic):
                if job in moved.get(nic, ()):
                    continue  # told already and not yet allowed back
                wanted.append(_make(
                    cfg, "move_off_nic", nic=nic, job=job, episode_ns=t0, now_ns=now_ns, ref=ref,
                    reason=f"{nic} is down or flapping (since {(now_ns - t0) / SEC:.1f} s): "
                    f"move job {job} off it",
                ))  # fmt: skip
                moved.setdefault(nic, set()).add(job)
    if back is not None:
        for nic, (t0, ref) in sorted(st.stable.items()):
            if now_ns - t0 < back.hold_ns:
                continue
            for job in sorted(moved.get(nic, ())):
                wanted.append(_make(
                    cfg, "may_move_back", nic=nic, job=job, episode_ns=t0, now_ns=now_ns, ref=ref,
                    reason=f"{nic} stable for {back.hold_ns / SEC:g} s: job {job} may move back",
                ))  # fmt: skip
            moved.pop(nic, None)
            stable.pop(nic)
    return replace(st, moved={k: frozenset(v) for k, v in moved.items()}, stable=stable)


def decide(
    config: PolicyConfig,
    state: PolicyState,
    findings: tuple[Finding, ...],
    jobs: JobNics,
    control_enabled: bool,
    now_ns: int,
) -> Decision:
    """Return the next state and the actions of this step (see the module docstring).

    ``findings`` are the findings since the previous step (any order; taken by time);
    ``jobs`` the registered jobs' NICs now. Pure: the same inputs give the same output.
    """
    wanted: list[ActionDoc] = list(state.wanted)
    st = state
    for f in sorted(findings, key=lambda f: f.t_ns):
        st = _absorb(config, st, f, jobs, now_ns, wanted)
    st = _due(config, st, jobs, now_ns, wanted)
    keep_ns = 10 * config.ttl_ns  # bounded memory; a NIC still down after that is re-announced
    issued = {k: t for k, t in st.issued.items() if now_ns - t < keep_ns}
    last, reported = dict(st.last), set(st.reported) & {a.id for a in st.wanted}
    sent = [t for t in st.sent if t > now_ns - config.budget_window_ns]
    keep: list[ActionDoc] = []
    out: list[Planned] = []
    seen: set[str] = set()
    for a in wanted:
        if a.id in issued or a.id in seen:
            continue  # de-duplicated: this id went out (or is queued) already
        seen.add(a.id)
        key = (a.kind, a.target, a.job)
        t_last = last.get(key)
        limited = (t_last is not None and now_ns - t_last < config.min_interval_ns) or (
            len(sent) >= config.max_actions
        )
        if limited:
            if a.expired(now_ns):
                continue
            keep.append(a)
            if a.id not in reported:
                reported.add(a.id)
                out.append(Planned(a, "suppressed"))
            continue
        go = replace(a, issued_at_ns=now_ns, expires_at_ns=now_ns + config.ttl_ns)
        issued[go.id] = now_ns
        last[key] = now_ns
        sent.append(now_ns)
        out.append(Planned(go, "send" if control_enabled else "would_have"))
    st = replace(
        st, wanted=tuple(keep), issued=issued, last=last, sent=tuple(sent),
        reported=frozenset(reported),
    )  # fmt: skip
    return Decision(st, tuple(out))
