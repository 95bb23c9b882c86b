"""Batched (vectorized) Huygens pair fit for many pairs at once.

``fit_pairs`` solves the same max-margin problem as ``sync.pairfit.fit_pair`` for every pair
index in one go. Per pass: detrend each sample by its pair's current slope, reduce every
(pair, direction) to ``n_bins`` time-bin minima (``np.minimum.at``), and maximize the concave
margin over the slope correction by a vectorized bisection on the dense (pairs x bins) arrays.
Keeping only bin minima of the *detrended* delays loses at most ``|slope error| x bin width``,
so repeating passes converges to the exact fit (tested against ``fit_pair``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sync._arrays import as_float, as_index
from sync.pairfit import F64, FitStatus, PairFits, _check_params, _std

_ROWS = NDArray[np.intp]


def _bin_minima(key: NDArray[np.int64], resid: F64, u: F64, n_cells: int) -> tuple[F64, F64]:
    """Minimum residual per cell and the (centred) time of that minimum; empty cells: inf, 0."""
    mins = np.full(n_cells, np.inf)
    if len(key) and bool(np.all(key[1:] >= key[:-1])):  # hull points come sorted by (pair, t)
        start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        mins[key[start]] = np.minimum.reduceat(resid, start)
    else:
        np.minimum.at(mins, key, resid)
    hit = resid == mins[key]
    t = np.zeros(n_cells)
    t[key[hit]] = u[hit]
    return mins, t


def _bisect(rf: F64, tf: F64, rr: F64, tr: F64, lo: F64, hi: F64, iters: NDArray[np.int64]) -> F64:
    """Row-wise argmax over dm in [lo, hi] of min(rf - dm tf) + min(rr + dm tr) (concave),
    ``iters[row]`` halvings per row (a row's result depends on its own data only, so pairs
    fitted in several batches, as edge owners do, come out as fitted at once). The rows'
    empty cells (inf) are moved to the end first, in order, and the columns that only hold
    those dropped: the first minimum of a row is the same cell, in fewer columns (a
    direction of a few kept exchanges fills few of its bins)."""
    rf, tf = _finite_first(rf, tf)
    rr, tr = _finite_first(rr, tr)
    n = rf.shape[0]
    at_f, at_r = np.arange(n) * rf.shape[1], np.arange(n) * rr.shape[1]
    tf_flat, tr_flat = tf.reshape(-1), tr.reshape(-1)
    buf_f, buf_r = np.empty_like(rf), np.empty_like(rr)
    lo, hi = lo.copy(), hi.copy()
    mid = np.empty(n)
    for it in range(int(iters.max(initial=0))):
        act = iters > it
        np.add(lo, hi, out=mid)
        mid *= 0.5
        np.subtract(rf, np.multiply(mid[:, None], tf, out=buf_f), out=buf_f)
        np.add(rr, np.multiply(mid[:, None], tr, out=buf_r), out=buf_r)
        i_f, i_r = buf_f.argmin(axis=1), buf_r.argmin(axis=1)
        up = tr_flat[at_r + i_r] - tf_flat[at_f + i_f] > 0  # subgradient of the margin
        np.copyto(lo, mid, where=up & act)
        np.copyto(hi, mid, where=~up & act)
    return 0.5 * (lo + hi)


def _finite_first(r: F64, t: F64) -> tuple[F64, F64]:
    """``r`` and ``t`` with each row's finite cells of ``r`` first (in their order) and the
    rest inf (``t`` 0), as wide as the row with the most finite cells."""
    fin = np.isfinite(r)
    width = max(int(fin.sum(axis=1).max()), 1) if len(r) else 1
    if width == r.shape[1]:
        return r, t
    col = np.cumsum(fin, axis=1) - 1
    row = np.broadcast_to(np.arange(len(r))[:, None], r.shape)
    r2, t2 = np.full((len(r), width), np.inf), np.zeros((len(r), width))
    r2[row[fin], col[fin]] = r[fin]
    t2[row[fin], col[fin]] = t[fin]
    return r2, t2


def _spread(e: F64) -> F64:
    """Per row: third-lowest finite minus lowest entry (or the highest if fewer than three)."""
    s = np.sort(e, axis=1)
    count = np.isfinite(s).sum(axis=1)
    k = np.clip(count - 1, 0, 2)
    kth = np.take_along_axis(s, k[:, None], axis=1)[:, 0]
    return np.asarray(kth - s[:, 0])


def fit_pairs(
    n_pairs: int,
    fwd_pair: ArrayLike,
    fwd_t: ArrayLike,
    fwd_d: ArrayLike,
    rev_pair: ArrayLike,
    rev_t: ArrayLike,
    rev_d: ArrayLike,
    *,
    min_samples: int = 3,
    max_drift: float = 1e-3,
    quant_ns: float = 0.0,
    drop_nonfinite: bool = False,
    n_bins: int = 16,
    max_passes: int = 8,
    tol_ns: float = 0.01,
    counts: tuple[ArrayLike, ArrayLike] | None = None,
) -> PairFits:
    """Fit every pair ``0 <= p < n_pairs`` from forward and reverse samples.

    ``*_pair`` are pair indices per sample, ``*_t`` times on one clock's axis per pair (float
    ns relative to t_ref; see ``sync.pairfit`` on the time axis), ``*_d`` delays (recv stamp - send stamp, ns). Samples need not be sorted.
    Non-finite samples make the pair NONFINITE unless ``drop_nonfinite`` (then they are just
    ignored). Early-stamp outliers pull the envelope: filter samples with ``sync.coded`` first.
    Iterates until the slope change
    moves the window edges by less than ``tol_ns``. ``counts`` (forward, reverse per pair):
    how many samples the given ones stand for, when they are a reduction such as the lower
    hulls of `sync.summary` (the fit depends only on the hulls; counts decide ``min_samples``
    and ``n_fwd``/``n_rev``). Returns PairFits (NaN estimates where status
    is not OK); raises ValueError on malformed arrays or parameters.
    """
    _check_params(min_samples, max_drift, quant_ns)
    if n_pairs < 0 or n_bins < 3 or max_passes < 1 or not tol_ns > 0:
        raise ValueError("need n_pairs >= 0, n_bins >= 3, max_passes >= 1, tol_ns > 0")
    p = n_pairs
    pf = as_index(fwd_pair, "fwd_pair", p)
    tf, df = as_float(fwd_t, "fwd_t", len(pf)), as_float(fwd_d, "fwd_d", len(pf))
    pr = as_index(rev_pair, "rev_pair", p)
    tr, dr = as_float(rev_t, "rev_t", len(pr)), as_float(rev_d, "rev_d", len(pr))

    fin_f = np.isfinite(tf) & np.isfinite(df)
    fin_r = np.isfinite(tr) & np.isfinite(dr)
    nonfinite = np.zeros(p, dtype=bool)
    if not drop_nonfinite:
        nonfinite[pf[~fin_f]] = True
        nonfinite[pr[~fin_r]] = True
    if not fin_f.all():  # copies only when needed: windows hold millions of samples
        pf, tf, df = pf[fin_f], tf[fin_f], df[fin_f]
    if not fin_r.all():
        pr, tr, dr = pr[fin_r], tr[fin_r], dr[fin_r]
    del fin_f, fin_r
    nf = np.bincount(pf, minlength=p).astype(np.int64)
    nr = np.bincount(pr, minlength=p).astype(np.int64)
    if counts is not None:
        cf, cr = (
            as_index(counts[0], "counts", 1 << 62, p),
            as_index(counts[1], "counts", 1 << 62, p),
        )
        if np.any((cf > 0) != (nf > 0)) or np.any((cr > 0) != (nr > 0)):
            raise ValueError("counts must be > 0 exactly for the pairs that have samples")
        nf, nr = cf.astype(np.int64), cr.astype(np.int64)

    tmin = np.full(p, np.inf)
    tmax = np.full(p, -np.inf)
    for idx, t in ((pf, tf), (pr, tr)):
        np.minimum.at(tmin, idx, t)
        np.maximum.at(tmax, idx, t)
    with np.errstate(invalid="ignore"):
        span = tmax - tmin

    status = np.zeros(p, dtype=np.int8)  # assigned lowest priority first
    status[~(span > 0)] = FitStatus.NO_SPAN
    status[np.minimum(nf, nr) < min_samples] = FitStatus.TOO_FEW
    status[nonfinite] = FitStatus.NONFINITE
    status[nr == 0] = FitStatus.NO_REV
    status[nf == 0] = FitStatus.NO_FWD

    act = status == FitStatus.OK
    nan = np.full(p, np.nan)
    out = {k: nan.copy() for k in ("offset", "drift", "ostd", "dstd", "floor")}
    rows = np.flatnonzero(act)
    if rows.size:
        # compact active pairs to 0..a-1 so the dense arrays only hold them
        remap = np.full(p, -1, dtype=np.int64)
        remap[rows] = np.arange(rows.size)
        kf, kr = act[pf], act[pr]
        if not kf.all():
            pf, tf, df = pf[kf], tf[kf], df[kf]
        if not kr.all():
            pr, tr, dr = pr[kr], tr[kr], dr[kr]
        del kf, kr
        res = _fit_active(
            rows.size, remap[pf], tf, df, remap[pr], tr, dr,
            tmin[rows], span[rows], max_drift, n_bins, max_passes, tol_ns,
        )  # fmt: skip
        m, c, floor, sf, sr = res
        # within the bisection tolerance of the bound: the data do not pin the slope
        at_bound = np.abs(m) >= max_drift - 2.0 * tol_ns / (0.5 * span[rows])
        tc = tmin[rows] + 0.5 * span[rows]
        ostd, dstd = _std(sf, sr, span[rows], tc, quant_ns)
        good = ~at_bound
        g = rows[good]
        out["offset"][g] = (c - m * tc)[good]
        out["drift"][g] = m[good]
        out["ostd"][g] = ostd[good]
        out["dstd"][g] = dstd[good]
        out["floor"][g] = floor[good]
        status[rows[at_bound]] = FitStatus.DRIFT_AT_BOUND
    return PairFits(
        offset_ns=out["offset"],
        drift=out["drift"],
        offset_std_ns=out["ostd"],
        drift_std=out["dstd"],
        floor_ns=out["floor"],
        n_fwd=nf,
        n_rev=nr,
        status=status,
    )


def _fit_active(
    a: int,
    pf: NDArray[np.int64],
    tf: F64,
    df: F64,
    pr: NDArray[np.int64],
    tr: F64,
    dr: F64,
    tmin: F64,
    span: F64,
    max_drift: float,
    n_bins: int,
    max_passes: int,
    tol_ns: float,
) -> tuple[F64, F64, F64, F64, F64]:
    """Multi-pass binned fit of ``a`` pairs that all have data; returns slope, centre offset,
    floor and the two envelope spreads. Each pass works only on pairs not yet converged."""
    half = 0.5 * span
    tc = tmin + half
    uf, ur = tf - tc[pf], tr - tc[pr]
    bin_f = np.clip((uf / span[pf] + 0.5) * n_bins, 0, n_bins - 1).astype(np.int64)
    bin_r = np.clip((ur / span[pr] + 0.5) * n_bins, 0, n_bins - 1).astype(np.int64)
    tol_m = tol_ns / half
    m = np.zeros(a)
    width = np.full(a, max_drift)
    minf, minr, sprf, sprr = np.empty(a), np.empty(a), np.empty(a), np.empty(a)
    live = np.arange(a)
    local = np.arange(a)  # pair index -> row among live pairs (-1 once converged)
    for k in range(max_passes):
        n = live.size
        ef, bf = _bin_minima(local[pf] * n_bins + bin_f, df - m[pf] * uf, uf, n * n_bins)
        er, br = _bin_minima(local[pr] * n_bins + bin_r, dr + m[pr] * ur, ur, n * n_bins)
        ef, bf, er, br = (x.reshape(n, n_bins) for x in (ef, bf, er, br))
        lo = np.maximum(-max_drift - m[live], -width[live])
        hi = np.minimum(max_drift - m[live], width[live])
        # halvings per pair from its own bracket (2 past its tolerance: the fits of
        # 95a53f8, which halved every pair as often as the widest needed, stay within 4 ps)
        iters = np.ceil(np.log2(np.maximum((hi - lo) / tol_m[live], 2.0))).astype(np.int64) + 3
        dm = _bisect(ef, bf, er, br, lo, hi, iters)
        m[live] += dm
        done = (np.abs(dm) <= tol_m[live]) | (k == max_passes - 1)
        fe = ef[done] - dm[done, None] * bf[done]  # residuals w.r.t. the final slope
        re = er[done] + dm[done, None] * br[done]
        rows = live[done]
        minf[rows], minr[rows] = fe.min(axis=1), re.min(axis=1)
        sprf[rows], sprr[rows] = _spread(fe), _spread(re)
        live = live[~done]
        if live.size == 0:
            break
        width[live] = 8.0 * np.abs(dm[~done]) + 4.0 * tol_m[live]
        local[:] = -1
        local[live] = np.arange(live.size)
        keep_f, keep_r = local[pf] >= 0, local[pr] >= 0
        pf, uf, df, bin_f = pf[keep_f], uf[keep_f], df[keep_f], bin_f[keep_f]
        pr, ur, dr, bin_r = pr[keep_r], ur[keep_r], dr[keep_r], bin_r[keep_r]
    return m, 0.5 * (minf - minr), 0.5 * (minf + minr), sprf, sprr
