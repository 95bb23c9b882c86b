"""``qpmesh testbed chaos``'s pure parts: the plan (`testbed.chaos`), the judgement of what a run
saw (`testbed.chaosreport`) and the flaky-test loop's summary (`testbed.chaosloop`)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from testbed.chaos import (
    DEFAULT_FAULTS,
    RECOVERY_ROOM_S,
    ChaosError,
    ComponentFault,
    chaos_plan,
    min_duration_s,
    needed_s,
    repeat_faults,
)
from testbed.chaosloop import Outcome, pytest_argv, run_order, summarize
from testbed.chaosreport import (
    Applied,
    Batch,
    Observed,
    Poll,
    judge,
    judge_actions,
    lost_batches,
    occurrences_found,
    recovered_ns,
    self_inflicted,
)
from testbed.scenario import Fault, FaultKind

S = 1_000_000_000
HOSTS = ("host0", "host1", "host2")


def _plan(seed: int, duration: float = 200.0) -> list[ComponentFault]:
    return chaos_plan(seed, duration, hosts=HOSTS, agents=("a0", "a1"))


def test_plan_is_the_seeds_and_every_fault_has_its_own_room() -> None:
    p = _plan(3)
    assert p == _plan(3) and p != _plan(4)
    assert sorted(f"{f.op}:{f.component}" for f in p) == sorted(DEFAULT_FAULTS)
    for f, g in itertools.pairwise(p):  # the outage and the room to recover fit
        assert f.t_s + f.down_s + RECOVERY_ROOM_S <= g.t_s + 1e-9, (f, g)
    last = p[-1]
    assert last.t_s + needed_s(last.op, last.component) <= 200.0
    assert all(f.t_s >= 6.0 for f in p)
    assert {f.target for f in p if f.component == "prober"} <= set(HOSTS)
    assert next(f for f in p if f.component == "api").down_s == 0  # its controller restarts it
    assert all(f.share == 0.02 and f.down_s == 20.0 for f in p if f.op == "starve")
    assert all(1.0 <= f.down_s <= 4.0 for f in p if f.op == "kill" and f.component != "api")


def test_plan_refuses_what_cannot_be() -> None:
    with pytest.raises(ChaosError, match="unknown component fault"):
        chaos_plan(1, 500, ["kill:switch"], hosts=HOSTS)
    with pytest.raises(ChaosError, match="unknown component fault"):
        chaos_plan(1, 500, ["starve:broker"], hosts=HOSTS)
    need = min_duration_s(DEFAULT_FAULTS, 6.0)
    with pytest.raises(ChaosError, match=f"at least {need:g} s"):
        chaos_plan(1, need - 1, hosts=HOSTS, agents=("a",))
    with pytest.raises(ChaosError, match="hosts"):
        chaos_plan(1, 500, ["kill:prober"])
    with pytest.raises(ChaosError, match="agent"):
        chaos_plan(1, 500, ["kill:agent"], hosts=HOSTS)
    assert chaos_plan(1, 10, []) == []


def test_repeat_faults_fill_the_run() -> None:
    f = [Fault(FaultKind.FLAP, "leaf0-spine1", 12, 9), Fault(FaultKind.CONGEST, "l", 24, 14, 0.6)]
    out = repeat_faults(f, 40, 130)
    assert [(g.kind, g.start_s) for g in out] == [
        (FaultKind.FLAP, 12),
        (FaultKind.CONGEST, 24),
        (FaultKind.FLAP, 52),
        (FaultKind.CONGEST, 64),
        (FaultKind.FLAP, 92),
        (FaultKind.CONGEST, 104),
    ]  # the copy at 132 s would end after the run


def _b(at_s: float, origin: str, seq: int) -> Batch:
    return Batch(round(at_s * S), origin, seq, 50, round(at_s * S) - S // 5)


def test_lost_batches_counts_gaps_not_restarts() -> None:
    batches = [_b(t, "host0", s) for t, s in ((1, 100), (1.5, 101), (3, 104), (3.5, 105))]
    batches += [_b(9, "host0", 9_000_000), _b(9.5, "host0", 9_000_001)]  # restarted: a new start
    batches += [_b(2, "host1", 7), _b(2.1, "host1", 7), _b(2.5, "host1", 8)]  # a repeat: no gap
    assert lost_batches(batches) == {"host0": [(3 * S, 102, 2)]}


def _obs() -> Observed:
    return Observed(t0_ns=0, hosts=("host0", "host1"))


def test_recovery_of_a_prober_needs_its_presence_and_its_batches() -> None:
    obs = _obs()
    a = Applied(ComponentFault("prober", "kill", 10, 2, target="host1"), 10 * S, 12 * S)
    obs.batches = [_b(9, "host1", 1), _b(14, "host1", 5000), _b(13, "host0", 9)]
    obs.presence = [(13 * S, "host1", True)]
    assert recovered_ns(a, obs) == 14 * S
    obs.presence = []
    assert recovered_ns(a, obs) is None


def test_recovery_of_the_broker_and_the_controller() -> None:
    obs = _obs()
    broker = Applied(ComponentFault("broker", "kill", 10, 2), 10 * S, 12 * S)
    obs.batches = [_b(13, "host0", 1), _b(15, "host1", 1)]
    obs.controller_log = [(1 * S, "connected"), (14 * S, "connected")]
    assert recovered_ns(broker, obs) == 15 * S
    ctl = Applied(ComponentFault("controller", "kill", 20, 2), 20 * S, 22 * S)
    obs.controller_log.append((23 * S, "connected"))
    obs.api = [Poll(24 * S, True, 24 * S, unknown_nics=2), Poll(25 * S, True, 25 * S, 0)]
    assert recovered_ns(ctl, obs) == 25 * S  # connected, and then the snapshot whole
    starve = Applied(ComponentFault("controller", "starve", 30, 5, 0.05), 30 * S, 35 * S)
    obs.api += [Poll(t * S, True, (t - lag) * S) for t, lag in ((36, 5), (37, 1), (38, 1), (39, 1))]
    assert recovered_ns(starve, obs) == 37 * S


def test_self_inflicted_findings() -> None:
    obs = _obs()
    k = Applied(ComponentFault("prober", "kill", 10, 2, target="host1"), 10 * S, 12 * S)
    c = Applied(ComponentFault("controller", "kill", 40, 2), 40 * S, 42 * S)
    obs.applied = [k, c]
    flap = Fault(FaultKind.FLAP, "leaf0-spine1", 30, 20)
    windows = {"kill:prober:host1": (9 * S, 20 * S), "kill:controller": (39 * S, 50 * S)}
    obs.events = [
        (11 * S, {"kind": "prober_down", "target": "host1"}),  # expected
        (12 * S, {"kind": "loss", "target": "nic1-leaf0"}),  # a killed prober is not a link
        (13 * S, {"kind": "clear", "target": "host1"}),
        (14 * S, {"kind": "clear", "target": "nic1-leaf0"}),
        (25 * S, {"kind": "prober_down", "target": "host0"}),  # nobody killed it
        (27 * S, {"kind": "clear", "target": "host0"}),
        (31 * S, {"kind": "loss", "target": "leaf0-spine1"}),  # the flap: right
        (38 * S, {"kind": "loss", "target": "leaf2-spine1"}),  # false, then never cleared
        (44 * S, {"kind": "loss", "target": "leaf0-spine1"}),  # its successor raises it again
        (60 * S, {"kind": "clear", "target": "leaf0-spine1"}),
        (70 * S, {"kind": "contention", "target": "leaf2->spine0"}),  # false, no fault near
    ]
    obs.batches = [_b(75, "host0", 1)]  # the run's end
    found, expected = self_inflicted(obs, [flap], windows)
    assert [(x["kind"], x["target"], x["cause"], x["why"].split(" (")[0]) for x in found] == [
        ("loss", "nic1-leaf0", "kill:prober:host1", "explained by no network fault"),
        ("prober_down", "host0", "none", "prober_down of a prober nobody killed"),
        ("loss", "leaf0-spine1", "kill:controller",
         "raised again after the controller's restart"),
        ("loss", "leaf2-spine1", "kill:controller",
         "open when the controller was killed, never cleared"),
    ]  # fmt: skip
    assert [e["target"] for _, e in expected] == ["host1"]
    rep = judge(obs, [flap], spool_batches=10_000, batch_interval_s=0.5)
    assert rep["self_inflicted_findings"] == 4
    assert rep["self_inflicted_kinds"] == {"loss": 3, "prober_down": 1}
    # the expected prober_down is no alert; the contention at 70 s is a false one
    assert rep["estimators"]["qpmesh"]["recall"] == 1.0
    assert rep["estimators"]["qpmesh"]["false_alerts"] == 4  # (kind, target) pairs


def test_occurrences_are_found_one_by_one() -> None:
    obs = _obs()
    flaps = repeat_faults([Fault(FaultKind.FLAP, "leaf0-spine1", 10, 5)], 40, 160)
    obs.events = [
        (12 * S, {"kind": "link_flap", "target": "leaf0-spine1"}),  # the first, found
        (30 * S, {"kind": "clear", "target": "leaf0-spine1"}),
        (53 * S, {"kind": "contention", "target": "spine0->leaf0"}),  # not the second's cause
        (95 * S, {"kind": "link_flap", "target": "leaf0-spine1"}),  # the third, within margin
        # still open at the fourth's start: consumers hold it, found
    ]
    got = occurrences_found(obs, flaps)
    assert (got["found"], got["of"], got["missed"]) == (3, 4, ["flap leaf0-spine1 at 50 s"])
    assert got["recall"] == 0.75
    # the estimators match by target alone: the missed second counts found there
    rep = judge(obs, flaps, spool_batches=10_000, batch_interval_s=0.5)
    assert rep["estimators"]["qpmesh"]["recall"] == 1.0 and rep["occurrences"]["recall"] == 0.75


def test_actions_duplicate_and_lost() -> None:
    obs = _obs()
    congest = Fault(FaultKind.CONGEST, "leaf1-spine0", 10, 10, 0.6)
    again = Fault(FaultKind.CONGEST, "leaf1-spine0", 50, 10, 0.6)
    act = {"id": "report_contention-1", "kind": "report_contention", "target": "leaf1->spine0",
           "job": "j"}  # fmt: skip
    obs.events = [(12 * S, {"kind": "contention", "target": "leaf1->spine0"}),
                  (52 * S, {"kind": "contention", "target": "spine0->leaf1"})]  # fmt: skip
    obs.actions = [(12 * S, act), (13 * S, act), (15 * S, {**act, "id": "report_contention-2"})]
    obs.actions.append((30 * S, {"id": "move_off_nic-9", "kind": "move_off_nic",
                                 "target": "nic2", "job": "j"}))  # fmt: skip
    obs.agent_nics = {"a0": ("nic2",)}
    r = judge_actions(obs, [congest, again])
    assert r["sent"] == 3 and r["duplicate_actions"] == 2  # distinct ids
    assert {d["why"] for d in r["duplicates"]} == {
        "id sent again", "a second action in one fault occurrence"
    }  # fmt: skip
    # the second congestion was found and told nobody; the NIC action was not acknowledged
    assert r["lost_actions"] == 2
    assert r["outside_faults"][0]["id"] == "move_off_nic-9"
    obs.acks = [(31 * S, {"action": "move_off_nic-9", "outcome": "done"})]
    assert judge_actions(obs, [congest, again])["lost_actions"] == 1


def test_flaky_loop_summary() -> None:
    runs = [Outcome("t.py::a", i, rc, s) for i, rc, s in ((1, 0, 80), (2, 1, 90), (3, 0, 100))]
    runs.append(Outcome("t.py::b", 1, 0, 10))
    s = summarize(runs)
    assert s["t.py::a"] == {"runs": 3, "passed": 2, "failed_runs": [2], "median_s": 90.0,
                            "max_s": 100.0}  # fmt: skip
    assert s["t.py::b"]["passed"] == 1
    argv = pytest_argv("py", "t.py::a", Path("/tmp/x"))
    assert argv[-1] == "t.py::a" and "--basetemp=/tmp/x" in argv and "no:cacheprovider" in argv
    assert run_order(["a", "b"], 2, interleave=False) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert run_order(["a", "b"], 2, interleave=True) == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
