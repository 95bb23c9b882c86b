"""Clock steps inside a window: which NICs' clocks jumped, when and by how much.

A NIC clock steps when its host reboots (the NIC clock restarts from the system time) or
when ptp4l / phc2sys step it (on start, or past their step threshold). Within a window the
step puts every pair offset of the NIC on two levels, ``S`` apart, before and after the
instant; a line fitted through both (the pair fits, the network solve) is wrong by up to
``S / 2`` everywhere, and a step of 100 µs left a NIC 18.6 µs off while reported known
(issue 34). No estimator can place such a NIC on one line, so the solve reports it unknown
and leaves its edges out; it is known again once a window no longer holds the step.

How a step shows: per exchange (the lowest-RTT exchanges a window keeps, or the live
solve's kept rows) its offset ``0.5 (d_fwd - d_rev)`` less the solved pair line at its time
is a residual of tens to hundreds of ns, centred per edge. Oriented towards each NIC (+ on
edges where it is the second end, - where the first) and pooled over the NIC's ~30 edges,
the median of the residuals in each of ``STEP_BINS`` equal time bins traces the NIC's clock
against its fitted line: flat but for noise, or a level shift where it stepped.
`find_steps` fits each NIC's trace (bin medians weighted by their counts) with a line plus a
level shift at each bin edge in turn (the solve tilted the NIC's line to straddle the step,
so both sides slope), keeps the split whose shift stands out most from what the fit leaves
(a robust scale of the residual bin medians), and calls a step where the shift is more than
``STEP_MIN_NS``, ``STEP_Z`` times that scale and ``STEP_SPREAD`` times the 90th percentile
of every NIC's best shift (steps are rare: the others' shifts are the window's noise; at
load 0.9 with 12 peers per NIC they reach 640 ns without a step, at load 0.4 tens of ns). Pure: arrays in, a frozen value out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from sync.runs import key_order
from sync.summary import Summary

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
STEP_BINS = 16  # time bins of a NIC's trace
STEP_MIN_NS = 300.0  # smaller level shifts are not called steps (hot spots: tens to ~250 ns)
STEP_Z = 8.0  # ... nor shifts within this many times the trace's noise
STEP_SPREAD = 3.0  # ... nor within this many times the 90th percentile of all NICs' shifts
MIN_PER_SIDE = 8  # residuals on each side of a split, at least


@dataclass(frozen=True)
class Steps:
    """NICs whose clocks stepped inside the window: index, when (in the exchanges' time axis,
    ns relative to the window's reference instant) and by how much (ns, + : the NIC's clock
    jumped ahead)."""

    nodes: I64
    at_ns: F64
    size_ns: F64

    def __len__(self) -> int:
        return len(self.nodes)


def exchange_residuals(
    edges: I64, x_edge: I64, x_mid: F64, x_off: F64, offset: F64, drift: F64
) -> F64:
    """Per exchange its offset ``x_off`` (``0.5 (d_fwd - d_rev)`` at ``x_mid``, clock i's time
    relative to the reference instant, on edge ``edges[x_edge] = (i, j)``) less the solved
    pair line ``offset_j - offset_i + (drift_j - drift_i) (x_mid - offset_i)``, centred on its
    edge's median (an edge's own constant error is no step). NaN where an end is unknown."""
    i, j = edges[x_edge, 0], edges[x_edge, 1]
    r = x_off - (offset[j] - offset[i] + (drift[j] - drift[i]) * (x_mid - offset[i]))
    ok = np.isfinite(r)
    m = len(edges)
    med = np.full(m, np.nan)
    if ok.any():
        e, v = x_edge[ok], r[ok]
        order = key_order(e, v)  # np.lexsort((v, e)), faster: every value is finite
        e, v = e[order], v[order]
        cnt = np.bincount(e, minlength=m)
        start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        has = cnt > 0
        lo = start[has] + (cnt[has] - 1) // 2
        hi = start[has] + cnt[has] // 2
        med[has] = 0.5 * (v[lo] + v[hi])
    return np.asarray(r - med[x_edge], dtype=np.float64)


def find_steps(
    n_nodes: int,
    edges: I64,
    x_edge: I64,
    x_mid: F64,
    resid: F64,
    *,
    min_step_ns: float = STEP_MIN_NS,
) -> Steps:
    """The NICs whose clocks stepped inside the window (module docstring), from each exchange's
    residual ``resid`` (`exchange_residuals`) at its time ``x_mid`` on edge ``x_edge``.
    Raises ValueError on arrays of different lengths."""
    if not len(x_edge) == len(x_mid) == len(resid):
        raise ValueError("x_edge, x_mid and resid must have one entry per exchange")
    ok = np.isfinite(resid) & np.isfinite(x_mid)
    empty = Steps(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
    if ok.sum() < 2 * MIN_PER_SIDE:
        return empty
    e, t, r = x_edge[ok], x_mid[ok], resid[ok]
    node = np.concatenate([edges[e, 1], edges[e, 0]])
    val = np.concatenate([r, -r])
    tt = np.concatenate([t, t])
    lo, hi = float(t.min()), float(t.max())
    if hi <= lo:
        return empty
    b = np.minimum(((tt - lo) / (hi - lo) * STEP_BINS).astype(np.int64), STEP_BINS - 1)
    # per (NIC, bin) the median and count of the oriented residuals
    key = node * STEP_BINS + b
    order = key_order(key, val)  # np.lexsort((val, key)), faster: every value is finite
    key, v = key[order], val[order]
    cells = n_nodes * STEP_BINS
    cnt = np.bincount(key, minlength=cells)
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    has = cnt > 0
    flat = np.full(cells, np.nan)
    flat[has] = 0.5 * (v[start[has] + (cnt[has] - 1) // 2] + v[start[has] + cnt[has] // 2])
    med = flat.reshape(n_nodes, STEP_BINS)
    cnt2 = cnt.reshape(n_nodes, STEP_BINS).astype(np.float64)
    # each split: a weighted least-squares line plus a level shift at the split through the
    # NIC's trace (the solve tilted the NIC's line to straddle the step, so the trace has a
    # slope on both sides); the shift that stands out most from what is left is the step
    tb = (np.arange(STEP_BINS) + 0.5) / STEP_BINS
    y = np.nan_to_num(med)
    w = np.where(np.isfinite(med), cnt2, 0.0)
    best = np.zeros(n_nodes)
    at = np.zeros(n_nodes, np.int64)
    noise = np.full(n_nodes, np.inf)
    score = np.zeros(n_nodes)
    for split in range(1, STEP_BINS):
        side = (np.arange(STEP_BINS) >= split).astype(np.float64)
        x = np.stack([np.ones(STEP_BINS), tb - 0.5, side], axis=1)  # (bins, 3)
        a = np.einsum("nb,bi,bj->nij", w, x, x) + 1e-9 * np.eye(3)
        rhs = np.einsum("nb,bi,nb->ni", w, x, y)
        coef = np.linalg.solve(a, rhs[..., None])[..., 0]
        res = np.where(w > 0, np.abs(y - coef @ x.T), np.inf)  # inf: an empty bin
        k = (w > 0).sum(axis=1)
        srt = np.sort(res, axis=1)
        rows = np.arange(n_nodes)
        mid = 0.5 * (srt[rows, np.maximum(k - 1, 0) // 2] + srt[rows, np.maximum(k, 1) // 2])
        scale = np.where(k > 0, 1.4826 * mid, np.nan)
        enough = (
            (cnt2[:, :split].sum(axis=1) >= MIN_PER_SIDE)
            & (cnt2[:, split:].sum(axis=1) >= MIN_PER_SIDE)
            & ((w > 0).sum(axis=1) >= 5)
        )
        jump = np.where(enough, coef[:, 2], 0.0)
        z = np.abs(jump) / np.maximum(np.nan_to_num(scale, nan=np.inf), 1.0)
        better = enough & (z > score)
        best = np.where(better, jump, best)
        at = np.where(better, split, at)
        noise = np.where(better, scale, noise)
        score = np.where(better, z, score)
    # what the other NICs' traces shift by is the window's noise (steps are rare): a step
    # must stand well out of it too (load 0.9, 128 NICs, 12 peers: p90 244 ns, max 639 ns)
    typical = float(np.quantile(np.abs(best), 0.9)) if n_nodes >= 10 else 0.0
    step = (np.abs(best) > max(min_step_ns, STEP_SPREAD * typical)) & (score > STEP_Z)
    nodes = np.flatnonzero(step)
    when = lo + at[nodes] / STEP_BINS * (hi - lo)
    return Steps(nodes.astype(np.int64), when.astype(np.float64), best[nodes])


def without_nodes(s: Summary, nodes: I64) -> Summary:
    """``s`` with every sample and exchange of the edges that touch ``nodes`` left out (their
    counts 0): a solve of it leaves those NICs unknown and the others free of them."""
    cut = np.asarray(np.isin(s.edges, nodes).any(axis=1), dtype=bool)
    if not cut.any():
        return s
    kc, ka, kx = ~cut[s.clean_g // 2], ~cut[s.all_g // 2], ~cut[s.x_edge]
    both = np.repeat(cut, 2)
    return dataclasses.replace(
        s,
        clean_g=s.clean_g[kc], clean_t=s.clean_t[kc], clean_d=s.clean_d[kc],
        all_g=s.all_g[ka], all_t=s.all_t[ka], all_d=s.all_d[ka],
        n_clean=np.where(both, 0, s.n_clean), n_all=np.where(both, 0, s.n_all),
        x_edge=s.x_edge[kx], x_rtt=s.x_rtt[kx], x_off=s.x_off[kx], x_mid=s.x_mid[kx],
    )  # fmt: skip
