"""Comparison baselines for the sync benchmark.

* ``ntp_offsets``: NTP-style per pair, ``theta = ((t2 - t1) - (t4 - t3)) / 2`` from the exchange
  with the smallest RTT in the window (assumes each way takes RTT/2; no drift).
* ``anchor_tree``: pairwise-only: pair estimates chained from the reference along the
  minimum-variance path (Dijkstra on edge variance 1/w), with no loop correction, to show what
  the network effect adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray
from scipy.sparse.csgraph import dijkstra

from sync._arrays import as_edges, as_float, as_index, as_int

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True)
class NtpOffsets:
    """Per pair: theta (ns, offset of receiver minus sender) from the min-RTT exchange, the
    time of that exchange (t1 - t_ref, ns), its RTT, and whether the pair had any exchange."""

    theta_ns: F64
    t_rel_ns: F64
    rtt_ns: F64
    ok: NDArray[np.bool_]


def ntp_offsets(
    n_pairs: int,
    pair: ArrayLike,
    t1: ArrayLike,
    t2: ArrayLike,
    t3: ArrayLike,
    t4: ArrayLike,
    t_ref_ns: int,
) -> NtpOffsets:
    """NTP baseline. For pair (a, b): t1 = a sends (a clock), t2 = b receives (b clock),
    t3 = b replies (b clock), t4 = a receives (a clock); int64 ns. Pairs with no exchange get
    NaN and ``ok`` False. Raises ValueError on mismatched lengths or bad pair indices."""
    s1 = as_int(t1, "t1")
    n = len(s1)
    p = as_index(pair, "pair", n_pairs, n)
    s2, s3, s4 = as_int(t2, "t2", n), as_int(t3, "t3", n), as_int(t4, "t4", n)
    rtt = (s4 - s1) - (s3 - s2)
    order = np.lexsort((rtt, p))
    first = np.ones(n, dtype=bool)
    first[1:] = p[order][1:] != p[order][:-1]
    best = order[first]
    nan = np.full(n_pairs, np.nan)
    theta, t_rel, rtt_out = nan.copy(), nan.copy(), nan.copy()
    pb = p[best]
    theta[pb] = ((s2[best] - s1[best]) - (s4[best] - s3[best])) / 2.0
    t_rel[pb] = (s1[best] - t_ref_ns).astype(np.float64)
    rtt_out[pb] = rtt[best].astype(np.float64)
    ok = np.zeros(n_pairs, dtype=bool)
    ok[pb] = True
    return NtpOffsets(theta, t_rel, rtt_out, ok)


@dataclass(frozen=True)
class TreeAnchoring:
    """Node offsets/drifts chained from ``ref`` along the min-variance path; NaN and
    ``known`` False for nodes not reachable from ``ref``. ``parent_edge`` is -1 at the root
    and for unreachable nodes."""

    offset_ns: F64
    drift: F64
    offset_std_ns: F64
    known: NDArray[np.bool_]
    parent_edge: I64


def anchor_tree(
    n_nodes: int,
    edges: ArrayLike,
    theta_ns: ArrayLike,
    weight: ArrayLike,
    *,
    drift: ArrayLike | None = None,
    ref: int = 0,
) -> TreeAnchoring:
    """Pairwise-only anchoring. ``edges`` (m, 2): ``theta_ns[e]`` = offset of ``edges[e,1]``
    minus offset of ``edges[e,0]``, ``weight`` = 1/variance (> 0). Each node's offset is the
    sum of thetas along its minimum summed-variance path from ``ref``; its std is the sqrt of
    that summed variance. Raises ValueError on malformed input."""
    i, j = as_edges(edges, n_nodes)
    m = len(i)
    th = as_float(theta_ns, "theta_ns", m)
    w = as_float(weight, "weight", m)
    dr = np.zeros(m) if drift is None else as_float(drift, "drift", m)
    if not (np.isfinite(th).all() and (w > 0).all() and np.isfinite(w).all()):
        raise ValueError("theta_ns must be finite and weight finite and > 0")
    if not 0 <= ref < n_nodes:
        raise ValueError(f"ref must be in [0, {n_nodes})")
    # keep the best (highest-weight) edge per unordered node pair, indexed in a symmetric matrix
    order = np.argsort(-w, kind="stable")
    lo, hi = np.minimum(i, j)[order], np.maximum(i, j)[order]
    _, uniq = np.unique(lo * n_nodes + hi, return_index=True)
    best = order[uniq]
    var = 1.0 / w[best]
    rows = np.concatenate([i[best], j[best]])
    cols = np.concatenate([j[best], i[best]])
    eid = np.concatenate([best, best])
    graph = sp.csr_matrix((np.concatenate([var, var]), (rows, cols)), shape=(n_nodes, n_nodes))
    dist, pred = dijkstra(graph, directed=False, indices=ref, return_predecessors=True)
    lookup = sp.csr_matrix((eid + 1.0, (rows, cols)), shape=(n_nodes, n_nodes))

    known = np.isfinite(dist)
    off = np.full(n_nodes, np.nan)
    dri = np.full(n_nodes, np.nan)
    parent_edge = np.full(n_nodes, -1, dtype=np.int64)
    off[ref], dri[ref] = 0.0, 0.0
    reach = np.flatnonzero(known & (np.arange(n_nodes) != ref))
    reach = reach[np.argsort(dist[reach], kind="stable")]  # parents come before children
    if reach.size:
        par = pred[reach]
        pe = np.asarray(lookup[par, reach]).ravel().astype(np.int64) - 1
        parent_edge[reach] = pe
        sign = np.where(j[pe] == reach, 1.0, -1.0)
        for node, p, s, k in zip(
            reach.tolist(), par.tolist(), sign.tolist(), pe.tolist(), strict=True
        ):
            off[node] = off[p] + s * th[k]
            dri[node] = dri[p] + s * dr[k]
    return TreeAnchoring(
        offset_ns=off,
        drift=dri if drift is not None else np.full(n_nodes, np.nan),
        offset_std_ns=np.where(known, np.sqrt(dist), np.nan),
        known=known,
        parent_edge=parent_edge,
    )
