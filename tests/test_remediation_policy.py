"""The remediation policy, table-driven: findings + jobs + Control + time -> actions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from contract.remediation import AckDoc, ActionDoc, DocumentError, ack_topic, action_topic
from controller.remediation.policy import (
    SEC,
    Decision,
    Finding,
    PolicyConfig,
    PolicyError,
    PolicyState,
    Rule,
    decide,
    finding,
    nic_of,
)

JOBS = {"train": frozenset({"nic0", "nic3"}), "eval": frozenset({"nic1"})}
CFG = PolicyConfig(
    rules=(
        Rule(("nic_down", "link_down", "link_flap"), "move_off_nic", hold_ns=1 * SEC),
        Rule(
            ("nic_down", "link_down", "link_flap"), "replace_link", min_count=3, window_ns=60 * SEC
        ),
        Rule(("contention",), "report_contention"),
        Rule(("clear",), "may_move_back", hold_ns=10 * SEC),
    ),
    ttl_ns=30 * SEC,
    min_interval_ns=5 * SEC,
    max_actions=4,
    budget_window_ns=60 * SEC,
)


def run(steps: list[tuple[float, list[Finding]]], control: bool = True,
        cfg: PolicyConfig = CFG) -> list[tuple[float, str, str, str, str]]:  # fmt: skip
    """Feed (time s, findings) steps; return (t, disposition, kind, target, job) of all actions."""
    st = PolicyState()
    out = []
    for t, fs in steps:
        d: Decision = decide(cfg, st, tuple(fs), JOBS, control, int(t * SEC))
        st = d.state
        out += [(t, p.disposition, p.action.kind, p.action.target, p.action.job) for p in d.actions]
    return out


def f(kind: str, target: str, t: float, flows: tuple[tuple[str, str, int], ...] = ()) -> Finding:
    return finding(kind, target, int(t * SEC), flows=flows)


@dataclass(frozen=True)
class Case:
    name: str
    steps: list[tuple[float, list[Finding]]]
    want: list[tuple[float, str, str, str, str]]
    control: bool = True


CASES = [
    Case(
        "nic down past the hold moves the jobs using it",
        [(0.0, [f("nic_down", "nic0", 0.0)]), (0.5, []), (1.0, [])],
        [(1.0, "send", "move_off_nic", "nic0", "train")],
    ),
    Case(
        "NIC link down names the NIC",
        [(0.0, [f("link_down", "nic1-leaf0", 0.0)]), (1.5, [])],
        [(1.5, "send", "move_off_nic", "nic1", "eval")],
    ),
    Case(
        "a flap shorter than the hold moves nothing; its clear says the NIC is usable",
        [(0.0, [f("nic_down", "nic0", 0.0)]), (0.6, [f("clear", "nic0", 0.6)]), (5.0, [])],
        [(0.6, "send", "may_move_back", "nic0", "train")],
    ),
    Case(
        "loss on a NIC link, cleared: the NIC is usable",
        [(0.0, [f("loss", "nic1-leaf0", 0.0)]), (2.0, [f("clear", "nic1-leaf0", 2.0)])],
        [(2.0, "send", "may_move_back", "nic1", "eval")],
    ),
    Case(
        "a clear with no finding before it, or of a NIC no job uses, says nothing",
        [
            (0.0, [f("clear", "nic0", 0.0), f("loss", "nic7-leaf1", 0.0)]),
            (1.0, [f("clear", "nic7-leaf1", 1.0)]),
        ],
        [],
    ),
    Case(
        "a flap finding acts at once",
        [(0.0, [f("link_flap", "nic3-leaf1", 0.0)])],
        [(0.0, "send", "move_off_nic", "nic3", "train")],
    ),
    Case("a NIC no job uses moves nothing", [(0.0, [f("nic_down", "nic7", 0.0)]), (2.0, [])], []),
    Case(
        "the same finding again is de-duplicated",
        [
            (0.0, [f("nic_down", "nic0", 0.0)]),
            (1.0, [f("nic_down", "nic0", 1.0)]),
            (2.0, [f("nic_down", "nic0", 2.0)]),
            (9.0, []),
        ],
        [(1.0, "send", "move_off_nic", "nic0", "train")],
    ),
    Case(
        "Control off: would have, nothing sent",
        [(0.0, [f("nic_down", "nic0", 0.0)]), (1.0, [])],
        [(1.0, "would_have", "move_off_nic", "nic0", "train")],
        control=False,
    ),
    Case(
        "N downs of one link in the window open replace_link",
        [
            (0.0, [f("link_down", "leaf0-spine1", 0.0)]),
            (1.0, [f("clear", "leaf0-spine1", 1.0)]),
            (2.0, [f("link_down", "leaf0-spine1", 2.0)]),
            (3.0, [f("clear", "leaf0-spine1", 3.0)]),
            (4.0, [f("link_flap", "leaf0-spine1", 4.0)]),
        ],
        [(4.0, "send", "replace_link", "leaf0-spine1", "")],
    ),
    Case(
        "downs spread wider than the window do not",
        [
            (0.0, [f("link_down", "leaf0-spine1", 0.0)]),
            (40.0, [f("link_down", "leaf0-spine1", 40.0)]),
            (80.0, [f("link_down", "leaf0-spine1", 80.0)]),
        ],
        [],
    ),
    Case(
        "contention reports the link and each affected job",
        [
            (
                0.0,
                [
                    f(
                        "contention",
                        "leaf0->spine1",
                        0.0,
                        (("nic0", "nic5", 4791), ("nic1", "nic5", 4792)),
                    )
                ],
            )
        ],
        [
            (0.0, "send", "report_contention", "leaf0->spine1", "eval"),
            (0.0, "send", "report_contention", "leaf0->spine1", "train"),
        ],
    ),
    Case(
        "contention with no job still reported once",
        [(0.0, [f("contention", "leaf1->spine0", 0.0, (("nic8", "nic9", 1),))])],
        [(0.0, "send", "report_contention", "leaf1->spine0", "")],
    ),
    Case(
        "back and stable for the hold: may move back",
        [
            (0.0, [f("nic_down", "nic0", 0.0)]),
            (1.0, []),
            (3.0, [f("clear", "nic0", 3.0)]),
            (12.0, []),
            (13.0, []),
        ],
        [
            (1.0, "send", "move_off_nic", "nic0", "train"),
            (13.0, "send", "may_move_back", "nic0", "train"),
        ],
    ),
    Case(
        "down again during the hold: no move back",
        [
            (0.0, [f("nic_down", "nic0", 0.0)]),
            (1.0, []),
            (3.0, [f("clear", "nic0", 3.0)]),
            (8.0, [f("nic_down", "nic0", 8.0)]),
            (14.0, []),
        ],
        [(1.0, "send", "move_off_nic", "nic0", "train")],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_policy_table(case: Case) -> None:
    assert run(case.steps, case.control) == case.want


def test_new_episode_within_min_interval_is_suppressed_then_sent() -> None:
    flows = (("nic0", "nic5", 7),)
    steps = [
        (0.0, [f("contention", "leaf0->spine1", 0.0, flows)]),
        (2.0, [f("contention", "leaf0->spine1", 2.0, flows)]),  # new episode 2 s later
        (3.0, []),
        (5.0, []),
    ]
    assert run(steps) == [
        (0.0, "send", "report_contention", "leaf0->spine1", "train"),
        (2.0, "suppressed", "report_contention", "leaf0->spine1", "train"),
        (5.0, "send", "report_contention", "leaf0->spine1", "train"),
    ]


def test_a_job_already_moved_is_not_told_again() -> None:
    steps = [
        (0.0, [f("link_flap", "nic0-leaf0", 0.0)]),
        (1.0, [f("clear", "nic0-leaf0", 1.0)]),
        (2.0, [f("link_flap", "nic0-leaf0", 2.0)]),
        (9.0, []),
    ]
    assert run(steps) == [(0.0, "send", "move_off_nic", "nic0", "train")]


def test_storm_of_findings_is_capped_by_the_budget() -> None:
    storm = [f("contention", f"leaf0->spine{k}", 0.0, (("nic9", "nic8", k),)) for k in range(50)]
    got = run([(0.0, storm), (1.0, storm), (61.0, [])])
    sent = [g for g in got if g[1] == "send"]
    assert len([g for g in sent if g[0] == 0.0]) == CFG.max_actions
    assert len([g for g in got if g[1] == "suppressed"]) == 50 - CFG.max_actions
    assert len([g for g in sent if g[0] == 61.0]) == CFG.max_actions  # drained as budget returns


def test_ids_are_stable_for_one_episode_and_differ_across_episodes() -> None:
    a = decide(CFG, PolicyState(), (f("link_flap", "nic0-leaf0", 0.0),), JOBS, True, 0)
    b = decide(CFG, PolicyState(), (f("link_flap", "nic0-leaf0", 0.0),), JOBS, True, 7 * SEC)
    c = decide(CFG, PolicyState(), (f("link_flap", "nic0-leaf0", 1.0),), JOBS, True, 0)
    assert a.actions[0].action.id == b.actions[0].action.id != c.actions[0].action.id


def test_actions_carry_reason_finding_and_expiry() -> None:
    d = decide(CFG, PolicyState(), (f("link_flap", "nic3-leaf1", 2.0),), JOBS, True, 2 * SEC)
    a = d.actions[0].action
    assert a.finding == "link_flap@nic3-leaf1@2000000000"
    assert a.expires_at_ns - a.issued_at_ns == CFG.ttl_ns and "nic3" in a.reason
    assert ActionDoc.decode(a.encode()) == a


def test_decide_is_pure() -> None:
    st = PolicyState()
    fs = (f("nic_down", "nic0", 0.0),)
    assert decide(CFG, st, fs, JOBS, True, SEC) == decide(CFG, st, fs, JOBS, True, SEC)
    assert st == PolicyState()


def test_bad_config_is_refused() -> None:
    with pytest.raises(PolicyError):
        Rule(("x",), "reboot")
    with pytest.raises(PolicyError):
        PolicyConfig(max_actions=0)


def test_nic_of() -> None:
    assert [nic_of(t) for t in ("nic3", "nic12-leaf1", "leaf0-spine1", "nicx")] == [
        "nic3",
        "nic12",
        "",
        "",
    ]


# ---- the contract documents ---------------------------------------------------------------


def test_action_and_ack_round_trip_and_topics() -> None:
    a = ActionDoc("move_off_nic-00aa", "move_off_nic", "r", "f", 1, 2, nic="nic1", job="j")
    assert ActionDoc.decode(a.encode()) == a
    k = AckDoc(a.id, "j/rank1", "done", 3, "re-formed on nic0")
    assert AckDoc.decode(k.encode()) == k
    assert action_topic("qpmesh/v1", "nic1") == "qpmesh/v1/remediation/nic1"
    assert ack_topic("qpmesh/v1", a.id) == "qpmesh/v1/remediation-ack/move_off_nic-00aa"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{", "remediation action: not JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"id":"x","kind":"zap","issued_at_ns":1,"expires_at_ns":2}', "kind: must be one of"),
        (
            b'{"id":"x","kind":"move_off_nic","issued_at_ns":1,"expires_at_ns":2}',
            "nic: must be a NIC id",
        ),
        (
            b'{"id":"x","kind":"replace_link","issued_at_ns":1,"expires_at_ns":2}',
            "link: must be a link id",
        ),
        (
            b'{"id":"x","kind":"move_off_nic","nic":"n","issued_at_ns":3,"expires_at_ns":2}',
            "after issued_at_ns",
        ),
        (
            b'{"id":"a/b","kind":"move_off_nic","nic":"n","issued_at_ns":1,"expires_at_ns":2}',
            "id: must be",
        ),
        (
            b'{"id":"x","kind":"move_off_nic","nic":"n","issued_at_ns":true,"expires_at_ns":2}',
            "issued_at_ns",
        ),
    ],
)
def test_bad_action_is_one_line_error(payload: bytes, message: str) -> None:
    with pytest.raises(DocumentError, match=message) as exc:
        ActionDoc.decode(payload)
    assert "\n" not in str(exc.value)


def test_bad_ack_is_refused() -> None:
    with pytest.raises(DocumentError, match="outcome"):
        AckDoc.decode(b'{"action":"x","receiver":"r","outcome":"maybe","t_ns":1}')
    with pytest.raises(DocumentError, match="receiver"):
        AckDoc.decode(b'{"action":"x","receiver":"","outcome":"done","t_ns":1}')


def test_send_planned_publishes_only_send_and_audits_all() -> None:
    from controller.remediation.publish import send_planned

    st = PolicyState()
    d_on = decide(CFG, st, (f("link_flap", "nic0-leaf0", 0.0),), JOBS, True, 0)
    d_off = decide(CFG, st, (f("link_flap", "nic1-leaf0", 0.0),), JOBS, False, 0)
    sent: list[tuple[str, bytes]] = []
    audit = send_planned(d_on.actions + d_off.actions, lambda t, p: sent.append((t, p)), 5)
    assert [t for t, _ in sent] == ["qpmesh/v1/remediation/nic0"]
    assert ActionDoc.decode(sent[0][1]) == d_on.actions[0].action
    assert [a["disposition"] for a in audit] == ["send", "would_have"]
    assert audit[1]["job"] == "eval" and audit[1]["finding"].startswith("link_flap@nic1-leaf0")


def test_remediator_turns_published_events_into_actions_over_ticks() -> None:
    from contract.documents import EventDoc
    from controller.remediation.loop import Remediator

    def ev(kind: str, target: str) -> EventDoc:
        return EventDoc(0, kind, target)

    r = Remediator(CFG)
    sent: list[str] = []
    assert r.observe(ev("gpu_fault", "host1")) is None
    r.observe(ev("nic_down", "nic0"))
    assert r.tick(JOBS, True, int(0.5 * SEC), lambda t, p: sent.append(t)) == []  # in the hold
    out = r.tick(JOBS, True, 1 * SEC, lambda t, p: sent.append(t))
    assert [(a["kind"], a["nic"], a["job"], a["disposition"]) for a in out] == [
        ("move_off_nic", "nic0", "train", "send")
    ]
    assert sent == ["qpmesh/v1/remediation/nic0"] and list(r.audit) == out


def test_remediator_with_the_job_registry_and_control_switch() -> None:
    from contract.documents import EventDoc
    from controller.control import Control
    from controller.jobs import Job, JobRegistry
    from controller.remediation.loop import Remediator

    reg = JobRegistry((Job("train", "t1", (("nic0",), ("nic3",))), Job("eval", "t2", (("nic1",),))))
    control = Control(enabled=False)
    r = Remediator(CFG)
    sent: list[str] = []
    r.observe(EventDoc(0, "link_flap", "nic3-leaf1"))
    out = r.tick_with(reg, control, 0, lambda t, p: sent.append(t))
    assert [(a["job"], a["disposition"]) for a in out] == [("train", "would_have")] and sent == []
    control.set(True, "operator", 1)
    r.observe(EventDoc(SEC, "link_flap", "nic1-leaf0"))
    out = r.tick_with(reg, control, SEC, lambda t, p: sent.append(t))
    assert [(a["job"], a["disposition"]) for a in out] == [("eval", "send")]
    assert sent == ["qpmesh/v1/remediation/nic1"]
