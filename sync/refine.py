"""Second-stage refinements for loaded fabrics, after a first network solve.

At high load the delay envelopes rarely touch the propagation floor, so a free-slope pair fit
is noisy in both slope and offset; software stamps add µs jitter whose extremes are noise.
Cheap, pure steps help. Measured on 128-NIC simulator windows (16 peers, 2 s, seeds 1 / 2),
node p99 error, first stage -> fixed slope + floor-excess std + ``solve_network(loss="huber")``:
hw load 0.4: 2.1 -> 1.5 ns with k_lowest=1 (k=32: 38 ns, worse);
hw load 0.9: 89 / 67 -> 44 / 51 ns with k=1, 35 / 37 ns with k=32;
sw load 0.4: 179 / 236 -> 48 / 65 ns with k=32 (k=1: 238 / 183).
So k_lowest=1 (the Huygens envelope) while floors are reached, larger k when they are not;
``sync.window.sync_window`` makes that choice from the data (loop-closure residuals).

* ``refit_fixed_slope``: drifts are node properties, so the network drift solution gives every
  pair a better slope than its own fit; with the slope fixed, the offset is the mid-point of the
  two detrended envelope minima (and the floor their mean).
* ``lowest_means``: the same envelope statistic for many ``k`` at once (``k`` a fraction of
  each direction's samples), so ``sync.window`` can pick ``k`` from the data.
* ``floor_excess_std``: the theta error of a pair is at most the excess of its fitted floor over
  the true floor ((qF + qR) / 2 >= |qF - qR| / 2). The true floor is unknown, but a node's best
  pairs reach it: a low quantile of the floors of the node's pairs serves as reference, and the
  excess inflates the pair's std so the network leans on well-sampled pairs.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sync._arrays import as_edges, as_float, as_index
from sync.runs import compact, key_order, runs_of, sorted_rows

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


def refit_fixed_slope(
    n_pairs: int,
    fwd_pair: ArrayLike,
    fwd_t: ArrayLike,
    fwd_d: ArrayLike,
    rev_pair: ArrayLike,
    rev_t: ArrayLike,
    rev_d: ArrayLike,
    slope: ArrayLike,
    *,
    k_lowest: int = 1,
) -> tuple[F64, F64]:
    """(offset_ns at t = 0, floor_ns) per pair with theta's slope fixed to ``slope[pair]``.

    Each side's envelope is the mean of its ``k_lowest`` detrended delays (1: the minimum, the
    Huygens envelope). Larger k trades bias under asymmetric queueing for far less variance when
    stamps carry heavy jitter on both sides (software stamps): its extreme values are noise.

    Same sample conventions as ``fit_pairs`` (one time axis per pair, float ns relative to
    t_ref). Pairs with no forward or no reverse sample, or a non-finite slope, get NaN.
    Non-finite samples are ignored. Raises ValueError on malformed arrays.
    """
    pf = as_index(fwd_pair, "fwd_pair", n_pairs)
    tf, df = as_float(fwd_t, "fwd_t", len(pf)), as_float(fwd_d, "fwd_d", len(pf))
    pr = as_index(rev_pair, "rev_pair", n_pairs)
    tr, dr = as_float(rev_t, "rev_t", len(pr)), as_float(rev_d, "rev_d", len(pr))
    m = as_float(slope, "slope", n_pairs)
    if k_lowest < 1:
        raise ValueError(f"k_lowest must be >= 1, got {k_lowest}")
    low_f = _mean_lowest(pf, df - m[pf] * tf, n_pairs, k_lowest)
    low_r = _mean_lowest(pr, dr + m[pr] * tr, n_pairs, k_lowest)
    good = np.isfinite(low_f) & np.isfinite(low_r)
    with np.errstate(invalid="ignore"):
        offset = np.where(good, 0.5 * (low_f - low_r), np.nan)
        floor = np.where(good, 0.5 * (low_f + low_r), np.nan)
    return offset, floor


def _mean_lowest(pair: I64, vals: F64, n: int, k: int) -> F64:
    """Per pair the mean of its ``k`` smallest finite values (all of them if fewer); inf if none."""
    ok = np.isfinite(vals)
    pair, vals = pair[ok], vals[ok]
    if k == 1:
        low = np.full(n, np.inf)
        np.minimum.at(low, pair, vals)
        return low
    order = np.lexsort((vals, pair))
    pair, vals = pair[order], vals[order]
    start = np.searchsorted(pair, np.arange(n))
    rank = np.arange(len(pair)) - start[pair]
    take = rank < k
    total = np.bincount(pair[take], weights=vals[take], minlength=n)
    count = np.bincount(pair[take], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.inf)


def lowest_means(pair: ArrayLike, vals: ArrayLike, n: int, fractions: ArrayLike) -> F64:
    """Per fraction ``q`` and per group ``0 <= p < n``: the mean of the ``max(1, round(q c_p))``
    smallest finite values of group p (``c_p`` its count); NaN for empty groups.

    Sorts once and reads every fraction off one cumulative sum, so many ``k`` cost about one.
    Returns shape ``(len(fractions), n)``. Raises ValueError on fractions outside (0, 1] or
    malformed arrays.
    """
    pr = as_index(pair, "pair", n)
    v = as_float(vals, "vals", len(pr))
    q = np.atleast_1d(np.asarray(fractions, dtype=np.float64))
    if q.ndim != 1 or not np.all((q > 0) & (q <= 1)):
        raise ValueError("fractions must be a 1-D sequence of values in (0, 1]")
    ok = np.isfinite(v)
    if not ok.all():
        pr, v = pr[ok], v[ok]
    order = np.lexsort((v, pr))
    pr, v = pr[order], v[order]
    del order
    count = np.bincount(pr, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    has = count > 0
    s0 = start[has]
    gmin = v[s0]
    # sum the excess over each group's minimum: ms-scale offsets would cost precision
    csum = np.concatenate([[0.0], np.cumsum(v - v[start[pr]])])
    del v, pr
    out = np.full((len(q), n), np.nan)
    for r, frac in enumerate(q):
        k = np.clip(np.rint(frac * count[has]), 1, count[has]).astype(np.int64)
        out[r, has] = gmin + (csum[s0 + k] - csum[s0]) / k
    return out


def lowest_key_means(
    group: ArrayLike, key: ArrayLike, vals: ArrayLike, n: int, fractions: ArrayLike
) -> F64:
    """Per fraction ``q`` and group ``0 <= p < n``: the mean of ``vals`` over the
    ``max(1, round(q c_p))`` samples of group p with the smallest ``key`` (finite key and value
    only); NaN for empty groups.

    With ``key`` = round-trip time and ``vals`` = per-exchange offsets this is the min-RTT
    filter generalized to a fraction: the exchanges least queued in *both* directions, whose
    offset is unbiased however unequal the two directions' queueing. Returns shape
    ``(len(fractions), n)``. Raises ValueError on fractions outside (0, 1] or malformed arrays.
    """
    pr = as_index(group, "group", n)
    kk = as_float(key, "key", len(pr))
    v = as_float(vals, "vals", len(pr))
    q = np.atleast_1d(np.asarray(fractions, dtype=np.float64))
    if q.ndim != 1 or not np.all((q > 0) & (q <= 1)):
        raise ValueError("fractions must be a 1-D sequence of values in (0, 1]")
    ok = np.isfinite(kk) & np.isfinite(v)
    if not ok.all():
        pr, kk, v = pr[ok], kk[ok], v[ok]
    order = np.lexsort((kk, pr))
    pr, v = pr[order], v[order]
    del order, kk
    count = np.bincount(pr, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    has = count > 0
    s0 = start[has]
    first = v[s0]
    csum = np.concatenate([[0.0], np.cumsum(v - v[start[pr]])])
    out = np.full((len(q), n), np.nan)
    for r, frac in enumerate(q):
        k = np.clip(np.rint(frac * count[has]), 1, count[has]).astype(np.int64)
        out[r, has] = first + (csum[s0 + k] - csum[s0]) / k
    return out


def floor_excess_std(
    n_nodes: int,
    edges: ArrayLike,
    floor_ns: ArrayLike,
    offset_std_ns: ArrayLike,
    *,
    quantile: float = 0.1,
) -> F64:
    """Per edge ``sqrt(std^2 + excess^2)``, ``excess = max(0, floor - min(ref_i, ref_j))`` with
    ``ref_k`` the ``quantile`` of the floors of node k's edges (finite ones only).

    Use only where all pairs share a similar floor (same hop count); edges with a non-finite
    floor or std come back NaN. Raises ValueError on malformed input.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    i, j = as_edges(edges, n_nodes)
    m = len(i)
    fl = as_float(floor_ns, "floor_ns", m)
    sd = as_float(offset_std_ns, "offset_std_ns", m)
    ok = np.isfinite(fl)
    node = np.concatenate([i[ok], j[ok]])
    val = np.concatenate([fl[ok], fl[ok]])
    ref = np.full(n_nodes, np.nan)
    runs = runs_of(node)
    if compact(runs):  # each node's floors as a sorted dense row
        rows = sorted_rows(runs, val)
        col = np.floor(quantile * (runs.counts - 1)).astype(np.int64)
        ref[runs.keys] = rows[np.arange(len(runs.keys)), col]
    elif len(node):  # a few nodes with far more edges: one sort by (node, floor)
        order = key_order(node, val)  # np.lexsort((val, node)): every value is finite
        node, val = node[order], val[order]
        count = np.bincount(node, minlength=n_nodes)
        start = np.concatenate([[0], np.cumsum(count)[:-1]])
        has = count > 0
        pick = start[has] + np.floor(quantile * (count[has] - 1)).astype(np.int64)
        ref[has] = val[pick]
    excess = np.maximum(fl - np.fmin(ref[i], ref[j]), 0.0)
    return np.asarray(np.sqrt(sd**2 + excess**2))
