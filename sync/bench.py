"""Micro-benchmark of the network solve (a thin shell: it reads the wall clock, the core never does).

``bench_network_solve`` builds a seeded random probe graph with noisy pair estimates and one
planted bad edge, then times ``solve_network`` against the pairwise-only ``anchor_tree``
baseline on the same input, and reports both speeds and both accuracies.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from sync.baselines import anchor_tree
from sync.network import solve_network
from sync.synth import random_graph


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_network_solve(n_nodes: int, peers: int, seed: int, repeats: int = 5) -> dict[str, float]:
    """Time the network solve on ``n_nodes`` with mean degree ``peers``; pair noise 2-10 ns
    (1 sigma), one edge off by +500 ns. Returns seconds (medians of ``repeats``), p99 absolute
    offset errors (ns) of the network solve and the tree baseline, and whether the planted edge
    was flagged (1.0/0.0)."""
    rng = np.random.default_rng(seed)
    g = random_graph(rng, n_nodes, peers)
    i, j = g.edges.T
    sigma = rng.uniform(2.0, 10.0, len(i))
    theta = g.offset_ns[j] - g.offset_ns[i] + rng.normal(0.0, sigma)
    drift = g.drift[j] - g.drift[i]
    bad = int(rng.integers(len(i)))
    theta[bad] += 500.0
    w = 1.0 / sigma**2
    sol = solve_network(n_nodes, g.edges, theta, w, drift=drift)
    tree = anchor_tree(n_nodes, g.edges, theta, w, drift=drift)
    net_s = _median_time(lambda: solve_network(n_nodes, g.edges, theta, w, drift=drift), repeats)
    tree_s = _median_time(lambda: anchor_tree(n_nodes, g.edges, theta, w, drift=drift), repeats)
    net_err = np.abs(sol.offset_ns - g.offset_ns)[sol.known]
    tree_err = np.abs(tree.offset_ns - g.offset_ns)[tree.known]
    return {
        "n_nodes": float(n_nodes),
        "n_edges": float(len(i)),
        "network_solve_s": net_s,
        "tree_baseline_s": tree_s,
        "network_p99_err_ns": float(np.percentile(net_err, 99)),
        "tree_p99_err_ns": float(np.percentile(tree_err, 99)),
        "p99_err_ratio_tree_over_network": float(
            np.percentile(tree_err, 99) / np.percentile(net_err, 99)
        ),
        "planted_edge_flagged": float(sol.flagged[bad]),
        "flagged_edges": float(sol.flagged.sum()),
    }
