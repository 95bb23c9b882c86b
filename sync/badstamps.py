"""Gross bad NIC stamps in a window's summary: find them and leave them out.

A NIC stamp is sometimes off by microseconds (docs/simulator.md, "NIC clocks as they are").
A stamp that makes a one-way delay *smaller* is the harmful kind: the sample sits below the
direction's delay floor, where no real sample can be, so it becomes the envelope's minimum,
the lowest of the order statistics the receive-side correction reads, and (every stamp is in
its exchange's round trip once) the lowest-RTT exchange. One such sample moves its pair's
offset by half its error and a NIC's receive reading by more (issue 34: ±1-50 µs at 1e-3 of
stamps took the load-0.9 p99 from 40 to 1,400-2,200 ns). A stamp that makes a delay larger
only adds a high sample, which no estimator here reads.

What gives one away: it is alone. A direction's lowest samples (detrended by the pair's
slope) rise from the floor in spacings of tens to hundreds of ns; a bad one sits a whole
error below the next. `leading_outliers` drops the values under the highest gap, among the
lowest few, that is wider than a microsecond (``OUTLIER_MIN_NS``, the smallest error the
simulator's bad stamps have) and ``OUTLIER_RATIO`` times the spread of the top three of the
lowest six. The microsecond is what keeps genuine minima: on the scale-free ratio alone the
tail model of `sync.excess` would drop 10 % of them at ``β = 1/2`` (`false_drop_rate`), and
at load 0.9 no genuine gap under the next value reaches a microsecond (128 NICs, seeds
101-106: nothing dropped on windows without bad stamps). Errors smaller than that are not
separable from luck, and cost about what a lucky genuine sample would. `without_bad`
applies it to a summary's hull points of all arrived samples (detrended by the pair slopes),
and leaves out the lowest-RTT exchanges with a sample below what is then its direction's
floor; `sync.summarysolve.sync_summary` runs it once its first stage has the slopes (again
with the slopes of the cleaned window, up to three rounds). Measured (load 0.9, 128 NICs,
bad stamps ±1-50 µs at 1e-3, seeds 101-108): p99 40.0 ns against 40.1 without bad stamps,
1,400-2,200 ns before (docs/benchmarks.md).
Pure: arrays in, a summary out.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from numpy.typing import NDArray

from sync.runs import runs_of, sorted_rows
from sync.summary import RX_K, Summary

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
OUTLIER_RATIO = 4.0  # the gap under the lowest value, against the spread of the top three
OUTLIER_MIN_NS = 1000.0  # gaps smaller than this are never called bad
MAX_DROPS = 3  # bad values dropped at most per group
# directions with fewer samples are not read for bad stamps. The live solve keeps ~16 a
# direction and window: there, reading them costs 0.4 ns of the load-0.9 p99 without bad
# stamps and saves 36 ns of it (median over solves; 60 of the mean) with them at 1e-3
# (`python -m testbed.bench_live_sync`, seeds 1-8)
MIN_SAMPLES = 8
# an exchange's sample is timed at its mid-time, off by half its round trip and turnaround
# (a few to tens of µs; TURN_NS allowed) times the pair's slope (tens of ppm at most)
FLOOR_TOL_NS = 2.0
TURN_NS = 20_000.0


def leading_outliers(group: I64, vals: F64, k: int = RX_K) -> NDArray[np.bool_]:
    """Mask of the values to drop: per group (``group`` ascending and, within it, ``vals``
    ascending), with ``v1 <= ... <= vK`` its ``K = min(k, count)`` lowest values, every value
    below the highest gap among the lowest ``min(MAX_DROPS, K - 3) + 1`` that is more than
    ``max(OUTLIER_MIN_NS, OUTLIER_RATIO * (vK - v(K-2)))``: the spread of the top three is
    the reference, and the highest gap counts, so that several bad values below the genuine
    ones (even close together) do not hide each other. Raises ValueError for ``k < 3`` or
    arrays of different lengths."""
    if k < 3 or len(group) != len(vals):
        raise ValueError("need k >= 3 and one value per group entry")
    n = len(group)
    drop = np.zeros(n, dtype=bool)
    if not n:
        return drop
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    kk = np.minimum(np.diff(np.r_[first, n]), k)
    width = max(k, MAX_DROPS + 1)
    col = np.arange(width)
    low = np.where(
        col[None, :] < kk[:, None], vals[np.minimum(first[:, None] + col, n - 1)], np.nan
    )
    cut = _cuts(low, kk)
    for r in range(MAX_DROPS):
        sel = cut > r
        drop[first[sel] + r] = True
    return drop


def _cuts(low: F64, kk: I64) -> I64:
    """Per group how many of its lowest values `leading_outliers` drops, from ``low`` (per
    group its lowest values ascending, at least ``max(k, MAX_DROPS + 1)`` columns) and ``kk``
    (how many of them it reads, ``min(k, count)``)."""
    rows = np.arange(len(kk))
    kq = np.maximum(kk, 3)
    ref = np.maximum(OUTLIER_MIN_NS, OUTLIER_RATIO * (low[rows, kq - 1] - low[rows, kq - 3]))
    cut = np.zeros(len(kk), np.int64)  # values below the highest big gap are dropped
    for r in range(MAX_DROPS):
        ok = (kk >= 4) & (r < kk - 3)
        cut = np.where(ok & (low[:, r + 1] - low[:, r] > ref), r + 1, cut)
    return cut


@functools.cache
def false_drop_rate(beta: float, k: int = RX_K, draws: int = 200_000) -> float:
    """How often the ratio test of `leading_outliers` alone (without ``OUTLIER_MIN_NS``) would
    drop a genuine minimum of ``k`` values from the tail model of `sync.excess` (``x_(r) - F
    = c Γ_r^beta``: scale-free), from ``draws`` fixed model draws."""
    rng = np.random.default_rng(0)
    e = np.cumsum(rng.exponential(size=(draws, k)), axis=1) ** beta
    gap, spread = e[:, 1] - e[:, 0], e[:, k - 1] - e[:, k - 3]
    return float(np.mean(gap > OUTLIER_RATIO * spread))


def without_bad(s: Summary, slope: F64) -> tuple[Summary, I64, I64]:
    """``s`` without the samples that bad stamps put below their direction's floor: per
    direction the hull points of all arrived samples detrended by the pair slope (``slope``
    per edge, of theta = offset_j - offset_i; `leading_outliers`) of the directions with
    ``MIN_SAMPLES`` samples at least, and per edge the lowest-RTT exchanges with a sample
    below what is left of its direction's floor. Returns (summary, per direction group how many of its stored
    lowest values were dropped, per edge how many exchanges); the same summary object when
    nothing was dropped. The coded-clean hulls are kept (a bad stamp breaks its coded
    pair's spacing, so the coded filter already left it out)."""
    g = s.all_g.astype(np.int64)
    e = g // 2
    sl = np.nan_to_num(slope)
    v = s.all_d + np.where(g % 2 == 0, -sl[e], sl[e]) * s.all_t
    runs = runs_of(s.all_g, presorted=True)  # hull points come sorted by group
    low = sorted_rows(runs, v, max(RX_K, MAX_DROPS + 1))
    cut = _cuts(low, np.minimum(runs.counts, RX_K))
    cut = np.where(s.n_all[runs.keys] >= MIN_SAMPLES, cut, 0)
    # the dropped are the ``cut`` lowest of a group: below its value of rank ``cut``, with a
    # gap of over a microsecond between
    rows = np.arange(len(cut))
    if cut.any():
        below = np.where(cut > 0, low[rows, cut], -np.inf)
        bad_p = v < np.repeat(below, runs.counts)
    else:
        bad_p = np.zeros(len(v), dtype=bool)
    # an exchange is bad where either of its samples lies below its direction's floor (the
    # lowest value left): a genuine sample of the direction cannot, at the same slope
    floor = np.full(2 * len(s.edges), np.inf)
    floor[runs.keys] = low[rows, cut]
    xe = s.x_edge
    half = 0.5 * s.x_rtt
    v_f = half + s.x_off - sl[xe] * s.x_mid  # forward sample, at the exchange's mid-time
    v_r = half - s.x_off + sl[xe] * s.x_mid
    tol = FLOOR_TOL_NS + np.abs(sl[xe]) * 0.5 * (np.abs(s.x_rtt) + TURN_NS)
    bad_x = (v_f < floor[2 * xe] - tol) | (v_r < floor[2 * xe + 1] - tol)
    lost = np.zeros(2 * len(s.edges), np.int64)
    lost[runs.keys] = cut
    lost_x = np.bincount(s.x_edge[bad_x], minlength=len(s.edges)).astype(np.int64)
    if not bad_p.any() and not bad_x.any():
        return s, lost, lost_x
    kp, kx = ~bad_p, ~bad_x
    out = dataclasses.replace(
        s,
        all_g=s.all_g[kp], all_t=s.all_t[kp], all_d=s.all_d[kp],
        x_edge=s.x_edge[kx], x_rtt=s.x_rtt[kx], x_off=s.x_off[kx], x_mid=s.x_mid[kx],
    )  # fmt: skip
    return out, lost, lost_x
