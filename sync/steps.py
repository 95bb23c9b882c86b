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
level shift at each bin edge (`best_split`, every split at once; the solve tilted the NIC's
line to straddle the step, so both sides slope), keeps the split whose shift stands out most from what the fit leaves
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

from sync.runs import PAD_FACTOR, key_order
from sync.summary import Summary

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
STEP_BINS = 16  # time bins of a NIC's trace
STEP_MIN_NS = 300.0  # smaller level shifts are not called steps (hot spots: tens to ~250 ns)
STEP_Z = 8.0  # ... nor shifts within this many times the trace's noise
STEP_SPREAD = 3.0  # ... nor within this many times the 90th percentile of all NICs' shifts
MIN_PER_SIDE = 8  # residuals on each side of a split, at least
CELL_CHUNK = 1 << 16  # cells per block of `cell_medians`' dense rows
SPLIT_CHUNK = 8192  # NICs per block of `best_split` (its temporaries: NICs x 15 x 16 floats)


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
    lo, hi = float(t.min()), float(t.max())
    if hi <= lo:
        return empty
    b = np.minimum(((t - lo) / (hi - lo) * STEP_BINS).astype(np.int64), STEP_BINS - 1)
    # per (NIC, bin) the median and count of the oriented residuals (each exchange on both
    # of its NICs' traces)
    cells = n_nodes * STEP_BINS
    key = np.concatenate([edges[e, 1] * STEP_BINS + b, edges[e, 0] * STEP_BINS + b])
    flat, cnt = cell_medians(key, np.concatenate([r, -r]), cells)
    med = flat.reshape(n_nodes, STEP_BINS)
    cnt2 = cnt.reshape(n_nodes, STEP_BINS).astype(np.float64)
    # each split: a weighted least-squares line plus a level shift at the split through the
    # NIC's trace (the solve tilted the NIC's line to straddle the step, so the trace has a
    # slope on both sides); the shift that stands out most from what is left is the step
    y = np.nan_to_num(med)
    w = np.where(np.isfinite(med), cnt2, 0.0)
    best, at, score = np.zeros(n_nodes), np.zeros(n_nodes, np.int64), np.zeros(n_nodes)
    for a in range(0, n_nodes, SPLIT_CHUNK):  # bounded temporaries: (chunk, splits, bins)
        blk = slice(a, min(a + SPLIT_CHUNK, n_nodes))
        best[blk], at[blk], score[blk] = best_split(w[blk], y[blk], cnt2[blk])
    # what the other NICs' traces shift by is the window's noise (steps are rare): a step
    # must stand well out of it too (load 0.9, 128 NICs, 12 peers: p90 244 ns, max 639 ns)
    typical = float(np.quantile(np.abs(best), 0.9)) if n_nodes >= 10 else 0.0
    step = (np.abs(best) > max(min_step_ns, STEP_SPREAD * typical)) & (score > STEP_Z)
    nodes = np.flatnonzero(step)
    when = lo + at[nodes] / STEP_BINS * (hi - lo)
    return Steps(nodes.astype(np.int64), when.astype(np.float64), best[nodes])


def cell_medians(key: I64, val: F64, cells: int) -> tuple[F64, I64]:
    """Per cell ``0 .. cells - 1`` the median of the finite ``val``s whose ``key`` it is (NaN
    where none) and their count. The values of a cell are what matter, not their order: the
    keys are sorted alone (an unstable integer sort) and each cell's values sorted as a row of
    a dense (cells, widest row) array, the rows no wider than `PAD_FACTOR` times the values
    allow; the few cells with more values than that get one sort by (key, value)
    (`sync.runs.key_order`) of their values alone. Either way the same medians, to the bit."""
    cnt = np.bincount(key, minlength=cells)
    out = np.full(cells, np.nan)
    if not len(key):
        return out, cnt
    width = min(int(cnt.max()), (PAD_FACTOR * len(key) + 4096) // max(cells, 1))
    if cells >= 2**31:  # keys past 32 bits: every cell takes the one sort
        width = 0
    wide = cnt > width
    if wide.any():  # a few crowded cells: their values sorted by (key, value)
        over = wide[key]
        k, v = key[over], val[over]
        order = key_order(k, v)  # np.lexsort((v, k)): every value is finite
        c = np.bincount(k, minlength=cells)
        start = np.concatenate([[0], np.cumsum(c)[:-1]])
        vs, lo, hi = v[order], start[wide] + (c[wide] - 1) // 2, start[wide] + c[wide] // 2
        out[wide] = 0.5 * (vs[lo] + vs[hi])
        key, val = key[~over], val[~over]
    if width and len(key):
        _dense_medians(key, val, np.where(wide, 0, cnt), width, out)
    return out, cnt


def _dense_medians(key: I64, val: F64, cnt: I64, width: int, out: F64) -> None:
    """Into ``out`` per cell with values (``cnt``, each at most ``width``) their median, each
    cell's values sorted as a row of a dense array (chunks of `CELL_CHUNK` cells)."""
    cells = len(cnt)
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    has = cnt > 0
    order = np.argsort(key.astype(np.int32))
    ks, vs = key[order], val[order]
    bounds = np.concatenate([start, [len(ks)]])
    for c0 in range(0, cells, CELL_CHUNK):  # bounded temporaries: (chunk, width)
        c1 = min(c0 + CELL_CHUNK, cells)
        a, b = int(bounds[c0]), int(bounds[c1])
        dense = np.full((c1 - c0, width), np.nan)
        dense[ks[a:b] - c0, np.arange(a, b) - start[ks[a:b]]] = vs[a:b]
        dense.sort(axis=1)
        c = np.arange(c0, c1)[has[c0:c1]]
        m = cnt[c]
        out[c] = 0.5 * (dense[c - c0, (m - 1) // 2] + dense[c - c0, m // 2])


def best_split(w: F64, y: F64, cnt: F64) -> tuple[F64, I64, F64]:
    """Per NIC trace (rows of ``y``: bin medians, ``w``: their weights, 0 where a bin is
    empty; ``cnt``: residuals per bin) the split at each inner bin edge that stands out most:
    a weighted least-squares fit of a line plus a level shift at the split, all splits at
    once (the normal equations from the rows' suffix sums, one batched 3 x 3 solve), scored
    by the shift over a robust scale (1.4826 x the median absolute residual of the filled
    bins). A split needs `MIN_PER_SIDE` residuals on each side and the trace 5 filled bins.
    Returns per row (shift, split, score): the first split of the highest score when it is
    > 0, else (0, 0, 0)."""
    n, nb = y.shape
    u = (np.arange(nb) + 0.5) / nb - 0.5  # bin centres, centred
    filled = w > 0
    k = filled.sum(axis=1)
    wu, wy = w * u, w * y
    t0, t1, ty = _after(w), _after(wu), _after(wy)  # the shift's column, per split
    s0, s1, s2 = w.sum(axis=1), wu.sum(axis=1), (wu * u).sum(axis=1)
    y0, y1 = wy.sum(axis=1), (wy * u).sum(axis=1)
    ns = nb - 1
    a = np.empty((n, ns, 3, 3))
    a[:, :, 0, 0], a[:, :, 1, 1], a[:, :, 2, 2] = s0[:, None], s2[:, None], t0
    a[:, :, 0, 1] = a[:, :, 1, 0] = s1[:, None]
    a[:, :, 0, 2] = a[:, :, 2, 0] = t0
    a[:, :, 1, 2] = a[:, :, 2, 1] = t1
    a += 1e-9 * np.eye(3)
    rhs = np.stack([np.broadcast_to(y0[:, None], (n, ns)), np.broadcast_to(y1[:, None], (n, ns)),
                    ty], axis=-1)  # fmt: skip
    coef = np.linalg.solve(a, rhs[..., None])[..., 0]  # (n, splits, 3)
    side = (np.arange(nb)[None, :] >= np.arange(1, nb)[:, None]).astype(np.float64)
    fit = coef[..., 0:1] + coef[..., 1:2] * u + coef[..., 2:3] * side  # (n, splits, bins)
    res = np.where(filled[:, None, :], np.abs(y[:, None, :] - fit), np.inf)  # inf: empty bin
    res.sort(axis=2)
    lo = np.broadcast_to((np.maximum(k - 1, 0) // 2)[:, None, None], (n, ns, 1))
    hi = np.broadcast_to((np.maximum(k, 1) // 2)[:, None, None], (n, ns, 1))
    mid = 0.5 * (np.take_along_axis(res, lo, 2) + np.take_along_axis(res, hi, 2))[..., 0]
    scale = np.where(k[:, None] > 0, 1.4826 * mid, np.nan)
    left = np.cumsum(cnt, axis=1)[:, :-1]  # residuals before each split (whole numbers: exact)
    right = cnt.sum(axis=1)[:, None] - left
    enough = (left >= MIN_PER_SIDE) & (right >= MIN_PER_SIDE) & (k[:, None] >= 5)
    jump = np.where(enough, coef[..., 2], 0.0)
    z = np.abs(jump) / np.maximum(np.nan_to_num(scale, nan=np.inf), 1.0)
    z = np.where(enough & (z > 0), z, 0.0)  # NaN and unsupported splits score nothing
    pick = np.argmax(z, axis=1)  # the first of the highest
    rows = np.arange(n)
    top = z[rows, pick]
    won = top > 0
    split = np.where(won, pick + 1, 0).astype(np.int64)
    return np.where(won, jump[rows, pick], 0.0), split, np.where(won, top, 0.0)


def _after(v: F64) -> F64:
    """Per row and split s (1 .. bins - 1) the sum of the row's bins at and after s."""
    return np.asarray(np.cumsum(v[:, ::-1], axis=1)[:, ::-1][:, 1:])


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
