"""Tomography: explain the bad paths of a window with the fewest faulty elements.

Each measurement crosses a set of elements (links for loss, directed hops for delay), given as
an (n, K) int array padded with -1. A measurement is *bad* (lost, or delayed beyond its baseline)
or good. Boolean tomography with exoneration, solved greedily as a weighted set cover:

1. every element gets ``total`` (measurements across it) and ``bad`` counts (``np.bincount``);
   its bad *rate* over all of its measurements is what exonerates it: an element whose paths are
   mostly good is not a cause, however many bad paths it also carries;
2. repeat: among elements whose still-unexplained bad count is >= ``min_bad`` and whose
   unexplained-bad rate is >= ``min_rate``, pick the one that clears that rate by the most
   measurements, ``unexplained bad - min_rate x total`` (a tie goes to the higher
   unexplained-bad rate, only then to the lower id); mark every bad measurement across it
   explained;
3. stop when no element qualifies or ``max_picks`` are chosen.

A single faulty link explains all its bad paths at once, so the healthy links those paths share
(the source NIC link, the other spine's links) are left with only background, and fall under
the thresholds: the fewest elements that explain the loss. Pure numpy, no per-measurement loop.

Why the margin and not the count of bad measurements alone: an element's good measurements
are evidence against it, and the count ignores them. If a faulty element makes a share p1 of
its measurements bad and a healthy one a share p0, the log-likelihood ratio of "faulty" over
``total`` measurements of which ``bad`` are bad is ``bad log(p1/p0) + (total - bad)
log((1-p1)/(1-p0))``, linear in ``bad - c x total`` for a rate c between p0 and p1 at which a
measurement is neutral; the margin takes c = ``min_rate``, the rate the exoneration rule
already calls neutral. It matters where one element's bad measurements are a superset of
another's: a NIC link under a congested uplink while the NIC's leaf-mate's delays are
withheld (its clock not trusted) carries every slow delay of the uplink and a few of the
background's, so it explains more, though half its other delays are clean; the uplink, all
of whose delays are slow, clears the rate by far more.
"""

from __future__ import annotations

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
    s = np.sort(sets, axis=1).astype(np.int32)
    if s.shape[1] > 1:
        dup = np.zeros_like(s, dtype=bool)
        dup[:, 1:] = s[:, 1:] == s[:, :-1]
        s[dup] = -1
    return s


def greedy_cover(
    total: npt.NDArray[np.int64],
    bad_sets: npt.NDArray[np.integer],
    *,
    min_rate: float,
    min_bad: int,
    max_picks: int = 8,
) -> Cover:
    """Pick the fewest elements that explain the bad measurements (see module docstring).

    ``total`` is per element (all measurements, good and bad); ``bad_sets`` (m, K) holds the
    elements of each bad measurement, each element at most once per row, -1 padded.
    Raises ValueError if ``bad_sets`` names an element outside ``total``.
    """
    n_elems = len(total)
    if bad_sets.size and int(bad_sets.max()) >= n_elems:
        raise ValueError("bad_sets names an element outside total")
    bad = element_counts(bad_sets, n_elems)
    picked: list[int] = []
    picked_bad: list[int] = []
    alive = np.ones(bad_sets.shape[0], dtype=bool)
    resid = bad.copy()
    denom = np.maximum(total, 1)
    while len(picked) < max_picks:
        ok = (resid >= min_bad) & (resid >= min_rate * denom)
        if not ok.any():
            break
        score = np.where(ok, resid - min_rate * total, -np.inf)
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
