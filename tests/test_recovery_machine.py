"""The recovery agent's state machine, event by event (no process group, no clock)."""

from __future__ import annotations

from contract.remediation import ActionDoc
from recovery.machine import (
    SEC,
    Ack,
    ActionReceived,
    AgentConfig,
    AgentState,
    CollectiveTimedOut,
    Command,
    ControlChanged,
    Event,
    Fail,
    PeerReform,
    Phase,
    Reform,
    ReformDone,
    ReformFailed,
    SafePoint,
    handle,
    initial,
)

CFG = AgentConfig("train", 1, ("nic2", "nic3"), verdict_wait_ns=5 * SEC, fail_after_ns=30 * SEC)


def move(
    nic: str = "nic2", t: int = 0, job: str = "train", kind: str = "move_off_nic"
) -> ActionDoc:
    return ActionDoc(f"{kind}-{nic}-{t}", kind, "down", f"nic_down@{nic}@{t}", t * SEC, (t + 60) * SEC,
                     nic=nic, job=job)  # fmt: skip


def feed(events: list[tuple[float, Event]], st: AgentState | None = None
         ) -> tuple[AgentState, list[Command]]:  # fmt: skip
    st = st or initial(CFG)
    out: list[Command] = []
    for t, ev in events:
        st, cmds = handle(CFG, st, ev, int(t * SEC))
        out += cmds
    return st, out


def only(cmds: list[Command], kind: type) -> list[Command]:
    return [c for c in cmds if isinstance(c, kind)]


def test_move_waits_for_the_safe_point_then_reforms_on_the_other_nic() -> None:
    st, cmds = feed([(0, ActionReceived(move()))])
    assert st.phase == Phase.MOVE_REQUESTED and not only(cmds, Reform)
    st, cmds = feed([(0.2, SafePoint(7))], st)
    assert only(cmds, Reform) == [Reform(1, "nic3", "nic2 failing: at a step boundary (7 done)")]
    st, cmds = feed([(0.9, ReformDone(1, "nic3"))], st)
    assert st.phase == Phase.HEALTHY and st.nic == "nic3" and st.gen == 1
    assert [(a.action, a.outcome) for a in only(cmds, Ack)] == [("move_off_nic-nic2-0", "done")]


def test_stuck_collective_then_action_reforms_at_once() -> None:
    st, cmds = feed([(0, CollectiveTimedOut()), (1.5, CollectiveTimedOut())])
    assert st.phase == Phase.STUCK and not only(cmds, Reform)
    st, cmds = feed([(2.0, ActionReceived(move(t=1)))], st)
    assert [r.nic for r in only(cmds, Reform)] == ["nic3"] and st.phase == Phase.REFORMING


def test_collective_stuck_while_move_pending_reforms_without_waiting_for_the_step() -> None:
    _, cmds = feed([(0, ActionReceived(move())), (0.5, CollectiveTimedOut())])
    assert [r.nic for r in only(cmds, Reform)] == ["nic3"]


def test_flap_during_a_step_without_verdict_reforms_in_place_after_the_wait() -> None:
    st, cmds = feed([(0, CollectiveTimedOut()), (4.9, CollectiveTimedOut())])
    assert not only(cmds, Reform)
    st, cmds = feed([(5.0, CollectiveTimedOut())], st)
    assert [r.nic for r in only(cmds, Reform)] == ["nic2"]  # no verdict: same NIC
    st, _ = feed([(5.5, ReformDone(1, "nic2")), (6.0, SafePoint(3))], st)
    assert st.phase == Phase.HEALTHY and st.nic == "nic2" and st.reforms == 0


def test_gives_up_after_max_reforms() -> None:
    st = initial(CFG)
    for k in range(CFG.max_reforms):
        st, _ = feed([(10 * k, CollectiveTimedOut()), (10 * k + 5, CollectiveTimedOut()),
                      (10 * k + 6, ReformDone(k + 1, "nic2"))], st)  # fmt: skip
    st, cmds = feed([(100, CollectiveTimedOut()), (106, CollectiveTimedOut())], st)
    assert st.phase == Phase.FAILED and only(cmds, Fail)


def test_recovery_message_while_healthy_for_a_nic_not_in_use() -> None:
    st, cmds = feed([(0, ActionReceived(move("nic3")))])
    assert st.phase == Phase.HEALTHY and st.nic == "nic2" and "nic3" in st.bad
    assert [a.outcome for a in only(cmds, Ack)] == ["done"] and not only(cmds, Reform)


def test_action_for_another_job_or_nic_is_ignored() -> None:
    _, cmds = feed([(0, ActionReceived(move(job="other"))), (0, ActionReceived(move("nic9")))])
    assert [a.outcome for a in only(cmds, Ack)] == ["ignored", "ignored"]


def test_duplicate_action_is_handled_once() -> None:
    st, cmds = feed([(0, ActionReceived(move())), (0.1, ActionReceived(move()))])
    assert len(only(cmds, Reform)) == 0 and st.phase == Phase.MOVE_REQUESTED
    assert len([c for c in cmds if not isinstance(c, Ack)]) == 1


def test_expired_action_is_acked_expired() -> None:
    _, cmds = feed([(120, ActionReceived(move()))])
    assert [a.outcome for a in only(cmds, Ack)] == ["expired"]


def test_no_spare_nic_fails_the_action_not_the_job() -> None:
    st, _ = feed([(0, ActionReceived(move("nic3")))])
    st, cmds = feed([(1, ActionReceived(move("nic2", t=1)))], st)
    assert [a.outcome for a in only(cmds, Ack)] == ["failed"] and st.phase == Phase.HEALTHY


def test_control_off_nothing_happens() -> None:
    st, cmds = feed([(0, ControlChanged(False)), (1, ActionReceived(move())), (2, SafePoint(1))])
    assert st.phase == Phase.HEALTHY and st.nic == "nic2" and not only(cmds, Reform)
    assert [a.outcome for a in only(cmds, Ack)] == ["ignored"]
    st, cmds = feed([(3, CollectiveTimedOut()), (20, CollectiveTimedOut())], st)
    assert not only(cmds, Reform) and not only(cmds, Fail)  # left to the job's own timeout
    st, cmds = feed([(33, CollectiveTimedOut())], st)
    assert only(cmds, Fail) and st.phase == Phase.FAILED


def test_control_switched_off_cancels_a_pending_move() -> None:
    st, cmds = feed(
        [(0, ActionReceived(move())), (0.1, ControlChanged(False)), (0.2, SafePoint(1))]
    )
    assert st.phase == Phase.HEALTHY and not only(cmds, Reform)
    assert [a.outcome for a in only(cmds, Ack)] == ["ignored"]


def test_peer_reform_follows_the_generation() -> None:
    st, cmds = feed([(0, CollectiveTimedOut()), (0.5, PeerReform(1))])
    assert only(cmds, Reform) == [Reform(1, "nic2", "rank peer announced generation 1")]
    st, cmds = feed([(0.6, PeerReform(1))], st)
    assert not cmds


def test_reform_failure_retries_then_gives_up() -> None:
    st, _ = feed([(0, ActionReceived(move())), (0.1, SafePoint(1))])
    st, cmds = feed([(0.5, ReformFailed("store timeout"))], st)
    assert st.phase == Phase.STUCK and not only(cmds, Fail)


def test_may_move_back_clears_the_bad_mark_and_stays() -> None:
    st, _ = feed([(0, ActionReceived(move())), (0.1, SafePoint(1)), (0.5, ReformDone(1, "nic3"))])
    st, cmds = feed([(70, ActionReceived(move(t=70, kind="may_move_back")))], st)
    assert (
        st.nic == "nic3"
        and "nic2" not in st.bad
        and [a.outcome for a in only(cmds, Ack)] == ["done"]
    )


def test_stuck_on_a_nic_qpmesh_calls_usable_reforms_in_place_at_once() -> None:
    """A flap that outlasted the collective timeout and cleared: the usable signal for the NIC
    in use re-forms in place at once instead of after the verdict wait."""
    st, _ = feed([(0, CollectiveTimedOut())])
    assert st.phase == Phase.STUCK
    st, cmds = feed([(1.5, ActionReceived(move(t=1, kind="may_move_back")))], st)
    assert st.phase == Phase.REFORMING and st.nic == "nic2"
    assert [(r.gen, r.nic) for r in only(cmds, Reform)] == [(1, "nic2")]
    assert [a.outcome for a in only(cmds, Ack)] == ["done"]
    # for the other NIC it only clears the mark: still stuck, still waiting for a verdict
    st, _ = feed([(0, CollectiveTimedOut())])
    st, cmds = feed([(1.5, ActionReceived(move("nic3", t=1, kind="may_move_back")))], st)
    assert st.phase == Phase.STUCK and not only(cmds, Reform)
