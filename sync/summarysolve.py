"""One window's clock sync from its summary: `sync.window.sync_window` on the bounded state
of `sync.summary` (pair fits on the hulls, drifts from the envelopes and the lowest-RTT lines,
the envelope and lowest-RTT candidates, the correction for the queueing left in the best
samples from `sync.excess`). Pure: a summary in, a `WindowSync` out.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from sync.badstamps import without_bad
from sync.batchfit import fit_pairs
from sync.excess import direction_excess, node_midmean, split_sides
from sync.network import solve_network
from sync.pairfit import PairFits
from sync.refine import refit_fixed_slope
from sync.steps import exchange_residuals, find_steps, without_nodes
from sync.summary import G32, Summary, fit_hulls
from sync.window import (
    RTT_FRACTIONS,
    WindowSync,
    choose_candidate,
    closure_scale,
    empty_window,
    first_stage,
    pick_ref,
)

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
LINE_FRACTION = 0.1  # lowest-RTT exchanges per edge the drift lines go through
BAD_ROUNDS = 3  # rounds of leaving out bad stamps (each with the slopes the last one gave)


def sync_summary(
    n_nodes: int,
    s: Summary,
    *,
    quant_ns: float = 0.0,
    min_samples: int = 3,
    min_coded: int = 8,
    ref: int = 0,
    rtt_fractions: tuple[float, ...] = RTT_FRACTIONS,
    bias_bound: bool = True,
    rx_correction: bool = True,
    leaf: I64 | None = None,
    drop_bad: bool = True,
    clock_steps: bool = True,
) -> WindowSync:
    """`sync.window.sync_window` on a summary: pair fits on the hulls, two network solves,
    second stage with the envelope and the lowest-RTT candidates (no per-direction lowest
    fractions: they need every sample). ``rx_correction``: subtract from every NIC's offset
    half the queueing its best incoming samples still carry (`receive_excess`); with ``leaf``
    (per node its leaf switch's index, the fabric's ECMP group) the excesses are split into a
    receive part per NIC and a send part per NIC, its leaf's plus the share of its own that the
    data show (CQE send stamps: the NIC's egress queue), and the NIC's offset loses half of
    their difference instead (`split_sides`; estimator name ``...+rx+uplink``). ``drop_bad``:
    once the first stage has the pair slopes, leave out the samples and exchanges that gross
    bad stamps put below their floor (`sync.badstamps.without_bad`) and start again on what is
    left (nothing changes when there are none). ``clock_steps``: a NIC whose clock stepped
    inside the window (`sync.steps.find_steps`) is left out with its edges and reported
    unknown (``stepped``, ``step_at_ns``); the others are solved again without it. Raises
    ValueError when a fraction needs more exchanges than ``cap`` kept (a cap from a too small
    ``max_exchanges``)."""
    m = len(s.edges)
    given = s  # (a stepped NIC is left out of the window as given, bad stamps and all)
    st = _first(n_nodes, s, quant_ns, min_samples, min_coded, ref)
    if isinstance(st, WindowSync):
        return st
    lost, lost_x = np.zeros(2 * m, np.int64), np.zeros(m, np.int64)
    if drop_bad:
        cleaned = _without_bad(n_nodes, s, st, (quant_ns, min_samples, min_coded, ref))
        if isinstance(cleaned, WindowSync):
            return cleaned
        s, st, lost, lost_x = cleaned
    g, t, d, fits, first, r, drift_from = st
    fwd, rev = g % 2 == 0, g % 2 == 1
    ge = g // 2
    i, j = s.edges[:, 0], s.edges[:, 1]
    slope = first.drift[j] - first.drift[i]
    shift = first.offset_ns[i]
    usable = fits.ok & np.isfinite(slope) & np.isfinite(shift)
    if not usable.any():
        return first
    slope = np.where(usable, slope, 0.0)
    env_off, env_floor = refit_fixed_slope(
        m, ge[fwd], t[fwd], d[fwd], ge[rev], t[rev], d[rev], slope
    )
    cands, names, excess = [env_off], ["envelope"], [np.zeros(m)]
    if rtt_fractions:
        n_x = np.bincount(s.x_edge, minlength=m)
        ks = [np.clip(np.rint(q * s.n_all[0::2]), 1, None).astype(np.int64) for q in rtt_fractions]
        short = (n_x < s.n_all[0::2]) & (np.max(ks, axis=0) > n_x + lost_x)
        ks = [np.where(lost_x > 0, np.clip(k, 1, np.maximum(n_x, 1)), k) for k in ks]
        if short.any():
            raise ValueError("cap too small for the lowest-RTT fractions on some edges")
        start = np.concatenate([[0], np.cumsum(n_x)[:-1]])
        rank = np.arange(len(s.x_edge)) - start[s.x_edge]
        has = n_x > 0
        rmin = np.full(m, np.nan)
        rmin[has] = s.x_rtt[start[has]]  # sorted by (edge, rtt): the first is the lowest
        for q, k in zip(rtt_fractions, ks, strict=True):
            take = rank < k[s.x_edge]
            num = np.bincount(s.x_edge[take], minlength=m).astype(np.float64)
            num = np.where(has, num, np.nan)
            # per-exchange offset detrended by the slope: 0.5 (xf - xr) = off - slope * mid
            off = np.bincount(s.x_edge[take], s.x_off[take], m) / num
            mid = np.bincount(s.x_edge[take], s.x_mid[take], m) / num
            rtt = np.bincount(s.x_edge[take], s.x_rtt[take], m) / num
            cands.append(off - slope * mid)
            excess.append(rtt - rmin)
            names.append(f"lowrtt{q:g}")
    out = choose_candidate(
        n_nodes, first, r, usable, slope * shift, cands, excess, names, env_floor, bias_bound
    )
    out = dataclasses.replace(out, drift_from=drift_from)
    if clock_steps:  # a NIC whose clock stepped in the window fits no line: unknown
        res = exchange_residuals(s.edges, s.x_edge, s.x_mid, s.x_off, out.offset_ns, out.drift)
        jumps = find_steps(n_nodes, s.edges, s.x_edge, s.x_mid, res)
        if len(jumps):
            again = sync_summary(
                n_nodes, without_nodes(given, jumps.nodes), quant_ns=quant_ns,
                min_samples=min_samples, min_coded=min_coded, ref=ref,
                rtt_fractions=rtt_fractions, bias_bound=bias_bound,
                rx_correction=rx_correction, leaf=leaf, drop_bad=drop_bad, clock_steps=False,
            )  # fmt: skip
            return dataclasses.replace(again, stepped=jumps.nodes, step_at_ns=jumps.at_ns)
    if not rx_correction:
        return out
    src, dst, val = direction_excess(s, slope, lost=lost)
    if leaf is None:
        rx, name = node_midmean(n_nodes, dst, val), "+rx"
    else:
        recv, send, _ = split_sides(n_nodes, src, dst, val, np.asarray(leaf, np.int64))
        rx, name = recv - send, "+rx+uplink"
    off = np.where(out.known, out.offset_ns - 0.5 * np.nan_to_num(rx), np.nan)
    off -= np.nanmean(off) if out.known.any() else 0.0
    return dataclasses.replace(out, offset_ns=off, estimator=out.estimator + name)


def _without_bad(
    n_nodes: int, s: Summary, st: _FirstStage, args: tuple[float, int, int, int]
) -> tuple[Summary, _FirstStage, I64, I64] | WindowSync:
    """Up to ``BAD_ROUNDS`` rounds: leave out the samples that bad stamps put below their
    floor, found with the slopes so far (`sync.badstamps.without_bad`), and run the first
    stage again (``args``: `_first`'s quant_ns, min_samples, min_coded, ref). Returns the
    summary, its first stage and the samples / exchanges left out per direction / edge, or
    the first stage's `WindowSync` when what is left cannot be solved."""
    m = len(s.edges)
    lost, lost_x = np.zeros(2 * m, np.int64), np.zeros(m, np.int64)
    e0, e1 = s.edges[:, 0], s.edges[:, 1]
    for _ in range(BAD_ROUNDS):
        s2, lost2, lost_x2 = without_bad(s, st.first.drift[e1] - st.first.drift[e0])
        if s2 is s:
            break
        s, lost, lost_x = s2, lost + lost2, lost_x + lost_x2
        again = _first(n_nodes, s, *args)
        if isinstance(again, WindowSync):
            return again
        st = again
    return s, st, lost, lost_x


class _FirstStage(NamedTuple):
    g: G32
    t: F64
    d: F64
    fits: PairFits
    first: WindowSync
    ref: int
    drift_from: str


def _first(
    n_nodes: int, s: Summary, quant_ns: float, min_samples: int, min_coded: int, ref: int
) -> _FirstStage | WindowSync:
    """Pair fits on the hulls, the first network solves and the node drifts (the window
    with every node unknown when no pair could be fitted)."""
    m = len(s.edges)
    g, t, d, cnt = fit_hulls(s, min_coded)
    fwd, rev = g % 2 == 0, g % 2 == 1
    ge = g // 2
    fits = fit_pairs(
        m, ge[fwd], t[fwd], d[fwd], ge[rev], t[rev], d[rev],
        min_samples=min_samples, quant_ns=quant_ns, counts=(cnt[0::2], cnt[1::2]),
    )  # fmt: skip
    if not fits.ok.any():
        return empty_window(n_nodes, s.edges, fits)
    first, r = first_stage(n_nodes, s.edges, fits, ref)
    drift, drift_from = _node_drift(n_nodes, s, first, r)
    if drift_from != "envelope":
        first = dataclasses.replace(first, drift=drift)
    return _FirstStage(g, t, d, fits, first, r, drift_from)


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


def _node_drift(n_nodes: int, s: Summary, first: WindowSync, ref: int) -> tuple[F64, str]:
    """Node drifts for the second stage from two independent sets of pair slopes: the pair
    envelopes' (first stage) and the lowest-RTT lines' (`lowrtt_lines`), solved together,
    each set weighted by ``1 / scale^2`` with ``scale`` the robust size of what its slopes
    leave around loops (drifts are node properties, so pair slopes must sum to zero around
    every loop). Returns (drift, "envelope") when too few lines exist, else (drift,
    "envelope+lowrtt-line")."""
    fits, edges = first.fits, first.edges
    line, _ = lowrtt_lines(s)
    ok_env, ok_line = fits.ok, np.isfinite(line)
    if ok_line.sum() < len(edges) // 2 or not ok_env.any():
        return first.drift, "envelope"
    ppb = 1e9  # closure scales and weights in ppb: ns over a second
    env, lin = fits.drift[ok_env] * ppb, line[ok_line] * ppb
    env_scale = closure_scale(n_nodes, edges[ok_env], env, ref)
    line_scale = closure_scale(n_nodes, edges[ok_line], lin, ref)
    if not (np.isfinite(env_scale) and np.isfinite(line_scale)):
        return first.drift, "envelope"
    e = np.concatenate([edges[ok_env], edges[ok_line]])
    w = np.concatenate([
        np.full(len(env), 1.0 / max(env_scale, 0.1) ** 2),
        np.full(len(lin), 1.0 / max(line_scale, 0.1) ** 2),
    ])  # fmt: skip
    sol = solve_network(
        n_nodes, e, np.concatenate([env, lin]), w, pin="mean", ref=pick_ref(e, ref),
        loss="huber", flag_min_ns=np.inf,
    )  # fmt: skip
    drift = np.where(sol.known & first.known, sol.offset_ns / ppb, np.nan)
    return drift, "envelope+lowrtt-line"
