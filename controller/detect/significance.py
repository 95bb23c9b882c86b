"""Is a link's own loss a finding, or a chance cluster of the losses its probes meet elsewhere?

`own_loss_rates` (`controller.detect.congestion`) is a point estimate. On a busy fabric every
switch egress drops a little (overflow), and a NIC's probes all share one link, its access
link: a chance cluster of their drops elsewhere (13 lost of ~600 probes in a second where ~5
are expected) is charged by the estimate to that shared link, at a rate over the horizon's
0.5 % floor although nothing on it drops. `loss_excess` asks whether a link's lost probes are
more than chance allows.

The rule (for link L, with the other links' own rates ``r`` and a floor ``f``):

- A probe i that crossed L (its forward and reply paths' links, each once) also crossed the
  other links O_i of those paths. Were L to lose nothing of its own, i would be lost with
  the probability that some other link drops it, q_i = 1 - prod over l in O_i of (1 - r_l)
  (links drop independently). Summed over **every** probe that crossed L, lost or not, that
  is the expected number of L's probes lost elsewhere. Only the lost probes' paths would be
  a biased sample: they are lost *because* they crossed the lossier links, so their mean
  loss elsewhere overstates every probe's (the reverted rule of 66912cf did that, times all
  of L's probes, and beside a down NIC read a flapping link's loss as explained).
- A probe whose path crosses another link that is dead (``gone``: its own rate near 1, a
  link seen dead within the horizon, a NIC reported down) is lost whatever L does: it
  carries no information about L, and is taken out of L's test entirely, out of its probes
  ``n`` and its lost probes ``k`` alike. Kept, it would add ~1 to the expectation and ~1 to
  the lost count per probe, so the difference stays while the deviation it is measured in
  grows with the dead link's probes: a real loss on L read as chance.
- L may lose up to the floor and be no finding: the expectation is
  ``E = sum_i q_i + f * n`` over the ``n`` probes kept.
- The lost count is a sum of independent rare events with mean E, close to Poisson (its
  variance is at most E). L's loss is a finding when ``k - E >= z * sqrt(E)`` (and k > E):
  at z = 3 a chance cluster passes rarely (a normal tail's 0.13 %; a Poisson's of a few
  events a little more), where a fault's loss (tens of percent, or a few percent held for a
  second over a few hundred probes) clears it by far.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class LossExcess:
    """A link's loss test: ``probes`` kept (not crossing a dead link), ``lost`` of them,
    ``expected`` lost (elsewhere plus the floor), and whether ``lost`` exceeds it
    significantly."""

    probes: int
    lost: int
    expected: float
    significant: bool


def loss_excess(
    link: int,
    pair_links: I32,
    pair_probes: I64,
    lost_sets: I32,
    own: F64,
    gone: B,
    *,
    floor: float,
    z: float,
) -> LossExcess:
    """Return the loss test of ``link`` (see the module docstring for the rule).

    ``pair_links`` (P, K): the links of each probed path pair (forward and reply paths,
    each link once, -1 padded; a pair may repeat, e.g. once per window); ``pair_probes``
    (P,): probes sent on each row; ``lost_sets`` (m, K'): the links of each lost probe, the
    same way; ``own`` (n_links,): each link's own loss rate (`own_loss_rates`); ``gone``
    (n_links,): dead links, whose probes are taken out of the test; ``floor``: the loss rate
    a link may have and be no finding; ``z``: standard deviations of the Poisson count.
    Raises ValueError on inconsistent shapes or parameters."""
    n_links = len(own)
    if len(gone) != n_links or not 0 <= link < n_links:
        raise ValueError("own and gone must cover the same links, and link be one of them")
    if pair_links.ndim != 2 or len(pair_links) != len(pair_probes) or lost_sets.ndim != 2:
        raise ValueError("need one row of links per pair count, and 2-d lost sets")
    if not 0 <= floor <= 1 or z < 0:
        raise ValueError("floor must be in [0, 1] and z >= 0")
    on, probes, q = _kept(link, pair_links, own, gone)
    counts = pair_probes[on][probes]
    n = int(counts.sum())
    _, lost_rows, _ = _kept(link, lost_sets, own, gone)
    k = int(lost_rows.sum())
    expected = float((counts * q[probes]).sum()) + floor * n
    hit = n > 0 and k > expected and k - expected >= z * float(np.sqrt(expected))
    return LossExcess(n, k, expected, bool(hit))


def _kept(link: int, rows: I32, own: F64, gone: B) -> tuple[B, B, F64]:
    """Return which ``rows`` (link sets) contain ``link`` and, of those, which cross no
    other gone link and each one's probability of loss on its other links
    (1 - prod (1 - own))."""
    on = (rows == link).any(axis=1)
    sets = rows[on]
    other = (sets >= 0) & (sets != link)
    idx = np.maximum(sets, 0)
    kept = ~(other & gone[idx]).any(axis=1)
    through = np.where(other, 1.0 - np.clip(own[idx], 0.0, 1.0), 1.0).prod(axis=1)
    return on, kept, np.asarray(1.0 - through, dtype=np.float64)


class ProbedPairs:
    """The probed path pairs (pair numbers, probes on each) of the windows that ended within
    the last ``span_ns``: the every-probe side of `loss_excess` over the loss horizon (one
    owner; not thread-safe)."""

    def __init__(self, span_ns: int) -> None:
        if span_ns <= 0:
            raise ValueError("span_ns must be > 0")
        self.span_ns = span_ns
        self._wins: deque[tuple[int, I64, I64]] = deque()

    def push(self, end_ns: int, pair_ids: I64, probes: I64) -> None:
        """Add one closed window (ending ``end_ns``): its pairs' numbers and probe counts;
        forget the windows that ended ``span_ns`` or more before it."""
        self._wins.append((end_ns, np.asarray(pair_ids, np.int64), np.asarray(probes, np.int64)))
        while self._wins[0][0] <= end_ns - self.span_ns:
            self._wins.popleft()

    def pairs(self) -> tuple[I64, I64]:
        """Return the pair numbers and probe counts of the windows held (a pair once per
        window it was probed in)."""
        if not self._wins:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return (
            np.concatenate([p for _, p, _ in self._wins]),
            np.concatenate([c for _, _, c in self._wins]),
        )
