"""Network effect: loop-consistent offsets, bad-edge flagging, pinning, components, baselines."""

from __future__ import annotations

import math
from typing import Any

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


def _spread_weights(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A probe graph whose edge weights span ten decades, as the envelope's per-edge
    uncertainties make them (a few floors to a ns, most to a µs), clocks up to 1 ms apart:
    (edges, theta, weight)."""
    rng = np.random.default_rng(seed)
    g = random_graph(rng, n, 12)
    i, j = g.edges.T
    sd = 10.0 ** rng.uniform(-0.3, 5.0, len(i))  # 0.5 ns .. 100 µs
    theta = g.offset_ns[j] - g.offset_ns[i] + rng.normal(0.0, sd)
    return g.edges, theta, 1.0 / sd**2


def _exact(n: int, edges: np.ndarray, theta: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The weighted least-squares offsets by a direct sparse solve, node 0 pinned, mean 0."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import spsolve

    i, j = edges.T
    a = sp.coo_matrix((np.r_[w, w], (np.r_[i, j], np.r_[j, i])), shape=(n, n)).tocsr()
    lap = (sp.diags(np.asarray(a.sum(axis=1)).ravel()) - a).tocsc()
    rhs = np.bincount(j, w * theta, n) - np.bincount(i, w * theta, n)
    x = np.zeros(n)
    x[1:] = spsolve(lap[1:, 1:], rhs[1:])
    return np.asarray(x - x.mean())


def test_weights_over_ten_decades_solve_to_the_direct_solution() -> None:
    """The block preconditioner changes how fast CG gets there, not where: on weights over
    ten decades the offsets are the direct sparse solve's."""
    edges, theta, w = _spread_weights(3)
    sol = solve_network(400, edges, theta, w, pin="mean", flag_min_ns=np.inf, max_rounds=1)
    np.testing.assert_allclose(sol.offset_ns, _exact(400, edges, theta, w), atol=0.05)


def test_blocks_take_strongly_tied_nodes_out_of_the_iterations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nodes tied by an edge that carries most of their weight are one block of the
    preconditioner, inverted exactly: CG needs a fraction of the plain diagonal's
    iterations on such a graph (the envelope's weights: hundreds of iterations)."""
    import scipy.sparse as sp

    from sync import network as nw

    edges, theta, w = _spread_weights(4)
    i, j = edges.T
    lap = nw._Laplacian(400, i, j)
    lap.set_weights(w)
    free = np.ones(400, bool)
    free[0] = False
    rhs = np.where(free, np.bincount(j, w * theta, 400) - np.bincount(i, w * theta, 400), 0.0)
    b = rhs / np.abs(rhs).max()
    x_blk, it_blk = nw._pcg(lap, b, free, np.zeros(400), 1e-10)
    assert len(nw._blocks(lap, free).nodes) > 0  # some blocks of two or more nodes

    def diagonal(lap: nw._Laplacian, free: np.ndarray) -> nw._Precond:
        none = np.zeros(0, np.int64)
        return nw._Precond(np.where(free, 1.0 / lap.diag, 0.0), none, sp.csr_matrix((0, 0)))

    monkeypatch.setattr(nw, "_blocks", diagonal)  # the same CG, the diagonal alone
    x_diag, it_diag = nw._pcg(lap, b, free, np.zeros(400), 1e-10)
    assert it_blk * 2 < it_diag
    np.testing.assert_allclose(x_blk, x_diag, atol=1e-6 * np.abs(x_diag).max())


def test_a_block_is_the_exact_inverse_of_its_rows() -> None:
    """Two nodes tied by one heavy edge, each with light edges elsewhere: their 2 x 2 block of
    the preconditioner is the inverse of [[d_a, -w], [-w, d_b]]."""
    from sync import network as nw

    edges = np.array([[1, 2], [0, 1], [2, 3], [3, 0], [0, 2]])
    w = np.array([10.0, 0.1, 0.2, 1.0, 1.0])
    lap = nw._Laplacian(4, edges[:, 0], edges[:, 1])
    lap.set_weights(w)
    free = np.array([False, True, True, True])
    m = nw._blocks(lap, free).dense()
    d1, d2 = 10.1, 11.2
    np.testing.assert_allclose(m[1:3, 1:3], np.linalg.inv([[d1, -10.0], [-10.0, d2]]))
    assert m[3, 3] == pytest.approx(1 / 1.2) and m[0].sum() == 0.0  # the pinned node: none


def test_a_graph_built_once_gives_the_same_solves_and_refuses_other_edges() -> None:
    from sync.network import ProbeGraph

    edges, theta, w = _spread_weights(5, 200)
    graph = ProbeGraph(200, edges)
    a = solve_network(200, edges, theta, w, pin="mean", loss="huber")
    b = solve_network(200, edges, theta, w, pin="mean", loss="huber", graph=graph)
    assert np.array_equal(a.offset_ns, b.offset_ns) and np.array_equal(a.flagged, b.flagged)
    with pytest.raises(ValueError, match="other edges"):
        solve_network(200, edges[::-1], theta, w, graph=graph)
    with pytest.raises(ValueError, match="self-loop"):
        ProbeGraph(3, np.array([[0, 1], [2, 2]]))


def test_a_start_near_the_solution_reaches_the_same_offsets_in_fewer_iterations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``start`` is where the first solve's iterations begin: the same offsets, and fewer
    iterations than from 0 when it is near (clocks a millisecond apart, a start 5 ns off)."""
    from sync import network as nw

    edges, theta, w = _spread_weights(6, 300)
    counts: list[int] = []
    pcg = nw._pcg

    def counted(*args: Any) -> tuple[np.ndarray, int]:
        x, it = pcg(*args)
        counts.append(it)
        return x, it

    monkeypatch.setattr(nw, "_pcg", counted)
    cold = solve_network(300, edges, theta, w, pin="mean", max_rounds=1, flag_min_ns=np.inf)
    near = cold.offset_ns + np.random.default_rng(0).normal(0.0, 5.0, 300)
    warm = solve_network(
        300, edges, theta, w, pin="mean", max_rounds=1, flag_min_ns=np.inf, start=near
    )
    assert len(counts) == 2 and counts[1] < counts[0]
    np.testing.assert_allclose(warm.offset_ns, cold.offset_ns, atol=0.05)
    with pytest.raises(ValueError, match="start"):
        solve_network(300, edges, theta, w, start=np.zeros(5))


@pytest.mark.parametrize("loss", ["l2", "huber"])
def test_a_consistent_graph_with_light_and_heavy_edges_is_reproduced(loss: str) -> None:
    """Nine edges in ten a million times lighter than the rest (the envelope's weights span
    decades): each node, light edges only or not, lands on its true offset. A residual
    measured on the heavy rows alone stopped CG with the light-only nodes tens of ns off
    (62 ns here with the diagonal preconditioner), and a light node held at 0 made the
    others' common shift a mode of its own; the stop reads every row on equal terms and
    the most weight-connected node is the one held."""
    rng = np.random.default_rng(1)
    g = random_graph(rng, 200, 6)
    i, j = g.edges.T
    theta = g.offset_ns[j] - g.offset_ns[i]
    w = np.where(rng.random(len(i)) < 0.1, 1.0, 1e-6)
    sol = solve_network(200, g.edges, theta, w, pin="mean", loss=loss)  # type: ignore[arg-type]
    np.testing.assert_allclose(sol.offset_ns, g.offset_ns - g.offset_ns.mean(), atol=0.5)
    assert not sol.flagged.any()
