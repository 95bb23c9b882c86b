"""The per-edge stages of `sync.summarysolve.sync_summary`: what one range of a window's
edges computes on its own summary, given the node-level vectors the network stages solved.

`sync_summary` interleaves work that needs no other edge (pair fits on the hulls, the
lowest-RTT lines, the bad-stamp search, the fixed-slope envelope refit and the lowest-RTT
candidates, the exchanges' residuals, each direction's lowest values) with network solves
and node-level reductions. An `EdgeRange` holds one range's `sync.summary.Summary` (edges
with global NIC indices, edge indices local to the range) and the little it must remember
between stages; each stage takes node vectors (drifts, offsets) and returns small per-edge
or per-direction arrays (`EdgeFit`, `Candidates`, `Residuals`, `sync.excess.DirectionLows`),
whose ranges laid end to end in edge order (`concat_fits`, `concat_candidates`,
`concat_residuals`, `concat_lows`: indices shifted by the edges before) are what the whole
window computes, to the bit: every per-edge step reads only its own edge's points. So one
process (one range: the whole window) and a fleet of edge owners (one range each,
`controller.fleet.edges`) run the same code. Pure: arrays in, small arrays out; an
`EdgeRange` changes only by its stages (``drop_bad``, ``cut_nodes``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
from numpy.typing import NDArray

from sync.badstamps import without_bad
from sync.batchfit import fit_pairs
from sync.excess import DirectionLows, direction_lows
from sync.pairfit import PairFits
from sync.refine import refit_fixed_slope
from sync.steps import exchange_residuals, without_nodes
from sync.summary import G32, Summary, fit_hulls

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
LINE_FRACTION = 0.1  # lowest-RTT exchanges per edge the drift lines go through


class FitParams(NamedTuple):
    """The pair fits' parameters (`sync.batchfit.fit_pairs`, `sync.summary.fit_hulls`)."""

    quant_ns: float = 0.0
    min_samples: int = 3
    min_coded: int = 8


class EdgeFit(NamedTuple):
    """Per edge of a range: its pair fit and its lowest-RTT line's slope (NaN: none)."""

    fits: PairFits
    line: F64


class Candidates(NamedTuple):
    """Per edge of a range, the second stage's inputs (`EdgeRange.candidates`): whether it is
    usable, slope x clock i's offset (moves a candidate to the reference instant), the
    candidate offsets (envelope first), the queueing each keeps and the envelope floors."""

    usable: NDArray[np.bool_]
    shift_term: F64
    cands: list[F64]
    excess: list[F64]
    env_floor: F64


class Residuals(NamedTuple):
    """A range's exchanges with a finite residual against the solved lines
    (`sync.steps.exchange_residuals`): edge (local), time, residual."""

    x_edge: I64
    x_mid: F64
    resid: F64


class RangeStages(Protocol):
    """What `sync.summarysolve.solve_ranges` asks of one range of edges: `EdgeRange`'s
    stages (an edge owner's, or a proxy that asks one over the wire)."""

    @property
    def edges(self) -> I64: ...

    def fit(self) -> EdgeFit: ...

    def drop_bad(self, drift: F64) -> bool: ...

    def candidates(self, drift: F64, offset: F64, rtt_fractions: Sequence[float]) -> Candidates: ...

    def residuals(self, offset: F64, drift: F64) -> Residuals: ...

    def cut_nodes(self, nodes: I64) -> None: ...

    def lows(self) -> DirectionLows: ...


class EdgeRange:
    """One range of a window's edges and what its stages remember: the summary as given
    (a stepped NIC is left out of it), the summary left after the bad-stamp rounds, the
    hull points its pair fits read, the stamps left out, the pair slopes of the second
    stage. Not thread-safe."""

    def __init__(self, s: Summary, params: FitParams) -> None:
        self.given = s
        self.params = params
        self._reset(s)

    def _reset(self, s: Summary) -> None:
        self.s = s
        m = len(s.edges)
        self.lost, self.lost_x = np.zeros(2 * m, np.int64), np.zeros(m, np.int64)
        self._pts: tuple[G32, F64, F64] | None = None
        self._fit: EdgeFit | None = None
        self._slope = np.zeros(m)

    @property
    def edges(self) -> I64:
        """The range's edges (m, 2), global NIC indices."""
        return self.s.edges

    def fit(self) -> EdgeFit:
        """Pair fits on the hulls and the lowest-RTT lines of what is left (kept until the
        summary changes: a second call is free)."""
        if self._fit is None:
            s, p = self.s, self.params
            m = len(s.edges)
            g, t, d, cnt = fit_hulls(s, p.min_coded)
            fwd, rev = g % 2 == 0, g % 2 == 1
            ge = g // 2
            fits = fit_pairs(
                m, ge[fwd], t[fwd], d[fwd], ge[rev], t[rev], d[rev],
                min_samples=p.min_samples, quant_ns=p.quant_ns, counts=(cnt[0::2], cnt[1::2]),
            )  # fmt: skip
            self._pts = (g, t, d)
            self._fit = EdgeFit(fits, lowrtt_lines(s)[0])
        return self._fit

    def drop_bad(self, drift: F64) -> bool:
        """One bad-stamp round with the node ``drift``s (`sync.badstamps.without_bad`):
        leave out what bad stamps put below their floor. Returns True when something was
        left out (the fits must be made again: `fit`)."""
        e0, e1 = self.s.edges[:, 0], self.s.edges[:, 1]
        s2, lost, lost_x = without_bad(self.s, drift[e1] - drift[e0])
        if s2 is self.s:
            return False
        self.s, self.lost, self.lost_x = s2, self.lost + lost, self.lost_x + lost_x
        self._fit = self._pts = None
        return True

    def candidates(self, drift: F64, offset: F64, rtt_fractions: Sequence[float]) -> Candidates:
        """The second stage's per-edge inputs with the node ``drift``s and ``offset``s of
        the first stage: the envelope refit with the pair slopes fixed, and per lowest-RTT
        fraction the mean detrended offset of the lowest-RTT exchanges and their mean RTT
        over the lowest (`sync.summarysolve.sync_summary`). Raises ValueError when a
        fraction needs more exchanges than ``cap`` kept."""
        s = self.s
        fit_ok = self.fit().fits.ok
        assert self._pts is not None
        g, t, d = self._pts
        m = len(s.edges)
        i, j = s.edges[:, 0], s.edges[:, 1]
        slope = drift[j] - drift[i]
        shift = offset[i]
        usable = fit_ok & np.isfinite(slope) & np.isfinite(shift)
        slope = np.where(usable, slope, 0.0)
        self._slope = slope
        fwd, rev = g % 2 == 0, g % 2 == 1
        ge = g // 2
        env_off, env_floor = refit_fixed_slope(
            m, ge[fwd], t[fwd], d[fwd], ge[rev], t[rev], d[rev], slope
        )
        cands, excess = [env_off], [np.zeros(m)]
        if rtt_fractions:
            lost_x = self.lost_x
            n_x = np.bincount(s.x_edge, minlength=m)
            ks = [
                np.clip(np.rint(q * s.n_all[0::2]), 1, None).astype(np.int64) for q in rtt_fractions
            ]
            short = (n_x < s.n_all[0::2]) & (np.max(ks, axis=0) > n_x + lost_x)
            ks = [np.where(lost_x > 0, np.clip(k, 1, np.maximum(n_x, 1)), k) for k in ks]
            if short.any():
                raise ValueError("cap too small for the lowest-RTT fractions on some edges")
            start = np.concatenate([[0], np.cumsum(n_x)[:-1]])
            rank = np.arange(len(s.x_edge)) - start[s.x_edge]
            has = n_x > 0
            rmin = np.full(m, np.nan)
            rmin[has] = s.x_rtt[start[has]]  # sorted by (edge, rtt): the first is the lowest
            for k in ks:
                take = rank < k[s.x_edge]
                num = np.bincount(s.x_edge[take], minlength=m).astype(np.float64)
                num = np.where(has, num, np.nan)
                # per-exchange offset detrended by the slope: 0.5 (xf - xr) = off - slope * mid
                off = np.bincount(s.x_edge[take], s.x_off[take], m) / num
                mid = np.bincount(s.x_edge[take], s.x_mid[take], m) / num
                rtt = np.bincount(s.x_edge[take], s.x_rtt[take], m) / num
                cands.append(off - slope * mid)
                excess.append(rtt - rmin)
        return Candidates(usable, slope * shift, cands, excess, env_floor)

    def residuals(self, offset: F64, drift: F64) -> Residuals:
        """Each exchange's residual against the solved node ``offset``s and ``drift``s
        (`sync.steps.exchange_residuals`), the finite ones only (`sync.steps.find_steps`
        reads no other)."""
        s = self.s
        res = exchange_residuals(s.edges, s.x_edge, s.x_mid, s.x_off, offset, drift)
        ok = np.isfinite(res) & np.isfinite(s.x_mid)
        return Residuals(s.x_edge[ok], s.x_mid[ok], res[ok])

    def cut_nodes(self, nodes: I64) -> None:
        """Start again from the summary as given without the edges of ``nodes``
        (`sync.steps.without_nodes`: NICs whose clocks stepped)."""
        self.given = without_nodes(self.given, nodes)
        self._reset(self.given)

    def lows(self) -> DirectionLows:
        """Each direction's lowest values detrended by the slopes of the last `candidates`
        call, at most what the bad-stamp rounds left sure (`sync.excess.direction_lows`)."""
        return direction_lows(self.s, self._slope, lost=self.lost)


def lowrtt_lines(s: Summary, fraction: float = LINE_FRACTION) -> tuple[F64, F64]:
    """Per edge a least-squares line through the per-exchange offsets ``0.5 (d_fwd - d_rev)``
    of its lowest-RTT ``fraction`` of exchanges against their times: (slope, slope std error),
    NaN where fewer than 3 exchanges or no time spread. At high load the pair envelope is
    touched by two samples whose queueing differs by hundreds of ns, so its slope is off by
    hundreds of ppb; many least-queued exchanges spread over the window pin it far better
    (docs/sync.md, "Drift at high load")."""
    m = len(s.edges)
    n_x = np.bincount(s.x_edge, minlength=m)
    start = np.concatenate([[0], np.cumsum(n_x)[:-1]])
    rank = np.arange(len(s.x_edge)) - start[s.x_edge]
    k = np.clip(np.rint(fraction * s.n_all[0::2]), 1, None).astype(np.int64)
    take = rank < k[s.x_edge]
    e, x, y = s.x_edge[take], s.x_mid[take], s.x_off[take]
    cnt = np.bincount(e, minlength=m).astype(np.float64)
    xm = np.bincount(e, x, m) / np.maximum(cnt, 1.0)
    ym = np.bincount(e, y, m) / np.maximum(cnt, 1.0)
    dx, dy = x - xm[e], y - ym[e]
    sxx = np.bincount(e, dx * dx, m)
    ok = (cnt >= 3) & (sxx > 0)
    sxx = np.where(ok, sxx, 1.0)
    slope = np.bincount(e, dx * dy, m) / sxx
    res = dy - slope[e] * dx
    se = np.sqrt(np.bincount(e, res * res, m) / np.maximum(cnt - 2.0, 1.0) / sxx)
    ok &= np.isfinite(se) & (se > 0)
    return np.where(ok, slope, np.nan), np.where(ok, se, np.nan)


def _offsets(sizes: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(int(n) for n in sizes)]


def concat_fits(parts: Sequence[EdgeFit]) -> EdgeFit:
    """The ranges' `EdgeFit`s laid end to end (edge order)."""
    f = [p.fits for p in parts]
    cat = np.concatenate
    fits = PairFits(
        cat([x.offset_ns for x in f]), cat([x.drift for x in f]),
        cat([x.offset_std_ns for x in f]), cat([x.drift_std for x in f]),
        cat([x.floor_ns for x in f]), cat([x.n_fwd for x in f]), cat([x.n_rev for x in f]),
        cat([x.status for x in f]),
    )  # fmt: skip
    return EdgeFit(fits, cat([p.line for p in parts]))


def concat_candidates(parts: Sequence[Candidates]) -> Candidates:
    """The ranges' `Candidates` laid end to end (edge order; as many candidates each)."""
    cat = np.concatenate
    n = len(parts[0].cands)
    return Candidates(
        cat([p.usable for p in parts]), cat([p.shift_term for p in parts]),
        [cat([p.cands[c] for p in parts]) for c in range(n)],
        [cat([p.excess[c] for p in parts]) for c in range(n)],
        cat([p.env_floor for p in parts]),
    )  # fmt: skip


def concat_residuals(parts: Sequence[Residuals], sizes: Sequence[int]) -> Residuals:
    """The ranges' `Residuals` laid end to end, edges shifted by the ``sizes`` (edges per
    range) before."""
    off = _offsets(sizes)
    cat = np.concatenate
    return Residuals(
        cat([p.x_edge + o for p, o in zip(parts, off, strict=False)]),
        cat([p.x_mid for p in parts]), cat([p.resid for p in parts]),
    )  # fmt: skip


def concat_lows(parts: Sequence[DirectionLows], sizes: Sequence[int]) -> DirectionLows:
    """The ranges' `sync.excess.DirectionLows` laid end to end, groups shifted by twice the
    ``sizes`` (edges per range) before."""
    off = _offsets(sizes)
    cat = np.concatenate
    return DirectionLows(
        cat([p.grp + 2 * o for p, o in zip(parts, off, strict=False)]),
        cat([p.kd for p in parts]), cat([p.low for p in parts]), cat([p.high for p in parts]),
    )  # fmt: skip


def edge_range(s: Summary, lo: int, hi: int) -> Summary:
    """The summary of ``s``'s edges ``lo`` to ``hi`` (excluded): the inverse of laying
    ranges end to end (`controller.fleet.edges.join`). Raises ValueError unless
    ``0 <= lo <= hi <= len(s.edges)``."""
    m = len(s.edges)
    if not 0 <= lo <= hi <= m:
        raise ValueError(f"need 0 <= lo <= hi <= {m}, got {lo}, {hi}")
    c0, c1 = np.searchsorted(s.clean_g, [2 * lo, 2 * hi])
    a0, a1 = np.searchsorted(s.all_g, [2 * lo, 2 * hi])
    x0, x1 = np.searchsorted(s.x_edge, [lo, hi])
    return Summary(
        s.edges[lo:hi], s.cap[lo:hi],
        (s.clean_g[c0:c1] - 2 * lo).astype(np.int32), s.clean_t[c0:c1], s.clean_d[c0:c1],
        (s.all_g[a0:a1] - 2 * lo).astype(np.int32), s.all_t[a0:a1], s.all_d[a0:a1],
        s.n_clean[2 * lo : 2 * hi], s.n_all[2 * lo : 2 * hi],
        s.x_edge[x0:x1] - lo, s.x_rtt[x0:x1], s.x_off[x0:x1], s.x_mid[x0:x1],
    )  # fmt: skip
