"""Per-pair Huygens offset+drift fit from forward and reverse one-way delay samples.

Model: forward samples ``d_fwd = owd_ab + theta(t)`` lie above ``theta(t) + floor``, reverse samples
``d_rev = owd_ba - theta(t)`` give points ``-d_rev`` below ``theta(t) - floor``. With a linear
``theta(t) = offset + drift * t`` and symmetric floors, the max-margin separating line solves the
1-D concave problem ``max_m  min_i(d_fwd_i - m t_i) + min_j(d_rev_j + m t_j)``; then
``offset = (minF - minR) / 2`` and ``floor = (minF + minR) / 2`` (the margin).

``fit_pair`` solves it exactly (lower convex hulls, breakpoints); ``fit_pairs`` solves many pairs
at once with numpy: per-(pair, direction) time-binned minima of the detrended delays, a vectorized
bisection on the slope, repeated on the re-detrended data until the slope settles (each pass
shrinks the binning error by about ``2 / n_bins``). Times are float ns relative to the caller's
epoch ``t_ref`` (t = 0); the returned offset is theta at t = 0.

Time axis: forward and reverse samples must be timed on ONE clock's axis, e.g. clock a (the
forward send stamp, the reverse *receive* stamp). Timing reverse samples by b's send stamp
shifts them by theta (up to ms), i.e. by drift x theta in delay (60 ppm x 1 ms = 60 ns). Also
the fitted offset is theta where that clock reads t_ref, which differs from true t_ref by
offset_a: re-evaluate at ``t = offset_a`` (known after a network solve) to align pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sync._arrays import as_float

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
MIN_STD_NS = 0.1  # floor of the reported offset std (ns)


class FitStatus(IntEnum):
    """Outcome of a pair fit; everything except OK means offset/drift are NaN."""

    OK = 0
    NO_FWD = 1
    NO_REV = 2
    TOO_FEW = 3
    NO_SPAN = 4
    DRIFT_AT_BOUND = 5
    NONFINITE = 6


REASONS: dict[FitStatus, str] = {
    FitStatus.OK: "ok",
    FitStatus.NO_FWD: "no forward samples",
    FitStatus.NO_REV: "no reverse samples",
    FitStatus.TOO_FEW: "too few samples in a direction",
    FitStatus.NO_SPAN: "samples span no time: drift not identifiable",
    FitStatus.DRIFT_AT_BOUND: "drift hit max_drift: data do not bound the slope",
    FitStatus.NONFINITE: "non-finite time or delay in window",
}


@dataclass(frozen=True)
class PairFit:
    """One pair's estimate: theta(t) = offset_ns + drift * t (t relative to t_ref, ns).

    Invariant (checked): status OK <=> offset/drift/std are finite; otherwise they are NaN.
    ``floor_ns`` is the fitted margin (symmetric one-way propagation floor estimate).
    """

    offset_ns: float
    drift: float
    offset_std_ns: float
    drift_std: float
    floor_ns: float
    n_fwd: int
    n_rev: int
    status: FitStatus

    def __post_init__(self) -> None:
        vals = (self.offset_ns, self.drift, self.offset_std_ns, self.drift_std)
        if self.status == FitStatus.OK:
            if not all(math.isfinite(v) for v in vals):
                raise ValueError("PairFit with status OK needs finite estimates")
            if self.offset_std_ns < 0 or self.drift_std < 0:
                raise ValueError("PairFit uncertainties must be >= 0")
        elif not all(math.isnan(v) for v in vals):
            raise ValueError(f"PairFit with status {self.status.name} must carry NaN estimates")
        if self.n_fwd < 0 or self.n_rev < 0:
            raise ValueError("sample counts must be >= 0")

    @property
    def ok(self) -> bool:
        """True when the estimate is usable."""
        return bool(self.status == FitStatus.OK)

    @property
    def reason(self) -> str:
        """Human-readable status."""
        return REASONS[self.status]


@dataclass(frozen=True)
class PairFits:
    """Batched fit result, one entry per pair index. Non-OK entries hold NaN estimates."""

    offset_ns: F64
    drift: F64
    offset_std_ns: F64
    drift_std: F64
    floor_ns: F64
    n_fwd: I64
    n_rev: I64
    status: NDArray[np.int8]

    def __post_init__(self) -> None:
        n = self.status.shape
        names = ("offset_ns", "drift", "offset_std_ns", "drift_std", "floor_ns", "n_fwd", "n_rev")
        if len(n) != 1 or any(getattr(self, k).shape != n for k in names):
            raise ValueError("PairFits columns must be 1-D and of equal length")
        ok = self.status == FitStatus.OK
        if np.isfinite(self.offset_ns[~ok]).any() or not np.isfinite(self.offset_ns[ok]).all():
            raise ValueError("PairFits: offsets must be finite exactly where status is OK")

    def __len__(self) -> int:
        return int(self.status.shape[0])

    @property
    def ok(self) -> NDArray[np.bool_]:
        """Mask of usable pairs."""
        return np.asarray(self.status == FitStatus.OK)

    def __getitem__(self, i: int) -> PairFit:
        return PairFit(
            offset_ns=float(self.offset_ns[i]),
            drift=float(self.drift[i]),
            offset_std_ns=float(self.offset_std_ns[i]),
            drift_std=float(self.drift_std[i]),
            floor_ns=float(self.floor_ns[i]),
            n_fwd=int(self.n_fwd[i]),
            n_rev=int(self.n_rev[i]),
            status=FitStatus(int(self.status[i])),
        )


def _check_params(min_samples: int, max_drift: float, quant_ns: float) -> None:
    if min_samples < 2:
        raise ValueError(f"min_samples must be >= 2, got {min_samples}")
    if not (0 < max_drift < 0.1):
        raise ValueError(f"max_drift must be in (0, 0.1), got {max_drift}")
    if not quant_ns >= 0:
        raise ValueError(f"quant_ns must be >= 0, got {quant_ns}")


def _std(spread_f: F64, spread_r: F64, span: F64, tc: F64, quant_ns: float) -> tuple[F64, F64]:
    """Heuristic 1-sigma offset (at t=0) and drift uncertainty.

    The envelope error of each side is taken as the gap between its lowest and third-lowest
    support residual (how densely samples sit at the floor), plus quantization. Drift error is
    that over the window span; the offset at t=0 adds the drift error times the distance from
    the window centre ``tc``. Floored at ``MIN_STD_NS`` so 1/std^2 weights stay finite.
    """
    q = quant_ns / math.sqrt(12.0)
    s_centre = np.maximum(0.5 * np.sqrt(spread_f**2 + spread_r**2 + 2 * q * q), MIN_STD_NS)
    drift_std = 2.0 * math.sqrt(3.0) * s_centre / np.maximum(span, 1.0)
    offset_std = np.sqrt(s_centre**2 + (drift_std * tc) ** 2)
    return offset_std, drift_std


# ---------------------------------------------------------------------------------------------
# Exact single-pair fit
# ---------------------------------------------------------------------------------------------


def _lower_hull(u: F64, d: F64) -> tuple[F64, F64]:
    """Vertices of the lower convex hull of points (u, d), sorted by u (monotone chain)."""
    order = np.lexsort((d, u))
    hu: list[float] = []
    hd: list[float] = []
    for x, y in zip(u[order].tolist(), d[order].tolist(), strict=True):
        if hu and hu[-1] == x:
            continue  # same time, larger or equal delay: never on the lower hull
        while (
            len(hu) >= 2
            and (hu[-1] - hu[-2]) * (y - hd[-2]) - (hd[-1] - hd[-2]) * (x - hu[-2]) <= 0
        ):
            hu.pop()
            hd.pop()
        hu.append(x)
        hd.append(y)
    return np.asarray(hu), np.asarray(hd)


def _exact_slope(uf: F64, df: F64, ur: F64, dr: F64, max_drift: float) -> tuple[float, bool]:
    """Maximize g(m) = min(df - m uf) + min(dr + m ur) on [-max_drift, max_drift].

    Returns (m, at_bound). g is concave piecewise linear with breakpoints at the edge slopes of
    the lower hull of F and minus the edge slopes of the lower hull of R.
    """
    hfu, hfd = _lower_hull(uf, df)
    hru, hrd = _lower_hull(ur, dr)
    bounds = np.array([-max_drift, max_drift])
    cand = [np.diff(hfd) / np.diff(hfu), -np.diff(hrd) / np.diff(hru), bounds]
    m: F64 = np.clip(np.unique(np.concatenate(cand)), -max_drift, max_drift)
    g = np.min(hfd[None, :] - m[:, None] * hfu[None, :], axis=1) + np.min(
        hrd[None, :] + m[:, None] * hru[None, :], axis=1
    )
    top = np.flatnonzero(g >= g.max() - 1e-9 * max(1.0, abs(float(g.max()))))
    lo, hi = float(m[top[0]]), float(m[top[-1]])
    best = 0.5 * (lo + hi)
    at_bound = (hi == lo) and abs(best) >= max_drift
    return best, at_bound


def fit_pair(
    fwd_t: ArrayLike,
    fwd_d: ArrayLike,
    rev_t: ArrayLike,
    rev_d: ArrayLike,
    *,
    min_samples: int = 3,
    max_drift: float = 1e-3,
    quant_ns: float = 0.0,
) -> PairFit:
    """Exact max-margin fit for one pair.

    ``fwd_t``/``rev_t`` are times on one clock's axis, float ns relative to t_ref (see the
    module docstring: a's send stamp forward, a's receive stamp reverse), ``fwd_d``/
    ``rev_d`` the measured delays (recv stamp minus send stamp). The envelope is a minimum, so
    early-stamp outliers bias it: filter with ``sync.coded`` first. Returns a PairFit (status != OK with
    NaN estimates when the window cannot be fitted). Raises ValueError for malformed input.
    """
    _check_params(min_samples, max_drift, quant_ns)
    uf = as_float(fwd_t, "fwd_t")
    df = as_float(fwd_d, "fwd_d", len(uf))
    ur = as_float(rev_t, "rev_t")
    dr = as_float(rev_d, "rev_d", len(ur))
    nf, nr = len(uf), len(ur)

    def bad(status: FitStatus) -> PairFit:
        nan = math.nan
        return PairFit(nan, nan, nan, nan, nan, nf, nr, status)

    finite = [np.isfinite(a).all() for a in (uf, df, ur, dr)]
    if nf == 0:
        return bad(FitStatus.NO_FWD)
    if nr == 0:
        return bad(FitStatus.NO_REV)
    if not all(finite):
        return bad(FitStatus.NONFINITE)
    if min(nf, nr) < min_samples:
        return bad(FitStatus.TOO_FEW)
    t_all = np.concatenate([uf, ur])
    t0, t1 = float(t_all.min()), float(t_all.max())
    if t1 <= t0:
        return bad(FitStatus.NO_SPAN)
    tc = 0.5 * (t0 + t1)
    uf, ur = uf - tc, ur - tc

    m, at_bound = _exact_slope(uf, df, ur, dr, max_drift)
    if at_bound:
        return bad(FitStatus.DRIFT_AT_BOUND)
    rf, rr = np.sort(df - m * uf), np.sort(dr + m * ur)
    c = 0.5 * (rf[0] - rr[0])
    floor = 0.5 * (rf[0] + rr[0])
    sf = np.array([rf[min(2, len(rf) - 1)] - rf[0]])
    sr = np.array([rr[min(2, len(rr) - 1)] - rr[0]])
    ostd, dstd = _std(sf, sr, np.array([t1 - t0]), np.array([tc]), quant_ns)
    return PairFit(
        offset_ns=float(c - m * tc),
        drift=float(m),
        offset_std_ns=float(ostd[0]),
        drift_std=float(dstd[0]),
        floor_ns=float(floor),
        n_fwd=nf,
        n_rev=nr,
        status=FitStatus.OK,
    )
