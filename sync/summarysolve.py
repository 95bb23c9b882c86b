"""One window's clock sync from its summary: `sync.window.sync_window` on the bounded state
of `sync.summary` (pair fits on the hulls, drifts from the envelopes and the lowest-RTT lines,
the envelope and lowest-RTT candidates, the correction for the queueing left in the best
samples from `sync.excess`). Pure: a summary in, a `WindowSync` out.

The solve is a composition of stages (`solve_ranges`): per-edge stages that one range of the
window's edges runs on its own summary (`sync.edgestage.EdgeRange`: pair fits and lowest-RTT
lines, a bad-stamp round, the second stage's candidates, the exchanges' residuals, each
direction's lowest values), each given the node vectors the network stages solved, and
network stages on the ranges' small per-edge arrays laid end to end (the first network
solves and the node drifts, the choice of candidate, `sync.steps.find_steps`, the pooled
tail index and the per-NIC reductions of `sync.excess`). `sync_summary` runs them on one
range, the whole window; a fleet's edge owners run them on theirs (`controller.fleet.edges`),
and the results are the same to the bit (tests/test_sync_edgestage.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from sync.edgestage import (
    LINE_FRACTION,
    EdgeRange,
    FitParams,
    RangeStages,
    concat_candidates,
    concat_fits,
    concat_lows,
    concat_residuals,
    lowrtt_lines,
)
from sync.excess import node_midmean, readings, split_sides
from sync.network import solve_network
from sync.pairfit import PairFits
from sync.steps import find_steps
from sync.summary import Summary
from sync.window import (
    RTT_FRACTIONS,
    WindowSync,
    choose_candidate,
    closure_scale,
    empty_window,
    first_stage,
    pick_ref,
)

__all__ = ["LINE_FRACTION", "lowrtt_lines", "solve_ranges", "sync_summary"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
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
    ``max_exchanges``). The stages of `solve_ranges` on one range, the whole window."""
    whole = EdgeRange(s, FitParams(quant_ns, min_samples, min_coded))
    return solve_ranges(
        n_nodes, [whole], ref=ref, rtt_fractions=rtt_fractions, bias_bound=bias_bound,
        rx_correction=rx_correction, leaf=leaf, drop_bad=drop_bad, clock_steps=clock_steps,
    )  # fmt: skip


def solve_ranges(
    n_nodes: int,
    ranges: Sequence[RangeStages],
    *,
    ref: int = 0,
    rtt_fractions: tuple[float, ...] = RTT_FRACTIONS,
    bias_bound: bool = True,
    rx_correction: bool = True,
    leaf: I64 | None = None,
    drop_bad: bool = True,
    clock_steps: bool = True,
) -> WindowSync:
    """`sync_summary` of the window whose edges are the ``ranges``' laid end to end (in edge
    order, disjoint): each per-edge stage runs on every range (`sync.edgestage.EdgeRange`)
    with the node vectors of the network stage before, and each network stage on their
    results laid end to end (module docstring). The ranges change as the stages go (bad
    stamps and stepped NICs left out): give fresh ones to solve again. Raises ValueError
    without a range, and as `sync_summary`."""
    if not ranges:
        raise ValueError("need at least one edge range")
    sizes = [len(r.edges) for r in ranges]
    edges = np.concatenate([r.edges for r in ranges])
    st = _first(n_nodes, edges, ranges, ref)
    if isinstance(st, WindowSync):
        return st
    if drop_bad:  # up to BAD_ROUNDS rounds, each with the slopes the last one gave
        for _ in range(BAD_ROUNDS):
            dropped = [r.drop_bad(st.first.drift) for r in ranges]  # every range, each round
            if not any(dropped):
                break
            again = _first(n_nodes, edges, ranges, ref)
            if isinstance(again, WindowSync):
                return again
            st = again
    first, r, drift_from = st
    cand = concat_candidates([g.candidates(first.drift, first.offset_ns, rtt_fractions)
                              for g in ranges])  # fmt: skip
    if not cand.usable.any():
        return first
    names = ["envelope"] + [f"lowrtt{q:g}" for q in rtt_fractions]
    out = choose_candidate(
        n_nodes, first, r, cand.usable, cand.shift_term, cand.cands, cand.excess, names,
        cand.env_floor, bias_bound,
    )  # fmt: skip
    out = dataclasses.replace(out, drift_from=drift_from)
    if clock_steps:  # a NIC whose clock stepped in the window fits no line: unknown
        res = concat_residuals([g.residuals(out.offset_ns, out.drift) for g in ranges], sizes)
        jumps = find_steps(n_nodes, edges, res.x_edge, res.x_mid, res.resid)
        if len(jumps):
            for g in ranges:  # the window as given, bad stamps and all, less those NICs
                g.cut_nodes(jumps.nodes)
            again = solve_ranges(
                n_nodes, ranges, ref=ref, rtt_fractions=rtt_fractions, bias_bound=bias_bound,
                rx_correction=rx_correction, leaf=leaf, drop_bad=drop_bad, clock_steps=False,
            )  # fmt: skip
            return dataclasses.replace(again, stepped=jumps.nodes, step_at_ns=jumps.at_ns)
    if not rx_correction:
        return out
    src, dst, val, _ = readings(edges, concat_lows([g.lows() for g in ranges], sizes))
    if leaf is None:
        rx, name = node_midmean(n_nodes, dst, val), "+rx"
    else:
        recv, send, _ = split_sides(n_nodes, src, dst, val, np.asarray(leaf, np.int64))
        rx, name = recv - send, "+rx+uplink"
    off = np.where(out.known, out.offset_ns - 0.5 * np.nan_to_num(rx), np.nan)
    off -= np.nanmean(off) if out.known.any() else 0.0
    return dataclasses.replace(out, offset_ns=off, estimator=out.estimator + name)


class _FirstStage(NamedTuple):
    first: WindowSync
    ref: int
    drift_from: str


def _first(
    n_nodes: int, edges: I64, ranges: Sequence[RangeStages], ref: int
) -> _FirstStage | WindowSync:
    """The ranges' pair fits (`sync.edgestage.EdgeRange.fit`), the first network solves and
    the node drifts (the window with every node unknown when no pair could be fitted)."""
    fit = concat_fits([r.fit() for r in ranges])
    fits = fit.fits
    if not fits.ok.any():
        return empty_window(n_nodes, edges, fits)
    first, r = first_stage(n_nodes, edges, fits, ref)
    drift, drift_from = _node_drift(n_nodes, fits, fit.line, first, r)
    if drift_from != "envelope":
        first = dataclasses.replace(first, drift=drift)
    return _FirstStage(first, r, drift_from)


def _node_drift(
    n_nodes: int, fits: PairFits, line: F64, first: WindowSync, ref: int
) -> tuple[F64, str]:
    """Node drifts for the second stage from two independent sets of pair slopes: the pair
    envelopes' (first stage) and the lowest-RTT lines' (``line``, `lowrtt_lines`), solved
    together, each set weighted by ``1 / scale^2`` with ``scale`` the robust size of what its
    slopes leave around loops (drifts are node properties, so pair slopes must sum to zero
    around every loop). Returns (drift, "envelope") when too few lines exist, else (drift,
    "envelope+lowrtt-line")."""
    edges = first.edges
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
