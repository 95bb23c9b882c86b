"""Delay evidence: per-hop queueing delay over a detection window.

Every one-way delay is measured on a path (`controller.detect.paths.PathIndex` numbers paths
and keeps their propagation baselines). The queueing delay of a measurement is its delay minus
its path's baseline; it is *slow* when that excess is above ``max(min_excess_ns, median +
noise_k * MAD)`` (over the batch: robust to the few contended paths), *moderately slow* when
it is above ``max(low_excess_ns, median + low_k * MAD)``. `DelayWindow` counts
judged measurements per path (expanded to directed hops once per window), keeps each path's
window minimum for the baseline, and keeps the hop sets and flows of the slow and the moderately
slow measurements for the tomography (`controller.localize.greedy_cover`). A *coarse* delay
(clocks certain to `ClockSyncConfig.coarse_unc_ns` only) is judged by the slow tier alone and
counted in that tier's judged measurements, never in the moderate tier's, and sets no
baseline: its clock error may reach the moderate floor, not the slow one.

Two tiers because a queue is a distribution, not a constant: an added queue of mean m puts a
share exp(-x / m) of its probes above x. Over the 4 µs floor, half of a hop's probes are slow
only from m ~ 6 µs on; a 3 µs queue has 26 % there but 61 % above 1.5 µs. The moderate tier
blames a hop whose *typical* (median) probe waits over ``low_excess_ns``, which the healthy
fabric's queues (< 1 µs at the median even on a hot hop), incast bursts (a minority of a hop's
probes) and the clock error (< 1 µs, docs/controller.md "Clock trust") do not reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.detect.paths import PathIndex, expand
from controller.localize import Cover, greedy_cover


@dataclass(frozen=True, slots=True)
class DelayParams:
    """Thresholds for queueing delay: see the module docstring. A hop is blamed when its
    unexplained slow measurements are >= ``min_slow`` and >= ``min_rate`` of its judged ones."""

    min_excess_ns: float = 4000.0
    noise_k: float = 8.0
    min_rate: float = 0.5
    low_excess_ns: float = 1500.0
    low_k: float = 4.0
    min_slow: int = 3
    drift_ns_per_s: float = 50.0
    max_faults: int = 8
    max_flows: int = 32


def _pad_concat(arrs: list[npt.NDArray[np.int32]]) -> npt.NDArray[np.int32]:
    if not arrs:
        return np.zeros((0, 1), dtype=np.int32)
    width = max(a.shape[1] for a in arrs)
    return np.concatenate(
        [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1) for a in arrs]
    )


@dataclass(eq=False)
class DelayWindow:
    """Mutable per-window accumulator of judged delays (owned by one brain or baseline)."""

    n_hops: int
    judged_paths: npt.NDArray[np.int64] = field(init=False)  # fine delays (both tiers)
    coarse_paths: npt.NDArray[np.int64] = field(init=False)  # coarse ones (slow tier only)
    wmin: npt.NDArray[np.float64] = field(init=False)
    _slow_hops: list[npt.NDArray[np.int32]] = field(init=False, default_factory=list)
    _slow_flows: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)
    _mod_hops: list[npt.NDArray[np.int32]] = field(init=False, default_factory=list)
    _mod_flows: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.judged_paths = np.zeros(0, dtype=np.int64)
        self.coarse_paths = np.zeros(0, dtype=np.int64)
        self.wmin = np.zeros(0, dtype=np.float64)

    def _grow(self, size: int) -> None:
        if size > len(self.wmin):
            extra = size - len(self.wmin)
            self.judged_paths = np.concatenate([self.judged_paths, np.zeros(extra, np.int64)])
            self.coarse_paths = np.concatenate([self.coarse_paths, np.zeros(extra, np.int64)])
            self.wmin = np.concatenate([self.wmin, np.full(extra, np.inf)])

    def add(
        self,
        index: PathIndex,
        path: npt.NDArray[np.int64],
        hops: npt.NDArray[np.int32],
        owd: npt.NDArray[np.float64],
        flows: tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]],
        params: DelayParams,
        coarse: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """Judge one direction's delays (NaN = unknown) against their path baselines.

        ``path`` are the path numbers of the rows (from ``index.paths(hops)``); ``flows`` is
        (src, dst, sport) of each measurement, for the affected-flow list. ``coarse`` marks
        delays whose clocks are certain only to the coarse bound (`ClockSyncConfig
        .coarse_unc_ns`): they are judged by the slow tier only (their clock error stays under
        its floor, not under the moderate one) and never set a baseline.
        """
        if not len(owd):
            return
        self._grow(index.size)
        ok = np.isfinite(owd)
        fine = ok if coarse is None else ok & ~coarse
        np.minimum.at(self.wmin, path[fine], owd[fine])
        excess = owd - index.base[path]
        known = np.isfinite(excess)
        if not known.any():
            return
        known_fine = known & fine
        # the batch's typical excess from fine delays when there are any (coarse clock error
        # would widen the spread the thresholds scale with)
        ex_stats = excess[known_fine] if known_fine.any() else excess[known]
        sample = ex_stats[:: max(1, len(ex_stats) // 20_000)]
        med = float(np.median(sample))
        mad = float(np.median(np.abs(sample - med))) * 1.4826
        thr = max(params.min_excess_ns, med + params.noise_k * mad)
        low = min(thr, max(params.low_excess_ns, med + params.low_k * mad))
        # add.at, not bincount: a bincount allocates and adds an array of every known path
        # per call, which at 10,000 NICs costs more than the batch itself
        np.add.at(self.judged_paths, path[known_fine], 1)
        if not known_fine.all():
            np.add.at(self.coarse_paths, path[known & ~known_fine], 1)
        for cut, sel, hop_sets, flow_sets in (
            (thr, known, self._slow_hops, self._slow_flows),
            (low, known_fine, self._mod_hops, self._mod_flows),
        ):
            slow = np.zeros(len(owd), dtype=bool)
            slow[sel] = excess[sel] > cut
            if slow.any():
                idx = np.flatnonzero(slow)
                hop_sets.append(hops[idx])
                flow_sets.append(np.column_stack([f[idx] for f in flows]).astype(np.int64))

    # ---- merge (fleet partials: `controller.detect.window`) ----------------------------------
    def per_path(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Return per path number (as `add` was given them) the fine and coarse delays judged
        and the window minimum (inf: none); paths past the end had nothing."""
        return self.judged_paths, self.coarse_paths, self.wmin

    def sets(
        self,
    ) -> tuple[
        npt.NDArray[np.int32], npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int64]
    ]:
        """Return the slow tier's hop sets and flows, then the moderate tier's: hop sets
        (n, H) -1 padded, flows (n, 3) of (src, dst, sport)."""
        out: list[npt.NDArray[np.int32] | npt.NDArray[np.int64]] = []
        for hops, flows in ((self._slow_hops, self._slow_flows), (self._mod_hops, self._mod_flows)):
            out.append(_pad_concat(hops))
            out.append(np.concatenate(flows) if flows else np.zeros((0, 3), np.int64))
        return out[0], out[1], out[2], out[3]  # type: ignore[return-value]

    def add_counts(
        self,
        size: int,
        path: npt.NDArray[np.int64],
        judged: npt.NDArray[np.int64],
        coarse: npt.NDArray[np.int64],
        wmin: npt.NDArray[np.float64],
    ) -> None:
        """Add judged and coarse counts and fold window minima per path number (``size``:
        the numbering's size now)."""
        self._grow(size)
        np.add.at(self.judged_paths, path, judged)
        np.add.at(self.coarse_paths, path, coarse)
        np.minimum.at(self.wmin, path, wmin)

    def add_sets(
        self,
        slow_hops: npt.NDArray[np.int32],
        slow_flows: npt.NDArray[np.int64],
        mod_hops: npt.NDArray[np.int32],
        mod_flows: npt.NDArray[np.int64],
    ) -> None:
        """Add slow and moderately slow hop sets with their flows (as `add` keeps them)."""
        if len(slow_hops):
            self._slow_hops.append(np.asarray(slow_hops, np.int32))
            self._slow_flows.append(np.asarray(slow_flows, np.int64))
        if len(mod_hops):
            self._mod_hops.append(np.asarray(mod_hops, np.int32))
            self._mod_flows.append(np.asarray(mod_flows, np.int64))

    def slow_sets(self) -> npt.NDArray[np.int32]:
        """Return the hop sets of this window's slow measurements, (m, H), -1 padded."""
        return _pad_concat(self._slow_hops)

    def judged(self, index: PathIndex, *, coarse: bool = False) -> npt.NDArray[np.int64]:
        """Return judged measurements per directed hop in this window: fine ones (the
        moderate tier's), or with ``coarse`` fine and coarse ones (the slow tier's)."""
        per_path = self.judged_paths + self.coarse_paths if coarse else self.judged_paths
        return expand(per_path, index.hops, self.n_hops)

    def verdict(
        self, index: PathIndex, params: DelayParams
    ) -> tuple[Cover, dict[int, list[tuple[int, int, int]]]]:
        """Localize this window's slow measurements to directed hops: the slow tier's cover,
        then the moderate tier's, which goes on from the slow tier's picks (its measurements
        across them count as explained) and adds hops only for what they leave unexplained.

        Returns the cover (picks of both tiers, in that order; ``total``/``bad`` of the slow
        tier) and, per blamed hop, up to ``max_flows`` affected (src, dst, sport).
        """
        out: dict[int, list[tuple[int, int, int]]] = {}
        covers: list[Cover] = []
        for judged, hop_sets, flow_sets in (
            (self.judged(index, coarse=True), self._slow_hops, self._slow_flows),
            (self.judged(index), self._mod_hops, self._mod_flows),
        ):
            sets = _pad_concat(hop_sets)
            flows = np.concatenate(flow_sets) if flow_sets else np.zeros((0, 3), np.int64)
            # the moderate tier goes on from the slow tier's picks: what they explain is
            # explained, so it blames only what the slow tier left (else its own greedy may
            # pick a healthy hop the slow tier's fault's paths share, a second explanation)
            left = ~np.isin(sets, covers[0].picked).any(axis=1) if covers else slice(None)
            cover = greedy_cover(
                judged,
                sets[left],
                min_rate=params.min_rate,
                min_bad=params.min_slow,
                max_picks=params.max_faults,
            )
            covers.append(cover)
            for hop in cover.picked:
                if int(hop) in out:
                    continue
                f = np.unique(flows[(sets == hop).any(axis=1)], axis=0)[: params.max_flows]
                out[int(hop)] = [(int(a), int(b), int(c)) for a, b, c in f]
        slow, mod = covers
        new = ~np.isin(mod.picked, slow.picked)
        both = Cover(
            np.concatenate([slow.picked, mod.picked[new]]),
            np.concatenate([slow.picked_bad, mod.picked_bad[new]]),
            slow.total,
            slow.bad,
        )
        return both, out

    def fold_baselines(self, index: PathIndex, dt_s: float, params: DelayParams) -> None:
        """Update the path baselines in ``index`` with this window's minima."""
        index.fold(self.wmin, dt_s, params.drift_ns_per_s)

    def reset(self) -> None:
        """Start a new window."""
        self.judged_paths[:] = 0
        self.coarse_paths[:] = 0
        self.wmin[:] = np.inf
        self._slow_hops.clear()
        self._slow_flows.clear()
        self._mod_hops.clear()
        self._mod_flows.clear()
