"""Delay evidence: per-path propagation baselines and per-hop queueing delay over a window.

Every one-way delay is measured on a path (its directed hops). `PathBaselines` keeps, per path
signature, the propagation baseline: the minimum delay seen, allowed to creep up slowly
(``drift_ns_per_s``) so a slowly drifting clock estimate does not look like queueing, yet a
contention episode of seconds barely moves it. The queueing delay of a measurement is its delay
minus its path's baseline; a measurement is *slow* when that excess is above
``max(min_excess_ns, noise_k * MAD)`` (MAD over the batch: robust to the few contended paths).
`DelayWindow` counts judged measurements per directed hop and keeps the hop sets and flows of
the slow ones for the tomography (`controller.localize.greedy_cover`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.localize import Cover, element_counts, greedy_cover

_MULT = np.uint64(0x9E3779B97F4A7C15)


def path_signature(hops: npt.NDArray[np.int32]) -> npt.NDArray[np.int64]:
    """Return a 64-bit signature per row of directed hop ids (-1 padding included)."""
    acc = np.zeros(hops.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in range(hops.shape[1]):
            acc = (acc ^ (hops[:, col].astype(np.int64) + 2).astype(np.uint64)) * _MULT
            acc ^= acc >> np.uint64(29)
    return acc.view(np.int64)


@dataclass(frozen=True, slots=True)
class DelayParams:
    """Thresholds for queueing delay: see the module docstring. A hop is blamed when its
    unexplained slow measurements are >= ``min_slow`` and >= ``min_rate`` of its judged ones."""

    min_excess_ns: float = 4000.0
    noise_k: float = 8.0
    min_rate: float = 0.5
    min_slow: int = 3
    min_samples: int = 5
    drift_ns_per_s: float = 50.0
    max_faults: int = 8
    max_flows: int = 32


@dataclass(eq=False)
class PathBaselines:
    """Propagation baseline per path signature (sorted table, vectorized lookups)."""

    sigs: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    base: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0, np.float64))

    def lookup(self, sig: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Return the baseline of each signature (NaN for paths not seen yet)."""
        if not len(self.sigs):
            return np.full(len(sig), np.nan)
        pos = np.minimum(np.searchsorted(self.sigs, sig), len(self.sigs) - 1)
        return np.where(self.sigs[pos] == sig, self.base[pos], np.nan)

    def update(
        self, sig: npt.NDArray[np.int64], owd: npt.NDArray[np.float64], dt_s: float, drift: float
    ) -> None:
        """Fold in a window's (signature, delay) samples: new min, or old + drift*dt if higher."""
        if not len(sig):
            return
        order = np.argsort(sig, kind="stable")
        s, d = sig[order], owd[order]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        usig, umin = s[starts], np.minimum.reduceat(d, starts)
        allsig = np.union1d(self.sigs, usig)
        base = np.full(len(allsig), np.inf)
        if len(self.sigs):
            base[np.searchsorted(allsig, self.sigs)] = self.base + drift * max(dt_s, 0.0)
        pos = np.searchsorted(allsig, usig)
        base[pos] = np.minimum(base[pos], umin)
        self.sigs, self.base = allsig, base


@dataclass(eq=False)
class DelayWindow:
    """Mutable per-window accumulator of judged delays per directed hop (owned by one brain)."""

    n_hops: int
    judged: npt.NDArray[np.int64] = field(init=False)
    _slow_hops: list[npt.NDArray[np.int32]] = field(init=False, default_factory=list)
    _slow_flows: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)
    _slow_excess: list[npt.NDArray[np.float64]] = field(init=False, default_factory=list)
    _sigs: list[npt.NDArray[np.int64]] = field(init=False, default_factory=list)
    _owds: list[npt.NDArray[np.float64]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.judged = np.zeros(self.n_hops, dtype=np.int64)

    def add(
        self,
        baselines: PathBaselines,
        hops: npt.NDArray[np.int32],
        owd: npt.NDArray[np.float64],
        flows: npt.NDArray[np.int64],
        params: DelayParams,
    ) -> None:
        """Judge one direction's delays (NaN skipped) against their path baselines.

        ``flows`` is (n, 3): src, dst, sport of each measurement (for the affected-flow list).
        """
        ok = np.isfinite(owd)
        if not ok.all():
            hops, owd, flows = hops[ok], owd[ok], flows[ok]
        if not len(owd):
            return
        sig = path_signature(hops)
        self._sigs.append(sig)
        self._owds.append(owd)
        excess = owd - baselines.lookup(sig)
        known = np.isfinite(excess)
        if not known.any():
            return
        ex = excess[known]
        med = float(np.median(ex))
        mad = float(np.median(np.abs(ex - med))) * 1.4826
        thr = max(params.min_excess_ns, med + params.noise_k * mad)
        hk = hops[known]
        self.judged += element_counts(hk, self.n_hops)
        slow = ex > thr
        if slow.any():
            self._slow_hops.append(hk[slow])
            self._slow_flows.append(flows[known][slow])
            self._slow_excess.append(ex[slow])

    def slow_sets(self) -> npt.NDArray[np.int32]:
        """Return the hop sets of this window's slow measurements, (m, H), -1 padded."""
        if not self._slow_hops:
            return np.zeros((0, 1), dtype=np.int32)
        width = max(a.shape[1] for a in self._slow_hops)
        return np.concatenate(
            [
                np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1)
                for a in self._slow_hops
            ]
        )

    def verdict(self, params: DelayParams) -> tuple[Cover, dict[int, list[tuple[int, int, int]]]]:
        """Localize this window's slow measurements to directed hops.

        Returns the cover and, per blamed hop, up to ``max_flows`` affected (src, dst, sport).
        """
        if self._slow_hops:
            width = max(a.shape[1] for a in self._slow_hops)
            sets = np.concatenate(
                [
                    np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1)
                    for a in self._slow_hops
                ]
            )
            flows = np.concatenate(self._slow_flows)
        else:
            sets = np.zeros((0, 1), dtype=np.int32)
            flows = np.zeros((0, 3), dtype=np.int64)
        cover = greedy_cover(
            self.judged,
            sets,
            min_rate=params.min_rate,
            min_bad=params.min_slow,
            max_picks=params.max_faults,
        )
        out: dict[int, list[tuple[int, int, int]]] = {}
        for hop in cover.picked:
            f = np.unique(flows[(sets == hop).any(axis=1)], axis=0)[: params.max_flows]
            out[int(hop)] = [(int(a), int(b), int(c)) for a, b, c in f]
        return cover, out

    def fold_baselines(self, baselines: PathBaselines, dt_s: float, params: DelayParams) -> None:
        """Update ``baselines`` with this window's samples."""
        if self._sigs:
            baselines.update(
                np.concatenate(self._sigs), np.concatenate(self._owds), dt_s, params.drift_ns_per_s
            )

    def reset(self) -> None:
        """Start a new window."""
        self.judged[:] = 0
        for lst in (self._slow_hops, self._slow_flows, self._slow_excess, self._sigs, self._owds):
            lst.clear()
