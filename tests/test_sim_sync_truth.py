"""`qpmesh sim sync --truth-breakdown`: the error split against the simulator's truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mesh.fabric import FabricShape, build_fabric
from qpmesh.cli import main
from testbed.sim.engine import SimConfig, Simulator
from testbed.sim.sync_stream import window_edges
from testbed.sim.sync_truth import BestQueueing, breakdown


def _ring_edges(n: int) -> np.ndarray:
    """Every node to its next three: loops everywhere, i < j per edge."""
    e = [(i, (i + k) % n) for i in range(n) for k in (1, 2, 3)]
    return np.array(sorted({(min(a, b), max(a, b)) for a, b in e}), dtype=np.int64)


def test_breakdown_separates_node_offsets_from_loop_noise() -> None:
    n = 40
    edges = _ring_edges(n)
    rng = np.random.default_rng(3)
    truth = rng.uniform(-1e5, 1e5, n)
    b = np.zeros(n)
    b[[4, 17]] = [60.0, -50.0]  # node-like errors: invisible around loops
    loop = rng.normal(0.0, 2.0, len(edges))
    i, j = edges[:, 0], edges[:, 1]
    theta = truth[j] - truth[i] + b[j] - b[i] + loop
    raw = truth + b  # what a solve of these pair offsets gives, up to the loop noise
    rx_true = np.zeros(n)
    rx_true[4] = 120.0  # the receive-side excess that made node 4's offset high by half of it
    out = breakdown(n, edges, theta, raw, truth, rx_true)
    assert 45.0 < out["node_like_p99_ns"] < 65.0
    assert out["loop_scale_ns"] < 4.0
    assert out["uncorrected_p99_ns"] > 45.0
    # knowing node 4's excess removes its error; node 17's (not a receive excess) stays
    # (p99 over 40 nodes interpolates between the two largest errors)
    assert 20.0 < out["perfect_rx_p99_ns"] < out["uncorrected_p99_ns"] - 10.0
    rx_true[17] = -100.0
    assert breakdown(n, edges, theta, raw, truth, rx_true)["perfect_rx_p99_ns"] < 5.0
    # the leaf split's correction, when given, is applied the same way and reported beside
    out = breakdown(n, edges, theta, raw, truth, rx_true, rx_true.copy())
    assert out["perfect_split_p99_ns"] == out["perfect_rx_p99_ns"]
    out = breakdown(n, edges, theta, raw, truth, rx_true, np.zeros(n))
    assert out["perfect_split_p99_ns"] == out["uncorrected_p99_ns"]
    assert "perfect_split_p99_ns" not in breakdown(n, edges, theta, raw, truth, rx_true)


def test_direction_oracle_removes_per_direction_queueing_and_keeps_the_rest() -> None:
    """Pair offsets high by half the difference of their directions' queueing: corrected pair
    by pair with that queueing the error is what is left (here a node-like 30 ns on node 7),
    with another direction's queueing it is not; other edges are refused."""
    n = 40
    edges = _ring_edges(n)
    rng = np.random.default_rng(5)
    truth = rng.uniform(-1e5, 1e5, n)
    q = BestQueueing(edges, n)
    q.best = rng.exponential(200.0, 2 * len(edges))  # per direction, no node structure
    i, j = edges[:, 0], edges[:, 1]
    b = np.zeros(n)
    b[7] = 30.0  # a constant asymmetry of node 7: no queueing explains it
    theta = truth[j] - truth[i] + b[j] - b[i] + 0.5 * (q.best[0::2] - q.best[1::2])
    out = breakdown(n, edges, theta, truth, truth, np.zeros(n), best=q, expected=q)
    assert out["perfect_direction_p99_ns"] == out["expected_direction_p99_ns"]
    # node 7's 30 ns and nothing more (p99 over 40 nodes: 0.61 of the largest error)
    assert out["perfect_direction_p99_ns"] == pytest.approx(0.61 * 30.0, abs=0.5)
    b[7] = 0.0
    theta = truth[j] - truth[i] + 0.5 * (q.best[0::2] - q.best[1::2])
    assert (
        breakdown(n, edges, theta, truth, truth, np.zeros(n), best=q)["perfect_direction_p99_ns"]
        < 1e-6
    )
    other = BestQueueing(edges, n)
    other.best = rng.exponential(200.0, 2 * len(edges))  # the same size, not these directions
    worse = breakdown(n, edges, theta, truth, truth, np.zeros(n), expected=other)
    assert worse["expected_direction_p99_ns"] > 50.0
    assert "perfect_direction_p99_ns" not in worse
    with pytest.raises(ValueError, match="other edges"):
        breakdown(n, edges, theta, truth, truth, np.zeros(n), best=BestQueueing(edges[:5], n))


def test_best_queueing_is_each_direction_s_least_queued_sample() -> None:
    fabric = build_fabric(FabricShape.for_nics(32, nics_per_leaf=16))
    sim = Simulator(fabric, SimConfig(load=0.95, peers=4, rate_hz=20.0, seed=5))
    n = len(fabric.nics)
    edges, _ = window_edges(sim.pairs_src, sim.pairs_dst, n)
    best = BestQueueing(edges, n)
    steps = list(sim.run(0.3, 0.1))
    for st in steps:
        best.observe(sim, st)
    # by hand for one direction: every arrived sample of pair 0 (src -> dst) and its replies
    a, c = int(sim.pairs_src[0]), int(sim.pairs_dst[0])
    e = int(np.flatnonzero((edges[:, 0] == min(a, c)) & (edges[:, 1] == max(a, c)))[0])
    qs = []
    for st in steps:
        src, dst = np.asarray(st.batch.src), np.asarray(st.batch.dst)
        for s_, d_, owd, hops in ((src, dst, st.true_fwd_ns, st.hops_fwd),
                                  (dst, src, st.true_rev_ns, st.hops_rev)):  # fmt: skip
            k = (s_ == a) & (d_ == c) & np.isfinite(owd)
            qs.extend(owd[k] - sim.fixed_delay_ns(hops[k], s_[k], d_[k]))
    assert qs and min(qs) >= -1e-6
    assert best.best[2 * e + (a > c)] == pytest.approx(min(qs), abs=1e-6)
    assert abs(best.best[2 * e + (a < c)] - min(qs)) > 1.0  # the other direction is another
    rx = best.receive_mean()
    assert np.all(rx[np.isfinite(rx)] >= 0.0) and np.isfinite(rx).sum() > n // 2
    d_src, d_dst, q = best.directions()
    k = np.flatnonzero((d_src == a) & (d_dst == c))
    assert len(k) == 1 and q[k[0]] == best.best[2 * e + (a > c)]
    assert len(q) == np.isfinite(best.best).sum()


def test_sim_sync_reports_the_truth_breakdown_only_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["sim", "sync", "--nics", "32", "--peers", "4", "--window", "0.5", "--rate", "20",
            "--load", "0.9", "--json"]  # fmt: skip
    assert main(args) == 0
    assert "truth_breakdown" not in json.loads(capsys.readouterr().out)
    assert main([*args, "--truth-breakdown"]) == 0
    tb = json.loads(capsys.readouterr().out)["truth_breakdown"]
    assert tb["node_like_p99_ns"] > 0 and tb["loop_scale_ns"] > 0
    assert tb["rx_true_p99_ns"] > 0 and tb["perfect_rx_p99_ns"] > 0
    assert tb["perfect_split_p99_ns"] > 0
    assert main([*args, "--truth-breakdown", "--timestamps", "sw"]) == 2
    assert "needs NIC stamps" in capsys.readouterr().err
