"""Brain on synthetic Observations: flap, NIC down, contention, prober down, healthy."""

from __future__ import annotations

import dataclasses

import numpy as np

from controller.brain import Brain, BrainConfig
from controller.observations import Observations
from mesh.snapshot import Health
from tests.fullmesh import DST, FAB, FWD, REV, SPORT, SRC, WIN

CFG = BrainConfig(lateness_ns=0)  # tests below deliver each window complete


def window(
    k: int,
    rng: np.random.Generator,
    *,
    dead_link: int | None = None,
    slow_hop: int | None = None,
    silent_nic: int | None = None,
) -> Observations:
    n = len(SRC)
    base_f = 1000.0 + 300.0 * (FWD >= 0).sum(axis=1)
    base_r = 1000.0 + 300.0 * (REV >= 0).sum(axis=1)
    owd_f = base_f + rng.exponential(100.0, n)
    owd_r = base_r + rng.exponential(100.0, n)
    lost: np.ndarray = np.zeros(n, dtype=bool)  # type: ignore[type-arg]
    if dead_link is not None:
        hops = (2 * dead_link, 2 * dead_link + 1)
        lost = np.asarray(np.isin(FWD, hops).any(axis=1) | np.isin(REV, hops).any(axis=1))
    if slow_hop is not None:
        owd_f += np.where(np.equal(FWD, slow_hop).any(axis=1), rng.exponential(20_000.0, n), 0.0)
        owd_r += np.where(np.equal(REV, slow_hop).any(axis=1), rng.exponential(20_000.0, n), 0.0)
    keep = np.ones(n, dtype=bool)
    if silent_nic is not None:
        lost |= np.equal(DST, silent_nic)
        keep = np.not_equal(SRC, silent_nic)
    t = k * WIN + rng.integers(0, WIN, n)
    obs = Observations(
        t.astype(np.int64),
        SRC.astype(np.int32),
        DST.astype(np.int32),
        SPORT.astype(np.int32),
        FWD,
        REV,
        lost,
        np.where(lost, np.nan, owd_f),
        np.where(lost, np.nan, owd_r),
        np.where(lost, np.nan, owd_f + owd_r),
    )
    return obs.select(keep)


def drive(brain: Brain, k0: int, k1: int, rng: np.random.Generator, **kw: int) -> list:  # type: ignore[type-arg]
    out = []
    for k in range(k0, k1):
        brain.observe(window(k, rng, **kw))
        out += brain.tick((k + 1) * WIN)
    return out


def test_healthy_raises_nothing() -> None:
    rng = np.random.default_rng(1)
    brain = Brain(FAB, CFG)
    assert drive(brain, 0, 50, rng) == []
    assert set(brain.link_health().values()) == {Health.UP}


def test_link_flap_detected_within_two_windows_and_counted() -> None:
    rng = np.random.default_rng(2)
    brain = Brain(FAB, CFG)
    lk = FAB.link_index["leaf1-spine2"]
    drive(brain, 0, 10, rng)
    ev = drive(brain, 10, 11, rng, dead_link=lk)
    assert [(e.kind, e.target) for e in ev] == [("link_down", "leaf1-spine2")]
    ev = drive(brain, 11, 15, rng)
    assert [e.kind for e in ev] == ["clear"]
    ev = drive(brain, 15, 16, rng, dead_link=lk)
    assert [(e.kind, e.target) for e in ev] == [("link_flap", "leaf1-spine2")]
    assert "2 times" in ev[0].detail
    assert brain.flap_counts() == {"leaf1-spine2": 2}
    assert brain.link_health()["leaf1-spine2"] == Health.FLAPPING


def test_nic_down_reported_on_the_nic_not_a_leaf_link() -> None:
    rng = np.random.default_rng(3)
    brain = Brain(FAB, CFG)
    drive(brain, 0, 10, rng)
    ev = drive(brain, 10, 13, rng, dead_link=int(FAB.nic_link[5]))
    assert [(e.kind, e.target) for e in ev] == [("nic_down", "nic5")]
    assert brain.nic_health()[5] == Health.DOWN


def test_contention_names_directed_hop_and_flows() -> None:
    rng = np.random.default_rng(4)
    brain = Brain(FAB, CFG)
    lk = FAB.link_index["leaf0-spine2"]
    hop = 2 * lk  # leaf0 -> spine2, up
    drive(brain, 0, 20, rng)
    ev = drive(brain, 20, 23, rng, slow_hop=hop)
    assert [(e.kind, e.target) for e in ev] == [("contention", "leaf0->spine2")]
    assert ev[0].flows and all(f[0] in {f"nic{i}" for i in range(4)} for f in ev[0].flows)
    ev = drive(brain, 23, 30, rng)
    assert [(e.kind, e.target) for e in ev] == [("clear", "leaf0->spine2")]


def test_silent_prober_is_a_host_fault_not_a_network_fault() -> None:
    rng = np.random.default_rng(5)
    brain = Brain(FAB, CFG)
    drive(brain, 0, 10, rng)
    ev = drive(brain, 10, 40, rng, silent_nic=7)
    assert [(e.kind, e.target) for e in ev] == [("prober_down", "host7")]
    assert brain.nic_health()[7] == Health.UNKNOWN


def test_nic_its_host_reports_down_is_nic_down_not_a_silent_prober() -> None:
    """A one-NIC host whose NIC lost carrier sends nothing, like a dead prober; its prober's
    health report (the NIC's link down) makes it a NIC fault, and the report of the link back
    up clears it. Without the report the same data stays a host fault (test above)."""
    rng = np.random.default_rng(5)
    brain = Brain(FAB, CFG)
    drive(brain, 0, 10, rng)
    brain.nic_links("host7", {"nic7": False, "nic3": False}, 10 * WIN)  # nic3: not host7's
    ev = drive(brain, 10, 40, rng, silent_nic=7)
    assert [(e.kind, e.target) for e in ev] == [("nic_down", "nic7")]
    assert "host7 reports the link of nic7 down" in ev[0].detail
    assert brain.nic_health()[7] == Health.DOWN and brain.nic_health()[3] == Health.UP
    brain.nic_links("host7", {"nic7": True}, 40 * WIN)
    ev = drive(brain, 40, 50, rng)
    assert [(e.kind, e.target) for e in ev] == [("clear", "nic7")]


def test_presence_and_gpu_events() -> None:
    brain = Brain(FAB, CFG)
    brain.presence("host3", False, 10)
    brain.gpu("host4", False, "Xid 79", 10)
    ev = brain.tick(WIN)
    assert {(e.kind, e.target) for e in ev} == {("prober_down", "host3"), ("gpu_fault", "host4")}
    brain.presence("host3", True, WIN)
    brain.gpu("host4", True, "", WIN)
    assert {(e.kind, e.target) for e in brain.tick(2 * WIN)} == {
        ("clear", "host3"),
        ("clear", "host4"),
    }


def _late_losses(brain: Brain, dead: set[int], lk: int, timeout: int, n: int) -> list:  # type: ignore[type-arg]
    """Windows 0..n-1, link ``lk`` dead in windows ``dead``; a window's successes arrive at its
    own tick, its lost probes ``timeout`` windows later (with that window's successes)."""
    rng = np.random.default_rng(7)
    late: dict[int, Observations] = {}
    out = []
    for k in range(n):
        obs = window(k, rng, dead_link=lk if k in dead else None)
        late[k + timeout] = obs.select(obs.lost)
        now = obs.select(~obs.lost)
        if k in late:
            arrived = late.pop(k)
            cols = [f.name for f in dataclasses.fields(Observations)]
            now = Observations(
                *(np.concatenate([getattr(now, c), getattr(arrived, c)]) for c in cols)
            )
        brain.observe(now)
        out += brain.tick((k + 1) * WIN)
    return out


def test_flap_with_late_lost_probes_windowed_by_send_time() -> None:
    # 1.5 s down / 1.5 s up, lost probes reported 1.5 s late: every arrival window mixes the
    # dead period's losses with the up period's successes (~50 % loss), none is 100 % dead
    lk = FAB.link_index["leaf1-spine2"]
    dead = set(range(10, 25)) | set(range(40, 55))
    ev = _late_losses(Brain(FAB, BrainConfig(lateness_ns=15 * WIN)), dead, lk, 15, 90)
    mine = [(e.kind, e.t_ns) for e in ev if e.target == "leaf1-spine2"]
    assert mine[0] == ("link_down", 11 * WIN)  # stamped with the dead window's end
    assert ("link_flap", 41 * WIN) in mine
    assert "loss" not in [k for k, _ in mine]
    assert all(e.target == "leaf1-spine2" for e in ev)
    # the same delivery judged by arrival (no lateness) never sees a dead window
    old = _late_losses(Brain(FAB, CFG), dead, lk, 15, 90)
    assert not {"link_down", "link_flap"} & {e.kind for e in old}


def test_a_restarted_prober_is_one_prober_down_not_two() -> None:
    """A SIGKILLed prober: its will raises prober_down, its hello after the restart clears it.
    The window that ended before the hello is judged after it (windows close late: the live
    controller judges each at its end time, `Brain.judge`) and holds the restart's gap; that
    gap is the same fault, not a second prober_down (the chaos run of 2026-11-28 saw
    prober_down, clear, prober_down, clear). A prober alive but silent after its hello is
    still raised."""
    rng = np.random.default_rng(6)
    brain = Brain(FAB, dataclasses.replace(CFG, silent_ns=2 * WIN))
    drive(brain, 0, 10, rng)
    brain.presence("host7", False, 10 * WIN + 1)
    ev = brain.take_pending() + drive(brain, 10, 11, rng, silent_nic=7)
    assert [(e.kind, e.target) for e in ev] == [("prober_down", "host7")]
    brain.presence("host7", True, 12 * WIN + 50)  # the hello, before window 11 is judged
    ev = brain.take_pending()
    brain.observe(window(11, rng, silent_nic=7))  # the restart's gap, judged at its end
    ev += brain.tick(12 * WIN) + drive(brain, 12, 20, rng)
    assert [(e.kind, e.target) for e in ev] == [("clear", "host7")]
    ev = drive(brain, 20, 40, rng, silent_nic=7)  # alive but silent after its hello: raised
    assert [(e.kind, e.target) for e in ev] == [("prober_down", "host7")]
