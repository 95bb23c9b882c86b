"""Network effect: loop-consistent offsets, bad-edge flagging, pinning, components, baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sync import anchor_tree, bench_network_solve, solve_network
from sync.synth import Graph, random_graph


def _noisy(g: Graph, rng: np.random.Generator, sigma_ns: float) -> tuple[np.ndarray, np.ndarray]:
    i, j = g.edges.T
    sig = rng.uniform(0.5, 2.0, len(i)) * sigma_ns
    return g.offset_ns[j] - g.offset_ns[i] + rng.normal(0, sig), 1.0 / sig**2


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(30, 300), peers=st.integers(8, 16))
def test_planted_inconsistent_edge_is_flagged_and_corrected(seed: int, n: int, peers: int) -> None:
    rng = np.random.default_rng(seed)
    g = random_graph(rng, n, min(peers, n - 1))
    theta, w = _noisy(g, rng, 3.0)
    bad = int(rng.integers(len(theta)))
    theta[bad] += 500.0
    sol = solve_network(n, g.edges, theta, w)
    assert sol.flagged[bad]
    assert sol.flagged.sum() <= 1 + len(theta) // 100
    i, j = g.edges[bad]
    assert abs(sol.residual_ns[bad] + 500.0) < 50.0  # the error is left on the bad edge
    assert abs((sol.offset_ns[j] - sol.offset_ns[i]) - (g.offset_ns[j] - g.offset_ns[i])) < 30
    assert np.abs(sol.offset_ns - g.offset_ns).max() < 40.0


def test_consistent_graph_is_reproduced_exactly_and_nothing_flagged() -> None:
    rng = np.random.default_rng(1)
    g = random_graph(rng, 500, 10)
    i, j = g.edges.T
    theta = g.offset_ns[j] - g.offset_ns[i]
    sol = solve_network(
        500, g.edges, theta, rng.uniform(0.01, 1, len(i)), drift=g.drift[j] - g.drift[i]
    )
    assert not sol.flagged.any()
    np.testing.assert_allclose(sol.offset_ns, g.offset_ns, atol=1e-3)
    np.testing.assert_allclose(sol.drift, g.drift, atol=1e-12)
    assert np.abs(sol.residual_ns).max() < 1e-3


def test_reference_pin_and_mean_pin() -> None:
    rng = np.random.default_rng(2)
    g = random_graph(rng, 200, 8)
    theta, w = _noisy(g, rng, 5.0)
    ref = 17
    sol = solve_network(200, g.edges, theta, w, ref=ref)
    assert sol.offset_ns[ref] == 0.0 and sol.offset_std_ns[ref] == 0.0
    np.testing.assert_allclose(sol.offset_ns, g.offset_ns - g.offset_ns[ref], atol=30.0)
    mean = solve_network(200, g.edges, theta, w, pin="mean")
    assert abs(mean.offset_ns.mean()) < 1e-6
    # the same geometry: only the constant differs
    np.testing.assert_allclose(mean.offset_ns - mean.offset_ns[ref], sol.offset_ns, atol=1e-4)


def test_network_beats_pairwise_tree_anchoring() -> None:
    rng = np.random.default_rng(3)
    g = random_graph(rng, 400, 12)
    theta, w = _noisy(g, rng, 5.0)
    net = solve_network(400, g.edges, theta, w)
    tree = anchor_tree(400, g.edges, theta, w)
    e_net = np.percentile(np.abs(net.offset_ns - g.offset_ns), 99)
    e_tree = np.percentile(np.abs(tree.offset_ns - g.offset_ns), 99)
    assert e_tree > 2 * e_net


def test_tree_anchoring_is_exact_on_consistent_data_and_follows_best_edges() -> None:
    edges = np.array([[0, 1], [1, 2], [0, 2], [3, 2]])
    x = np.array([0.0, 10.0, 25.0, -4.0])
    theta = x[edges[:, 1]] - x[edges[:, 0]]
    theta[2] += 100.0  # bad but low-weight direct edge 0-2
    w = np.array([1.0, 1.0, 0.01, 1.0])
    tree = anchor_tree(4, edges, theta, w, drift=np.zeros(4))
    np.testing.assert_allclose(tree.offset_ns, x)
    assert tree.parent_edge.tolist() == [-1, 0, 1, 3]


def test_disconnected_components_get_own_pins_and_are_unknown() -> None:
    # component A: 0-1-2 triangle; component B: 3-4-5 triangle; node 6 isolated
    edges = np.array([[0, 1], [1, 2], [0, 2], [3, 4], [4, 5], [3, 5]])
    x = np.array([0.0, 5.0, -7.0, 100.0, 130.0, 90.0, 0.0])
    theta = x[edges[:, 1]] - x[edges[:, 0]]
    sol = solve_network(7, edges, theta, np.ones(6), drift=np.zeros(6))
    assert sol.known.tolist() == [True] * 3 + [False] * 4
    np.testing.assert_allclose(sol.offset_ns[:3], x[:3], atol=1e-6)
    assert np.isnan(sol.offset_ns[3:]).all() and np.isnan(sol.offset_std_ns[3:]).all()
    assert np.isnan(sol.drift[3:]).all()
    # B is solved relative to its own pin (its lowest node)
    np.testing.assert_allclose(sol.component_offset_ns[3:6], x[3:6] - x[3], atol=1e-6)
    assert len(set(sol.component.tolist())) == 3
    tree = anchor_tree(7, edges, theta, np.ones(6))
    assert tree.known.tolist() == sol.known.tolist()
    assert math.isnan(tree.offset_ns[4])


def test_malformed_network_input_raises() -> None:
    with pytest.raises(ValueError, match="shape"):
        solve_network(3, [0, 1], [1.0], [1.0])
    with pytest.raises(ValueError, match="length"):
        solve_network(3, [[0, 1]], [1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="weight"):
        solve_network(3, [[0, 1]], [1.0], [0.0])
    with pytest.raises(ValueError, match="finite"):
        solve_network(3, [[0, 1]], [math.nan], [1.0])
    with pytest.raises(ValueError):
        solve_network(3, [[0, 3]], [1.0], [1.0])
    with pytest.raises(ValueError, match="self-loop"):
        solve_network(3, [[1, 1]], [1.0], [1.0])


def test_bench_reports_a_fast_accurate_solve() -> None:
    res = bench_network_solve(2000, 16, seed=1, repeats=1)
    assert res["planted_edge_flagged"] == 1.0
    assert res["n_edges"] > 0.4 * 2000 * 16
    assert res["network_p99_err_ns"] < res["tree_p99_err_ns"]
    assert res["network_solve_s"] < 5.0  # generous: 2 noisy cores; real figure in the report


def test_several_bad_edges_are_all_flagged_without_collateral() -> None:
    rng = np.random.default_rng(4)
    g = random_graph(rng, 300, 14)
    theta, w = _noisy(g, rng, 3.0)
    bad = rng.choice(len(theta), 6, replace=False)
    theta[bad] += rng.choice([-1.0, 1.0], 6) * rng.uniform(200, 800, 6)
    sol = solve_network(300, g.edges, theta, w)
    assert set(np.flatnonzero(sol.flagged).tolist()) == set(bad.tolist())
    assert np.abs(sol.offset_ns - g.offset_ns).max() < 20.0


def test_cli_runs_the_network_bench_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    from sync.cli import register

    # our own root parser: the shared one imports every component, some mid-edit elsewhere
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["sync", "bench-network", "--nodes", "300", "--peers", "8", "--repeats", "1", "--json"]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_nodes"] == 300.0 and out["planted_edge_flagged"] == 1.0
