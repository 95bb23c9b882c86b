"""Micro-benchmarks (a thin shell: they read the wall clock, the core never does).

``bench_network_solve`` builds a seeded random probe graph with noisy pair estimates and one
planted bad edge, then times ``solve_network`` against the pairwise-only ``anchor_tree``
baseline on the same input, and reports both speeds and both accuracies. ``bench_pair_fits``
times the batched pair fit against a loop of exact single-pair fits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from sync.baselines import anchor_tree
from sync.batchfit import fit_pairs
from sync.network import solve_network
from sync.pairfit import fit_pair
from sync.synth import pair_samples, random_graph


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


def bench_pair_fits(
    n_pairs: int, per_dir: int, seed: int, loop_pairs: int = 200
) -> dict[str, float]:
    """Time the batched ``fit_pairs`` on ``n_pairs`` x ``per_dir`` samples per direction (hw-like
    noise, load 0.4) against a per-pair ``fit_pair`` loop on ``loop_pairs`` of them (scaled to
    all pairs). Returns seconds, the speed-up, and the largest batched-vs-exact offset gap (ns)."""
    rng = np.random.default_rng(seed)
    s = pair_samples(rng, n_pairs, per_dir)
    cols = (s.fwd_pair, s.fwd_t, s.fwd_d, s.rev_pair, s.rev_t, s.rev_d)
    t0 = time.perf_counter()
    fits = fit_pairs(n_pairs, *cols, quant_ns=6.4)
    batched_s = time.perf_counter() - t0
    k = min(loop_pairs, n_pairs)
    fo, ro = np.argsort(s.fwd_pair, kind="stable"), np.argsort(s.rev_pair, kind="stable")
    fb = np.searchsorted(s.fwd_pair[fo], np.arange(k + 1))
    rb = np.searchsorted(s.rev_pair[ro], np.arange(k + 1))
    t0 = time.perf_counter()
    exact = [
        fit_pair(
            s.fwd_t[fo[fb[p] : fb[p + 1]]],
            s.fwd_d[fo[fb[p] : fb[p + 1]]],
            s.rev_t[ro[rb[p] : rb[p + 1]]],
            s.rev_d[ro[rb[p] : rb[p + 1]]],
            quant_ns=6.4,
        ).offset_ns
        for p in range(k)
    ]
    loop_s = (time.perf_counter() - t0) * n_pairs / k
    err = np.abs(fits.offset_ns - s.offset_ns)
    return {
        "pairs": float(n_pairs),
        "samples": float(2 * n_pairs * per_dir),
        "batched_s": batched_s,
        "exact_loop_s_scaled": loop_s,
        "speedup": loop_s / batched_s,
        "batched_vs_exact_max_gap_ns": float(np.max(np.abs(fits.offset_ns[:k] - exact))),
        "p99_offset_err_ns": float(np.percentile(err, 99)),
    }
