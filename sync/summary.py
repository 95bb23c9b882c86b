"""Bounded summaries of one sync window, so a window can be streamed chunk by chunk.

At 10,000 NICs and 50 coded pairs per second per peer a 2 s window holds ~32 M probes; the
hardware-stamp estimators (`sync.summarysolve.sync_summary`) read far less of it:

* per edge direction, the **lower convex hull** of its coded-clean ``(t, d)`` samples (of every
  arrived sample when fewer than ``min_coded`` are clean, as `orient_samples` falls back): the
  envelope ``min(d - m t)`` for any slope ``m`` is attained on the hull, so the max-margin pair
  fit and the fixed-slope envelope refit are the same on the hull as on all samples; and the
  first ``RX_K`` hull layers of all arrived samples (`sync.excess` reads them);
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

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from sync.runs import key_order
from sync.window import RTT_FRACTIONS, EdgeSamples

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
G32 = NDArray[np.int32]  # hull group ids (2 edge + dir): half the bytes of int64
GT = TypeVar("GT", bound=np.integer[Any])
RX_K = 6  # hull layers of all arrived samples kept per direction (`sync.excess` reads them)


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


def _by_group_t_d(g: NDArray[GT], t: F64, d: F64) -> NDArray[np.intp]:
    """``np.lexsort((d, t, g))``, faster: the order by (g, t) (`sync.runs.key_order`), then
    the few runs of equal (g, t) (times are whole ns) ordered by d, each in itself."""
    if not (np.isfinite(t).all() and np.isfinite(d).all()):
        return np.lexsort((d, t, g))
    order = key_order(g, t)
    gs, ts = g[order], t[order]
    tie = (gs[1:] == gs[:-1]) & (ts[1:] == ts[:-1])  # position p + 1 ties with p
    if tie.any():
        member = np.zeros(len(order), dtype=bool)
        member[1:] |= tie
        member[:-1] |= tie
        pos = np.flatnonzero(member)
        run = np.cumsum(np.r_[True, ~tie])[pos]
        order[pos] = order[pos[np.lexsort((d[order[pos]], run))]]
    return order


def lower_hull(g: NDArray[GT], t: F64, d: F64, layers: int = 1) -> tuple[NDArray[GT], F64, F64]:
    """Per group, the vertices of the first ``layers`` lower convex hulls of the points
    ``(t, d)`` (peeled: layer 2 is the hull of what layer 1 left), sorted by (group, t, d).
    Of points with equal t only the lowest is on a layer; collinear points are not vertices.
    A point on no layer has, for every slope m, at least ``layers`` points with ``d - m t``
    at most its own, so the ``layers`` lowest values of ``d - m t`` per group, for any m, are
    among the layers' points; and the layers of the layers of two sets are the layers of
    their union (what `merge` needs). Each layer removes every point on or above the segment
    of its neighbours, repeatedly (such a point is not a vertex of the current set)."""
    order = _by_group_t_d(g, t, d)
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
    order = key_order(edge, rtt)
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


def fit_hulls(s: Summary, min_coded: int) -> tuple[G32, F64, F64, I64]:
    """Per edge direction the points the pair fits read: the clean hull, or the arrived
    envelope where fewer than ``min_coded`` samples are clean (as `orient_samples` falls back).
    Returns group, t, d and the count of samples each direction stands for."""
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
