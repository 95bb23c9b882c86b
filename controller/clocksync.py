"""Continuous clock sync: sliding sample windows -> `sync` solves -> per-NIC clock models.

`ClockSync.add(ing)` turns an ingested batch into per-pair delay samples (coded-pair filter from
`sync.coded`, both directions of every probe) and appends them to a columnar ring buffer.
`ClockSync.maybe_solve(now_ns)` (every ``solve_every_ns``) fits every pair in the window with
`sync.batchfit.fit_pairs` and reconciles the pairs on the probe graph with
`sync.network.solve_network`, giving per-NIC clock models ``c_i(t) = offset_i + drift_i * t``
(t in ns relative to an epoch fixed at the first sample). `ClockSync.delays(ing)` extrapolates
those models to the batch's stamps and returns one-way delays; before the first solve, or for a
NIC outside the solved part of the probe graph, delays are NaN (unknown), never a guess.

Sample convention for the unordered pair (a, b), a < b, theta = c_b - c_a: a forward sample is
a message a -> b with delay d = recv_b - send_a = owd_ab + theta, a reverse sample a message
b -> a with d = recv_a - send_b = owd_ba - theta. Sample times are in a's clock (t1/t4 when a
initiated the probe, t2/t3 when b did) so both directions share one time axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controller.ingest import Ingested
from controller.windows import SampleRing
from sync import coded_pair_mask, fit_pairs, solve_network

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True)
class ClockSyncConfig:
    """Window and solve cadence (ns), coded-pair tolerance, ring capacity (samples)."""

    window_ns: int = 20_000_000_000
    solve_every_ns: int = 2_000_000_000
    coded_tol_ns: int = 2_000
    use_uncoded: bool = False
    capacity: int = 2_000_000
    min_samples: int = 3
    max_drift: float = 1e-3
    decimate_bins: int = 32  # per window (fit_pairs bins by window/16); 0 keeps every sample

    def __post_init__(self) -> None:
        if self.window_ns <= 0 or self.solve_every_ns <= 0 or self.capacity < 16:
            raise ValueError("window and solve period must be > 0 and capacity >= 16")
        if self.coded_tol_ns < 0:
            raise ValueError("coded_tol_ns must be >= 0")


@dataclass(frozen=True, eq=False)
class ClockState:
    """Per-NIC clock models from one solve; NaN where a NIC is not synced."""

    t_ref_ns: int
    offset_ns: F64  # at t_ref
    drift: F64
    offset_std_ns: F64
    drift_std: F64
    center_ns: float  # middle of the solved window, relative to t_ref
    solved_at_ns: int
    n_pairs: int
    n_samples: int = 0


@dataclass(frozen=True, eq=False)
class Delays:
    """One-way delays of an ingested batch (ns, NaN if lost or clocks unknown)."""

    t_ns: I64  # send time on the controller timebase (initiator clock corrected)
    owd_fwd_ns: F64
    owd_rev_ns: F64
    rtt_ns: F64


class ClockSync:
    """Stateful wrapper that runs the pure `sync` package continuously; see module docstring."""

    def __init__(self, n_nics: int, config: ClockSyncConfig | None = None) -> None:
        self.n_nics = n_nics
        self.config = config or ClockSyncConfig()
        self._ring = SampleRing(
            self.config.capacity,
            {"a": np.int32, "b": np.int32, "t": np.float64, "d": np.float64, "fwd": np.bool_},
        )
        self.t_ref_ns: int | None = None
        self.state: ClockState | None = None
        self._last_solve_ns: int | None = None
        self._t_max = -np.inf
        self.solves = 0
        self.last_solve_samples = 0

    # ---- samples -------------------------------------------------------------------------
    def add(self, ing: Ingested) -> int:
        """Append the batch's sync samples to the window; return how many were kept."""
        if not len(ing):
            return 0
        if self.t_ref_ns is None:
            self.t_ref_ns = int(ing.t1.min())
        ok = ~ing.lost
        coded = ing.pair >= 0
        keep_q = np.zeros(len(ing), bool)  # probe direction (t1 -> t2)
        keep_r = np.zeros(len(ing), bool)  # reply direction (t3 -> t4)
        if coded.any():
            first, second = _coded_partners(ing.pair, ing.t1)
            tol = self.config.coded_tol_ns
            both = ok[first] & ok[second]
            q_ok = coded_pair_mask(
                ing.t1[first], ing.t1[second], ing.t2[first], ing.t2[second], tol,
                arrived_first=both, arrived_second=both,
            )  # fmt: skip
            r_ok = coded_pair_mask(
                ing.t3[first], ing.t3[second], ing.t4[first], ing.t4[second], tol,
                arrived_first=both, arrived_second=both,
            )  # fmt: skip
            keep_q[first[q_ok]] = True  # first probe of each passing pair: independent samples
            keep_r[first[r_ok]] = True
        if self.config.use_uncoded:
            keep_q |= ~coded & ok
            keep_r |= ~coded & ok
        ref = self.t_ref_ns
        src, dst = ing.src, ing.dst
        lo = src < dst  # initiator is a
        a = np.minimum(src, dst)
        b = np.maximum(src, dst)
        # probe message src -> dst: forward sample if src is a; time in a's clock
        tq = np.where(lo, ing.t1, ing.t2)
        # reply message dst -> src: forward sample if dst is a (i.e. not lo)
        tr = np.where(lo, ing.t4, ing.t3)
        dq = (ing.t2 - ing.t1).astype(np.float64)
        dr = (ing.t4 - ing.t3).astype(np.float64)
        sa = np.concatenate([a[keep_q], a[keep_r]])
        sb = np.concatenate([b[keep_q], b[keep_r]])
        t_rel = np.concatenate([tq[keep_q] - ref, tr[keep_r] - ref]).astype(np.float64)
        d = np.concatenate([dq[keep_q], dr[keep_r]])
        fwd = np.concatenate([lo[keep_q], ~lo[keep_r]])
        if self.state is not None and self.config.decimate_bins > 0:
            sel = self._decimate(sa, sb, t_rel, d, fwd)
            sa, sb, t_rel, d, fwd = sa[sel], sb[sel], t_rel[sel], d[sel], fwd[sel]
        self._ring.append(a=sa, b=sb, t=t_rel, d=d, fwd=fwd)
        n = len(t_rel)
        if n:
            self._t_max = max(self._t_max, float(t_rel.max()))
        return n

    def _decimate(
        self, a: NDArray[np.int32], b: NDArray[np.int32], t: F64, d: F64, fwd: NDArray[np.bool_]
    ) -> I64:
        """Rows to keep: per (pair, direction, time bin of window/decimate_bins) the sample
        lowest above the current clock model (the envelope fit only uses such minima)."""
        st = self.state
        assert st is not None
        theta = (st.offset_ns[b] - st.offset_ns[a]) + (st.drift[b] - st.drift[a]) * t
        theta = np.where(np.isfinite(theta), theta, 0.0)
        resid = np.where(fwd, d - theta, d + theta)
        binw = self.config.window_ns / self.config.decimate_bins
        key = ((a.astype(np.int64) * self.n_nics + b) * 2 + fwd) << 24
        key |= (np.floor(t / binw).astype(np.int64)) & 0xFFFFFF
        if not len(key):
            return np.zeros(0, np.int64)
        order = np.argsort(key)
        ks, rs = key[order], resid[order]
        start = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
        gmin = np.minimum.reduceat(rs, start)
        group = np.cumsum(np.concatenate([[False], ks[1:] != ks[:-1]]))
        is_min = rs == gmin[group]
        # first minimum of each group
        cand = np.flatnonzero(is_min)
        firsts = cand[np.concatenate([[True], group[cand[1:]] != group[cand[:-1]]])]
        return np.asarray(order[firsts], dtype=np.int64)

    # ---- solving -------------------------------------------------------------------------
    def due(self, now_ns: int) -> bool:
        """True when a solve is due at ``now_ns``."""
        last = self._last_solve_ns
        return last is None or now_ns - last >= self.config.solve_every_ns

    def start_solve(self, now_ns: int) -> SampleWindow | None:
        """If a solve is due: mark it started and return the window to solve (else None)."""
        if not self.due(now_ns):
            return None
        self._last_solve_ns = now_ns
        return self.window()

    def maybe_solve(self, now_ns: int) -> bool:
        """Solve if due; return True if a new clock state was produced."""
        if not self.due(now_ns):
            return False
        self._last_solve_ns = now_ns
        return self.solve(now_ns)

    def solve(self, now_ns: int) -> bool:
        """Fit all pairs in the window and solve the network; return True on a new state."""
        window = self.window()
        if window is None:
            return False
        return self.install(compute_state(window, self.n_nics, self.config, now_ns))

    def window(self) -> SampleWindow | None:
        """Return a copy of the samples in the current window (None if there are none).

        With `compute_state` and `install` this lets a caller run the heavy solve elsewhere
        (a worker thread) while ingest goes on."""
        if self.t_ref_ns is None or not self._ring.count:
            return None
        s = self._ring.view()
        win = s["t"] >= self._t_max - self.config.window_ns
        return SampleWindow(
            self.t_ref_ns, s["a"][win], s["b"][win], s["t"][win], s["d"][win], s["fwd"][win]
        )

    def install(self, state: ClockState | None) -> bool:
        """Adopt a computed clock state (None = the solve found nothing); return True if adopted."""
        if state is None or state.t_ref_ns != self.t_ref_ns:
            return False
        self.state = state
        self.solves += 1
        self.last_solve_samples = state.n_samples
        if self.solves == 1 and self.config.decimate_bins > 0:
            self._compact()
        return True

    def _compact(self) -> None:
        """Decimate the samples gathered before the first solve (now that a model exists)."""
        s = self._ring.view()
        keep = self._decimate(s["a"], s["b"], s["t"], s["d"], s["fwd"])
        keep.sort()
        self._ring = SampleRing(self.config.capacity, {k: v.dtype.type for k, v in s.items()})
        self._ring.append(**{k: v[keep] for k, v in s.items()})

    # ---- models --------------------------------------------------------------------------
    def clock_at(self, nic: NDArray[np.int32], t_ns: I64) -> F64:
        """Return the clock error (NIC clock minus timebase, ns) of ``nic`` at its stamps."""
        st = self.state
        if st is None:
            return np.full(len(nic), np.nan)
        rel = (t_ns - st.t_ref_ns).astype(np.float64)
        return np.asarray(st.offset_ns[nic] + st.drift[nic] * rel)

    def offsets(self, t_ns: int) -> tuple[F64, F64]:
        """Return (clock offset, uncertainty) of every NIC at ``t_ns`` (NaN where unknown)."""
        st = self.state
        if st is None:
            nan = np.full(self.n_nics, np.nan)
            return nan, nan.copy()
        rel = float(t_ns - st.t_ref_ns)
        off = st.offset_ns + st.drift * rel
        unc = st.offset_std_ns + st.drift_std * abs(rel - st.center_ns)
        return off, unc

    def delays(self, ing: Ingested) -> Delays:
        """Return one-way delays of the batch's probes and replies from the current models."""
        lost = ing.lost
        c_src_1 = self.clock_at(ing.src, ing.t1)
        c_dst_1 = self.clock_at(ing.dst, ing.t1)
        c_src_4 = self.clock_at(ing.src, ing.t4)
        c_dst_4 = self.clock_at(ing.dst, ing.t4)
        owd_f = (ing.t2 - ing.t1).astype(np.float64) - (c_dst_1 - c_src_1)
        owd_r = (ing.t4 - ing.t3).astype(np.float64) - (c_src_4 - c_dst_4)
        rtt = ((ing.t4 - ing.t1) - (ing.t3 - ing.t2)).astype(np.float64)
        owd_f[lost] = np.nan
        owd_r[lost] = np.nan
        rtt[lost] = np.nan
        corr = np.where(np.isfinite(c_src_1), c_src_1, 0.0)
        t_ns = ing.t1 - np.rint(corr).astype(np.int64)
        return Delays(t_ns, owd_f, owd_r, rtt)


def _coded_partners(pair: I64, send: I64) -> tuple[I64, I64]:
    """Return (first, second) row indices of every coded pair with exactly two probes.

    ``pair`` is -1 for uncoded probes; first/second are ordered by send stamp. One sort, shared
    by both message directions (what `sync.coded_probe_mask` does per call).
    """
    idx = np.flatnonzero(pair >= 0)
    if len(idx) >= 2 and len(idx) % 2 == 0:
        # fast path: partners on adjacent rows (how probers and the simulator emit them)
        fa, fb = idx[0::2], idx[1::2]
        pa = pair[fa]
        if (pa == pair[fb]).all() and (pa[1:] != pa[:-1]).all():
            swap = send[fb] < send[fa]
            return np.where(swap, fb, fa).astype(np.int64), np.where(swap, fa, fb).astype(np.int64)
    order = idx[np.argsort(pair[idx], kind="stable")]
    p = pair[order]
    if len(p) < 2:
        e = np.zeros(0, np.int64)
        return e, e.copy()
    same = p[1:] == p[:-1]
    # groups of exactly two: equal to the next, not equal to the previous or the one after next
    prev_diff = np.concatenate([[True], ~same[:-1]])
    next_diff = np.concatenate([~same[1:], [True]])
    start = np.flatnonzero(same & prev_diff & next_diff)
    a, b = order[start], order[start + 1]
    swap = send[b] < send[a]
    return np.where(swap, b, a).astype(np.int64), np.where(swap, a, b).astype(np.int64)


@dataclass(frozen=True, eq=False)
class SampleWindow:
    """A copy of the sync samples in one window (see `ClockSync` for the convention)."""

    t_ref_ns: int
    a: NDArray[np.int32]
    b: NDArray[np.int32]
    t: F64
    d: F64
    fwd: NDArray[np.bool_]


def compute_state(
    w: SampleWindow, n_nics: int, config: ClockSyncConfig, now_ns: int
) -> ClockState | None:
    """Pure solve: pair fits (`sync.fit_pairs`) + network (`sync.solve_network`) -> models.

    Returns None when no pair could be fitted. Safe to run in a worker thread.
    """
    a, b, t, d, fwd = w.a, w.b, w.t, w.d, w.fwd
    key = a.astype(np.int64) * n_nics + b
    uniq, inv = np.unique(key, return_inverse=True)
    fits = fit_pairs(
        len(uniq),
        inv[fwd], t[fwd], d[fwd],
        inv[~fwd], t[~fwd], d[~fwd],
        min_samples=config.min_samples,
        max_drift=config.max_drift,
    )  # fmt: skip
    good = fits.ok
    if not good.any():
        return None
    ea = (uniq[good] // n_nics).astype(np.int64)
    eb = (uniq[good] % n_nics).astype(np.int64)
    ostd = np.maximum(fits.offset_std_ns[good], 1.0)
    dstd = np.maximum(fits.drift_std[good], 1e-12)
    # reference: the NIC with most edges (it lies in the largest component of the graph)
    deg = np.bincount(np.concatenate([ea, eb]), minlength=n_nics)
    sol = solve_network(
        n_nics,
        np.stack([ea, eb], axis=1),
        fits.offset_ns[good],
        1.0 / ostd**2,
        drift=fits.drift[good],
        drift_weight=1.0 / dstd**2,
        ref=int(np.argmax(deg)),
        pin="mean",
    )
    known = sol.known & (deg > 0)
    nan = np.full(n_nics, np.nan)
    wd = np.bincount(ea, 1.0 / dstd**2, n_nics) + np.bincount(eb, 1.0 / dstd**2, n_nics)
    with np.errstate(divide="ignore"):
        drift_std = np.sqrt(1.0 / wd)
    return ClockState(
        t_ref_ns=w.t_ref_ns,
        offset_ns=np.where(known, sol.component_offset_ns, nan),
        drift=np.where(known, sol.component_drift, nan),
        offset_std_ns=np.where(known, sol.offset_std_ns, nan),
        drift_std=np.where(known, drift_std, nan),
        center_ns=float(0.5 * (t.min() + t.max())),
        solved_at_ns=now_ns,
        n_pairs=int(good.sum()),
        n_samples=len(t),
    )
