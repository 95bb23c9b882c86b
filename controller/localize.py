"""Tomography: explain the bad paths of a window with the fewest faulty elements.

Each measurement crosses a set of elements (links for loss, directed hops for delay), given as
an (n, K) int array padded with -1. A measurement is *bad* (lost, or delayed beyond its baseline)
or good. Boolean tomography with exoneration, solved greedily as a weighted set cover:

1. every element gets ``total`` (measurements across it) and ``bad`` counts (``np.bincount``);
   its bad *rate* over all of its measurements is what exonerates it: an element whose paths are
   mostly good is not a cause, however many bad paths it also carries;
2. repeat: among elements whose still-unexplained bad count is >= ``min_bad`` and whose
   unexplained-bad rate is >= ``min_rate``, pick the one with the greatest evidence,
   ``unexplained bad - c x total`` (`neutral_rate`; a tie goes to the higher
   unexplained-bad rate, only then to the lower id); mark every bad measurement across it
   explained;
3. stop when no element qualifies or ``max_picks`` are chosen.

A single faulty link explains all its bad paths at once, so the healthy links those paths share
(the source NIC link, the other spine's links) are left with only background, and fall under
the thresholds: the fewest elements that explain the loss. Pure numpy, no per-measurement loop.

Why the evidence and not the count of bad measurements alone: an element's good
measurements are evidence against it, and the count ignores them. If a faulty element makes a
share p1 of its measurements bad and a healthy one a share p0, the log-likelihood ratio of
"faulty" over ``total`` measurements of which ``bad`` are bad is ``bad log(p1/p0) + (total -
bad) log((1-p1)/(1-p0))``, proportional to ``bad - c x total`` with the neutral rate
``c = log((1-p0)/(1-p1)) / log(p1 (1-p0) / (p0 (1-p1)))``, between p0 and p1. p1 is taken as
``min_rate`` (the least rate at which an element is blamed at all), p0 as the window's mean
bad rate per element crossing (every bad measurement counted once per element it crosses,
over every element's measurements: the background, a little raised by the faults). For the
slow tier (``min_rate`` 0.5, a few % of delays slow) c is ~0.15-0.2; for loss (0.05, ~0.1 %
lost) ~0.013, where the count ruled before. It matters where one element's bad measurements
are a superset of another's: a NIC link under a congested uplink while the NIC's leaf-mate's
delays are withheld (its clock not trusted) carries every slow delay of the uplink and a
few of the background's, so it explains more, though half its other delays are clean (the
namespace testbed's capture `b16`: 84 bad of 158 against the uplink's 78 of 78, evidence 57
and 65 at c = 0.17). What it costs where the count was right: a small, nearly pure subset of
a broad fault's bad measurements can now outrank it and leave it under the rate; on the
simulator at load 0.9 (16 NICs, seeds 1-10) this rule alone found 195 congestion episodes of
329 against the count's 196 (c = ``min_rate`` the same 195), and with the queue estimate's
pair step of the same change 198 (docs/benchmarks.md, "False contention beside a congested
uplink").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, eq=False)
class Cover:
    """Result of `greedy_cover`: picked element ids (in pick order), the unexplained-bad count
    each had when picked, and per-element ``total`` / ``bad`` counts and ``rate`` (bad/total,
    NaN where total is 0)."""

    picked: npt.NDArray[np.int64]
    picked_bad: npt.NDArray[np.int64]
    total: npt.NDArray[np.int64]
    bad: npt.NDArray[np.int64]

    @property
    def rate(self) -> npt.NDArray[np.float64]:
        """Bad fraction per element over all its measurements (NaN where none)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.total > 0, self.bad / np.maximum(self.total, 1), np.nan)


def element_counts(sets: npt.NDArray[np.integer], n_elems: int) -> npt.NDArray[np.int64]:
    """Return how many rows of ``sets`` (n, K; -1 padded) contain each element id."""
    counts = np.bincount(sets.ravel() + 1, minlength=n_elems + 1)
    return counts[1:].astype(np.int64)


def unique_rows(sets: npt.NDArray[np.integer]) -> npt.NDArray[np.int32]:
    """Return ``sets`` with duplicates inside each row replaced by -1 (rows sorted)."""
    s = np.asarray(np.sort(sets, axis=1), np.int32)  # a fresh array: no second copy
    if s.shape[1] > 1:
        dup = np.zeros_like(s, dtype=bool)
        dup[:, 1:] = s[:, 1:] == s[:, :-1]
        s[dup] = -1
    return s


def neutral_rate(p0: float, p1: float) -> float:
    """Return the bad rate c at which a measurement is neutral between a faulty element's
    bad rate ``p1`` and the background's ``p0``: the log-likelihood ratio of "faulty" is
    proportional to ``bad - c x total`` (the module docstring). ``p1`` where ``p0`` is not
    under it (or either is outside (0, 1))."""
    if not 0.0 < p0 < p1 < 1.0:
        return p1
    return math.log((1 - p0) / (1 - p1)) / math.log(p1 * (1 - p0) / (p0 * (1 - p1)))


def greedy_cover(
    total: npt.NDArray[np.int64],
    bad_sets: npt.NDArray[np.integer],
    *,
    min_rate: float,
    min_bad: int,
    max_picks: int = 8,
    barred: npt.NDArray[np.bool_] | None = None,
) -> Cover:
    """Pick the fewest elements that explain the bad measurements (see module docstring).

    ``total`` is per element (all measurements, good and bad); ``bad_sets`` (m, K) holds the
    elements of each bad measurement, each element at most once per row, -1 padded;
    ``barred`` (per element, None: none) marks elements known good by other evidence, never
    picked (their bad measurements are left to the other elements of their sets).
    Raises ValueError if ``bad_sets`` names an element outside ``total`` or ``barred`` is
    not one flag per element.
    """
    n_elems = len(total)
    if bad_sets.size and int(bad_sets.max()) >= n_elems:
        raise ValueError("bad_sets names an element outside total")
    if barred is not None and barred.shape != (n_elems,):
        raise ValueError("barred must hold one flag per element")
    bad = element_counts(bad_sets, n_elems)
    c = neutral_rate(float(bad.sum()) / max(float(total.sum()), 1.0), min_rate)
    picked: list[int] = []
    picked_bad: list[int] = []
    alive = np.ones(bad_sets.shape[0], dtype=bool)
    resid = bad.copy()
    denom = np.maximum(total, 1)
    while len(picked) < max_picks:
        ok = (resid >= min_bad) & (resid >= min_rate * denom)
        if barred is not None:
            ok &= ~barred
        if not ok.any():
            break
        score = np.where(ok, resid - c * total, -np.inf)
        # a tie goes to the higher rate, not the lower id: in a window that holds only some
        # probers' probes two hops can carry the same slow ones, and the one whose other
        # probes are clean is the healthy one (docs/reliability.md)
        top = score == score.max()
        best = int(np.argmax(np.where(top, resid / denom, -1.0)))
        picked.append(best)
        picked_bad.append(int(resid[best]))
        hit = alive & (bad_sets == best).any(axis=1)
        alive &= ~hit
        resid = element_counts(bad_sets[alive], n_elems)
    return Cover(np.array(picked, dtype=np.int64), np.array(picked_bad, dtype=np.int64), total, bad)
