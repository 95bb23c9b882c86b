"""How much queueing a window's best samples still carry, read from its summary.

With hardware send stamps taken at the wire, the queueing left in a NIC's best incoming
samples (its leaf's port towards it) and in the best samples leaving a leaf (the leaf's
uplink) shifts every pair offset of the NIC alike: a node offset that loop closure cannot see
(docs/sync.md, "What is left"). `direction_excess` reads, per edge direction, how far its best
sample sits above the delay floor (extrapolated from the lowest samples with a tail index
pooled over the window, `pooled_tail_index` and `tail_factor`); `receive_excess` aggregates it
per receiving NIC and `split_excess` into a receive part per NIC and a send part per leaf.
`receive_luck` is what no reading of a window can remove: the luck of each direction's best
sample. `queueing_bound` is a data-only size of that bias before the correction. Pure: arrays
in, arrays out.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln

from sync.runs import Runs, compact, runs_of, sorted_rows
from sync.summary import RX_K, Summary

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
# a direction reads at most 1 in RX_SAMPLES_PER_K of its samples: the tail model is near-floor
RX_SAMPLES_PER_K = 20
SPLIT_ROUNDS = 8  # backfitting rounds of `split_excess` (the parts settle in 3-4)
BETA_MIN = 1 / 3  # the steepest rise from the floor `pooled_tail_index` allows (index 3)
# `split_sides` uses the NICs' own send parts only where they are at least this share signal:
# measured 0-0.28 with send stamps at the wire, 0.75-0.88 with CQE send stamps (load 0.9)
SEND_SHRINK_MIN = 0.5


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
    s: Summary, slope: F64, k: int = RX_K, block: int = 1 << 20, lost: I64 | None = None
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
    ``lost`` (per direction group): how many of its stored lowest values were left out as bad
    stamps (`sync.badstamps.without_bad`); the stored layers then hold only its ``k - lost``
    lowest genuine values for sure, and it reads no more. Raises ValueError if ``k`` is below
    3 or exceeds the stored layers."""
    src, dst, val, _ = _readings(s, slope, k, block, lost)
    return src, dst, val


def _readings(
    s: Summary, slope: F64, k: int, block: int, lost: I64 | None = None
) -> tuple[I64, I64, F64, float]:
    """`direction_excess` and the pooled ``beta`` it used (1 when no direction has ``k``
    samples). Raises ValueError as `direction_excess`."""
    low = direction_lows(s, slope, k, block, lost)
    return readings(s.edges, low, k)


class DirectionLows(NamedTuple):
    """Per edge direction with at least 3 usable samples (`direction_lows`): its group
    (``2 edge + dir``), how many lowest values it reads (``kd``), and ``x2 - x1`` and
    ``x_kd - x1`` of them. Per direction, so edge ranges' lows laid end to end (groups
    shifted by the edges before) are the lows of their union."""

    grp: I64
    kd: I64
    low: F64
    high: F64


def direction_lows(
    s: Summary, slope: F64, k: int = RX_K, block: int = 1 << 20, lost: I64 | None = None
) -> DirectionLows:
    """The per-direction half of `direction_excess` (each direction reads only its own
    points): see there. Raises ValueError as `direction_excess`."""
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
        runs = runs_of(g, presorted=True)  # sorted by group: per group its lowest k values
        low = sorted_rows(runs, v, k)
        grp = runs.keys
        near = np.maximum(s.n_all[grp] // RX_SAMPLES_PER_K, 3)  # the floor's neighbourhood
        kd = np.minimum(np.minimum(runs.counts, k), near)
        if lost is not None:
            kd = np.minimum(kd, k - lost[grp])
        ok = kd >= 3
        low, kd, grp = low[ok], kd[ok], grp[ok]
        rows = np.arange(len(kd))
        parts.append((grp, kd, low[:, 1] - low[:, 0], low[rows, kd - 1] - low[:, 0]))
    if not parts:
        empty = np.zeros(0, np.int64)
        return DirectionLows(empty, empty.copy(), np.zeros(0), np.zeros(0))
    grp, kd, low, high = (np.concatenate(c) for c in zip(*parts, strict=True))
    return DirectionLows(grp, kd, low, high)


def readings(edges: I64, lows: DirectionLows, k: int = RX_K) -> tuple[I64, I64, F64, float]:
    """The window-wide half of `direction_excess` from every direction's `DirectionLows` on
    ``edges``: (sender, receiver, excess ns, the pooled ``beta``; 1 when no direction has
    ``k`` samples). Raises ValueError for ``k < 3``."""
    if not len(lows.grp):
        empty = np.zeros(0, np.int64)
        return empty, empty.copy(), np.zeros(0), 1.0
    full = lows.kd == k
    beta = pooled_tail_index(lows.low[full], lows.high[full], k)
    return (*direction_ends(edges, lows.grp), lows.high * tail_factor(lows.kd, beta), beta)


def receive_excess(
    n_nodes: int, s: Summary, slope: F64, k: int = RX_K, block: int = 1 << 20
) -> F64:
    """Per NIC, how far its best incoming samples sit above the delay floor (ns): the
    interquartile mean (`node_midmean`) of `direction_excess` over the NIC's incoming
    directions. With hardware stamps taken at the wire a NIC's own egress queue is not
    measured, so the queueing its access link leaves in the envelopes is on the receive side
    only, and it inflates every delay *into* the NIC alike: the NIC's offset comes out high by
    half of it (a node offset that loops cannot see). NaN for NICs with no direction of 3
    samples. Raises ValueError as `direction_excess`."""
    _, dst, val = direction_excess(s, slope, k, block)
    return node_midmean(n_nodes, dst, val)


def luck_cv(beta: float) -> float:
    """The coefficient of variation of a direction's best-sample excess in the tail model of
    `tail_factor`: ``x_(1) - F`` is ``c Γ_1^beta`` with ``Γ_1`` a unit exponential, so the
    ratio of its standard deviation to its mean is ``sqrt(Γ(1 + 2 beta) - Γ(1 + beta)^2) /
    Γ(1 + beta)`` (1 for ``beta = 1``, 0.52 for 1/2). Raises ValueError for ``beta`` outside
    (0, 1]."""
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"need beta in (0, 1], got {beta}")
    g1 = math.gamma(1.0 + beta)
    return math.sqrt(math.gamma(1.0 + 2.0 * beta) - g1 * g1) / g1


def receive_luck(n_nodes: int, s: Summary, slope: F64, k: int = RX_K, block: int = 1 << 20) -> F64:
    """Per NIC, the standard deviation (ns) of the offset error that no reading of the window
    can remove: the luck of its incoming directions' best samples. The correction subtracts
    half of what a NIC's best incoming samples are *expected* to carry (`direction_excess`:
    ``c E[Γ_1^beta]`` per direction, from the scale its lowest samples show); what they
    actually carry is ``c Γ_1^beta``, and which sample was luckiest does not show in its
    neighbours (conditioning on the lowest six's shape reduces the error by ~2 %, docs/sync.md
    "The limit of the reading"). So the NIC's offset keeps half of the mean over its ``D``
    incoming directions of ``c (Γ_1^beta - E)``: ``0.5 luck_cv(beta) sqrt(sum val^2) / D`` with
    ``val`` each direction's reading. A model figure, for reports beside the error; the
    reading's own error (its scale is read from six samples per direction) comes on top: with
    the tail index of a load-0.9 window the model puts the correction's whole error at 1.46x
    this, and the simulator's truth gives 1.46x too (docs/sync.md). NaN for NICs with no
    direction of 3 samples. Raises ValueError as `direction_excess`."""
    _, dst, val, beta = _readings(s, slope, k, block)
    cnt = np.bincount(dst, minlength=n_nodes)
    out = 0.5 * luck_cv(beta) * np.sqrt(np.bincount(dst, val * val, n_nodes)) / np.maximum(cnt, 1)
    return np.where(cnt > 0, out, np.nan)


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
    interquartile mean (`node_midmean`) for both parts, robust to the per-direction
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
    by_dst, by_leaf = runs_of(dst), runs_of(out_leaf[inter])  # the same every round
    for _ in range(max(1, rounds)):
        recv = node_midmean(n_nodes, dst, val - np.where(inter, send[out_leaf], 0.0), by_dst)
        rest = val - recv[dst]
        part = node_midmean(n_leaves, out_leaf[inter], rest[inter], by_leaf)
        send = np.where(np.isfinite(part), part, 0.0)
    return recv, send


def split_sides(
    n_nodes: int, src: I64, dst: I64, val: F64, leaf: I64, *, rounds: int = SPLIT_ROUNDS
) -> tuple[F64, F64, float]:
    """Split per-direction excesses into a receive part per NIC and a send part per NIC: its
    leaf's (`split_excess`, on directions that leave the leaf) plus a share ``shrink`` of the
    NIC's own, ``val ~ recv[dst] + send_leaf[leaf[src]] (leaving the leaf) + shrink *
    own[src]``. Returns (recv, send per node ``send_leaf[leaf] + shrink * own``, shrink).

    Why: where send stamps are taken at the wire (port stamps) no queue is the sender's own,
    and what a per-NIC send part fits beyond its leaf's is noise; where they are taken at the
    TX completion (CQE stamps, qpmesh's RDMA path) the sender NIC's own egress queue is in
    every delay out of it, a per-NIC part as large as the receive side's. The estimator is not
    told which: ``own`` is the interquartile mean of what the leaf split leaves in a NIC's
    outgoing directions, and ``shrink`` the empirical-Bayes share ``1 - noise / spread``
    (clipped to [0, 1]) of its spread over NICs that is not the noise of reading it (from the
    same residuals), used only from ``SEND_SHRINK_MIN`` (below it the per-NIC part was noise:
    0.28 at most at the wire, 0.75 at least with CQE stamps, 128 NICs at load 0.9). The three
    parts are then backfitted with the share fixed. Raises ValueError as `split_excess`."""
    recv, send_leaf = split_excess(n_nodes, src, dst, val, leaf, rounds=rounds)
    out_leaf = leaf[src]
    inter = out_leaf != leaf[dst]
    leaf_part = np.where(inter, send_leaf[out_leaf], 0.0)
    rest = val - np.nan_to_num(recv[dst]) - leaf_part
    by_src = runs_of(src)
    own = node_midmean(n_nodes, src, rest, by_src)
    cnt = np.bincount(src, minlength=n_nodes)
    has = (cnt >= 3) & np.isfinite(own)
    if has.sum() < 2:
        return recv, send_leaf[leaf], 0.0
    res = rest - np.nan_to_num(own[src])
    noise = np.bincount(src, res * res, n_nodes) / np.maximum(cnt - 1, 1) / np.maximum(cnt, 1)
    spread = float(np.var(own[has]))
    shrink = float(np.clip(1.0 - np.mean(noise[has]) / max(spread, 1e-12), 0.0, 1.0))
    if shrink < SEND_SHRINK_MIN:
        return recv, send_leaf[leaf], shrink
    own = np.where(has, own, 0.0)
    n_leaves = len(send_leaf)
    by_dst, by_leaf = runs_of(dst), runs_of(out_leaf[inter])
    for _ in range(max(1, rounds)):
        mine = shrink * own[src]
        recv = node_midmean(n_nodes, dst, val - leaf_part - mine, by_dst)
        part = node_midmean(n_leaves, out_leaf[inter], (val - recv[dst] - mine)[inter], by_leaf)
        send_leaf = np.where(np.isfinite(part), part, 0.0)
        leaf_part = np.where(inter, send_leaf[out_leaf], 0.0)
        own = np.nan_to_num(node_midmean(n_nodes, src, val - recv[dst] - leaf_part, by_src))
    return recv, send_leaf[leaf] + shrink * own, shrink


def node_midmean(n_nodes: int, node: I64, val: F64, runs: Runs | None = None) -> F64:
    """Per node the interquartile mean of its values: the mean of those ranked in
    ``[floor(c / 4), c - floor(c / 4))`` of its ``c`` (all of them for ``c < 4``); NaN where
    none. Robust to the few wild per-direction extrapolations like a median, and it averages
    ~15 of a NIC's ~30 instead of reading one or two. ``runs``: `sync.runs.runs_of` ``node``,
    when the caller has it (the same nodes over many calls); the result does not depend on
    it. The kept values are summed in ascending order, one after another."""
    r = runs_of(node) if runs is None else runs
    out = np.full(n_nodes, np.nan)
    if not len(r.counts):
        return out
    if not compact(r):  # a few nodes with far more values than the rest: one sort of all
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
    rows = sorted_rows(r, val)
    col = np.arange(rows.shape[1])[None, :]
    cut = (r.counts // 4)[:, None]
    keep = (col >= cut) & (col < r.counts[:, None] - cut)
    tot = np.cumsum(np.where(keep, rows, 0.0), axis=1)[:, -1]  # in order, as bincount adds
    num = keep.sum(axis=1)
    out[r.keys] = np.where(num > 0, tot / np.maximum(num, 1), np.nan)
    return out


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
