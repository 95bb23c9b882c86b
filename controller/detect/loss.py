"""Loss evidence per detection window: probes and lost probes per physical link.

A lost probe (no reply) may have died on its forward or on its reply path, so its evidence set
is the links of both paths (``hop // 2``). Links are the unit for
loss because a failing cable or optic drops both directions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.detect.paths import PathIndex, expand
from controller.localize import Cover, greedy_cover


def probe_links(
    hops_fwd: npt.NDArray[np.int32], hops_rev: npt.NDArray[np.int32]
) -> npt.NDArray[np.int32]:
    """Return per probe the links of its forward then reply path, (n, 2H), -1 padded.

    A link crossed both ways (always the NIC links) appears twice: it is counted twice in the
    totals and twice in the lost counts, so its loss rate is unchanged.
    """
    links: npt.NDArray[np.int32] = np.concatenate([hops_fwd, hops_rev], axis=1) >> 1
    return links


@dataclass(frozen=True, slots=True)
class LossParams:
    """Thresholds: a link is blamed when its unexplained lost probes are >= ``min_lost`` and
    >= ``min_rate`` of its probes; it is dead when >= ``dead_rate`` of its probes were lost.
    ``min_probes``: fewer probes than this in a window means no evidence (NODATA)."""

    min_rate: float = 0.05
    min_lost: int = 3
    dead_rate: float = 0.9
    min_probes: int = 5
    max_faults: int = 8


@dataclass(frozen=True, eq=False)
class LossVerdict:
    """Window verdict: the cover (blamed links), per-link loss rate of the blamed links."""

    cover: Cover
    blamed: dict[int, float]  # link index -> loss rate over the window

    def dead(self, dead_rate: float) -> set[int]:
        """Return the blamed links with a loss rate >= ``dead_rate``."""
        return {lk for lk, r in self.blamed.items() if r >= dead_rate}


@dataclass(eq=False)
class LossWindow:
    """Mutable per-window accumulator (owned by one brain). ``add`` is pure array code."""

    n_links: int
    seen_paths: npt.NDArray[np.int64] = field(init=False)
    _lost: list[npt.NDArray[np.int32]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.seen_paths = np.zeros(0, dtype=np.int64)

    def add(
        self,
        index: PathIndex,
        path_fwd: npt.NDArray[np.int64],
        path_rev: npt.NDArray[np.int64],
        hops_fwd: npt.NDArray[np.int32],
        hops_rev: npt.NDArray[np.int32],
        lost: npt.NDArray[np.bool_],
    ) -> None:
        """Count probes per path (both directions) and keep the lost ones' link sets."""
        size = max(index.size, len(self.seen_paths))
        if size > len(self.seen_paths):
            self.seen_paths = np.concatenate(
                [self.seen_paths, np.zeros(size - len(self.seen_paths), np.int64)]
            )
        self.seen_paths += np.bincount(path_fwd, minlength=size)
        self.seen_paths += np.bincount(path_rev, minlength=size)
        if lost.any():
            self._lost.append(probe_links(hops_fwd[lost], hops_rev[lost]))

    def totals(self, index: PathIndex) -> npt.NDArray[np.int64]:
        """Return probes per link in this window (a link crossed both ways counts twice)."""
        return expand(self.seen_paths, index.hops, self.n_links, links=True)

    def lost_sets(self) -> npt.NDArray[np.int32]:
        """Return the link sets of this window's lost probes, (m, K)."""
        if not self._lost:
            return np.zeros((0, 1), dtype=np.int32)
        width = max(a.shape[1] for a in self._lost)
        return np.concatenate(
            [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1) for a in self._lost]
        )

    def verdict(self, index: PathIndex, params: LossParams) -> LossVerdict:
        """Localize this window's loss (greedy cover) and return the blamed links."""
        cover = greedy_cover(
            self.totals(index),
            self.lost_sets(),
            min_rate=params.min_rate,
            min_bad=params.min_lost,
            max_picks=params.max_faults,
        )
        rate = cover.rate
        return LossVerdict(cover, {int(lk): float(rate[lk]) for lk in cover.picked})

    def reset(self) -> None:
        """Start a new window."""
        self.seen_paths[:] = 0
        self._lost.clear()
