"""Delay evidence: per-hop queueing delay over a detection window.

Every one-way delay is measured on a path (`controller.detect.paths.PathIndex` numbers paths
and keeps their propagation baselines). The queueing delay of a measurement is its delay minus
its path's baseline; it is *slow* when that excess is above ``max(min_excess_ns, median +
noise_k * MAD)`` (over the batch: robust to the few contended paths). `DelayWindow` counts
judged measurements per path (expanded to directed hops once per window), keeps each path's
window minimum for the baseline, the hop sets and flows of the slow measurements for the
tomography (`controller.localize.greedy_cover`: the *slow tier*), and every fine delay's path,
queueing delay and flow for the per-hop queue estimate (`controller.detect.queues`, which
finds the hops whose *typical* probe waits: the brain's second tier). A *coarse* delay (clocks
certain to `ClockSyncConfig.coarse_unc_ns` only) is judged by the slow tier alone and counted
in its judged measurements, never given to the queue estimate, and sets no baseline: its
clock error may reach the queue estimate's 1.5 µs floor, not the slow tier's 4 µs. Each fine
delay goes to the queue estimate with its stamp kind (kernel or NIC: `Observations.sw`): the
hosts' stamp jitter of kernel-stamped delays sets how small a queue the estimate can see.

Two tiers because a queue is a distribution, not a constant: an added queue of mean m puts a
share exp(-x / m) of its probes above x. Over the 4 µs floor, half of a hop's probes are slow
only from m ~ 6 µs on; a 3 µs queue has 26 % there, but its median is 2.1 µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.detect import roundtrips
from controller.detect.paths import PathIndex, expand
from controller.localize import Cover, greedy_cover


@dataclass(frozen=True, slots=True)
class DelayParams:
    """Thresholds for queueing delay: see the module docstring. A hop is blamed when its
    unexplained slow measurements are >= ``min_slow`` and >= ``min_rate`` of its judged ones."""

    min_excess_ns: float = 4000.0
    noise_k: float = 8.0
    min_rate: float = 0.5
    min_slow: int = 3
    drift_ns_per_s: float = 50.0
    max_faults: int = 8
    max_flows: int = 32
    # the round trips of a round path (forward and reply path) whose delays are not judged
    # finely clear a hop of it when at least round_trip_min of them are significantly (sign
    # test at round_trip_alpha over the window's tests) under this share of what a tier
    # claims on the hop (`controller.detect.roundtrips`; the margin is for the baselines'
    # own error, a path's least delay seen, and for the other hops' share of a round trip)
    round_trip_cut: float = 0.5
    round_trip_min: int = 8
    round_trip_alpha: float = 0.01
    # a fine delay this far under its path's baseline while its probe's round trip is not is
    # a clock error (`controller.detect.roundtrips.clock_split`): both delays withheld
    clock_split_ns: float = 1000.0

    def __post_init__(self) -> None:
        if not 0 < self.round_trip_cut <= 1 or self.round_trip_min < 1:
            raise ValueError("round_trip_cut must be in (0, 1] and round_trip_min >= 1")
        if not 0 < self.round_trip_alpha < 1:
            raise ValueError("round_trip_alpha must be in (0, 1)")
        if not self.clock_split_ns > 0:
            raise ValueError("clock_split_ns must be > 0")


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
    judged_paths: npt.NDArray[np.int64] = field(init=False)  # fine delays
    coarse_paths: npt.NDArray[np.int64] = field(init=False)  # coarse ones (slow tier only)
    wmin: npt.NDArray[np.float64] = field(init=False)
    _slow_hops: list[npt.NDArray[np.int32]] = field(init=False, default_factory=list)
    _slow_flows: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)
    _slow_excess: list[npt.NDArray[np.float64]] = field(init=False, default_factory=list)
    _fine_paths: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)
    _fine_excess: list[npt.NDArray[np.float64]] = field(init=False, default_factory=list)
    _fine_flows: list[npt.NDArray[np.int32]] = field(init=False, default_factory=list)
    _fine_sw: list[npt.NDArray[np.bool_]] = field(init=False, default_factory=list)
    _rt_fwd: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)
    _rt_rev: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)
    _rt_excess: list[npt.NDArray[np.float64]] = field(init=False, default_factory=list)

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
        sw: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """Judge one direction's delays (NaN = unknown) against their path baselines.

        ``path`` are the path numbers of the rows (from ``index.paths(hops)``); ``flows`` is
        (src, dst, sport) of each measurement, for the affected-flow list. ``coarse`` marks
        delays whose clocks are certain only to the coarse bound (`ClockSyncConfig
        .coarse_unc_ns`): they are judged by the slow tier only (their clock error stays under
        its floor, not under the queue estimate's) and never set a baseline. ``sw`` marks
        kernel-stamped delays (None: none are), kept with the fine delays (`fine`).
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
        # would widen the spread the threshold scales with)
        ex_stats = excess[known_fine] if known_fine.any() else excess[known]
        sample = ex_stats[:: max(1, len(ex_stats) // 20_000)]
        med = float(np.median(sample))
        mad = float(np.median(np.abs(sample - med))) * 1.4826
        thr = max(params.min_excess_ns, med + params.noise_k * mad)
        # add.at, not bincount: a bincount allocates and adds an array of every known path
        # per call, which at 10,000 NICs costs more than the batch itself
        np.add.at(self.judged_paths, path[known_fine], 1)
        if not known_fine.all():
            np.add.at(self.coarse_paths, path[known & ~known_fine], 1)
        idx = np.flatnonzero(known_fine)
        self._fine_paths.append(path[idx])
        self._fine_excess.append(excess[idx])
        self._fine_flows.append(np.column_stack([f[idx] for f in flows]).astype(np.int32))
        self._fine_sw.append(np.zeros(len(idx), np.bool_) if sw is None else sw[idx])
        slow = np.zeros(len(owd), dtype=bool)
        slow[known] = excess[known] > thr
        if slow.any():
            idx = np.flatnonzero(slow)
            self._slow_hops.append(hops[idx])
            self._slow_flows.append(np.column_stack([f[idx] for f in flows]).astype(np.int64))
            self._slow_excess.append(excess[idx])

    def add_round_trips(
        self,
        index: PathIndex,
        fwd: npt.NDArray[np.int64],
        rev: npt.NDArray[np.int64],
        rtt: npt.NDArray[np.float64],
        keep: npt.NDArray[np.bool_],
    ) -> None:
        """Keep the round trips of the rows ``keep`` marks (probes whose delays are not
        judged finely: `controller.detect.roundtrips`): their forward and reply path numbers
        and their excess over both paths' baselines (ns); rows without a baseline on either
        path or without a round trip are dropped."""
        idx = np.flatnonzero(keep)
        if not len(idx):
            return
        f, r = fwd[idx], rev[idx]
        excess = rtt[idx] - index.base[f] - index.base[r]
        ok = np.isfinite(excess)
        if ok.any():
            self.add_round_trip_rows(f[ok], r[ok], excess[ok])

    def add_round_trip_rows(
        self, fwd: npt.NDArray[np.int64], rev: npt.NDArray[np.int64],
        excess: npt.NDArray[np.float64],
    ) -> None:  # fmt: skip
        """Add round trips as `add_round_trips` keeps them: forward and reply path numbers
        and excess (ns)."""
        if len(fwd):
            self._rt_fwd.append(np.asarray(fwd, np.int64))
            self._rt_rev.append(np.asarray(rev, np.int64))
            self._rt_excess.append(np.asarray(excess, np.float64))

    def has_round_trips(self) -> bool:
        """Return True when the window kept any round trip (`add_round_trips`)."""
        return bool(self._rt_excess)

    def round_trips(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Return the kept round trips' forward and reply path numbers and excess (ns)."""
        if not self._rt_excess:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
        return (np.concatenate(self._rt_fwd), np.concatenate(self._rt_rev),
                np.concatenate(self._rt_excess))  # fmt: skip

    def cleared(
        self, index: PathIndex, claim_ns: npt.NDArray[np.float64], params: DelayParams
    ) -> npt.NDArray[np.bool_]:
        """Return per directed hop whether this window's kept round trips clear it of the
        queue a tier claims on it, ``claim_ns`` (per hop, NaN: not tested): a round path of
        at least ``round_trip_min`` round trips significantly under ``round_trip_cut`` of it
        (`controller.detect.roundtrips`)."""
        fwd, rev, excess = self.round_trips()
        return roundtrips.cleared(
            fwd, rev, excess, index.hops, claim_ns * params.round_trip_cut,
            min_count=params.round_trip_min, alpha=params.round_trip_alpha,
        )  # fmt: skip

    def fine(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Return the path numbers, queueing delays (delay over the path's baseline, ns) and
        whether kernel-stamped, of this window's judged fine delays (for
        `controller.detect.queues`)."""
        if not self._fine_paths:
            return np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.bool_)
        return (np.concatenate(self._fine_paths), np.concatenate(self._fine_excess),
                np.concatenate(self._fine_sw))  # fmt: skip

    def flows_over(
        self, index: PathIndex, cut_ns: npt.NDArray[np.float64], hops: npt.NDArray[np.int64],
        max_flows: int,
    ) -> dict[int, list[tuple[int, int, int]]]:  # fmt: skip
        """Return per hop of ``hops`` up to ``max_flows`` (src, dst, sport) of this window's
        fine delays across it whose queueing delay is over ``cut_ns[hop]``."""
        out: dict[int, list[tuple[int, int, int]]] = {int(h): [] for h in hops}
        if not self._fine_paths or not len(hops):
            return out
        paths, excess, _ = self.fine()
        low = float(np.min(cut_ns[hops]))
        sel = np.flatnonzero(excess > low)
        if not len(sel):
            return out
        rows = index.hops[paths[sel]]
        flows = np.concatenate(self._fine_flows)[sel]
        for h in out:
            on = (rows == h).any(axis=1) & (excess[sel] > cut_ns[h])
            f = np.unique(flows[on], axis=0)[:max_flows]
            out[h] = [(int(a), int(b), int(c)) for a, b, c in f]
        return out

    # ---- merge (fleet partials: `controller.detect.window`) ----------------------------------
    def per_path(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Return per path number (as `add` was given them) the fine and coarse delays judged
        and the window minimum (inf: none); paths past the end had nothing."""
        return self.judged_paths, self.coarse_paths, self.wmin

    def sets(
        self,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Return the slow tier's hop sets, (n, H) -1 padded, their flows, (n, 3) of (src,
        dst, sport), and their queueing delays (ns)."""
        flows = np.concatenate(self._slow_flows) if self._slow_flows else np.zeros((0, 3), np.int64)
        excess = np.concatenate(self._slow_excess) if self._slow_excess else np.zeros(0)
        return _pad_concat(self._slow_hops), flows, excess.astype(np.float64)

    def slow_claims(self) -> npt.NDArray[np.float64]:
        """Return per directed hop the median queueing delay (ns) of this window's slow
        measurements across it: what the slow tier would blame it for (NaN: none)."""
        out = np.full(self.n_hops, np.nan)
        sets, _, excess = self.sets()
        if not len(excess):
            return out
        ex = np.broadcast_to(excess[:, None], sets.shape)[sets >= 0]
        hop = sets[sets >= 0].astype(np.int64)
        order = np.lexsort((ex, hop))
        hop, ex = hop[order], ex[order]
        starts = np.flatnonzero(np.r_[True, hop[1:] != hop[:-1]])
        counts = np.diff(np.r_[starts, len(hop)])
        lo = ex[starts + (counts - 1) // 2]
        hi = ex[starts + counts // 2]
        out[hop[starts]] = (lo + hi) / 2
        return out

    def fine_sets(
        self,
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int32],
        npt.NDArray[np.bool_],
    ]:  # fmt: skip
        """Return every judged fine delay's path number, queueing delay (ns), flow (n, 3:
        src, dst, sport) and whether kernel-stamped, in the order `add` was given them."""
        paths, excess, sw = self.fine()
        flows = np.concatenate(self._fine_flows) if self._fine_flows else np.zeros((0, 3), np.int32)
        return paths, excess, flows, sw

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
        self, slow_hops: npt.NDArray[np.int32], slow_flows: npt.NDArray[np.int64],
        slow_excess: npt.NDArray[np.float64],
    ) -> None:  # fmt: skip
        """Add slow hop sets with their flows and queueing delays (as `add` keeps them)."""
        if len(slow_hops):
            self._slow_hops.append(np.asarray(slow_hops, np.int32))
            self._slow_flows.append(np.asarray(slow_flows, np.int64))
            self._slow_excess.append(np.asarray(slow_excess, np.float64))

    def add_fine(
        self, paths: npt.NDArray[np.int64], excess: npt.NDArray[np.float64],
        flows: npt.NDArray[np.int32], sw: npt.NDArray[np.bool_],
    ) -> None:  # fmt: skip
        """Add judged fine delays: path numbers, queueing delays, flows and whether
        kernel-stamped (as `add` keeps them)."""
        if len(paths):
            self._fine_paths.append(np.asarray(paths, np.int64))
            self._fine_excess.append(np.asarray(excess, np.float64))
            self._fine_flows.append(np.asarray(flows, np.int32))
            self._fine_sw.append(np.asarray(sw, np.bool_))

    def slow_sets(self) -> npt.NDArray[np.int32]:
        """Return the hop sets of this window's slow measurements, (m, H), -1 padded."""
        return _pad_concat(self._slow_hops)

    def judged(self, index: PathIndex) -> npt.NDArray[np.int64]:
        """Return the slow tier's judged measurements (fine and coarse) per directed hop."""
        return expand(self.judged_paths + self.coarse_paths, index.hops, self.n_hops)

    def verdict(
        self, index: PathIndex, params: DelayParams, barred: npt.NDArray[np.bool_] | None = None
    ) -> tuple[Cover, dict[int, list[tuple[int, int, int]]]]:
        """Localize this window's slow measurements to directed hops (the slow tier's cover),
        never to a hop ``barred`` marks (cleared by round trips: `cleared`).

        Returns the cover and, per blamed hop, up to ``max_flows`` affected (src, dst, sport).
        """
        sets = _pad_concat(self._slow_hops)
        flows = np.concatenate(self._slow_flows) if self._slow_flows else np.zeros((0, 3), np.int64)
        cover = greedy_cover(
            self.judged(index),
            sets,
            min_rate=params.min_rate,
            min_bad=params.min_slow,
            max_picks=params.max_faults,
            barred=barred,
        )
        out: dict[int, list[tuple[int, int, int]]] = {}
        for hop in cover.picked:
            f = np.unique(flows[(sets == hop).any(axis=1)], axis=0)[: params.max_flows]
            out[int(hop)] = [(int(a), int(b), int(c)) for a, b, c in f]
        return cover, out

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
        self._slow_excess.clear()
        self._fine_paths.clear()
        self._fine_excess.clear()
        self._fine_flows.clear()
        self._fine_sw.clear()
        self._rt_fwd.clear()
        self._rt_rev.clear()
        self._rt_excess.clear()
