"""Bounded summaries of one sync window, so a window can be streamed chunk by chunk.

At 10,000 NICs and 50 coded pairs per second per peer a 2 s window holds ~32 M probes; the
hardware-stamp estimators read far less of it. `sync_summary` (`sync.window.sync_window`
without the per-direction lowest-fraction candidates, which need every sample) reads only:

* per edge direction, the **lower convex hull** of its coded-clean ``(t, d)`` samples (of every
  arrived sample when fewer than ``min_coded`` are clean, as `orient_samples` falls back): the
  envelope ``min(d - m t)`` for any slope ``m`` is attained on the hull, so the max-margin pair
  fit and the fixed-slope envelope refit are the same on the hull as on all samples;
* per edge the **lowest-RTT exchanges**, as many as the largest lowest-RTT fraction can take
  (``cap``), each with ``0.5 (d_fwd - d_rev)`` and ``0.5 (t_fwd + t_rev)``: the detrended
  per-exchange offset for any slope is linear in these two. RTT is ``d_fwd + d_rev`` as
  measured (the slope moves it by drift x RTT, picoseconds);
* counts (clean and arrived samples per direction, arrived exchanges per edge).

`reduce_chunk` turns one chunk of oriented probes into a `Summary`; `merge` combines two into
the summary of their union (hull of the hulls, lowest of the lowest, ties kept in arrival
order, counts summed), so a window streamed chunk by chunk summarizes exactly as held at once.
Pure: arrays in, frozen values out.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln

from sync.batchfit import fit_pairs
from sync.network import solve_network
from sync.refine import refit_fixed_slope
from sync.window import (
    RTT_FRACTIONS,
    EdgeSamples,
    WindowSync,
    choose_candidate,
    closure_scale,
    empty_window,
    first_stage,
    pick_ref,
)

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
G32 = NDArray[np.int32]  # hull group ids (2 edge + dir): half the bytes of int64
GT = TypeVar("GT", bound=np.integer[Any])
LINE_FRACTION = 0.1  # lowest-RTT exchanges per edge the drift lines go through
RX_K = 6  # lowest samples per direction the receive-side floor excess is extrapolated from
# a direction reads at most 1 in RX_SAMPLES_PER_K of its samples: the tail model is near-floor
RX_SAMPLES_PER_K = 20
SPLIT_ROUNDS = 8  # backfitting rounds of `split_excess` (the parts settle in 3-4)
BETA_MIN = 1 / 3  # the steepest rise from the floor `pooled_tail_index` allows (index 3)


@dataclass(frozen=True)
class Summary:
    """Summary of a window's probes on ``edges`` (m, 2). Hull points: group ``2 edge + dir``
    (0 forward i->j, 1 reverse), sorted by (group, t). Exchanges: sorted by (edge, rtt), ties
    in arrival order, at most ``cap[edge]`` per edge."""

    edges: I64
    cap: I64
    clean_g: G32
    clean_t: F64
    clean_d: F64
    all_g: G32
    all_t: F64
    all_d: F64
    n_clean: I64
    n_all: I64
    x_edge: I64
    x_rtt: F64
    x_off: F64
    x_mid: F64

    @property
    def n_points(self) -> int:
        """How many samples and exchanges the summary holds (its size)."""
        return len(self.clean_g) + len(self.all_g) + len(self.x_edge)


def _hull_mask(g: NDArray[GT], t: F64, d: F64) -> NDArray[np.bool_]:
    """Mask of the lower-hull vertices per group of points sorted by (group, t, d)."""
    idx = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (t[1:] != t[:-1])])
    while len(idx) >= 3:
        gi, ti, di = g[idx], t[idx], d[idx]
        same = (gi[1:-1] == gi[:-2]) & (gi[1:-1] == gi[2:])
        above = same & (
            (di[1:-1] - di[:-2]) * (ti[2:] - ti[:-2]) >= (di[2:] - di[:-2]) * (ti[1:-1] - ti[:-2])
        )
        if not above.any():
            break
        keep = np.ones(len(idx), dtype=bool)
        keep[1:-1] = ~above
        idx = idx[keep]
    mask = np.zeros(len(g), dtype=bool)
    mask[idx] = True
    return mask


def lower_hull(g: NDArray[GT], t: F64, d: F64, layers: int = 1) -> tuple[NDArray[GT], F64, F64]:
    """Per group, the vertices of the first ``layers`` lower convex hulls of the points
    ``(t, d)`` (peeled: layer 2 is the hull of what layer 1 left), sorted by (group, t, d).
    Of points with equal t only the lowest is on a layer; collinear points are not vertices.
    A point on no layer has, for every slope m, at least ``layers`` points with ``d - m t``
    at most its own, so the ``layers`` lowest values of ``d - m t`` per group, for any m, are
    among the layers' points; and the layers of the layers of two sets are the layers of
    their union (what `merge` needs). Each layer removes every point on or above the segment
    of its neighbours, repeatedly (such a point is not a vertex of the current set)."""
    order = np.lexsort((d, t, g))
    g, t, d = g[order], t[order], d[order]
    on = np.zeros(len(g), dtype=bool)
    rest = np.arange(len(g))
    for _ in range(layers):
        if not rest.size:
            break
        m = _hull_mask(g[rest], t[rest], d[rest])
        on[rest[m]] = True
        rest = rest[~m]
    return g[on], t[on], d[on]


def _lowest(edge: I64, rtt: F64, off: F64, mid: F64, cap: I64) -> tuple[I64, F64, F64, F64]:
    """Keep per edge the ``cap[edge]`` exchanges of lowest rtt (stable: earlier first)."""
    order = np.lexsort((rtt, edge))
    edge, rtt, off, mid = edge[order], rtt[order], off[order], mid[order]
    n = len(cap)
    count = np.bincount(edge, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    rank = np.arange(len(edge)) - start[edge]
    keep = rank < cap[edge]
    return edge[keep], rtt[keep], off[keep], mid[keep]


def reduce_chunk(samples: EdgeSamples, edge_of: I64, edges: I64, cap: I64) -> Summary:
    """Summary of one chunk of probes oriented by `sync.window.orient_samples` (called with
    ``min_coded=0``: the clean/arrived choice is made on the whole window). ``edge_of`` maps
    the chunk's edge indices to rows of the window's ``edges``; ``cap`` is per window edge.
    Raises ValueError on mismatched shapes or more than 2^30 edges (hull groups are int32)."""
    m = len(edges)
    if len(cap) != m or len(edge_of) != len(samples.edges):
        raise ValueError("cap must have one entry per edge and edge_of one per chunk edge")
    if 2 * m > np.iinfo(np.int32).max:
        raise ValueError(f"too many edges for int32 hull groups: {m}")
    e = edge_of[samples.edge]
    arr = (
        np.ones(len(e), dtype=bool) if samples.arrived is None else samples.arrived
    )  # fmt: skip

    def hull(
        fk: NDArray[np.bool_], rk: NDArray[np.bool_], layers: int
    ) -> tuple[G32, F64, F64, I64]:
        g = np.concatenate([2 * e[fk], 2 * e[rk] + 1]).astype(np.int32)
        cnt = np.bincount(g, minlength=2 * m).astype(np.int64)
        t = np.concatenate([samples.fwd_t[fk], samples.rev_t[rk]])
        d = np.concatenate([samples.fwd_d[fk], samples.rev_d[rk]])
        hg, ht, hd = lower_hull(g, t, d, layers)
        return hg, ht, hd, cnt

    cg, ct, cd, nc = hull(samples.fwd_ok, samples.rev_ok, 1)
    ag, at, ad, na = hull(arr, arr, RX_K)
    ea = e[arr]
    fd, rd = samples.fwd_d[arr], samples.rev_d[arr]
    xe, xr, xo, xm = _lowest(
        ea, fd + rd, 0.5 * (fd - rd), 0.5 * (samples.fwd_t[arr] + samples.rev_t[arr]), cap
    )
    return Summary(edges, cap, cg, ct, cd, ag, at, ad, nc, na, xe, xr, xo, xm)


def merge(a: Summary, b: Summary) -> Summary:
    """The summary of the probes of ``a`` followed by those of ``b`` (same edges and cap).
    Raises ValueError when the edges differ."""
    if a.edges.shape != b.edges.shape or not np.array_equal(a.edges, b.edges):
        raise ValueError("summaries of different edge sets cannot be merged")
    cg, ct, cd = _merge_hulls(
        (a.clean_g, a.clean_t, a.clean_d), (b.clean_g, b.clean_t, b.clean_d), 1
    )
    ag, at, ad = _merge_hulls(  # layers: `receive_excess` reads the lowest RX_K
        (a.all_g, a.all_t, a.all_d), (b.all_g, b.all_t, b.all_d), RX_K
    )
    xe, xr, xo, xm = _merge_lowest(a, b)
    return Summary(
        a.edges, a.cap, cg, ct, cd, ag, at, ad,
        a.n_clean + b.n_clean, a.n_all + b.n_all, xe, xr, xo, xm,
    )  # fmt: skip


Points = tuple[G32, F64, F64]
_BLOCK = 1 << 19  # points per block when merging hulls (bounds the sort's temporaries)


def _merge_hulls(a: Points, b: Points, layers: int) -> Points:
    """``lower_hull`` of the union of two point sets sorted by group, block by block of
    groups (groups are independent), so a window's state is never sorted whole. Each block's
    hull is written into arrays sized for every point and shrunk in place at the end
    (`numpy.ndarray.resize`, a realloc): the blocks are never held beside their
    concatenation, and pages never written are never resident."""
    ga, gb = a[0], b[0]
    if len(ga) + len(gb) <= _BLOCK:
        cat = np.concatenate
        return lower_hull(cat([ga, gb]), cat([a[1], b[1]]), cat([a[2], b[2]]), layers)
    top = int(max(ga.max(initial=-1), gb.max(initial=-1))) + 1
    step = max(1, top * _BLOCK // (len(ga) + len(gb)))
    n_max = len(ga) + len(gb)
    cols: list[tuple[NDArray[Any], NDArray[Any]]] = [(a[0], b[0]), (a[1], b[1]), (a[2], b[2])]
    out = tuple(np.empty(n_max, np.result_type(x, y)) for x, y in cols)
    k = 0
    for lo in range(0, top, step):
        i0, i1 = np.searchsorted(ga, [lo, lo + step])
        j0, j1 = np.searchsorted(gb, [lo, lo + step])
        part = lower_hull(
            np.concatenate([ga[i0:i1], gb[j0:j1]]),
            np.concatenate([a[1][i0:i1], b[1][j0:j1]]),
            np.concatenate([a[2][i0:i1], b[2][j0:j1]]),
            layers,
        )
        n = len(part[0])
        for o, p in zip(out, part, strict=True):
            o[k : k + n] = p
        k += n
    for o in out:
        o.resize(k, refcheck=False)  # no view of ``o`` exists: slices above are gone
    return out[0], out[1], out[2]


def _no_points(s: Summary) -> Points:
    """An empty point set of the summary's hull dtypes."""
    return s.all_g[:0], s.all_t[:0], s.all_d[:0]


def _merge_lowest(a: Summary, b: Summary) -> tuple[I64, F64, F64, F64]:
    """`_lowest` of ``a``'s exchanges followed by ``b``'s, block by block of edges into
    arrays of the exact kept size (both are sorted by edge, so an edge's exchanges of ``a``
    and ``b`` meet in one block, ``a``'s first: the same stable order as sorting all)."""
    m = len(a.cap)
    na = np.bincount(a.x_edge, minlength=m)
    nb = np.bincount(b.x_edge, minlength=m)
    sa = np.concatenate([[0], np.cumsum(na)])
    sb = np.concatenate([[0], np.cumsum(nb)])
    so = np.concatenate([[0], np.cumsum(np.minimum(a.cap, na + nb))])
    cols_a = (a.x_edge, a.x_rtt, a.x_off, a.x_mid)
    cols_b = (b.x_edge, b.x_rtt, b.x_off, b.x_mid)
    out = tuple(
        np.empty(int(so[-1]), np.result_type(x, y)) for x, y in zip(cols_a, cols_b, strict=True)
    )
    step = max(1, m * _BLOCK // max(1, int(sa[-1] + sb[-1])))
    for lo in range(0, m, step):
        hi = min(lo + step, m)
        i0, i1, j0, j1 = sa[lo], sa[hi], sb[lo], sb[hi]
        e, r, f, t = (
            np.concatenate([x[i0:i1], y[j0:j1]]) for x, y in zip(cols_a, cols_b, strict=True)
        )
        part = _lowest(e, r, f, t, a.cap)
        for o, p in zip(out, part, strict=True):
            o[so[lo] : so[hi]] = p
    return out[0], out[1], out[2], out[3]


def rtt_cap(max_exchanges: I64, fractions: tuple[float, ...] = RTT_FRACTIONS) -> I64:
    """Per edge how many lowest-RTT exchanges to keep so that every fraction of at most
    ``max_exchanges`` arrived exchanges is exact (``max(1, round(q n))`` for the largest q)."""
    q = max(fractions) if fractions else 0.0
    return (
        np.maximum(np.rint(q * np.asarray(max_exchanges, dtype=np.float64)), 1).astype(np.int64) + 1
    )


def _pick_hulls(s: Summary, min_coded: int) -> tuple[G32, F64, F64, I64]:
    """Per edge direction the clean hull, or the arrived one where fewer than ``min_coded``
    samples are clean; returns group, t, d and the count each direction stands for."""
    thin = s.n_clean < min_coded
    # the first layer (the envelope) of the thin directions' arrived points, block by block of
    # groups: hulls are per group, so this is the whole hull's part on thin groups, without
    # the whole (10,016 NICs: ~1 GB of sort temporaries over 8.5 M points)
    sel = thin[s.all_g]
    ag, at, ad = _merge_hulls((s.all_g[sel], s.all_t[sel], s.all_d[sel]), _no_points(s), 1)
    kc = ~thin[s.clean_g]
    g = np.concatenate([s.clean_g[kc], ag])
    t = np.concatenate([s.clean_t[kc], at])
    d = np.concatenate([s.clean_d[kc], ad])
    return g, t, d, np.where(thin, s.n_all, s.n_clean)


def sync_summary(
    n_nodes: int,
    s: Summary,
    *,
    quant_ns: float = 0.0,
    min_samples: int = 3,
    min_coded: int = 8,
    ref: int = 0,
    rtt_fractions: tuple[float, ...] = RTT_FRACTIONS,
    bias_bound: bool = True,
    rx_correction: bool = True,
    leaf: I64 | None = None,
) -> WindowSync:
    """`sync.window.sync_window` on a summary: pair fits on the hulls, two network solves,
    second stage with the envelope and the lowest-RTT candidates (no per-direction lowest
    fractions: they need every sample). ``rx_correction``: subtract from every NIC's offset
    half the queueing its best incoming samples still carry (`receive_excess`); with ``leaf``
    (per node its leaf switch's index, the fabric's ECMP group) the excesses are split into a
    receive part per NIC and a send part per leaf and the NIC's offset loses half of their
    difference instead (`split_excess`; estimator name ``...+rx+uplink``). Raises
    ValueError when a fraction needs more exchanges than ``cap`` kept (a cap from a too small
    ``max_exchanges``)."""
    m = len(s.edges)
    g, t, d, cnt = _pick_hulls(s, min_coded)
    fwd, rev = g % 2 == 0, g % 2 == 1
    ge = g // 2
    fits = fit_pairs(
        m, ge[fwd], t[fwd], d[fwd], ge[rev], t[rev], d[rev],
        min_samples=min_samples, quant_ns=quant_ns, counts=(cnt[0::2], cnt[1::2]),
    )  # fmt: skip
    if not fits.ok.any():
        return empty_window(n_nodes, s.edges, fits)
    first, r = first_stage(n_nodes, s.edges, fits, ref)
    drift, drift_from = _node_drift(n_nodes, s, first, r)
    if drift_from != "envelope":
        first = dataclasses.replace(first, drift=drift)
    i, j = s.edges[:, 0], s.edges[:, 1]
    slope = drift[j] - drift[i]
    shift = first.offset_ns[i]
    usable = fits.ok & np.isfinite(slope) & np.isfinite(shift)
    if not usable.any():
        return first
    slope = np.where(usable, slope, 0.0)
    env_off, env_floor = refit_fixed_slope(
        m, ge[fwd], t[fwd], d[fwd], ge[rev], t[rev], d[rev], slope
    )
    cands, names, excess = [env_off], ["envelope"], [np.zeros(m)]
    if rtt_fractions:
        n_x = np.bincount(s.x_edge, minlength=m)
        ks = [np.clip(np.rint(q * s.n_all[0::2]), 1, None).astype(np.int64) for q in rtt_fractions]
        short = (n_x < s.n_all[0::2]) & (np.max(ks, axis=0) > n_x)
        if short.any():
            raise ValueError("cap too small for the lowest-RTT fractions on some edges")
        start = np.concatenate([[0], np.cumsum(n_x)[:-1]])
        rank = np.arange(len(s.x_edge)) - start[s.x_edge]
        has = n_x > 0
        rmin = np.full(m, np.nan)
        rmin[has] = s.x_rtt[start[has]]  # sorted by (edge, rtt): the first is the lowest
        for q, k in zip(rtt_fractions, ks, strict=True):
            take = rank < k[s.x_edge]
            num = np.bincount(s.x_edge[take], minlength=m).astype(np.float64)
            num = np.where(has, num, np.nan)
            # per-exchange offset detrended by the slope: 0.5 (xf - xr) = off - slope * mid
            off = np.bincount(s.x_edge[take], s.x_off[take], m) / num
            mid = np.bincount(s.x_edge[take], s.x_mid[take], m) / num
            rtt = np.bincount(s.x_edge[take], s.x_rtt[take], m) / num
            cands.append(off - slope * mid)
            excess.append(rtt - rmin)
            names.append(f"lowrtt{q:g}")
    out = choose_candidate(
        n_nodes, first, r, usable, slope * shift, cands, excess, names, env_floor, bias_bound
    )
    out = dataclasses.replace(out, drift_from=drift_from)
    if not rx_correction:
        return out
    src, dst, val = direction_excess(s, slope)
    if leaf is None:
        rx, name = _node_midmean(n_nodes, dst, val), "+rx"
    else:
        recv, send = split_excess(n_nodes, src, dst, val, np.asarray(leaf, np.int64))
        rx, name = recv - send[leaf], "+rx+uplink"
    off = np.where(out.known, out.offset_ns - 0.5 * np.nan_to_num(rx), np.nan)
    off -= np.nanmean(off) if out.known.any() else 0.0
    return dataclasses.replace(out, offset_ns=off, estimator=out.estimator + name)


def tail_factor(k: I64 | int, beta: float) -> F64:
    """``E[x_(1) - F] / E[x_(k) - x_(1)]`` for the lowest order statistics of a sample whose
    distribution rises from its floor ``F`` like ``(x - F)^(1/beta)`` (a lower tail regularly
    varying with index ``1 / beta``): with ``g(r) = Γ(r + beta) / Γ(r)``, ``E[x_(r) - F]`` is
    proportional to ``g(r)``, so the factor is ``g(1) / (g(k) - g(1))``. ``beta = 1`` (a
    density at the floor) gives ``1 / (k - 1)``: the minimum's excess is one mean spacing.
    Raises ValueError for ``k < 2`` or ``beta`` outside (0, 1]."""
    kk = np.asarray(k, dtype=np.float64)
    if np.any(kk < 2) or not 0.0 < beta <= 1.0:
        raise ValueError(f"need k >= 2 and beta in (0, 1], got beta={beta}")
    g1 = math.gamma(1.0 + beta)
    gk = np.exp(gammaln(kk + beta) - gammaln(kk))
    return np.asarray(g1 / (gk - g1), dtype=np.float64)


_MC_DRAWS = 40_000  # model draws behind `median_spacing_ratio` (fixed seed: deterministic)


@functools.cache
def _unit_arrivals(k: int) -> F64:
    """The first ``k`` arrival times of a unit-rate Poisson process, ``_MC_DRAWS`` rows."""
    rng = np.random.default_rng(0)
    return np.cumsum(rng.exponential(size=(_MC_DRAWS, k)), axis=1)


def median_spacing_ratio(k: int, beta: float) -> float:
    """The median of ``(x_(k) - x_(1)) / (x_(2) - x_(1))`` over windows of the tail model of
    `tail_factor` (``x_(r) - F`` is ``Γ_r^beta`` times a scale, ``Γ_r`` the r-th arrival of a
    unit Poisson process), from ``_MC_DRAWS`` fixed draws; it rises with ``beta``. The ratio
    is scale-free, so directions with different queueing scales share it."""
    e = _unit_arrivals(k) ** beta
    return float(np.median((e[:, k - 1] - e[:, 0]) / (e[:, 1] - e[:, 0])))


def pooled_tail_index(low: F64, high: F64, k: int) -> float:
    """The inverse tail index ``beta`` (in [BETA_MIN, 1]) that one window's directions share,
    from ``low = x_(2) - x_(1)`` and ``high = x_(k) - x_(1)`` of each direction with ``k``
    samples: the ``beta`` whose model median of the scale-free ratio ``high / low``
    (`median_spacing_ratio`) equals the directions' median ratio. Pooled over the fabric
    because a direction's own ratio is far too noisy. 1 (a density at the floor) when no
    direction has ``k`` samples or most lowest spacings are 0 (an atom at the floor, as with
    unqueued minima); clipped to the interval. Raises ValueError for ``k < 3``."""
    if k < 3:
        raise ValueError(f"k must be >= 3, got {k}")
    if not len(low):
        return 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        target = float(np.median(np.where(low > 0, high / low, np.inf)))
    lo, hi = BETA_MIN, 1.0
    if not np.isfinite(target) or target >= median_spacing_ratio(k, hi):
        return hi
    if target <= median_spacing_ratio(k, lo):
        return lo
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if median_spacing_ratio(k, mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def direction_ends(edges: I64, grp: NDArray[np.integer[Any]]) -> tuple[I64, I64]:
    """(sender, receiver) of each edge direction ``grp``: group ``2 e`` runs i -> j for
    ``edges[e] = (i, j)``, group ``2 e + 1`` runs j -> i."""
    fwd = grp % 2 == 0
    i, j = edges[grp // 2, 0], edges[grp // 2, 1]
    return np.where(fwd, i, j), np.where(fwd, j, i)


def direction_excess(
    s: Summary, slope: F64, k: int = RX_K, block: int = 1 << 20
) -> tuple[I64, I64, F64]:
    """Per edge direction with at least 3 usable samples: (sender, receiver, excess ns), the
    excess being how far the direction's best sample sits above its delay floor, read from the
    data: the lowest ``k`` delays detrended by the pair slope (``slope[edge]``, exact from the
    stored hull layers; at most 1 in ``RX_SAMPLES_PER_K`` of the direction's samples, since
    the tail model below holds near the floor only, and at least 3), the floor extrapolated
    from them. The extrapolation assumes the delay distribution rises from its floor like a
    power ``1 / beta`` of the excess (`tail_factor`): ``beta = 1`` is a density at the floor
    (the minimum's excess is one spacing), while a hot receive hop makes the best samples the
    few that found it idle plus a small wait elsewhere, a faster rise (index ~2). ``beta`` is
    one figure per window, pooled over all directions with ``k`` samples
    (`pooled_tail_index`): per direction it is far too noisy, and so is a direction's excess
    (it is aggregated per NIC, `receive_excess`, or per NIC and leaf, `split_excess`). The
    hull points are read in runs of whole groups of about ``block`` points (they are sorted
    by group), so the temporaries stay bounded; the result does not depend on ``block``.
    Raises ValueError if ``k`` is below 3 or exceeds the stored layers."""
    if not 3 <= k <= RX_K:
        raise ValueError(f"k must be in [3, {RX_K}], got {k}")
    n_groups = 2 * len(s.edges)
    step = max(1, (block * n_groups) // max(len(s.all_g), 1))
    bounds = np.searchsorted(s.all_g, np.arange(0, n_groups + step, step))
    parts: list[tuple[I64, I64, F64, F64]] = []  # group, samples used, x2 - x1, xk - x1
    for a, b in itertools.pairwise(bounds.tolist()):
        if a == b:
            continue
        g = s.all_g[a:b]
        e = g // 2
        v = s.all_d[a:b] + np.where(g % 2 == 0, -slope[e], slope[e]) * s.all_t[a:b]
        order = np.lexsort((v, g))
        g, v = g[order], v[order]
        first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        grp = g[first]
        near = np.maximum(s.n_all[grp] // RX_SAMPLES_PER_K, 3)  # the floor's neighbourhood
        kd = np.minimum(np.minimum(np.diff(np.r_[first, len(g)]), k), near)
        ok = kd >= 3
        f, kd, grp = first[ok], kd[ok], grp[ok].astype(np.int64)
        parts.append((grp, kd, v[f + 1] - v[f], v[f + kd - 1] - v[f]))
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, empty.copy(), np.zeros(0)
    grp, kd, low, high = (np.concatenate(c) for c in zip(*parts, strict=True))
    full = kd == k
    beta = pooled_tail_index(low[full], high[full], k)
    return (*direction_ends(s.edges, grp), high * tail_factor(kd, beta))


def receive_excess(
    n_nodes: int, s: Summary, slope: F64, k: int = RX_K, block: int = 1 << 20
) -> F64:
    """Per NIC, how far its best incoming samples sit above the delay floor (ns): the
    interquartile mean (`_node_midmean`) of `direction_excess` over the NIC's incoming
    directions. With hardware stamps taken at the wire a NIC's own egress queue is not
    measured, so the queueing its access link leaves in the envelopes is on the receive side
    only, and it inflates every delay *into* the NIC alike: the NIC's offset comes out high by
    half of it (a node offset that loops cannot see). NaN for NICs with no direction of 3
    samples. Raises ValueError as `direction_excess`."""
    _, dst, val = direction_excess(s, slope, k, block)
    return _node_midmean(n_nodes, dst, val)


def split_excess(
    n_nodes: int, src: I64, dst: I64, val: F64, leaf: I64, *, rounds: int = SPLIT_ROUNDS
) -> tuple[F64, F64]:
    """Split per-direction excesses ``val`` (directions ``src -> dst``) into a part per
    receiving NIC and a part per sending NIC's leaf: ``val ~ recv[dst] + send[leaf[src]]``,
    the send part only where the direction leaves the leaf (``leaf[src] != leaf[dst]``).

    Why: with send stamps taken at the wire the first queue a probe can meet is its leaf's
    uplink towards a spine, shared by every NIC of the leaf; the last is the leaf's port
    towards the receiving NIC. A pair offset is biased by half the difference of its two
    directions' excesses, so NIC ``j`` carries ``(recv[j] - send[leaf[j]]) / 2``: the receive
    part alone (`receive_excess`) leaves the leaf's send part, the same for all its NICs and
    as invisible to loop closure. Fitted by backfitting (``rounds`` alternations) with the
    interquartile mean (`_node_midmean`) for both parts, robust to the per-direction
    extrapolations' wild values. Returns (recv per node, NaN where no incoming direction;
    send per leaf index, 0 for a leaf with no outgoing direction). Each part is determined up
    to a constant that can move between them (only the directions inside a leaf pin it, and
    backfitting moves it slowly); ``recv - send[leaf]``, the correction, does not see it.
    Raises ValueError on arrays of different lengths or a leaf index < 0."""
    if not len(src) == len(dst) == len(val):
        raise ValueError("src, dst and val must have one entry per direction")
    n_leaves = int(leaf.max()) + 1 if len(leaf) else 0
    if len(leaf) != n_nodes or (len(leaf) and int(leaf.min()) < 0):
        raise ValueError("leaf must give a leaf index >= 0 for every node")
    out_leaf = leaf[src]
    inter = out_leaf != leaf[dst]
    send = np.zeros(n_leaves)
    recv = np.full(n_nodes, np.nan)
    for _ in range(max(1, rounds)):
        recv = _node_midmean(n_nodes, dst, val - np.where(inter, send[out_leaf], 0.0))
        rest = val - recv[dst]
        part = _node_midmean(n_leaves, out_leaf[inter], rest[inter])
        send = np.where(np.isfinite(part), part, 0.0)
    return recv, send


def _node_midmean(n_nodes: int, node: I64, val: F64) -> F64:
    """Per node the interquartile mean of its values: the mean of those ranked in
    ``[floor(c / 4), c - floor(c / 4))`` of its ``c`` (all of them for ``c < 4``); NaN where
    none. Robust to the few wild per-direction extrapolations like a median, and it averages
    ~15 of a NIC's ~30 instead of reading one or two."""
    order = np.lexsort((val, node))
    node, val = node[order], val[order]
    cnt = np.bincount(node, minlength=n_nodes)
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    rank = np.arange(len(node)) - first[node]
    cut = cnt[node] // 4
    keep = (rank >= cut) & (rank < cnt[node] - cut)
    num = np.bincount(node[keep], minlength=n_nodes)
    tot = np.bincount(node[keep], val[keep], n_nodes)
    return np.where(num > 0, tot / np.maximum(num, 1), np.nan)


def _node_median(n_nodes: int, node: I64, val: F64) -> F64:
    """Per node the median of its values (NaN where none)."""
    order = np.lexsort((val, node))
    node, val = node[order], val[order]
    cnt = np.bincount(node, minlength=n_nodes)
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    has = cnt > 0
    lo = first[has] + (cnt[has] - 1) // 2
    hi = first[has] + cnt[has] // 2
    out = np.full(n_nodes, np.nan)
    out[has] = 0.5 * (val[lo] + val[hi])
    return out


def lowrtt_lines(s: Summary, fraction: float = LINE_FRACTION) -> tuple[F64, F64]:
    """Per edge a least-squares line through the per-exchange offsets ``0.5 (d_fwd - d_rev)``
    of its lowest-RTT ``fraction`` of exchanges against their times: (slope, slope std error),
    NaN where fewer than 3 exchanges or no time spread. At high load the pair envelope is
    touched by two samples whose queueing differs by hundreds of ns, so its slope is off by
    hundreds of ppb; many least-queued exchanges spread over the window pin it far better
    (docs/sync.md, "Drift at high load")."""
    m = len(s.edges)
    n_x = np.bincount(s.x_edge, minlength=m)
    start = np.concatenate([[0], np.cumsum(n_x)[:-1]])
    rank = np.arange(len(s.x_edge)) - start[s.x_edge]
    k = np.clip(np.rint(fraction * s.n_all[0::2]), 1, None).astype(np.int64)
    take = rank < k[s.x_edge]
    e, x, y = s.x_edge[take], s.x_mid[take], s.x_off[take]
    cnt = np.bincount(e, minlength=m).astype(np.float64)
    xm = np.bincount(e, x, m) / np.maximum(cnt, 1.0)
    ym = np.bincount(e, y, m) / np.maximum(cnt, 1.0)
    dx, dy = x - xm[e], y - ym[e]
    sxx = np.bincount(e, dx * dx, m)
    ok = (cnt >= 3) & (sxx > 0)
    sxx = np.where(ok, sxx, 1.0)
    slope = np.bincount(e, dx * dy, m) / sxx
    res = dy - slope[e] * dx
    se = np.sqrt(np.bincount(e, res * res, m) / np.maximum(cnt - 2.0, 1.0) / sxx)
    ok &= np.isfinite(se) & (se > 0)
    return np.where(ok, slope, np.nan), np.where(ok, se, np.nan)


def _node_drift(n_nodes: int, s: Summary, first: WindowSync, ref: int) -> tuple[F64, str]:
    """Node drifts for the second stage from two independent sets of pair slopes: the pair
    envelopes' (first stage) and the lowest-RTT lines' (`lowrtt_lines`), solved together,
    each set weighted by ``1 / scale^2`` with ``scale`` the robust size of what its slopes
    leave around loops (drifts are node properties, so pair slopes must sum to zero around
    every loop). Returns (drift, "envelope") when too few lines exist, else (drift,
    "envelope+lowrtt-line")."""
    fits, edges = first.fits, first.edges
    line, _ = lowrtt_lines(s)
    ok_env, ok_line = fits.ok, np.isfinite(line)
    if ok_line.sum() < len(edges) // 2 or not ok_env.any():
        return first.drift, "envelope"
    ppb = 1e9  # closure scales and weights in ppb: ns over a second
    env, lin = fits.drift[ok_env] * ppb, line[ok_line] * ppb
    env_scale = closure_scale(n_nodes, edges[ok_env], env, ref)
    line_scale = closure_scale(n_nodes, edges[ok_line], lin, ref)
    if not (np.isfinite(env_scale) and np.isfinite(line_scale)):
        return first.drift, "envelope"
    e = np.concatenate([edges[ok_env], edges[ok_line]])
    w = np.concatenate([
        np.full(len(env), 1.0 / max(env_scale, 0.1) ** 2),
        np.full(len(lin), 1.0 / max(line_scale, 0.1) ** 2),
    ])  # fmt: skip
    sol = solve_network(
        n_nodes, e, np.concatenate([env, lin]), w, pin="mean", ref=pick_ref(e, ref),
        loss="huber", flag_min_ns=np.inf,
    )  # fmt: skip
    drift = np.where(sol.known & first.known, sol.offset_ns / ppb, np.nan)
    return drift, "envelope+lowrtt-line"


def queueing_bound(n_nodes: int, s: Summary, k: int = 3) -> F64:
    """Per node, an estimate from the data of the queueing bias its offset may carry (ns).

    The envelope (and the lowest-RTT exchange) of a pair sits above the delay floor by the
    queueing its best samples still met; half of the excess of the lowest RTT over the RTT
    floor bounds the offset error of both (each direction's minimum is at most that
    exchange's delay in that direction). The RTT floor is extrapolated from the lower tail:
    with a density at the floor, the lowest order statistics are evenly spaced, so the
    lowest RTT's excess is about one spacing, ``(r_k - r_1) / (k - 1)``. Queueing that
    differs by direction on a NIC's own access link acts on every pair of the NIC alike (a
    node offset that loops cannot see), so the node's figure is the median over its edges
    of half that spacing. NaN for nodes without an edge of at least ``k`` exchanges. Raises
    ValueError for ``k < 2``.
    """
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    m = len(s.edges)
    n_x = np.bincount(s.x_edge, minlength=m)
    start = np.concatenate([[0], np.cumsum(n_x)[:-1]])
    ok = n_x >= k
    st = start[ok]
    beta = (s.x_rtt[st + k - 1] - s.x_rtt[st]) / (2.0 * (k - 1))
    node = np.concatenate([s.edges[ok, 0], s.edges[ok, 1]])
    return _node_median(n_nodes, node, np.concatenate([beta, beta]))
