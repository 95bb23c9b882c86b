"""Traffic congestion versus link faults: whose loss is it, and is it overflow?

Two observations the loss tomography alone cannot make:

- **Loss that other links cause.** On a busy fabric every hop drops a little (buffer
  overflow), so every probe loses ~1 % end to end and every link's share of lost probes is
  over the horizon's 0.5 % floor although none of them fails. `own_loss_rates` estimates the
  loss each link causes itself, with the other links' estimated losses on the same probes
  taken out: the expectation-maximisation of loss tomography (a lost probe is charged to the
  links it crossed in proportion to their current estimates; each link's estimate is what it
  was charged over the probes that crossed it; repeated). A link the cover blames is a loss
  finding only when its own rate is over the same floor, and its lost probes are more than
  the other links' rates and the floor explain, by ``z`` Poisson deviations
  (`controller.detect.significance`): a chance cluster of a busy fabric's overflow drops on
  one NIC's paths is charged by the estimate to the one link they all share.
- **Overflow.** A drop-tail buffer drops only when it is full, so congestion loss comes with
  a standing queue on the same link: a link whose own loss is at most ``max_loss`` while its
  probes show a standing queue (its two directions' typical waits together at least
  ``standing_ns``, `controller.detect.queues`; the sum, because one-way delays cannot split a
  queue common to a tier between the up and the down direction, but they do measure the
  link's sum) is *congested*, not failing: its loss is reported inside the link's
  `contention` finding (when the queue is contended), never as `loss`. Congestion control
  (DCQCN, TCP) keeps a congested port's drops well under a few percent; a link losing more
  than ``max_loss`` is failing whatever its queue (a failing optic on a busy link).

What this cannot tell: a small loss (under ``max_loss``) from a failing optic on a link with a
standing queue reads as overflow; it is found once the queue goes or the loss grows. A small
loss on a link whose queue no judged delay shows (the controller's first seconds, before its
clocks are trusted; a leaf whose every path is queued, whose NICs' clocks are then not
trusted) is held for up to ``hold_ns`` (5 s), then reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class CongestionParams:
    """``max_loss``: the most a congested link's own loss rate may be and still be read as
    overflow; ``standing_ns``: a link whose two directions' typical waits add up to this has
    a standing queue; ``hold_ns``: how long a small loss on a link whose queue no judged delay
    shows is held before it is reported; ``iterations`` of `own_loss_rates`; ``z``: Poisson
    standard deviations by which a link's lost probes must exceed what the other links and
    the floor explain (`controller.detect.significance.loss_excess`)."""

    max_loss: float = 0.03
    standing_ns: float = 300.0
    hold_ns: int = 5_000_000_000
    iterations: int = 30
    z: float = 3.0

    def __post_init__(self) -> None:
        if not 0 <= self.max_loss <= 1 or self.standing_ns < 0 or self.iterations < 1:
            raise ValueError("max_loss must be in [0, 1], standing_ns >= 0, iterations >= 1")
        if self.hold_ns < 0 or self.z < 0:
            raise ValueError("hold_ns and z must be >= 0")


def own_loss_rates(
    totals: npt.NDArray[np.int64], lost_sets: npt.NDArray[np.int32], iterations: int
) -> F64:
    """Return per link the loss rate it causes itself (see the module docstring): ``totals``
    probes across each link, ``lost_sets`` (m, K) the links of each lost probe (-1 padded,
    each link once per row). 0 where a link carried no probe."""
    n = len(totals)
    denom = np.maximum(totals, 1).astype(np.float64)
    valid = lost_sets >= 0
    if not valid.any():
        return np.zeros(n)
    sets = np.where(valid, lost_sets, 0)
    links = sets[valid]
    p = np.bincount(links, minlength=n)[:n] / denom  # start: every lost probe charged in full
    for _ in range(iterations):
        w = np.where(valid, p[sets], 0.0)
        tot = w.sum(axis=1, keepdims=True)
        w = np.divide(w, tot, out=np.full_like(w, 0.0), where=tot > 0)
        p = np.bincount(links, weights=w[valid], minlength=n)[:n] / denom
    return np.asarray(np.minimum(p, 1.0), dtype=np.float64)


def link_queue_ns(queue_ns: F64) -> F64:
    """Return per link the typical waits of its two directions added (a direction not
    measured counted as 0; NaN when neither was): the part of a hop's queue one-way delays
    can place (`controller.detect.queues`)."""
    up, down = queue_ns[0::2], queue_ns[1::2]
    both = np.nan_to_num(up, nan=0.0) + np.nan_to_num(down, nan=0.0)
    return np.asarray(np.where(np.isnan(up) & np.isnan(down), np.nan, both), dtype=np.float64)
