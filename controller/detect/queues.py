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
- per-hop medians from a histogram of those residuals (``bin_ns`` wide, one ``np.bincount``
  per class: no sort), interpolated inside the median's bin;
- ``sweeps`` passes over the classes, started from the previous window's estimate.

A median, not a mean: incast bursts and rare long waits hit a minority of a hop's probes and
do not move it; a standing queue does. A hop is *contended* when its estimate is over
``max(contention_ns, class median + noise_k x MAD)`` of its class (robust to what every hop of
a class carries alike: software-stamp jitter on the NIC hops, a clock error common to all)
with at least ``min_samples`` measurements.

What one-way delays cannot place: every path crosses one hop of class ``2t`` (up from tier
t) exactly when it crosses one of class ``2t + 1`` (down to tier t), so adding a constant to
every hop of one and taking it from every hop of the other explains the same delays. A queue
common to a whole tier is therefore read as shared half and half between the two directions
(the threshold is placed on that gauge: ``class median + max(contention_ns - level, noise_k x
MAD, contention_ns / 2)``, ``level`` the mean of the two classes' medians); a link's two
directions together are gauge-free and measured (`controller.detect.congestion`).
"""

from __future__ import annotations

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
    """See the module docstring. ``windows``: detection windows whose delays one estimate
    reads (the brain's: the window judged and the one before it; two halve the sampling
    noise of a hop's median at the price of 100 ms more to see a queue end)."""

    contention_ns: float = 1500.0
    noise_k: float = 4.0
    min_samples: int = 8
    sweeps: int = 2
    bin_ns: float = 50.0
    lo_ns: float = -2000.0
    hi_ns: float = 20000.0
    windows: int = 2

    def __post_init__(self) -> None:
        if self.bin_ns <= 0 or self.hi_ns <= self.lo_ns or self.sweeps < 1 or self.windows < 1:
            raise ValueError("bin_ns must be > 0, hi_ns > lo_ns, sweeps and windows >= 1")


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


@dataclass(frozen=True, eq=False)
class QueueEstimate:
    """Per directed hop: typical queueing ``queue_ns`` (NaN where fewer than ``min_samples``
    measurements crossed it), ``samples`` and the contention ``threshold_ns`` of its class."""

    queue_ns: F64
    samples: I64
    threshold_ns: F64

    def contended(self) -> I64:
        """Return the hops whose estimate is over their class's threshold."""
        with np.errstate(invalid="ignore"):
            return np.flatnonzero(self.queue_ns > self.threshold_ns).astype(np.int64)


def _group_median(g: I64, r: F64, n_groups: int, p: QueueParams) -> F64:
    """Return per group (0..n_groups-1) the median of ``r`` read from a histogram (NaN: empty)."""
    nb = int(np.ceil((p.hi_ns - p.lo_ns) / p.bin_ns))
    b = np.clip(((r - p.lo_ns) / p.bin_ns).astype(np.int64), 0, nb - 1)
    counts = np.bincount(g * nb + b, minlength=n_groups * nb).reshape(n_groups, nb)
    cum = np.cumsum(counts, axis=1)
    n = cum[:, -1]
    half = n / 2.0
    k = np.argmax(cum >= half[:, None], axis=1)
    rows = np.arange(n_groups)
    below = np.where(k > 0, cum[rows, np.maximum(k - 1, 0)], 0)
    inside = np.maximum(counts[rows, k], 1)
    frac = np.clip((half - below) / inside, 0.0, 1.0)
    med = p.lo_ns + (k + frac) * p.bin_ns
    return np.asarray(np.where(n > 0, med, np.nan), dtype=np.float64)


def estimate_queues(
    hops: I32,
    excess: F64,
    hop_class: npt.NDArray[np.int8],
    params: QueueParams,
    warm: F64 | None = None,
    aliases: Sequence[tuple[int, ...]] = (),
) -> QueueEstimate:
    """Return the per-hop queueing that explains ``excess`` (one-way delay over the path's
    baseline, ns, finite) of measurements crossing ``hops`` ((m, H) directed hop ids, -1
    padded); ``hop_class`` per hop (`hop_classes`); ``warm``: a previous estimate to start
    from (NaN = 0); ``aliases``: groups of hops every path crosses together
    (`controller.detect.paths.alias_groups` with ``directed``), whose queues no delay splits:
    each group's total is put on its first hop, as the slow tier's cover picks the lowest
    index among equals."""
    n_hops = len(hop_class)
    valid = hops >= 0
    h = np.where(valid, hops, 0)
    samples = np.bincount(hops[valid], minlength=n_hops).astype(np.int64)
    q = np.zeros(n_hops) if warm is None else np.nan_to_num(np.maximum(warm, 0.0), nan=0.0)
    q = q.copy()
    thr = np.full(n_hops, params.contention_ns)
    if not len(excess):
        return QueueEstimate(np.full(n_hops, np.nan), samples, thr)
    cls = np.where(valid, hop_class[h], -1)
    # per class: the measurements crossing it, the hop of that class each crossed (a path
    # crosses a class at most once) and the class's hops as dense group numbers
    plan = []
    for c in (int(x) for x in np.unique(cls) if x >= 0):
        hc = np.full(len(excess), -1, np.int64)
        for col in np.flatnonzero((cls == c).any(axis=0)):
            sel = cls[:, col] == c
            hc[sel] = h[sel, col]
        on = np.flatnonzero(hc >= 0)
        members, g = np.unique(hc[on], return_inverse=True)
        plan.append((on, hc[on], g.astype(np.int64), members))
    s = np.where(valid, q[h], 0.0).sum(axis=1)
    for _ in range(params.sweeps):
        for on, hop, g, members in plan:
            r = excess[on] - s[on] + q[hop]
            med = _group_median(g, r, len(members), params)
            new = np.maximum(np.nan_to_num(med, nan=0.0), 0.0)
            s[on] += new[g] - q[hop]
            q[members] = new
    for grp in aliases:
        g = list(grp)
        q[g[0]] = q[g].sum()
        q[g[1:]] = 0.0
    est = np.where(samples >= params.min_samples, q, np.nan)
    med: dict[int, float] = {}
    mad: dict[int, float] = {}
    for c in (int(x) for x in np.unique(hop_class)):
        v = est[(hop_class == c) & np.isfinite(est)]
        if len(v) >= 4:
            med[c] = float(np.median(v))
            mad[c] = 1.4826 * float(np.median(np.abs(v - med[c])))
    for c, m in med.items():
        # a queue common to a class and its reverse (c ^ 1) is placed half on each: one-way
        # delays cannot split it (the module docstring)
        level = (m + med[c ^ 1]) / 2 if c ^ 1 in med else m
        margin = max(
            params.contention_ns - level, params.noise_k * mad[c], params.contention_ns / 2
        )
        thr[hop_class == c] = m + margin
    return QueueEstimate(est, samples, thr)
