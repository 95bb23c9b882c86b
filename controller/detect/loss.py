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
from controller.localize import Cover, greedy_cover, unique_rows
from mesh.fabric.model import hop_links


def probe_links(
    hops_fwd: npt.NDArray[np.int32], hops_rev: npt.NDArray[np.int32]
) -> npt.NDArray[np.int32]:
    """Return per probe the links of its forward and reply paths, each once, (n, 2H), -1 padded."""
    return unique_rows(hop_links(np.concatenate([hops_fwd, hops_rev], axis=1)))


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
    width: int
    pairs: PathIndex | None = None  # shared pair numbering (several open windows); own if None
    seen: npt.NDArray[np.int64] = field(init=False)
    _lost: list[npt.NDArray[np.int32]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.seen = np.zeros(0, dtype=np.int64)
        if self.pairs is None:
            self.pairs = PathIndex(2 * self.width)

    @property
    def _pairs(self) -> PathIndex:
        assert self.pairs is not None
        return self.pairs

    def add(
        self,
        path_fwd: npt.NDArray[np.int64],
        path_rev: npt.NDArray[np.int64],
        hops_fwd: npt.NDArray[np.int32],
        hops_rev: npt.NDArray[np.int32],
        lost: npt.NDArray[np.bool_],
    ) -> None:
        """Count probes per (forward path, reply path) pair and keep the lost ones' link sets.

        ``path_fwd``/``path_rev`` are path numbers (`PathIndex.paths`); each pair's link set
        (both paths' links, each once) is computed once, when the pair is first seen.
        """
        pid = self._pair_ids(path_fwd, path_rev, hops_fwd, hops_rev)
        np.add.at(self.seen, pid, 1)  # not a bincount over every known pair per call
        if lost.any():
            self._lost.append(probe_links(hops_fwd[lost], hops_rev[lost]))

    def _pair_ids(
        self,
        path_fwd: npt.NDArray[np.int64],
        path_rev: npt.NDArray[np.int64],
        hops_fwd: npt.NDArray[np.int32],
        hops_rev: npt.NDArray[np.int32],
    ) -> npt.NDArray[np.int64]:
        """Number the (forward, reply) path pairs, adding unseen ones; grow ``seen``."""
        sig = ((path_fwd + 1) << 32) | path_rev
        pid = self._pairs.ids(sig, lambda sel: probe_links(hops_fwd[sel], hops_rev[sel]))
        size = self._pairs.size
        if size > len(self.seen):
            self.seen = np.concatenate([self.seen, np.zeros(size - len(self.seen), np.int64)])
        return pid

    # ---- merge (fleet partials: `controller.detect.window`) ----------------------------------
    def pairs_seen(
        self,
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]
    ]:
        """Return the path pairs probed in this window: (pair numbers, probes on each, forward
        path numbers, reply path numbers), the path numbers those `add` was given."""
        pid = np.flatnonzero(self.seen > 0)
        sig = self._pairs.sigs[pid]
        return pid, self.seen[pid], (sig >> 32) - 1, sig & 0xFFFFFFFF

    def add_pairs(
        self,
        path_fwd: npt.NDArray[np.int64],
        path_rev: npt.NDArray[np.int64],
        hops_fwd: npt.NDArray[np.int32],
        hops_rev: npt.NDArray[np.int32],
        seen: npt.NDArray[np.int64],
    ) -> None:
        """Add ``seen`` probes to each (forward, reply) path pair (as `add` counts them)."""
        pid = self._pair_ids(path_fwd, path_rev, hops_fwd, hops_rev)  # grows ``seen``
        np.add.at(self.seen, pid, seen)

    def add_lost(self, link_sets: npt.NDArray[np.int32]) -> None:
        """Add the link sets (rows, -1 padded) of lost probes."""
        if len(link_sets):
            self._lost.append(np.asarray(link_sets, np.int32))

    def totals(self) -> npt.NDArray[np.int64]:
        """Return the probes across each link in this window."""
        return expand(self.seen, self._pairs.hops, self.n_links)

    def lost_sets(self) -> npt.NDArray[np.int32]:
        """Return the link sets of this window's lost probes, (m, K)."""
        if not self._lost:
            return np.zeros((0, 1), dtype=np.int32)
        width = max(a.shape[1] for a in self._lost)
        return np.concatenate(
            [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1) for a in self._lost]
        )

    def verdict(self, params: LossParams) -> LossVerdict:
        """Localize this window's loss (greedy cover) and return the blamed links."""
        cover = greedy_cover(
            self.totals(),
            self.lost_sets(),
            min_rate=params.min_rate,
            min_bad=params.min_lost,
            max_picks=params.max_faults,
        )
        rate = cover.rate
        return LossVerdict(cover, {int(lk): float(rate[lk]) for lk in cover.picked})

    def reset(self) -> None:
        """Start a new window."""
        self.seen[:] = 0
        self._lost.clear()
