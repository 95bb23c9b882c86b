"""Seeded synthetic inputs for the sync tests and micro-benchmarks (pure: the RNG is passed in).

Not a simulator of the fabric (that is ``testbed/sim``); just enough ground truth to check the
estimators: pair delay samples with a propagation floor, queueing tails, stamp quantization and
rare outliers, and random probe graphs with known node offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True)
class PairSamples:
    """Forward/reverse samples for many pairs plus the true theta(t) = offset + drift * t."""

    fwd_pair: I64
    fwd_t: F64
    fwd_d: F64
    rev_pair: I64
    rev_t: F64
    rev_d: F64
    offset_ns: F64
    drift: F64


def _delays(
    rng: np.random.Generator,
    n: int,
    floor_ns: float,
    load: float,
    queue_ns: float,
    quant_ns: float,
    outlier_prob: float,
    outlier_ns: float,
) -> F64:
    """One-way delays: floor + (with prob ``load``) exponential queueing, two stamp
    quantization errors, and rare outliers of either sign up to ``outlier_ns``."""
    d = np.full(n, floor_ns)
    d += np.where(rng.random(n) < load, rng.exponential(queue_ns, n), 0.0)
    if quant_ns > 0:
        d += quant_ns * (rng.random(n) - rng.random(n))
    hit = rng.random(n) < outlier_prob
    d[hit] += rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(10.0, outlier_ns, hit.sum())
    return d


def pair_samples(
    rng: np.random.Generator,
    n_pairs: int,
    n_per_dir: int,
    *,
    window_ns: float = 1e9,
    t0_ns: float = 0.0,
    max_offset_ns: float = 1e6,
    max_drift: float = 60e-6,
    floor_ns: float = 2000.0,
    asym_ns: float = 0.0,
    load: float = 0.4,
    queue_ns: float = 500.0,
    quant_ns: float = 6.4,
    outlier_prob: float = 0.0,
    outlier_ns: float = 100.0,
) -> PairSamples:
    """Random pairs: offsets in +-max_offset_ns, relative drifts in +-max_drift, send times
    uniform over [t0, t0 + window). Forward floor is ``floor_ns + asym_ns``."""
    off = rng.uniform(-max_offset_ns, max_offset_ns, n_pairs)
    drift = rng.uniform(-max_drift, max_drift, n_pairs)
    n = n_pairs * n_per_dir
    pair = np.repeat(np.arange(n_pairs, dtype=np.int64), n_per_dir)
    args = (load, queue_ns, quant_ns, outlier_prob, outlier_ns)
    tf = t0_ns + rng.uniform(0, window_ns, n)
    tr = t0_ns + rng.uniform(0, window_ns, n)
    theta_f = off[pair] + drift[pair] * tf
    theta_r = off[pair] + drift[pair] * tr
    df = _delays(rng, n, floor_ns + asym_ns, *args) + theta_f
    dr = _delays(rng, n, floor_ns, *args) - theta_r
    return PairSamples(pair, tf, df, pair.copy(), tr, dr, off, drift)


@dataclass(frozen=True)
class Graph:
    """A random probe graph of average degree about ``peers`` (duplicates removed)."""

    n_nodes: int
    edges: I64  # (m, 2): i, j with theta_ij = x_j - x_i
    offset_ns: F64  # true node offsets, node 0 at 0
    drift: F64  # true node drifts, node 0 at 0


def random_graph(
    rng: np.random.Generator,
    n_nodes: int,
    peers: int,
    *,
    max_offset_ns: float = 1e6,
    max_drift: float = 30e-6,
) -> Graph:
    """Each node i starts ``max(1, peers // 2)`` edges to distinct random j != i (so the mean
    degree is about ``peers``); edges are de-duplicated as unordered pairs. Offsets/drifts are
    uniform, then shifted so node 0 reads 0. Raises ValueError for impossible sizes."""
    if n_nodes < 2 or not 1 <= peers < n_nodes:
        raise ValueError("need n_nodes >= 2 and 1 <= peers < n_nodes")
    k = max(1, peers // 2)
    src = np.repeat(np.arange(n_nodes), k)
    step = np.concatenate([rng.choice(n_nodes - 1, k, replace=False) + 1 for _ in range(n_nodes)])
    dst = (src + step) % n_nodes
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    edges = np.unique(np.stack([lo, hi], axis=1), axis=0).astype(np.int64)
    off = rng.uniform(-max_offset_ns, max_offset_ns, n_nodes)
    drift = rng.uniform(-max_drift, max_drift, n_nodes)
    return Graph(n_nodes, edges, off - off[0], drift - drift[0])
