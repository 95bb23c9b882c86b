"""Round trips that clear hops: a bound on their queues that needs no clock.

A probe's round trip, (t4 - t1) - (t3 - t2), differences each NIC's stamps on its own clock,
so no clock model enters it. Over the forward and reply paths' baselines, its excess is the
sum of the waits on both paths' hops at that probe's instants; waits are >= 0, so each hop of
either path waited at most that much. A hop's queue is its egress port's, seen by every probe
that crosses it, so the round trips of any one *round path* (a forward and a reply path) are
samples of each of its hops' waits, bounded from above (pointwise dominance): when
significantly fewer than half of them exceed a hop's cut, that hop's median wait is under
it, and the hop holds no standing queue over the cut: the round path *clears* it.

The test per round path and hop, where the round path holds at least ``min_count`` round
trips, is a one-sided sign test at level ``alpha`` divided by the (round path, hop) tests of
the window (Bonferroni): a hop whose waits exceed its cut half the time or more is cleared
by no round path with probability at least 1 - ``alpha``, however many cross it.

The same sum catches a clock error in a probe the clocks are trusted on: an error shifts its
two one-way delays by the same amount in opposite directions and leaves their sum alone, so
a delay well under its path's baseline whose round trip did not drop with it is a clock off
(a step not yet found between solves), not a shorter path (`clock_split`): its two delays are
withheld before they are judged or lower a baseline (a baseline set low by a stepped clock
would show its path queued for as long as the baseline takes to creep back up).

Where both clocks are trusted finely the one-way delays hold everything the round trip does;
the round trips are kept for the other probes only (`controller.detect.delay.DelayWindow`):
a NIC whose clock is withheld still tells, through its round trips, which hops did not queue
(docs/detection.md, "Round trips clear hops"). Pure: arrays in, arrays out.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from controller.detect.queues import sign_tail

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]


def cleared(
    fwd: I64,
    rev: I64,
    excess: F64,
    path_hops: I32,
    cut_ns: F64,
    *,
    min_count: int,
    alpha: float,
) -> Bool:
    """Return per directed hop (``len(cut_ns)``) whether a round path clears it (module
    docstring). ``fwd``, ``rev``: each round trip's forward and reply path (rows of
    ``path_hops``, (P, H) directed hop ids, -1 padded); ``excess``: its round trip over both
    paths' baselines (ns); ``cut_ns``: per hop (NaN: a hop not tested). Raises ValueError
    on columns of different lengths, a path outside ``path_hops`` or a hop outside
    ``cut_ns``."""
    n_hops = len(cut_ns)
    out = np.zeros(n_hops, np.bool_)
    if not len(fwd) == len(rev) == len(excess):
        raise ValueError("forward paths, reply paths and excess must have one length")
    if not len(fwd):
        return out
    if min(int(fwd.min()), int(rev.min())) < 0 or max(int(fwd.max()), int(rev.max())) >= len(
        path_hops
    ):
        raise ValueError("a round trip names a path outside path_hops")
    if path_hops.size and int(path_hops.max()) >= n_hops:
        raise ValueError("a path names a hop outside cut_ns")
    key = fwd.astype(np.int64) << 32 | rev.astype(np.int64)
    keys, first, group = np.unique(key, return_index=True, return_inverse=True)
    rows = np.concatenate([path_hops[fwd[first]], path_hops[rev[first]]], axis=1)  # (G, K)
    count = np.bincount(group, minlength=len(keys))
    cuts = np.where(rows >= 0, cut_ns[np.maximum(rows, 0)], np.nan)  # (G, K)
    # per round path and hop slot: its round trips at or under the slot's cut
    with np.errstate(invalid="ignore"):
        at_or_under = excess[:, None] <= cuts[group]  # (n, K)
    width = rows.shape[1]
    slot = (group[:, None] * width + np.arange(width)[None, :])[at_or_under]
    under = np.bincount(slot, minlength=len(keys) * width).reshape(len(keys), width)
    tested = (count >= min_count)[:, None] & np.isfinite(cuts)
    if not tested.any():
        return out
    level = alpha / int(tested.sum())
    maybe = np.argwhere(tested & (2 * under > count[:, None]))  # the others cannot pass
    for g, k in maybe:
        if sign_tail(int(count[g]), int(under[g, k])) <= level:
            out[rows[g, k]] = True
    return out


def clock_split(excess_fwd: F64, excess_rev: F64, tol_ns: float) -> Bool:
    """Return per probe whether its one-way delays split its round trip by a clock error:
    one delay more than ``tol_ns`` under its path's baseline (``excess_*``: delay less
    baseline, ns; NaN: unknown) while their sum, the round trip over both baselines, stays
    over half that drop (a shorter path or a baseline crept up lowers the round trip too;
    a clock error leaves it alone). Raises ValueError on columns of different lengths."""
    if len(excess_fwd) != len(excess_rev):
        raise ValueError("forward and reply excess must have one length")
    with np.errstate(invalid="ignore"):
        low = np.fmin(excess_fwd, excess_rev)
        split = (low < -tol_ns) & (excess_fwd + excess_rev > low / 2)
    return np.asarray(split & np.isfinite(excess_fwd) & np.isfinite(excess_rev), np.bool_)
