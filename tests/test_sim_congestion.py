"""The simulator's congestion truth, paths that move (re-hash, discovery), gray and optic
faults, and how `sim localize` scores alerts against faults and congestion."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from contract.documents import EventDoc
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths
from testbed.scenario import Fault, FaultKind
from testbed.sim.congestion_truth import CONTENTION_NS, QueueTruth, mm1_median_ns
from testbed.sim.engine import SimConfig, Simulator
from testbed.sim.fault_model import gray_drops, optic_drops
from testbed.sim.localize_score import Alert, CongestionTruth, Scorer, hop_of
from testbed.sim.model import ModelKnobs
from testbed.sim.reroute_model import Outage, Rerouter, Router, hash_inputs

FAB = build_fabric(FabricShape())  # 4 leaves x 4 NICs, 4 spines


def test_median_queue_of_the_engine_s_m_m_1_queue() -> None:
    svc = np.full(3, 82.0)
    med = mm1_median_ns(np.array([0.4, 0.9, 0.98]), svc)
    assert med[0] == 0  # a probe waits with probability rho: under 0.5, the median waits 0
    assert med[1] == pytest.approx(82 / 0.1 * np.log(1.8))
    assert med[2] > CONTENTION_NS > med[1]  # a hot hop (0.98) is contended, 0.9 is not
    # against the engine's own draws
    rng = np.random.default_rng(1)
    w = (rng.random(200_000) < 0.95) * rng.exponential(82 / 0.05, 200_000)
    assert np.median(w) == pytest.approx(mm1_median_ns(np.array([0.95]), svc[:1])[0], rel=0.03)


def test_a_nic_s_own_transmit_queue_is_not_fabric_truth_with_wire_stamps() -> None:
    egress = np.zeros(FAB.n_hops, dtype=bool)
    egress[[2 * int(li) for li in FAB.nic_link]] = True
    rho = np.full(FAB.n_hops, 0.98)
    svc = np.full(FAB.n_hops, 82.0)
    hidden = QueueTruth(ModelKnobs(), 1, egress, hw_at_wire=True).hop_queue_ns(rho, svc, None)
    seen = QueueTruth(ModelKnobs(), 1, egress, hw_at_wire=False).hop_queue_ns(rho, svc, None)
    assert np.all(hidden[egress] == 0) and np.all(hidden[~egress] > CONTENTION_NS)
    assert np.all(seen > CONTENTION_NS)


def test_steps_carry_the_congestion_truth_and_hot_spots_are_in_it() -> None:
    sim = Simulator(FAB, SimConfig(load=0.7, seed=3))
    st = sim.step(0.0, 0.1)
    assert st.hop_queue_ns is not None and len(st.hop_queue_ns) == FAB.n_hops
    hot = sim._util.hot(0.0)
    contended = st.hop_queue_ns >= CONTENTION_NS
    assert contended.any() and np.all(hot[contended])  # only hot hops queue that much at 0.7
    cold = Simulator(FAB, SimConfig(load=0.4, seed=3)).step(0.0, 0.1)
    assert cold.hop_queue_ns is not None and not (cold.hop_queue_ns >= CONTENTION_NS).any()


def test_a_down_link_s_flows_re_hash_after_routing_converges() -> None:
    router = Router(FAB, 0.01, 0.3)
    down = FAB.link_index["leaf0-spine1"]
    n = len(FAB.nics)
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    keep = src != dst
    src, dst = src[keep].astype(np.int64), dst[keep].astype(np.int64)
    sport = np.full(len(src), 50_000, np.int64)
    mis = np.zeros(len(src), dtype=bool)
    fwd = flow_paths(FAB, src, dst, sport)
    rev = flow_paths(FAB, dst, src, ROCEV2_PORT, sport)
    through = ((fwd >> 1) == down).any(axis=1)
    assert through.any()
    rr = Rerouter(router, [Outage(down, 1.0, 2.0)])
    for t, lost_up, lost_down in ((1.005, True, True), (1.1, False, True), (1.5, False, False)):
        f, _, lost = rr.apply(np.full(len(src), t), src, dst, sport, mis, fwd, rev)
        up = through & (src // 4 == 0)  # climbing from leaf0 through the dead uplink
        dn = through & (dst // 4 == 0)  # coming down to leaf0 through it
        assert bool(lost[up].all()) is lost_up and bool(lost[dn].all()) is lost_down
        moved = ~lost & through
        assert not ((f[moved] >> 1) == down).any()  # re-hashed flows avoid it
        # flows that did not cross it keep their paths (resilient hashing)
        assert np.array_equal(f[~through & ~((rev >> 1) == down).any(axis=1)],
                              fwd[~through & ~((rev >> 1) == down).any(axis=1)])  # fmt: skip
    f, _, lost = rr.apply(np.full(len(src), 2.5), src, dst, sport, mis, fwd, rev)
    assert not lost.any() and np.array_equal(f, fwd)  # back up: flows return
    assert hash_inputs(np.array([5]), np.array([False]), reply=True) == (
        np.array([ROCEV2_PORT]),
        np.array([5]),
    )


def test_discovery_re_learns_paths_and_the_step_says_what_it_found() -> None:
    knobs = dataclasses.replace(ModelKnobs(), ecmp_mismatch=0.5, discovered=0.0, traces_per_s=50)
    sim = Simulator(FAB, SimConfig(seed=4, model=knobs))
    n = len(sim.discovered_paths()[0])
    true_f = sim.probed_paths()[:n]  # the probes' rows come first, then the replies'
    wrong0 = int((true_f != sim.discovered_paths()[3]).any(axis=1).sum())
    found = 0
    for st in sim.run(4.0, 0.1):
        if st.discovered is not None:
            found += len(st.discovered[0])
    assert wrong0 > 0 and found >= wrong0
    # every flow traced once per sweep: all paths known now
    assert not (true_f != sim.discovered_paths()[3]).any()


def test_gray_failure_drops_a_fixed_share_of_the_link_s_five_tuples() -> None:
    link = "leaf1-spine2"
    li = FAB.link_index[link]
    n = len(FAB.nics)
    rng = np.random.default_rng(5)
    src = rng.integers(0, n, 40_000)
    dst = (src + 1 + rng.integers(0, n - 1, 40_000)) % n
    sport = rng.integers(49152, 65536, 40_000)
    fwd = flow_paths(FAB, src, dst, sport)
    rev = flow_paths(FAB, dst, src, ROCEV2_PORT, sport)
    drops = gray_drops(FAB, Fault(FaultKind.GRAY, link, 0, 10, 5.0), src, dst, sport, fwd, rev)
    on_f, on_r = ((fwd >> 1) == li).any(axis=1), ((rev >> 1) == li).any(axis=1)
    assert not drops[~on_f & ~on_r].any()
    share = drops[on_f & ~on_r].mean()
    assert share == pytest.approx(0.05, abs=0.015)
    again = gray_drops(FAB, Fault(FaultKind.GRAY, link, 0, 10, 5.0), src, dst, sport, fwd, rev)
    assert np.array_equal(drops, again)  # the same 5-tuples every time


def test_optic_loss_is_bursty_with_the_given_mean() -> None:
    li = FAB.link_index["leaf0-spine0"]
    fault = Fault(FaultKind.OPTIC, "leaf0-spine0", 0.0, 100.0, 0.5)
    t = np.sort(np.random.default_rng(6).uniform(0, 100, 400_000))
    hops = np.full((len(t), 1), 2 * li, np.int32)
    none = np.full((len(t), 1), -1, np.int32)
    lost = optic_drops(fault, li, t, hops, none, 0.05, 2.0, np.random.default_rng(7))
    assert lost.mean() == pytest.approx(0.005, rel=0.25)
    # bursty: a loss is followed by another within 1 ms far more often than at random
    # (20 losses a second spread evenly: 2 % of the gaps under 1 ms)
    gaps = np.diff(t[lost])
    assert (gaps < 1e-3).mean() > 0.1


def test_scoring_congestion_episodes_direction_and_repeated_false_alerts() -> None:
    hot = 2 * FAB.link_index["leaf2-spine1"]  # leaf2 -> spine1
    truth = CongestionTruth(FAB.n_hops)
    for k in range(50):
        q = np.zeros(FAB.n_hops)
        if 10 <= k < 30:
            q[hot] = 2500.0  # contended 1.0-3.0 s
        q[hot + 2] = 1200.0  # a standing queue under the threshold, all along
        truth.add(k * 0.1, (k + 1) * 0.1, q)
    truth.close()
    assert truth.episodes() == [(hot, 1.0, 3.0)]
    assert hop_of(FAB, "spine1->leaf2") == hot + 1
    name = FAB.hop_name(hot)
    alerts = [
        Alert(1.2, name, "contention"),  # a hit
        Alert(1.5, FAB.hop_name(hot + 1), "contention"),  # the other direction: false
        Alert(1.6, FAB.hop_name(hot + 2), "contention"),  # standing queue: near
        Alert(4.5, name, "contention"),  # after the episode (+ 1 s grace): false
        Alert(6.0, "leaf0-spine0", "loss"),  # a false fault alert, raised twice
        Alert(7.0, "leaf0-spine0", "loss"),
    ]
    s = Scorer(FAB, (), truth).evaluate(alerts)
    assert s["congestion_recall"] == 1.0 and s["congestion_precision"] == pytest.approx(
        1 / 3, abs=1e-3
    )
    assert s["wrong_direction_alerts"] == 1 and s["near_congestion_alerts"] == 1
    assert s["false_fault_alerts"] == 2 and s["false_alerts"] == 4
    assert s["precision"] == 0.0  # faults: two false raises, no hit
    # the blind start is spared: an episode counts from ``warmup_s`` on, if 0.5 s are left
    late = Scorer(FAB, (), truth, warmup_s=2.7).evaluate([])
    assert late["congestion_episodes"] == 0 and late["congestion_recall_from_start"] == 0.0
    assert Scorer(FAB, (), truth, warmup_s=2.5).evaluate([])["congestion_episodes"] == 1
    # a contention finding still standing when the episode starts finds it
    early = [Alert(0.5, name, "contention", until_s=2.0)]
    assert Scorer(FAB, (), truth).evaluate(early)["congestion_recall"] == 1.0
    both = Alert.of_event(
        1.1, EventDoc(1, "contention", name, f"queueing delay on {name} and spine1->leaf2 (x)")
    )
    assert both.hops(FAB) == [hot, hot + 1]
