"""The recovery agent's state machine: pure, one event in -> new state + commands out.

Phases: ``healthy`` -> (a ``move_off_nic`` for the NIC in use) ``move_requested`` -> (the next
safe point: a step boundary) ``reforming`` -> (the new group is up) ``healthy`` again, on the
other NIC, with the action acknowledged ``done``. A collective that times out while healthy
makes the agent ``stuck``: it waits up to ``verdict_wait_ns`` for qpmesh's verdict (a
``move_off_nic`` arriving then re-forms on a spare NIC at once, without waiting for a safe
point; a ``may_move_back`` for the NIC in use, sent when a finding on it cleared, re-forms in
place at once), and without one re-forms
in place (the link may have come back; a timed-out gloo group is not reusable), at most
``max_reforms`` times in a row before it gives up (``failed``). Another rank bumping the
group generation in the rendezvous store (`PeerReform`) makes this rank re-form too.

Control off (`ControlChanged(False)`): actions are acknowledged ``ignored`` and change
nothing; a stuck collective is left to the job's own timeout (``fail_after_ns``), as without
the agent. Nothing here does I/O or reads a clock: the shell (`recovery.gloo`) turns
`Reform` into a new process group and `Ack` into an MQTT message.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from contract.remediation import ActionDoc

SEC = 1_000_000_000


class Phase(StrEnum):
    """Where the agent is."""

    HEALTHY = "healthy"
    MOVE_REQUESTED = "move_requested"
    STUCK = "stuck"
    REFORMING = "reforming"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """One rank's agent: its job, rank, NICs in preference order (the first is used first)."""

    job: str
    rank: int
    nics: tuple[str, ...]
    verdict_wait_ns: int = 10 * SEC
    fail_after_ns: int = 600 * SEC  # the job's own collective timeout (PyTorch: 10 min)
    max_reforms: int = 3

    def __post_init__(self) -> None:
        if not self.nics or len(set(self.nics)) != len(self.nics):
            raise ValueError("agent needs one or more distinct NICs")
        if self.rank < 0 or self.verdict_wait_ns < 0 or self.max_reforms < 1:
            raise ValueError("rank >= 0, verdict wait >= 0 and max_reforms >= 1 required")

    @property
    def receiver(self) -> str:
        """Return the name this rank acknowledges as: ``<job>/rank<k>``."""
        return f"{self.job}/rank{self.rank}"


@dataclass(frozen=True, slots=True)
class AgentState:
    """The agent's memory (frozen; `handle` returns a new one)."""

    phase: Phase
    nic: str
    gen: int = 0
    control: bool = True
    bad: frozenset[str] = frozenset()
    pending: ActionDoc | None = None
    target: str = ""
    stuck_since_ns: int | None = None
    reforms: int = 0
    seen: frozenset[str] = field(default_factory=frozenset)


def initial(cfg: AgentConfig) -> AgentState:
    """Return the state of a fresh healthy agent on its first NIC."""
    return AgentState(Phase.HEALTHY, cfg.nics[0])


# ---- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActionReceived:
    """A remediation action arrived on one of this rank's NIC topics."""

    action: ActionDoc


@dataclass(frozen=True, slots=True)
class ControlChanged:
    """The controller's Control switch is now ``enabled``."""

    enabled: bool


@dataclass(frozen=True, slots=True)
class SafePoint:
    """The training loop is at a step boundary (``step`` steps done)."""

    step: int


@dataclass(frozen=True, slots=True)
class CollectiveTimedOut:
    """A collective did not finish within the short timeout (or still has not: a tick)."""


@dataclass(frozen=True, slots=True)
class PeerReform:
    """Another rank announced group generation ``gen`` in the rendezvous store."""

    gen: int


@dataclass(frozen=True, slots=True)
class ReformDone:
    """The group of generation ``gen`` is up on NIC ``nic``."""

    gen: int
    nic: str


@dataclass(frozen=True, slots=True)
class ReformFailed:
    """Building the group of the current generation failed (``reason``)."""

    reason: str


Event = (
    ActionReceived | ControlChanged | SafePoint | CollectiveTimedOut | PeerReform | ReformDone
    | ReformFailed
)  # fmt: skip

# ---- commands ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledge ``action`` with ``outcome`` (contract `OUTCOMES`)."""

    action: str
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True)
class Reform:
    """Abandon the current group; build generation ``gen`` bound to ``nic``."""

    gen: int
    nic: str
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    """Give up: raise in the training loop (the job fails as it would without the agent)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Log:
    """A decision worth logging (and showing as an event)."""

    text: str


Command = Ack | Reform | Fail | Log


def _spare(cfg: AgentConfig, st: AgentState, avoid: frozenset[str]) -> str | None:
    return next((n for n in cfg.nics if n not in avoid and n != st.nic), None)


def _reform(st: AgentState, nic: str, reason: str) -> tuple[AgentState, list[Command]]:
    gen = st.gen + 1
    st = replace(st, phase=Phase.REFORMING, target=nic, gen=gen, reforms=st.reforms + 1)
    return st, [Log(f"re-forming the group (generation {gen}) on {nic}: {reason}"),
                Reform(gen, nic, reason)]  # fmt: skip


def _on_action(cfg: AgentConfig, st: AgentState, a: ActionDoc, now_ns: int
               ) -> tuple[AgentState, list[Command]]:  # fmt: skip
    if a.id in st.seen:
        return st, []
    st = replace(st, seen=st.seen | {a.id})
    if a.job and a.job != cfg.job:
        return st, [Ack(a.id, "ignored", f"for job {a.job}, this is {cfg.job}")]
    if not st.control:
        return st, [Ack(a.id, "ignored", "Control is off: nothing changed"), Log(f"would have acted on {a.kind} {a.target} (Control off)")]  # fmt: skip
    if a.expired(now_ns):
        return st, [Ack(a.id, "expired", "arrived after its expiry")]
    if a.kind == "may_move_back":
        st = replace(st, bad=st.bad - {a.nic})
        if st.phase == Phase.STUCK and a.nic == st.nic:  # the verdict: the link is back
            st, cmds = _reform(st, st.nic, f"{a.nic} usable again ({a.reason}): re-form in place")
            return st, [Ack(a.id, "done", f"re-formed in place on {a.nic}"), *cmds]
        return st, [Ack(a.id, "done", f"{a.nic} usable again; staying on {st.nic}")]
    if a.kind != "move_off_nic" or a.nic not in cfg.nics:
        return st, [Ack(a.id, "ignored", f"{a.kind} {a.target}: not a NIC of this rank")]
    bad = st.bad | {a.nic}
    if a.nic != st.nic and st.phase != Phase.REFORMING:
        return replace(st, bad=bad), [Ack(a.id, "done", f"not using {a.nic} (on {st.nic})")]
    spare = _spare(cfg, st, bad)
    if spare is None:
        return replace(st, bad=bad), [Ack(a.id, "failed", f"no healthy NIC left besides {a.nic}")]  # fmt: skip
    st = replace(st, bad=bad, pending=a)
    if st.phase in (Phase.STUCK, Phase.REFORMING):
        return _reform(st, spare, f"{a.nic} failing ({a.reason}); collective stuck: at once")
    return replace(st, phase=Phase.MOVE_REQUESTED), [Log(f"{a.nic} failing: moving to {spare} at the next step boundary")]  # fmt: skip


def _on_stuck(cfg: AgentConfig, st: AgentState, now_ns: int) -> tuple[AgentState, list[Command]]:
    if st.phase == Phase.MOVE_REQUESTED:
        spare = _spare(cfg, st, st.bad)
        assert spare is not None  # checked when the move was requested
        return _reform(st, spare, "collective stuck while a move was pending: at once")
    if st.phase == Phase.HEALTHY:
        st = replace(st, phase=Phase.STUCK, stuck_since_ns=now_ns)
        return st, [Log(f"collective stuck on {st.nic}: waiting for qpmesh's verdict")]
    if st.phase != Phase.STUCK or st.stuck_since_ns is None:
        return st, []
    waited = now_ns - st.stuck_since_ns
    if not st.control:
        if waited >= cfg.fail_after_ns:
            return replace(st, phase=Phase.FAILED), [Fail(f"collective stuck {waited / SEC:.1f} s (Control off)")]  # fmt: skip
        return st, []
    if waited < cfg.verdict_wait_ns:
        return st, []
    if st.reforms >= cfg.max_reforms:
        return replace(st, phase=Phase.FAILED), [Fail(f"collective stuck {waited / SEC:.1f} s after {st.reforms} re-forms")]  # fmt: skip
    return _reform(st, st.nic, f"stuck {waited / SEC:.1f} s without a verdict: re-form in place")


def handle(cfg: AgentConfig, st: AgentState, ev: Event, now_ns: int
           ) -> tuple[AgentState, list[Command]]:  # fmt: skip
    """Return the next state and the commands for event ``ev`` at ``now_ns``."""
    if st.phase == Phase.FAILED:
        return st, []
    match ev:
        case ActionReceived(action=a):
            return _on_action(cfg, st, a, now_ns)
        case ControlChanged(enabled=on):
            out: list[Command] = [Log(f"Control {'on' if on else 'off'}")]
            if not on and st.phase == Phase.MOVE_REQUESTED and st.pending is not None:
                out.append(Ack(st.pending.id, "ignored", "Control switched off before the move"))
                st = replace(st, phase=Phase.HEALTHY, pending=None)
            return replace(st, control=on), out
        case SafePoint():
            if st.phase == Phase.MOVE_REQUESTED:
                spare = _spare(cfg, st, st.bad)
                assert spare is not None
                return _reform(st, spare, f"{st.nic} failing: at a step boundary ({ev.step} done)")
            return replace(st, reforms=0) if st.phase == Phase.HEALTHY else st, []
        case CollectiveTimedOut():
            return _on_stuck(cfg, st, now_ns)
        case PeerReform(gen=g):
            if g <= st.gen:
                return st, []
            spare = _spare(cfg, st, st.bad) if st.nic in st.bad else None
            nic = spare or st.nic
            st = replace(st, gen=g - 1)
            return _reform(st, nic, f"rank peer announced generation {g}")
        case ReformDone(gen=g, nic=nic):
            out = [Log(f"running again on {nic} (generation {g})")]
            if st.pending is not None:
                out.append(Ack(st.pending.id, "done", f"moved from {st.pending.nic} to {nic}, generation {g}"))  # fmt: skip
            return replace(st, phase=Phase.HEALTHY, nic=nic, gen=g, pending=None, target="",
                           stuck_since_ns=None), out  # fmt: skip
        case ReformFailed(reason=why):
            if st.reforms >= cfg.max_reforms:
                return replace(st, phase=Phase.FAILED), [Fail(f"re-form failed: {why}")]
            return replace(st, phase=Phase.STUCK, stuck_since_ns=now_ns), [Log(f"re-form failed ({why}); will retry")]  # fmt: skip
    return st, []
