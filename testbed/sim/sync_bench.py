"""``qpmesh sim sync``: clock-sync accuracy against simulated truth, with baselines.

Simulates a two-tier Clos with known clocks, collects one window of coded probes, and
estimates every NIC's clock offset three ways from the *same* probes:

- ``qpmesh``: coded filter + pair fits + network effect + second stage (`sync.window.sync_window`;
  ``estimator`` in the report names the envelope statistic its residual rule chose);
- ``pairwise_only``: the same pair fits chained from a reference along a spanning tree
  (`sync.anchor_tree`), i.e. without loop correction;
- ``ntp_baseline``: per pair and per 1/8 of the window the min-RTT exchange's
  ``((t2-t1)-(t4-t3))/2`` (NTP's symmetric assumption), a least-squares line through those
  (NTP's frequency discipline) evaluated at the window's reference time, then the *same*
  network solve as qpmesh (`sync.solve_network`, Huber loss, mean pinned): the fair baseline;
- ``ntp_tree``: the same per-pair NTP estimates chained along a spanning tree (no network
  effect), the baseline before the fair one;
- ``ntp_plain`` (context only): the window's single min-RTT exchange per pair, no frequency fit.

The report names the model in force (``"model": {"ideal": ..., knobs}``) and, as
``asymmetry_floor``, the error a perfect two-way estimator would still make: the simulator's
constant per-pair path asymmetry (half of fixed forward minus fixed reverse delay, averaged over
the pair's swept paths) pushed through the same network solve. Two-way probes cannot observe
it; qpmesh's error should be read beside it. With hardware stamps ``receive_luck_sd`` is a
second such figure, from the data: per NIC the standard deviation of the offset error left by
the luck of its incoming directions' best samples, which no reading of the window can remove
(`sync.excess.receive_luck`; docs/sync.md, "The limit of the reading"). With
``--truth-breakdown --luck-draws R`` the report adds what no correction of the best samples'
queueing can beat, from the truth: ``expected_direction_p99_ns`` (docs/sync.md, "CQE send
stamps: what is observable, and the bound").

Errors are absolute offset errors in ns at the window's middle after removing the common
offset (no sync can observe it), over the NICs the estimator reports known, centred on their
median: ``|est_k - true_k - median(est - true)|`` (`testbed.clockerr`); ``unknown`` counts the
NICs left out.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.interrupt import finish, interruptible
from contract.records import ProbeBatch
from mesh.fabric import Fabric, FabricShape, build_fabric
from sync import anchor_tree, ntp_offsets, solve_network
from sync.excess import queueing_bound, receive_luck
from sync.summarysolve import sync_summary
from sync.window import EdgeSamples, orient_samples, sync_window
from testbed.clockerr import error_figures
from testbed.sim.engine import EPOCH_NS, HW_TICK_NS, STAMPS, SimConfig, SimStep, Simulator
from testbed.sim.heap import release_free_heap
from testbed.sim.model import ModelKnobs
from testbed.sim.options import add_model_options, model_from_args
from testbed.sim.sync_stream import N_SUB, collect_window, window_batches, window_edges
from testbed.sim.sync_truth import BestQueueing, breakdown, mean_queueing

F64 = npt.NDArray[np.float64]


def _errors(est: F64, known: npt.NDArray[np.bool_], truth: F64) -> dict[str, float]:
    """Error figures of the NICs reported known, centred on their median; the unknown ones
    counted apart (`testbed.clockerr.error_figures`)."""
    return error_figures(est, truth, known)


def _spread_of(v: F64) -> dict[str, float]:
    """p50/p99/max over the finite values of a per-node figure (NaN when none)."""
    f = v[np.isfinite(v)]
    if not f.size:
        return {"p50_ns": float("nan"), "p99_ns": float("nan"), "max_ns": float("nan")}
    return {
        "p50_ns": round(float(np.percentile(f, 50)), 2),
        "p99_ns": round(float(np.percentile(f, 99)), 2),
        "max_ns": round(float(f.max()), 2),
    }


def ntp_line(x: F64, y: F64, ok: npt.NDArray[np.bool_]) -> tuple[F64, npt.NDArray[np.bool_]]:
    """NTP's frequency discipline per edge: a least-squares line through the min-RTT exchange
    of each sub-window (rows: edges; x = time, y = offset), evaluated at t_ref (x = 0)."""
    cnt = ok.sum(axis=1)
    xm = np.where(ok, x, 0.0).sum(axis=1) / np.maximum(cnt, 1)
    ym = np.where(ok, y, 0.0).sum(axis=1) / np.maximum(cnt, 1)
    dx = np.where(ok, x - xm[:, None], 0.0)
    dy = np.where(ok, y - ym[:, None], 0.0)
    sxx = (dx * dx).sum(axis=1)
    slope = np.where(sxx > 0, (dx * dy).sum(axis=1) / np.where(sxx > 0, sxx, 1.0), 0.0)
    theta = ym - slope * xm  # value of the line at t_rel = 0 (t_ref)
    return theta, cnt >= 2


def _ntp_with_frequency(
    n_edges: int,
    edge: npt.NDArray[np.int64],
    stamps: tuple[npt.NDArray[np.int64], ...],
    t_ref: int,
    window_s: float,
    n_sub: int = N_SUB,
) -> tuple[F64, npt.NDArray[np.bool_]]:
    """NTP-style estimate per edge at ``t_ref``: the min-RTT exchange of each of ``n_sub``
    sub-windows gives ``((t2-t1)-(t4-t3))/2`` at its time; a least-squares line through those
    points (NTP's frequency discipline) is evaluated at ``t_ref``."""
    t1, t2, t3, t4 = stamps  # arrived probes only
    e = edge
    rel = (t1 - t_ref).astype(np.float64)
    sub = np.clip(((rel / 1e9 + window_s / 2) / window_s * n_sub).astype(np.int64), 0, n_sub - 1)
    ntp = ntp_offsets(n_edges * n_sub, e * n_sub + sub, t1, t2, t3, t4, t_ref)
    return ntp_line(
        ntp.t_rel_ns.reshape(n_edges, n_sub),
        ntp.theta_ns.reshape(n_edges, n_sub),
        ntp.ok.reshape(n_edges, n_sub),
    )


Est = tuple[F64, npt.NDArray[np.bool_]]


def _ntp_estimates(
    n_nodes: int, samples: EdgeSamples, c: dict[str, npt.NDArray[Any]], t_ref: int, window_s: float
) -> tuple[Est, Est, Est]:
    """(offset, known) per node for the NTP baseline with a frequency fit through qpmesh's
    network solve, the same chained along a spanning tree, and plain NTP (the window's min-RTT
    exchange, no frequency fit) chained along a spanning tree."""
    arrived = ~c["lost"]
    sel: slice | npt.NDArray[np.intp] = slice(None) if arrived.all() else np.flatnonzero(arrived)
    edge = samples.edge[sel]
    fwd = c["src"][sel] == samples.edges[edge, 0]
    s1 = np.where(fwd, c["t1"][sel], c["t3"][sel])
    s2 = np.where(fwd, c["t2"][sel], c["t4"][sel])
    s3 = np.where(fwd, c["t3"][sel], c["t1"][sel])
    s4 = np.where(fwd, c["t4"][sel], c["t2"][sel])
    del fwd
    m = len(samples.edges)
    theta, ok = _ntp_with_frequency(m, edge, (s1, s2, s3, s4), t_ref, window_s)
    plain = ntp_offsets(m, edge, s1, s2, s3, s4, t_ref)
    del s1, s2, s3, s4
    return _ntp_solves(n_nodes, samples.edges, theta, ok, plain.theta_ns, plain.ok)


def _ntp_solves(
    n_nodes: int,
    edges: npt.NDArray[np.int64],
    theta: F64,
    ok: npt.NDArray[np.bool_],
    plain: F64,
    plain_ok: npt.NDArray[np.bool_],
) -> tuple[Est, Est, Est]:
    """The NTP pair estimates through the network solve, and both chained along a tree."""
    out = []
    for th, good in ((theta, ok), (plain, plain_ok)):
        ne = edges[good]
        tree = anchor_tree(n_nodes, ne, th[good], np.ones(len(ne)), ref=int(ne[0, 0]))
        out.append((tree.offset_ns, tree.known))
    ne = edges[ok]
    net = solve_network(n_nodes, ne, theta[ok], np.ones(len(ne)), pin="mean", loss="huber")
    return (net.offset_ns, net.known), out[0], out[1]


def _truth(sim: Simulator, t_mid_ns: float) -> tuple[F64, F64, npt.NDArray[np.int64]]:
    """True offsets at the window's middle, constant pair asymmetry and its pairs (read after
    the window is simulated, as the clock wander is drawn as time goes)."""
    edges = np.stack([sim.pairs_src, sim.pairs_dst], axis=1)
    return sim.true_offset_ns(t_mid_ns), sim.pair_asymmetry_ns(), edges


def run_sync_bench(
    nics: int,
    peers: int,
    load: float,
    timestamps: str,
    seed: int,
    *,
    window_s: float = 2.0,
    rate_hz: float = 50.0,
    progress: bool = False,
    model: ModelKnobs | None = None,
    truth_breakdown: bool = False,
    windows: int = 1,
    leaf_split: bool = True,
    luck_draws: int = 0,
) -> dict[str, Any]:
    """Run the benchmark and return the report (see module docstring). ``truth_breakdown``
    (hardware stamps only) adds ``truth_breakdown`` (`testbed.sim.sync_truth.breakdown`).
    ``windows`` > 1 scores that many consecutive windows of one simulated run (the fabric, its
    fixed delays and its clocks go on; hot spots move): the report is the first window's, plus
    ``windows`` (each window's figures) and ``over_windows`` (their medians).
    ``leaf_split`` False: the hw estimator without the leaf split (the receive part alone;
    for comparison). ``luck_draws`` R >= 2 (with ``truth_breakdown``): each window is
    simulated R - 1 more times with other per-probe luck (`Simulator.redraw_luck`) and the
    breakdown adds ``expected_split_p99_ns`` (`testbed.sim.sync_truth.breakdown`). Raises
    ValueError."""
    if truth_breakdown and timestamps == "sw":
        raise ValueError("--truth-breakdown needs NIC stamps (--timestamps hw or cqe)")
    if windows < 1:
        raise ValueError("--windows must be >= 1")
    if luck_draws and (luck_draws < 2 or not truth_breakdown):
        raise ValueError("--luck-draws needs --truth-breakdown and at least 2 draws")
    if nics < 4:
        raise ValueError("--nics must be >= 4")
    if not 1 <= peers < nics:
        raise ValueError("--peers must be in [1, nics)")
    fabric, cfg = sync_setup(nics, peers, load, timestamps, seed, rate_hz, model)
    t0 = time.perf_counter()
    hold = _SimHold(Simulator(fabric, cfg))
    reports = []
    for w in range(windows):
        reports.append(
            _score_window(hold, cfg, w * window_s, window_s, last=w == windows - 1, t0=t0,
                          progress=progress, truth_breakdown=truth_breakdown,
                          leaf_split=leaf_split, luck_draws=luck_draws)
        )  # fmt: skip
        t0 = time.perf_counter()
    rep = reports[0]
    if windows > 1:
        rep["windows"] = [_window_figures(r) for r in reports]
        rep["over_windows"] = _over_windows(rep["windows"])
    return rep


def sync_setup(
    nics: int,
    peers: int,
    load: float,
    timestamps: str,
    seed: int,
    rate_hz: float,
    model: ModelKnobs | None = None,
) -> tuple[Fabric, SimConfig]:
    """The fabric and simulator configuration of ``sim sync`` (two tiers, 16 NICs per leaf up
    to 512 NICs, 32 beyond; ``peers`` random peers per NIC over 8 ports per pair)."""
    fabric = build_fabric(FabricShape.for_nics(nics, nics_per_leaf=16 if nics <= 512 else 32))
    cfg = SimConfig(
        load=load, timestamps=timestamps, rate_hz=rate_hz, peers=peers, mesh_in_group=False,
        ports_per_pair=8, seed=seed, model=ModelKnobs() if model is None else model,
    )  # fmt: skip
    return fabric, cfg


def _redrawn_best(
    fabric: Fabric,
    cfg: SimConfig,
    edges: npt.NDArray[np.int64],
    start_s: float,
    window_s: float,
    draw: int,
    draws: int,
    progress: bool,
) -> BestQueueing:
    """Per direction the best sample's true queueing in the window ``[start_s, start_s +
    window_s)`` simulated afresh with draw ``draw`` of the per-probe luck
    (`Simulator.redraw_luck`: the same fabric, pairs, paths and load). Raises ValueError if
    the fresh simulator's probe pairs differ from ``edges``'s."""
    sim = Simulator(fabric, cfg)
    sim.redraw_luck(draw)
    n = len(fabric.nics)
    if not np.array_equal(window_edges(sim.pairs_src, sim.pairs_dst, n)[0], edges):
        raise ValueError("a luck draw's probe pairs differ from the window's")
    best = BestQueueing(edges, n)
    for _ in window_batches(
        sim, window_s, 0.1, start_s=start_s, observe=lambda st: best.observe(sim, st)
    ):
        pass
    if progress:
        print(f"sim sync: luck draw {draw + 1}/{draws} simulated", file=sys.stderr)
    return best


class _SimHold:
    """The run's simulator, let go once its last window is simulated, so that its memory
    (hundreds of MB at 10,000 NICs) is free before that window's solve."""

    def __init__(self, sim: Simulator) -> None:
        self.sim: Simulator | None = sim


def _window_figures(rep: dict[str, Any]) -> dict[str, Any]:
    """One window's line of ``windows``: where it starts, the headline p99s and the choice."""
    est = rep["estimators"]
    out = {
        "start_s": rep["window_start_s"],
        "qpmesh_p99_ns": est["qpmesh"]["p99_ns"],
        "ntp_baseline_p99_ns": est["ntp_baseline"]["p99_ns"],
        "p99_ratio_ntp_over_qpmesh": rep["p99_ratio_ntp_over_qpmesh"],
        "estimator": rep["estimator"],
        "receive_luck_sd_p99_ns": rep["receive_luck_sd"]["p99_ns"],
    }
    tb = rep.get("truth_breakdown")
    if tb is not None:
        out["perfect_rx_p99_ns"] = tb["perfect_rx_p99_ns"]
        out["perfect_split_p99_ns"] = tb["perfect_split_p99_ns"]
        for key in ("expected_split_p99_ns", "perfect_direction_p99_ns",
                    "expected_direction_p99_ns"):  # fmt: skip
            if key in tb:
                out[key] = tb[key]
    return out


def _over_windows(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the windows' lines of every numeric figure (NaN and None left out)."""
    out: dict[str, Any] = {"windows": len(lines)}
    for key, v in lines[0].items():
        if key == "start_s" or not isinstance(v, (int, float)):
            continue
        vals = [x[key] for x in lines if isinstance(x[key], (int, float)) and np.isfinite(x[key])]
        out[f"median_{key}"] = round(float(np.median(vals)), 2) if vals else None
    return out


def _score_window(
    hold: _SimHold,
    cfg: SimConfig,
    start_s: float,
    window_s: float,
    *,
    last: bool,
    t0: float,
    progress: bool,
    truth_breakdown: bool,
    leaf_split: bool,
    luck_draws: int = 0,
) -> dict[str, Any]:
    """Simulate the window ``[start_s, start_s + window_s)`` on ``hold``'s simulator, estimate
    and score it (the report of `run_sync_bench` for one window). ``last``: let the simulator
    go once the window is simulated. ``t0``: when this window's work began (for
    ``simulate_seconds``)."""
    sim = hold.sim
    assert sim is not None  # (let go only after the last window)
    fabric = sim.fabric
    timestamps, rate_hz, peers, load, seed = (
        cfg.timestamps,
        cfg.rate_hz,
        cfg.peers,
        cfg.load,
        cfg.seed,
    )
    n_nodes = len(fabric.nics)
    leaf = fabric.nic_group_index.astype(np.int64)  # the controller knows each NIC's leaf
    t_mid_ns = (start_s + window_s / 2) * 1e9
    t_ref = EPOCH_NS + int(t_mid_ns)

    best: BestQueueing | None = None

    def observe(st: SimStep) -> None:
        if best is not None:
            best.observe(sim, st)

    def run() -> Iterator[ProbeBatch]:
        return window_batches(
            sim, window_s, 0.1, start_s=start_s, progress=progress, observe=observe
        )  # fmt: skip

    quant = HW_TICK_NS if timestamps != "sw" else 0.0
    if timestamps != "sw":  # streamed: the window is reduced step by step, never held
        edges, per = window_edges(sim.pairs_src, sim.pairs_dst, n_nodes)
        if truth_breakdown:
            best = BestQueueing(edges, n_nodes)
        max_x = per * 2 * (int(np.ceil(window_s * rate_hz)) + 1)
        sw = collect_window(run(), edges, max_x, n_nodes, t_ref, window_s, 25)
        truth, asym, asym_edges = _truth(sim, t_mid_ns)
        expected: BestQueueing | None = None
        if best is not None and luck_draws:
            expected = mean_queueing([best] + [
                _redrawn_best(fabric, cfg, edges, start_s, window_s, r, luck_draws, progress)
                for r in range(1, luck_draws)
            ])  # fmt: skip
        if last:
            hold.sim = None
        del sim
        sim_s = time.perf_counter() - t0  # includes the reduction, which runs as steps come
        t1 = time.perf_counter()
        m = len(edges)
        ok_sub = np.isfinite(sw.ntp_sub.rtt).reshape(m, N_SUB)
        th, th_ok = ntp_line(
            sw.ntp_sub.t_rel.reshape(m, N_SUB), sw.ntp_sub.theta.reshape(m, N_SUB), ok_sub
        )
        ntp_net, ntp_fit, ntp_plain = _ntp_solves(
            n_nodes, edges, th, th_ok, sw.ntp_plain.theta, np.isfinite(sw.ntp_plain.rtt)
        )
        n_probes, summary_points = sw.probes, sw.summary.n_points
        qb = queueing_bound(n_nodes, sw.summary)
        release_free_heap()  # what the window's reduction freed, before the solve's temporaries
        t_fit = time.perf_counter()
        ws = sync_summary(n_nodes, sw.summary, quant_ns=quant, leaf=leaf if leaf_split else None)
        solve_total = time.perf_counter() - t_fit
        se = sw.summary.edges
        luck = receive_luck(
            n_nodes, sw.summary, np.nan_to_num(ws.drift[se[:, 1]] - ws.drift[se[:, 0]])
        )
        if best is not None:  # the same solve without the receive-side correction, vs truth
            raw = sync_summary(n_nodes, sw.summary, quant_ns=quant, rx_correction=False)
            tb = breakdown(
                n_nodes, edges, raw.theta_ns, raw.offset_ns, truth, best.receive_mean(),
                best.through_split(leaf),
                None if expected is None else expected.through_split(leaf), best, expected,
            )  # fmt: skip
        n_edges = m
        del sw
    else:  # software stamps: the per-direction lowest fractions need every sample, held
        cols: dict[str, list[npt.NDArray[Any]]] = {
            k: [] for k in ("src", "dst", "pair", "t1", "t2", "t3", "t4", "lost")
        }
        for b in run():
            for k, col in cols.items():
                col.append(getattr(b, k))
            del b
        c = {k: np.concatenate(cols.pop(k)) for k in list(cols)}
        truth, asym, asym_edges = _truth(sim, t_mid_ns)
        if last:
            hold.sim = None
        del sim
        sim_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        samples = orient_samples(
            c["src"], c["dst"], c["pair"], c["t1"], c["t2"], c["t3"], c["t4"], c["lost"],
            t_ref, coded_tol_ns=3000,
        )  # fmt: skip
        # NTP baselines on the same probes, oriented onto the same edges
        ntp_net, ntp_fit, ntp_plain = _ntp_estimates(n_nodes, samples, c, t_ref, window_s)
        n_probes, summary_points = len(c["t1"]), 0
        qb = np.full(n_nodes, np.nan)  # (hw stamps only: from the summary's RTT tails)
        luck = np.full(n_nodes, np.nan)  # (hw stamps only: from the summary's hull layers)
        del c
        t_fit = time.perf_counter()
        ws = sync_window(n_nodes, samples, quant_ns=quant)
        solve_total = time.perf_counter() - t_fit
        n_edges = len(samples.edges)
        del samples
    # the network-effect solve alone, timed on the same edges: first-stage form (weights
    # 1/std^2 from the fits, std floored at 0.5 ns, L2 with flagging, plus the drift solve) and
    # the final second-stage form (chosen envelope statistic, Huber loss)
    ok = ws.fits.ok
    e = ws.edges[ok]
    w = 1.0 / np.maximum(ws.fits.offset_std_ns[ok], 0.5) ** 2
    theta_fit = ws.fits.offset_ns[ok] + ws.fits.drift[ok] * np.nan_to_num(ws.offset_ns[e[:, 0]])
    ts = time.perf_counter()
    solve_network(n_nodes, e, theta_fit, w, drift=ws.fits.drift[ok], pin="mean")
    solve_s = time.perf_counter() - ts
    fin = np.isfinite(ws.theta_ns)
    ts = time.perf_counter()
    solve_network(n_nodes, ws.edges[fin], ws.theta_ns[fin], np.ones(int(fin.sum())), pin="mean",
                  loss="huber")  # fmt: skip
    solve_huber_s = time.perf_counter() - ts
    qp = _errors(ws.offset_ns, ws.known, truth)

    tree = anchor_tree(n_nodes, e, theta_fit, w, drift=ws.fits.drift[ok], ref=int(e[0, 0]))
    pw = _errors(tree.offset_ns, tree.known, truth)
    nb = _errors(*ntp_net, truth)
    nt = _errors(*ntp_fit, truth)
    npl = _errors(*ntp_plain, truth)
    # the unobservable part: constant path asymmetry through the same network solve
    floor = solve_network(n_nodes, asym_edges, asym, np.ones(len(asym)), pin="mean")
    af = _errors(floor.offset_ns, floor.known, np.zeros(n_nodes))
    est_s = time.perf_counter() - t1

    extra: dict[str, Any] = {}
    if truth_breakdown:
        extra["truth_breakdown"] = tb
    return {
        "nics": n_nodes,
        "peers": peers,
        "load": load,
        "timestamps": timestamps,
        "seed": seed,
        "window_s": window_s,
        "window_start_s": start_s,
        "rate_hz": rate_hz,
        "probes": n_probes,
        "streamed": timestamps != "sw",
        "summary_points": summary_points,
        "edges": n_edges,
        "edges_fitted": int(ok.sum()),
        "edges_flagged": int(ws.flagged.sum()),
        "estimator": ws.estimator,
        "drift_from": ws.drift_from,
        "closure_scale_ns": round(ws.closure_scale_ns, 2),
        "solve_seconds": round(solve_s, 4),
        "solve_huber_seconds": round(solve_huber_s, 4),
        "fit_and_solve_seconds": round(solve_total, 3),
        "estimate_seconds": round(est_s, 3),
        "simulate_seconds": round(sim_s, 3),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "model": cfg.model.to_dict(),
        "estimators": {
            "qpmesh": qp,
            "ntp_baseline": nb,
            "ntp_tree": nt,
            "ntp_plain": npl,
            "pairwise_only": pw,
        },
        "asymmetry_floor": af,
        "queueing_bound": _spread_of(qb),
        "receive_luck_sd": _spread_of(luck),
        "p99_ratio_ntp_over_qpmesh": round(nb["p99_ns"] / qp["p99_ns"], 1)
        if qp["p99_ns"] > 0
        else None,
        "p99_ratio_ntp_tree_over_qpmesh": round(nt["p99_ns"] / qp["p99_ns"], 1)
        if qp["p99_ns"] > 0
        else None,
        **extra,
    }


def _cmd(args: argparse.Namespace) -> int:
    rep: dict[str, Any] | None = None
    with interruptible() as stop:  # the report comes at the end: none if stopped before
        rep = _run(args)
    return finish(stop, rep, as_json=args.json, show=_show)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    return run_sync_bench(
        args.nics,
        args.peers,
        args.load,
        args.timestamps,
        args.seed,
        window_s=args.window,
        rate_hz=args.rate,
        progress=not args.json,
        model=model_from_args(args),
        truth_breakdown=args.truth_breakdown,
        windows=args.windows,
        leaf_split=not args.no_leaf_split,
        luck_draws=args.luck_draws,
    )


def _show(rep: Mapping[str, Any]) -> None:
    print(
        f"{rep['nics']} NICs, {rep['peers']} peers, load {rep['load']}, {rep['timestamps']} stamps, "
        f"{rep['probes']} probes on {rep['edges']} pairs ({rep['edges_fitted']} fitted, {rep['edges_flagged']} flagged)"
    )
    print(f"  model: {'ideal' if rep['model']['ideal'] else 'realistic'} (docs/simulator.md)")
    rows = {
        **rep["estimators"],
        "asym_floor": rep["asymmetry_floor"],
        "queue_bound": rep["queueing_bound"],
        "luck_sd": rep["receive_luck_sd"],
    }
    for name, e in rows.items():
        print(
            f"  {name:14s} p50 {e['p50_ns']:10.1f} ns  p99 {e['p99_ns']:10.1f} ns  max {e['max_ns']:10.1f} ns"
        )
    print(
        f"  network solve {rep['solve_seconds']} s; fits+solves {rep['fit_and_solve_seconds']} s; peak RSS {rep['max_rss_mb']} MB"
    )
    if "windows" in rep:
        for w in rep["windows"]:
            print(
                f"  window at {w['start_s']:6.1f} s: qpmesh p99 {w['qpmesh_p99_ns']:8.1f} ns, "
                f"NTP (network) p99 {w['ntp_baseline_p99_ns']:8.1f} ns ({w['estimator']})"
            )
        ow = rep["over_windows"]
        print(
            f"  median over {ow['windows']} windows: qpmesh p99 {ow['median_qpmesh_p99_ns']} ns, "
            f"NTP (network) p99 {ow['median_ntp_baseline_p99_ns']} ns, "
            f"ratio {ow['median_p99_ratio_ntp_over_qpmesh']}x"
        )


def register_sync(ssub: Any) -> None:
    """Register ``qpmesh sim sync``."""
    p = ssub.add_parser(
        "sync",
        help="clock-sync accuracy vs truth: qpmesh vs NTP-style and pairwise-only baselines",
        description=(
            "Simulate a two-tier Clos with known clocks (offsets up to 1 ms, drift up to 30 ppm), probe, "
            "and report p50/p99/max offset error for qpmesh and baselines fed the same probes, "
            "beside what no two-way estimator can see: the constant path asymmetry (asym_floor) "
            "and, with hw stamps, the luck of the best samples (luck_sd, a standard deviation)."
        ),
    )
    p.add_argument("--nics", type=int, default=128, help="number of NICs (default %(default)s)")
    p.add_argument(
        "--peers", type=int, default=16, help="random peers per NIC, K (default %(default)s)"
    )
    p.add_argument(
        "--load",
        type=float,
        default=0.4,
        help="background link utilisation 0..0.9 (default %(default)s)",
    )
    p.add_argument(
        "--timestamps",
        choices=STAMPS,
        default="hw",
        help="NIC stamps at the wire (hw: UDP, or RDMA with port timestamps), NIC stamps with "
        "sends stamped at the TX completion (cqe: qpmesh's RDMA path, docs/simulator.md) or "
        "kernel stamps (sw)",
    )
    p.add_argument("--seed", type=int, default=1, help="random seed (default %(default)s)")
    p.add_argument(
        "--window", type=float, default=2.0, help="sync window in seconds (default %(default)s)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=50.0,
        help="coded probe pairs per second per peer (default %(default)s)",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=1,
        help="score this many consecutive windows of one run (the fabric and its clocks go on, "
        "hot spots move); the report is the first window's plus `windows` and their medians "
        "`over_windows` (default %(default)s)",
    )
    p.add_argument(
        "--no-leaf-split",
        action="store_true",
        help="hw stamps: correct by the receive part alone, without the split by the sender's "
        "leaf uplink (the estimator before 2026-11-27's leaf split; for comparison)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--truth-breakdown",
        action="store_true",
        help="NIC stamps (hw or cqe): also split the error against the simulator's truth into "
        "its node-like and loop parts and report what a perfect receive-side correction would "
        "reach, and a perfect per-direction one (`perfect_direction_p99_ns`) "
        "(`truth_breakdown`; docs/benchmarks.md; costs one more solve and the truth per probe)",
    )
    p.add_argument(
        "--luck-draws",
        type=int,
        default=0,
        metavar="R",
        help="with --truth-breakdown: simulate each window R - 1 more times with other per-probe "
        "luck (same fabric, paths, load) and report `expected_split_p99_ns` and "
        "`expected_direction_p99_ns`, the error a perfect reading of each direction's expected "
        "best-sample queueing would leave through the leaf split / pair by pair (the luck is "
        "not readable: docs/sync.md); R times the simulation time (default: off)",
    )
    add_model_options(p)
    p.set_defaults(func=_cmd)
