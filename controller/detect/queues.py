"""Per-hop queueing from one-way delays: additive tomography on medians.

Queueing adds along a path: a probe's queueing delay (its one-way delay over its path's
propagation baseline, `controller.detect.delay`) is the sum of the waits at the hops it
crossed. On a busy fabric every hop queues a little, so a path's delay is over any fixed
threshold although no hop is contended, and a threshold relative to the batch (median + k
MAD, the slow tier's) rises with the load until a hot hop's queue hides under it. This module
estimates the *typical* wait of every directed hop instead, ``q[h]``, the value that makes
``excess[m] ~ sum(q[h] for h in path(m))`` in the least-absolute-deviation sense:

- block coordinate descent over *hop classes* (the tier of the hop's lower end and its
  direction: NIC up, leaf down to a NIC, leaf up, spine down to a leaf, ...). A path crosses
  each class at most once, so the hops of one class share no measurement and are solved
  together exactly: for each hop of the class, ``q[h] = max(0, median over its measurements
  of (excess[m] - sum of the other hops' q))``;
- per-hop medians from a histogram of those residuals (``bin_ns`` wide up to 10 µs, 5 %
  wider each beyond, up to 1 ms; one ``np.bincount`` per class: no sort), interpolated
  inside the median's bin; a median past 10 µs (a hot hop: few) is then taken exactly from
  its residuals, since a 5 % bin read as uniform misplaces a narrow standing queue by up to
  its width (100 µs of a 2 ms queue) and the last bin holds every longer wait (a 6 ms queue
  read as 1 ms), and the hop's neighbours would explain the rest;
- ``sweeps`` passes over the classes, started from the previous window's estimate.

A median, not a mean: incast bursts and rare long waits hit a minority of a hop's probes and
do not move it; a standing queue does. A hop with at least ``min_samples`` measurements is
*contended* when its estimate, less ``z`` standard errors of its median (from the spread of
its residuals and its count: a hop of a small fabric has tens of measurements a window), is
over its class's threshold (below), which is robust to what every hop of a class carries
alike (software-stamp jitter on the NIC hops, a clock error common to all): it uses the
class median and the MAD of the hops at or under it (contention only adds).

**Is the queue the hop's?** The sweeps solve one class at a time, so two hops that most of
each other's measurements cross together (a spine uplink and the spine's down-link to the one
leaf whose delays the window holds most of, when another leaf's NICs' clocks are not trusted)
split their shared queue by where the warm start put it: the few delays that tell them apart
are outvoted in both medians, a fixed point of the sweeps but not of their least absolute
deviation. Between sweeps, `_separate` moves queue between each hop over half the contention
level and each *partner* (a hop crossed by more than half of its measurements) to the split
their *separating* delays (each one's delays that avoid the other) fit best. And a hop over
its threshold is not contended (`_unplaced`) where the window cannot split it from a partner
(fewer than ``min_samples`` separating delays on the two sides together), or where its own
separating delays sit under its estimate more often than a sign test allows (one-sided, at
the ``z`` level) and, judged on them alone (median less ``z`` standard errors), do not clear
its threshold: delays sent at different points of a queue that grew inside the window fit no
split, and those that avoid the partner are the ones that show whether the hop queues. Fewer
than ~6 of its own reject nothing (its partner's may then place it). The slow tier, whose
cover weighs each hop's clean delays against it, judges an unplaced pair alone.

What one-way delays cannot place: every path crosses one hop of class ``2t`` (up from tier
t) exactly when it crosses one of class ``2t + 1`` (down to tier t), so adding a constant to
every hop of one and taking it from every hop of the other explains the same delays. A queue
common to a whole tier is therefore read as shared half and half between the two directions
(the threshold is placed on that gauge: ``class median + max(contention_ns - level, noise_k x
MAD, contention_ns / 2)``, ``level`` the mean of the two classes' medians); a link's two
directions together are gauge-free and measured (`controller.detect.congestion`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric, NodeKind

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
_TIER = {NodeKind.LEAF: 1, NodeKind.SPINE: 2, NodeKind.SUPERSPINE: 3}


@dataclass(frozen=True, slots=True)
class QueueParams:
    """See the module docstring. Residuals are binned ``bin_ns`` wide from ``lo_ns`` to
    ``fine_ns``, then in bins 5 % wider each up to ``hi_ns`` (values outside fall in the end
    bins). ``z``: standard errors of a hop's median by which it must clear the threshold.
    ``windows``: detection windows whose delays one estimate reads at most (the brain's: the
    window judged, and the one before it while it holds fewer than ``enough`` delays: a
    small fabric's hops get tens of delays a window, and two windows halve the sampling
    noise of their medians at the price of 100 ms more to see a queue end). ``warmup_ns``:
    for this long after the first judged delays the brain reports no contention from the
    estimate and treats every link's queue as unknown (`controller.brain.Brain._warming`)."""

    contention_ns: float = 1500.0
    noise_k: float = 2.0
    z: float = 2.0
    min_samples: int = 8
    sweeps: int = 2
    bin_ns: float = 100.0
    lo_ns: float = -1000.0
    fine_ns: float = 10_000.0
    hi_ns: float = 1_000_000.0
    windows: int = 2
    enough: int = 150_000
    warmup_ns: int = 3_000_000_000

    def __post_init__(self) -> None:
        if self.bin_ns <= 0 or not self.lo_ns < self.fine_ns < self.hi_ns:
            raise ValueError("bin_ns must be > 0 and lo_ns < fine_ns < hi_ns")
        if self.sweeps < 1 or self.windows < 1 or self.z < 0:
            raise ValueError("sweeps and windows must be >= 1, z >= 0")

    def edges(self) -> F64:
        """Return the histogram's bin edges (ns): ``bin_ns`` wide up to ``fine_ns``, then 5 %
        wider each (`bin_of` numbers them)."""
        n_fine = int(np.ceil((self.fine_ns - self.lo_ns) / self.bin_ns))
        fine = self.lo_ns + self.bin_ns * np.arange(n_fine)
        n = int(np.ceil(np.log(self.hi_ns / self.fine_ns) / np.log(1.05)))
        return np.concatenate([fine, self.fine_ns * 1.05 ** np.arange(n + 1)])

    def bin_of(self, r: F64) -> I64:
        """Return the bin of each value in `edges` (by arithmetic, not a search; values
        outside fall in the end bins)."""
        n_fine = int(np.ceil((self.fine_ns - self.lo_ns) / self.bin_ns))
        n_geo = int(np.ceil(np.log(self.hi_ns / self.fine_ns) / np.log(1.05)))
        b = r - self.lo_ns
        np.divide(b, self.bin_ns, out=b)
        np.floor(b, out=b)
        wide = np.flatnonzero(~(r < self.fine_ns))  # the few past fine_ns (and NaN): by log
        if len(wide):
            with np.errstate(divide="ignore", invalid="ignore"):
                b[wide] = n_fine + np.floor(np.log(r[wide] / self.fine_ns) / np.log(1.05))
        np.clip(b, 0, n_fine + n_geo - 1, out=b)
        return b.astype(np.int64)


def hop_classes(fabric: Fabric) -> npt.NDArray[np.int8]:
    """Return per directed hop its class: 2 x the tier of the link's lower end (NIC 0, leaf
    1, spine 2, super-spine 3) + 1 if the hop goes down. A path crosses a class at most once."""
    kind = {n.id: n.kind for n in fabric.nodes}
    out = np.zeros(fabric.n_hops, dtype=np.int8)
    for lk in fabric.links:
        tier = _TIER.get(kind.get(lk.lower, NodeKind.HOST), 0)
        out[2 * lk.index] = 2 * tier
        out[2 * lk.index + 1] = 2 * tier + 1
    return out


def hop_ends(fabric: Fabric) -> I64:
    """Return per directed hop the (lower, upper) end of its link as node numbers (each id
    of a link end numbered once), for `estimate_queues`'s lift."""
    ids = {
        x: k for k, x in enumerate(sorted({e for lk in fabric.links for e in (lk.lower, lk.upper)}))
    }
    out = np.zeros((fabric.n_hops, 2), np.int64)
    for lk in fabric.links:
        out[2 * lk.index] = out[2 * lk.index + 1] = (ids[lk.lower], ids[lk.upper])
    return out


@dataclass(frozen=True, eq=False)
class QueueEstimate:
    """Per directed hop: typical queueing ``queue_ns`` (NaN where fewer than ``min_samples``
    measurements crossed it), ``samples``, the standard error of that median ``stderr_ns``
    and the contention ``threshold_ns`` of its class (raised on kernel-stamped hops:
    `kernel_floor`); ``z`` (`QueueParams.z`); ``jitter_ns``: the spread of the
    kernel-stamped delays the thresholds were raised by (NaN: none were); ``unplaced``: hops
    over their threshold whose queue the delays avoiding a partner hop do not show
    (`_unplaced`; None: none)."""

    queue_ns: F64
    samples: I64
    stderr_ns: F64
    threshold_ns: F64
    z: float = 2.0
    jitter_ns: float = float("nan")
    unplaced: npt.NDArray[np.bool_] | None = None

    def over(self) -> npt.NDArray[np.bool_]:
        """Return per hop whether its estimate is over its class's threshold by ``z``
        standard errors (placed or not)."""
        with np.errstate(invalid="ignore"):
            return np.asarray(self.queue_ns - self.z * self.stderr_ns > self.threshold_ns)

    def placed(self) -> npt.NDArray[np.bool_]:
        """Return per hop whether its queue may be judged on it (not `unplaced`)."""
        if self.unplaced is None:
            return np.ones(len(self.queue_ns), np.bool_)
        return ~self.unplaced

    def contended(self) -> I64:
        """Return the hops whose estimate is over their class's threshold by ``z`` standard
        errors and whose queue is placed on them (the module docstring)."""
        return np.flatnonzero(self.over() & self.placed()).astype(np.int64)


def _group_quantiles(
    g: I64, r: F64, n_groups: int, p: QueueParams, edges: F64, qs: tuple[float, ...]
) -> F64:
    """Return per group (0..n_groups-1) the quantiles ``qs`` of ``r`` read from a histogram
    over ``edges`` (`QueueParams.edges`; linear inside a bin), shape (n_groups, len(qs)); NaN
    rows: empty."""
    return _cell_quantiles(g * (len(edges) - 1), r, n_groups, p, edges, qs)


def _cell_quantiles(
    cell: I64,
    r: F64,
    n_groups: int,
    p: QueueParams,
    edges: F64,
    qs: tuple[float, ...],
    n_out: I64 | None = None,
) -> F64:
    """`_group_quantiles` with each value's group given as its row's first cell (group x
    bins); ``n_out``, when given, receives each group's count of values."""
    nb = len(edges) - 1
    b = p.bin_of(r)
    b += cell
    counts = np.bincount(b, minlength=n_groups * nb).reshape(n_groups, nb)
    cum = np.cumsum(counts, axis=1)
    n = cum[:, -1]
    if n_out is not None:
        n_out[:] = n
    rows = np.arange(n_groups)
    out = np.full((n_groups, len(qs)), np.nan)
    for j, q in enumerate(qs):
        want = n * q
        k = np.argmax(cum >= want[:, None], axis=1)
        below = np.where(k > 0, cum[rows, np.maximum(k - 1, 0)], 0)
        frac = np.clip((want - below) / np.maximum(counts[rows, k], 1), 0.0, 1.0)
        val = edges[k] + frac * (edges[k + 1] - edges[k])
        out[:, j] = np.where(n > 0, val, np.nan)
    return out


def class_table(hops: I32, hop_class: npt.NDArray[np.int8]) -> I32:
    """Return per path (rows of ``hops``: directed hop ids, -1 padded) its hop of each class,
    shape (paths, classes), -1 where it crosses none (a path crosses a class at most once)."""
    n_cls = int(hop_class.max()) + 1 if len(hop_class) else 0
    out = np.full((len(hops), n_cls), -1, np.int32)
    for c in range(hops.shape[1]):  # a column at a time: no 2-d nonzero; later hops land later
        col = hops[:, c]
        rows = np.flatnonzero(col >= 0)
        hop = col[rows]
        out[rows, hop_class[hop]] = hop
    return out


def estimate_queues(  # noqa: PLR0913 (the brain passes its tables; tests the first five)
    path: I64,
    excess: F64,
    classes: I32,
    hop_class: npt.NDArray[np.int8],
    params: QueueParams,
    warm: F64 | None = None,
    aliases: Sequence[tuple[int, ...]] = (),
    sw: npt.NDArray[np.bool_] | None = None,
    hop_ends: I64 | None = None,
) -> QueueEstimate:
    """Return the per-hop queueing that explains ``excess`` (one-way delay over the path's
    baseline, ns, finite) of measurements on paths ``path`` (numbers into ``classes``, each
    path's hop per class: `class_table`); ``hop_class`` per hop (`hop_classes`); ``warm``: a
    previous estimate to start from (NaN = 0); ``aliases``: groups of hops every path crosses
    together (`controller.detect.paths.alias_groups` with ``directed``), whose queues no
    delay splits: each group's total is put on its first hop, as the slow tier's cover picks
    the lowest index among equals; ``sw``: which measurements are kernel-stamped (None:
    none), whose hops' thresholds `kernel_floor` raises; ``hop_ends``: per hop its link's
    (lower, upper) node (`hop_ends`), for the lift between sweeps (`_lift`; None: no lift)."""
    n_hops = len(hop_class)
    edges = params.edges()
    q = np.zeros(n_hops) if warm is None else np.nan_to_num(np.maximum(warm, 0.0), nan=0.0)
    q = q.copy()
    iqr = np.full(n_hops, np.nan)
    thr = np.full(n_hops, params.contention_ns)
    samples = np.zeros(n_hops, np.int64)
    sw = np.zeros(len(excess), np.bool_) if sw is None else np.asarray(sw, np.bool_)
    if not len(excess):
        return QueueEstimate(np.full(n_hops, np.nan), samples, iqr, thr, params.z)
    path = np.asarray(path, np.int32 if len(classes) < 2**31 else np.int64)
    plan = _plan(path, excess, classes, hop_class, len(edges) - 1)
    crossing = _Crossings(path, classes, hop_class, aliases)
    along = _along(q, classes)
    for sweep in range(params.sweeps):
        last = sweep == params.sweeps - 1
        for c, pth, ex, g_path, cell, members in plan:
            others = along[:c].sum(axis=0) + along[c + 1 :].sum(axis=0)
            r = ex - others[pth]
            want = (0.5, 0.25, 0.75) if last else (0.5,)
            n_cross = np.zeros(len(members), np.int64) if sweep == 0 else None
            qs = _cell_quantiles(cell, r, len(members), params, edges, want, n_cross)
            if n_cross is not None:  # every delay lands in a bin: its hop's measurements
                samples[members] = n_cross
            if (qs[:, 0] > params.fine_ns).any():  # a few hot hops: exact medians
                _exact_large_medians(g_path[pth], r, qs[:, 0], params.fine_ns)
            seen = np.isfinite(qs[:, 0])  # a class member no measurement crossed keeps its q
            q[members] = np.where(
                seen, np.maximum(np.nan_to_num(qs[:, 0], nan=0.0), 0.0), q[members]
            )
            along[c] = _along(q, classes[:, c : c + 1])[0]
            if last:
                iqr[members] = qs[:, 2] - qs[:, 1]
        if (
            not last
            and hop_ends is not None
            and _lift(q, excess, path, classes, hop_class, hop_ends, samples > 0, params)
        ):
            along = _along(q, classes)
        if not last and _separate(q, excess, crossing, params.contention_ns / 2, params.z):
            along = _along(q, classes)
    for grp in aliases:
        q[grp[0]] = q[list(grp)].sum()
        q[list(grp[1:])] = 0.0
    est = np.where(samples >= params.min_samples, q, np.nan)
    stderr = median_stderr(iqr, np.maximum(samples, 1))
    med: dict[int, float] = {}
    mad: dict[int, float] = {}
    for c in (int(x) for x in np.unique(hop_class)):
        v = est[(hop_class == c) & np.isfinite(est)]
        if len(v) >= 4:
            med[c] = float(np.median(v))
            # the spread of the hops at or under the median: contention only adds, so the
            # contended hops of a small fabric (3 of a leaf's 4 uplinks while the 4th is
            # down) do not widen it
            mad[c] = 1.4826 * float(np.median(med[c] - v[v <= med[c]]))
    for c, m in med.items():
        # a queue common to a class and its reverse (c ^ 1) is placed half on each: one-way
        # delays cannot split it (the module docstring)
        level = (m + med[c ^ 1]) / 2 if c ^ 1 in med else m
        margin = max(
            params.contention_ns - level, params.noise_k * mad[c], params.contention_ns / 2
        )
        thr[hop_class == c] = m + margin
    jitter = float("nan")
    if np.count_nonzero(sw) >= params.min_samples:
        residual = excess[sw] - along.sum(axis=0)[path[sw]]
        floor, jitter = kernel_floor(excess[sw], residual, hop_class, med, params)
        kernel_samples = _crossings(path[sw], classes, n_hops)
        kernel = 2 * kernel_samples > samples  # hops most of whose delays are kernel-stamped
        thr = np.where(kernel, np.fmax(thr, floor), thr)
    with np.errstate(invalid="ignore"):
        over = np.flatnonzero(est - params.z * stderr > thr)
    unplaced = _unplaced(q, thr, over, excess, crossing, params)
    return QueueEstimate(est, samples, stderr, thr, params.z, jitter, unplaced)


class _Crossings:
    """Each hop's measurements and its partners, for `_separate` and `_unplaced`: per class,
    the measurements sorted by their hop of that class (one stable sort, made when a hop of
    the class is first asked for)."""

    def __init__(
        self,
        path: npt.NDArray[np.integer],
        classes: I32,
        hop_class: npt.NDArray[np.int8],
        aliases: Sequence[tuple[int, ...]] = (),
    ) -> None:
        self.path, self.classes, self.hop_class = path, classes, hop_class
        self._sorted: dict[int, tuple[I64, I64]] = {}  # class -> (order, each hop's start)
        self._group = {h: k for k, grp in enumerate(aliases) for h in grp}
        self._partners: dict[int, list[int]] = {}

    def of(self, hop: int) -> I64:
        """Return the measurements (numbers into ``path``) that crossed ``hop``."""
        c = int(self.hop_class[hop])
        if c not in self._sorted:
            col = self.classes[:, c][self.path]
            order = np.argsort(col, kind="stable").astype(np.int64)
            starts = np.searchsorted(col[order], np.arange(len(self.hop_class) + 1))
            self._sorted[c] = (order, starts.astype(np.int64))
        order, starts = self._sorted[c]
        return order[starts[hop] : starts[hop + 1]]

    def partners(self, hop: int, on: I64) -> list[int]:
        """Return the hops crossed by more than half of ``hop``'s measurements ``on`` (its
        `of`), but its aliases (every path crossing one crosses the other: their queue is
        one, put on the group's first hop). Kept per hop: they do not depend on the waits."""
        if hop not in self._partners:
            self._partners[hop] = self._find_partners(hop, on)
        return self._partners[hop]

    def _find_partners(self, hop: int, on: I64) -> list[int]:
        rows = self.classes[self.path[on]]
        hops, counts = np.unique(rows[rows >= 0], return_counts=True)  # hop ids name classes
        group = self._group.get(hop, -1)
        return [
            b
            for b in hops[2 * counts > len(on)].tolist()
            if b != hop and (group < 0 or self._group.get(b, -2) != group)
        ]

    def separating(self, a: int, b: int, on: I64) -> I64:
        """Return those of ``a``'s measurements ``on`` that avoid ``b``."""
        keep = self.classes[self.path[on], int(self.hop_class[b])] != b
        return np.asarray(on[keep], np.int64)

    def residual(self, q: F64, excess: F64, hop: int, on: I64) -> F64:
        """Return each measurement's ``excess`` less the waits ``q`` of its path's hops but
        ``hop``."""
        others = _along(q, self.classes[self.path[on]]).sum(axis=0) - q[hop]
        return np.asarray(excess[on] - others, np.float64)


def _separate(q: F64, excess: F64, crossing: _Crossings, level: float, z: float) -> bool:
    """Move, in place, queue between each hop over ``level`` and each partner crossed by more
    than half of its measurements, where their separating delays say the split is off;
    return whether anything moved.

    Taking d from hop a and giving it to its partner b changes only the delays that cross
    one of them: a's that avoid b are predicted d lower, b's that avoid a d higher; the
    delays crossing both do not move. Their least absolute deviation is therefore at d = the
    median of v = {q[a] - r} over a's separating delays and {r - q[b]} over b's (``r`` each
    delay's excess less the other hops' waits), within [-q[b], q[a]]: a step along a
    direction no single hop's median takes, which the sweeps' fixed point of a shared queue
    split by the warm start (the module docstring) is not a fixed point of. The pair moves
    only when the values of v on d's side of 0 are more than a sign test allows (were the
    split right, each would be on either side with probability 1/2) at the one-sided ``z``
    level divided by the number of pairs tested in the call (Bonferroni): a hop's few delays
    in a window shift its split by their noise, and a busy fabric has hundreds of pairs a
    window. Ungated, the simulator at load 0.9 lost 3 of 57 congestion episodes on one seed
    to such moves; at the ``z`` level per pair, a busy hour raised 43 false contentions
    against 35."""
    moved = False
    pairs = [
        (a, b, on)
        for a in sorted(np.flatnonzero(q > level).tolist(), key=lambda h: -q[h])
        if len(on := crossing.of(a))
        for b in crossing.partners(a, on)
    ]
    alpha = normal_tail(z) / max(len(pairs), 1)  # every pair is a test
    for a, b, on in pairs:
        sep_a = crossing.separating(a, b, on)
        sep_b = crossing.separating(b, a, crossing.of(b))
        if not len(sep_a) + len(sep_b):
            continue
        ra = crossing.residual(q, excess, a, sep_a)
        rb = crossing.residual(q, excess, b, sep_b)
        v = np.concatenate([q[a] - ra, rb - q[b]])
        d = min(max(float(np.median(v)), -q[b]), q[a])
        side = int(np.count_nonzero(v > 0 if d > 0 else v < 0))
        if d == 0.0 or sign_tail(int(np.count_nonzero(v)), side) >= alpha:
            continue
        q[a] -= d
        q[b] += d
        moved = True
    return moved


def normal_tail(x: float) -> float:
    """Return P(Z > x) for a standard normal Z."""
    return 0.5 * math.erfc(x / math.sqrt(2))


def median_stderr(iqr: F64 | float, n: I64 | int) -> F64:
    """Return the standard error of a median of ``n`` values whose interquartile range is
    ``iqr``: 1.2533 sigma / sqrt(n), sigma = iqr / 1.349 (a normal's)."""
    return np.asarray(1.2533 * (np.asarray(iqr) / 1.349) / np.sqrt(n), np.float64)


def sign_tail(n: int, k: int) -> float:
    """Return P(X >= k) for X ~ Binomial(n, 1/2): exact up to n = 200, else the normal
    approximation with continuity correction."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if n <= 200:
        return sum(math.comb(n, i) for i in range(k, n + 1)) / 2.0**n
    return normal_tail((k - 0.5 - n / 2) / math.sqrt(n / 4))


def _unplaced(
    q: F64, thr: F64, over: I64, excess: F64, crossing: _Crossings, params: QueueParams
) -> npt.NDArray[np.bool_]:
    """Return per hop whether it is one of the ``over`` hops whose queue is not placed on it
    (the module docstring). For each partner b of hop a (a hop crossed by more than half of
    a's measurements), the *separating* delays are a's that avoid b and b's that avoid a:

    - fewer than ``min_samples`` of them together: the window cannot split the pair's queue;
    - else a's, less the other hops' waits on their paths (``q``), would each be under a's
      estimate with probability 1/2 were it placed right; when more of them are under it than
      a sign test allows at one-sided level ``z``, a is judged on them alone: their median,
      less ``z`` standard errors (the estimate's formula, on their count), must be over a's
      threshold."""
    out = np.zeros(len(q), np.bool_)
    alpha = normal_tail(params.z)
    for a in over.tolist():
        on = crossing.of(a)
        for b in crossing.partners(a, on) if len(on) else []:
            sep_a = crossing.separating(a, b, on)
            n_b = len(crossing.separating(b, a, crossing.of(b)))
            if len(sep_a) + n_b < params.min_samples:
                out[a] = True
                continue
            r = crossing.residual(q, excess, a, sep_a)
            if sign_tail(len(r), int(np.count_nonzero(r < q[a]))) >= alpha:
                continue
            lo, mid, hi = np.percentile(r, (25, 50, 75))
            if not mid - params.z * float(median_stderr(hi - lo, len(r))) > thr[a]:
                out[a] = True
    return out


def _lift(
    q: F64,
    excess: F64,
    path: I64,
    classes: I32,
    hop_class: npt.NDArray[np.int8],
    ends: I64,
    seen: npt.NDArray[np.bool_],
    params: QueueParams,
) -> bool:
    """Move, in place, what all the seen hops into (and out of) a switch from below share onto
    its hops above, as far as the paths that turn at that switch show none of it; return
    whether anything moved.

    Every path that goes up from tier t through switch X (class 2t, into X) and on up (class
    2t + 2, out of X) crosses one hop of each, so adding d to every hop above X and taking d
    from every hop below it changes only the paths that turn at X: up into X and down out of
    it (class 2t + 1) with no hop above (the paths inside a leaf; a path whose middle hops are
    unknown, a flow with no learnt path, is not one of them). When a leaf's every uplink
    queues, its NICs' paths but those inside the leaf cross one, and the per-hop medians, NIC
    hops first, can settle with the queue on the NIC hops: a fixed point of the sweeps, not of
    their least absolute deviation. The turning paths decide: d is the median of their
    over-prediction, within what every seen hop below can give; the same down (class 2t + 1
    out of X below, 2t + 3 into X from above). Their absolute deviation cannot grow."""
    moved = False
    n_cls = classes.shape[1]
    edges = params.edges()
    for lo_up in range(0, n_cls - 2, 2):
        up, dn, hi = classes[:, lo_up], classes[:, lo_up + 1], classes[:, lo_up + 2]
        turns = (up >= 0) & (dn >= 0) & (hi < 0)  # per path (the table, not the delays)
        turns[turns] = ends[up[turns], 1] == ends[dn[turns], 1]  # up into X, down out of X
        if not turns.any():
            continue
        node = np.where(turns, ends[np.maximum(up, 0), 1], -1)  # per path: its X
        # d is at most the least wait of X's hops below: an X one of whose seen hops below
        # (either way) waits 0 moves nothing, and its delays are not read
        below = {c: np.flatnonzero((hop_class == c) & seen) for c in (lo_up, lo_up + 1)}
        can = np.zeros(int(ends.max()) + 2, bool)  # per node (the last: no node)
        for hops in below.values():
            least = np.full(len(can), np.inf)
            np.minimum.at(least, ends[hops, 1], q[hops])
            can |= np.isfinite(least) & (least > 0)
        turns &= can[node]
        if not turns.any():
            continue
        turning = np.zeros(len(can), bool)
        turning[node[turns]] = True
        xs = np.flatnonzero(turning)  # the switches whose turning delays are read
        xr = np.searchsorted(xs, node)  # per path: its X's number (valid where it turns)
        g = np.where(turns, xr, -1)[path]
        on = np.flatnonzero(g >= 0)
        if not len(on):
            continue
        g, tp, ex = g[on], path[on], excess[on]
        turning_paths = np.flatnonzero(turns)  # the turning paths alone are summed along
        row = np.searchsorted(turning_paths, tp)  # per turning delay: its path's row
        for lo_c in (lo_up, lo_up + 1):  # up into X from below, then down out of X
            # the turning delays' over-prediction, its median per X read as the sweeps read
            # theirs (histogram, exact past fine_ns)
            over = _along(q, classes[turning_paths]).sum(axis=0)[row] - ex
            med = _group_quantiles(g, over, len(xs), params, edges, (0.5,))[:, 0]
            _exact_large_medians(g, over, med, params.fine_ns)
            above = np.flatnonzero(hop_class == lo_c + 2)
            for at, m in zip(xs.tolist(), med.tolist(), strict=True):
                mine = below[lo_c][ends[below[lo_c], 1] == at]
                if not len(mine) or not m > 0:
                    continue
                d = min(m, float(q[mine].min()))
                if d <= 0:
                    continue
                q[mine] -= d
                q[above[ends[above, 0] == at]] += d
                moved = True
    return moved


def _along(q: F64, classes: I32) -> F64:
    """Return per class and path (rows of ``classes``) the wait ``q`` of the path's hop of
    that class (0 where it crosses none), shape (classes, paths): the sum along a path is
    a property of the path, not of each measurement on it."""
    t = classes.T
    return np.where(t >= 0, q[np.maximum(t, 0)], 0.0)


def _plan(
    path: npt.NDArray[np.integer],
    excess: F64,
    classes: I32,
    hop_class: npt.NDArray[np.int8],
    n_bins: int,
) -> list[tuple[int, npt.NDArray[np.integer], F64, I64, I64, I64]]:
    """Return per class that some measurement crosses: the class, the paths and delays of
    the measurements crossing it, per path the number of its hop among the class's hops
    (its histogram row; -1: none), per measurement its row's first cell (x ``n_bins``), and
    the class's hops (each hop's count of measurements is its histogram's)."""
    n_hops, n_paths = len(hop_class), len(classes)
    used = np.bincount(path, minlength=n_paths) > 0
    plan = []
    for c in range(classes.shape[1]):
        col = classes[:, c]
        members = np.flatnonzero(hop_class == c)
        rank = np.full(n_hops + 1, -1, np.int64)  # the last: no hop of this class
        rank[members] = np.arange(len(members))
        g_path = rank[col]  # per path its hop's number in the class, -1: none
        crossing = g_path >= 0
        cross_used = crossing[used]
        if not cross_used.any():
            continue
        if cross_used.all():  # every measurement crosses a hop of this class
            pth, ex = path, excess
        else:
            on = np.flatnonzero(crossing[path])
            pth, ex = path[on], excess[on]
        cell = (g_path * n_bins).astype(np.int32 if n_hops * n_bins < 2**31 else np.int64)
        plan.append((c, pth, ex, g_path, cell[pth], members))
    return plan


def _crossings(path: npt.NDArray[np.integer], classes: I32, n_hops: int) -> I64:
    """Return per hop how many of the measurements on ``path`` (rows of ``classes``)
    crossed it."""
    per_path = np.bincount(path, minlength=len(classes))
    has = classes >= 0
    weight = np.broadcast_to(per_path[:, None], classes.shape)[has]
    return np.bincount(classes[has], weight, minlength=n_hops).astype(np.int64)


def _exact_large_medians(g: I64, r: F64, med: F64, over_ns: float) -> None:
    """Replace in place each group's histogram median ``med`` that is over ``over_ns`` by the
    exact median of its values of ``r`` (groups ``g``); order-independent."""
    big = np.flatnonzero(med > over_ns)
    if not len(big):
        return
    is_big = np.zeros(len(med), bool)
    is_big[big] = True
    sel = np.flatnonzero(is_big[g])
    order = sel[np.argsort(g[sel], kind="stable")]
    gs = g[order]
    starts = np.searchsorted(gs, big)
    ends = np.searchsorted(gs, big, side="right")
    for k, a, b in zip(big.tolist(), starts.tolist(), ends.tolist(), strict=True):
        med[k] = float(np.median(r[order[a:b]]))


def _quantile(r: F64, p: QueueParams, edges: F64, q: float) -> float:
    """Return the quantile ``q`` of ``r`` from the histogram `estimate_queues` reads medians
    from (order-independent: a fleet's merged measurements give the same)."""
    g = np.zeros(len(r), np.int64)
    return float(_group_quantiles(g, r, 1, p, edges, (q,))[0, 0])


def kernel_floor(
    excess: F64,
    residual: F64,
    hop_class: npt.NDArray[np.int8],
    class_median: dict[int, float],
    params: QueueParams,
) -> tuple[F64, float]:
    """Return per hop the least contention threshold of a hop whose delays are
    kernel-stamped, and the stamps' jitter it is built from (ns).

    A kernel stamp is taken when the host's driver and kernel get to the packet, later than
    the wire by a per-stamp, per-host amount (interrupt coalescing, scheduling); a delay
    carries the receiver's lateness less the sender's. That lateness adds to exactly the
    delays a queue on the host's own NIC link adds to, and the clock solve on such stamps
    places each NIC's clock only about as well, so a NIC hop's estimate carries its host's
    typical lateness and clock error, which differ from host to host by about the per-probe
    spread of the lateness. ``jitter``: that spread, measured in the window as the robust
    standard deviation (1.4826 MAD) of the kernel-stamped ``residual`` (each delay's queueing
    ``excess`` less the sum of the estimate's waits on its path: what no hop's typical wait
    explains). A kernel-stamped hop is contended only ``noise_k x jitter`` over its
    reference: its class's median where the class has one (`estimate_queues`), else the
    median queueing of the kernel-stamped delays (all of a path's lateness, the level a hop
    of a class too small for a median may carry with no queue of its own)."""
    edges = params.edges()
    mid = _quantile(residual, params, edges, 0.5)
    jitter = 1.4826 * _quantile(np.abs(residual - mid), params, edges, 0.5)
    level = _quantile(excess, params, edges, 0.5)
    ref = np.full(len(hop_class), level)
    for c, m in class_median.items():
        ref[hop_class == c] = m
    return ref + params.noise_k * jitter, jitter
