"""Where a fleet's clock work goes, measured on synthetic partials (a thin shell: it reads the
clock and the process's memory; the cores it times never do).

``python -m controller.fleet.bench --nics 100000 --peers 32 --json`` makes, for every window of
one clock solve window, the clock part the fleet's workers would send the solver: per directed
NIC pair one kept coded pair (two probes, raw stamps of clocks with random offsets and drifts,
delays of a floor and exponential queueing), each NIC probing ``peers`` others (half of them
chosen, the other half choosing it: every edge is probed from both ends, whose batches go to
different workers). It then times what the solver does with them, stage by stage, as
`controller.fleet.solver.FleetSolver` and `controller.clocksolve.solve_window` run them:

- ``fold``: the partials of a window folded into the clock's selection
  (`controller.clocksync.ClockSync.add_pairs`: per directed pair and clock bin the best pair),
  per window;
- ``summary``: the kept rows oriented onto edges and reduced to hulls and lowest-RTT exchanges
  (`controller.clocksolve.window_summary`): per edge, block of edges by block, so a second
  stage of edge owners could run it on other cores and hand the solver its blocks to lay end
  to end;
- ``fit_and_solve``: `sync.summarysolve.sync_summary` (pair fits on the hulls, the network
  solves, the second stage, the receive-side correction) on the whole fleet's summary;

and reports each stage's CPU seconds and the peak RSS the process reached in it, the rows and
summary points, the bytes of one window's partials, and whether the solve knows every NIC.

With ``--edge-owners K`` (`controller.fleet.edges`, ``FleetConfig.edge_owners``) the fold and
the summary are an edge stage's: each window's clock part split by owner
(``split_cpu_s_per_window``, a worker's work), each owner's share folded
(`EdgeStage.add`, timed owner by owner), and the clock window's rows summarized and the solve
staged (`sync.summarysolve.solve_ranges`, as `controller.fleet.edges.solve_blocks` runs it)
with each owner a process of its own (`controller.fleet.benchowners`): it summarizes its rows
(``owners[*].summary_cpu_s``; ``block_bytes``: its block as it would travel,
`controller.fleet.edges.SummaryBlock.encode`, zlib) and answers the rounds' calls over a pipe
as the fleet's stage frames (``owners[*].stages_cpu_s``, ``stage_bytes``: its replies;
``stages_critical_cpu_s``: per round the slowest owner; ``owners[*].peak_rss_mb``). The
solver's part is measured in its own process, which holds no rows and no block:
``network_cpu_s`` (the network stages, encoding the calls and decoding the replies) and
``network_peak_rss_mb`` (= ``fit_and_solve_peak_rss_mb``).
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from controller.clocksolve import (
    ClockSyncConfig,
    SampleRows,
    SampleWindow,
    fit_params,
    solve_edge_ranges,
    window_summary,
)
from controller.clocksync import ClockSync
from controller.fleet.benchowners import OwnerProcs, hwm_mb, release_heap, reset_peak
from controller.fleet.edges import EdgeInput, EdgeStage, first_send, owner_bounds, split_clock
from controller.fleet.partial import MovedClocks
from sync.summarysolve import sync_summary
from sync.window import WindowSync

I64 = npt.NDArray[np.int64]
T = TypeVar("T")
EPOCH = 1_700_000_000_000_000_000


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _timed(out: dict[str, Any], name: str, fn: Callable[[], T]) -> T:
    reset_peak()
    t0, w0 = time.process_time(), time.perf_counter()
    res = fn()
    out[f"{name}_cpu_s"] = round(time.process_time() - t0, 3)
    out[f"{name}_wall_s"] = round(time.perf_counter() - w0, 3)
    out[f"{name}_peak_rss_mb"] = round(hwm_mb())
    return res


def probe_graph(n: int, peers: int, seed: int) -> tuple[I64, I64]:
    """Directed pairs (src, dst): each NIC chooses ``peers // 2`` others; both directions of
    every chosen edge are probed (duplicate edges dropped)."""
    rng = np.random.default_rng(seed)
    half = max(1, peers // 2)
    src = np.repeat(np.arange(n, dtype=np.int64), half)
    dst = (src + rng.integers(1, n, len(src))) % n
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    key = np.unique(lo * n + hi)
    lo, hi = key // n, key % n
    return np.concatenate([lo, hi]), np.concatenate([hi, lo])


def window_part(
    src: I64, dst: I64, k: int, width_ns: int, offset: npt.NDArray[np.float64],
    drift: npt.NDArray[np.float64], floor: npt.NDArray[np.float64], rng: np.random.Generator,
    pair_base: int,
) -> SampleRows:  # fmt: skip
    """The clock part of window ``k``: per directed pair one kept coded pair, stamped by
    clocks ``offset`` + ``drift`` (per NIC), delays ``floor`` (per directed pair) plus
    exponential queueing (mean 100 ns; the kept pair is the least queued of its window)."""
    m = len(src)
    t = k * width_ns + rng.integers(0, width_ns - 10_000, m)  # ns after EPOCH (float-exact)
    rev_floor = floor[(np.arange(m) + m // 2) % m]  # the reply's: the reverse pair's floor

    def clock(nic: I64, at: npt.NDArray[np.float64]) -> I64:
        return EPOCH + np.rint(at + offset[nic] + drift[nic] * at).astype(np.int64)

    cols: dict[str, list[I64]] = {c: [] for c in ("t1", "t2", "t3", "t4")}
    for gap in (0.0, 1000.0):  # the coded pair: two probes 1 µs apart, queued alike
        q1 = rng.exponential(30.0, m)
        q2 = rng.exponential(30.0, m)
        s = t.astype(np.float64) + gap
        a = s + floor + q1
        b = a + rng.uniform(1000.0, 3000.0, m)
        c = b + rev_floor + q2
        cols["t1"].append(clock(src, s))
        cols["t2"].append(clock(dst, a))
        cols["t3"].append(clock(dst, b))
        cols["t4"].append(clock(src, c))
    inter = {k2: np.stack(v, axis=1).reshape(-1) for k2, v in cols.items()}
    pair = np.repeat(pair_base + np.arange(m, dtype=np.int64), 2)
    return SampleRows(
        np.repeat(src, 2).astype(np.int32), np.repeat(dst, 2).astype(np.int32), pair,
        inter["t1"], inter["t2"], inter["t3"], inter["t4"], np.zeros(2 * m, bool),
    )  # fmt: skip


def run(
    nics: int, peers: int, seed: int = 1, fold_windows: int = 2, owners: int = 0
) -> dict[str, Any]:
    """Measure the solver's clock stages on synthetic partials (see the module docstring):
    the fold on ``fold_windows`` windows' partials, then the summary and the solve on what a
    clock window keeps (``ClockSyncConfig.bins`` kept pairs per directed pair, made directly:
    holding every window's folded selection at once takes ~20 GB at 100,000 NICs, more than
    this shared machine gives); ``owners``: that many edge owners fold and summarize
    (module docstring). Returns the figures as a JSON-ready dict."""
    cfg = ClockSyncConfig(capacity=max(4_000_000, 16 * nics * peers))
    width = 1_000_000_000
    rng = np.random.default_rng(seed)
    src, dst = probe_graph(nics, peers, seed)
    offset = rng.uniform(-1e6, 1e6, nics)
    drift = rng.normal(0.0, 2e-8, nics)
    half = rng.uniform(1000.0, 3000.0, len(src) // 2)  # per edge, nearly the same each way
    floor = np.concatenate([half, half]) + rng.normal(0.0, 10.0, len(src))
    leaf = np.arange(nics, dtype=np.int64) // 16
    out: dict[str, Any] = {"nics": nics, "peers": peers, "directed_pairs": len(src),
                           "edges": len(src) // 2}  # fmt: skip
    cs = ClockSync(nics, cfg, leaf=leaf)
    bounds = owner_bounds(nics, owners) if owners else None
    stages = [EdgeStage(nics, cfg, k) for k in range(owners)]
    fold_cpu, split_cpu = 0.0, 0.0
    owner_fold = np.zeros(owners)
    reset_peak()
    for k in range(fold_windows):
        part = window_part(src, dst, k, width, offset, drift, floor, rng, k * len(src))
        if k == 0:
            out["window_partials_bytes"] = len(_encode(part))
        t0 = time.process_time()
        if bounds is None:
            cs.add_pairs(part)
        else:
            pieces = split_clock(part, bounds)
            split_cpu += time.process_time() - t0
            for o, stage in enumerate(stages):
                t1 = time.process_time()
                stage.add([EdgeInput(k, "w", pieces[o], MovedClocks.empty(), first_send(part))])
                owner_fold[o] += time.process_time() - t1
        fold_cpu += time.process_time() - t0
        del part
    out["fold_cpu_s_per_window"] = round(fold_cpu / fold_windows, 3)
    out["fold_peak_rss_mb"] = round(hwm_mb())
    del cs, stages
    w = _kept(src, dst, cfg, offset, drift, floor, rng)
    out["kept_rows"] = len(w)
    t_ref = cfg.window_ns // 2 + EPOCH
    if bounds is None:
        s = _timed(out, "summary", functools.partial(window_summary, w, t_ref, cfg.coded_tol_hw_ns))
        del w  # the solve holds the summary, not the rows
        out["summary_points"] = s.n_points
        ws = _timed(
            out, "fit_and_solve",
            lambda: sync_summary(nics, s, quant_ns=cfg.quant_hw_ns,
                                 min_samples=cfg.min_samples, min_coded=cfg.min_coded, leaf=leaf),
        )  # fmt: skip
    else:
        out["split_cpu_s_per_window"] = round(split_cpu / fold_windows, 3)
        pieces = split_clock(w, bounds)  # the owners' rows: OwnerProcs empties the list
        del w
        with OwnerProcs(pieces, t_ref, cfg.coded_tol_hw_ns, fit_params(cfg)) as procs:
            ws = _staged(out, nics, procs, leaf, owner_fold / fold_windows)
    known = ws.known & np.isfinite(ws.offset_ns)
    out["known_nics"] = int(known.sum())
    truth = offset + drift * (t_ref - EPOCH)  # the clocks at the solve's reference instant
    err = (ws.offset_ns - truth)[known]
    err -= np.mean(err)
    out["offset_err_p99_ns"] = round(float(np.percentile(np.abs(err), 99)), 2) if len(err) else None
    out["estimator"] = ws.estimator
    out["max_rss_mb"] = round(_peak_mb())
    return out


def _staged(
    out: dict[str, Any], nics: int, procs: OwnerProcs, leaf: I64,
    fold: npt.NDArray[np.float64],
) -> WindowSync:  # fmt: skip
    """The staged solve (`sync.summarysolve.solve_ranges`) with each owner a process of its
    own (`controller.fleet.benchowners`): per owner its rows, fold per window, summary and
    block bytes, stages' CPU and results' bytes and peak resident set (``owners``); per round
    the slowest owner (``stages_critical_cpu_s``); the solver's part measured in its own
    process (``network_cpu_s``: the network stages plus encoding the calls and decoding the
    replies; ``fit_and_solve_peak_rss_mb``: its peak while solving)."""
    per: list[dict[str, Any]] = [
        {"owner": o, "rows": h["rows"], "fold_cpu_s_per_window": round(float(fold[o]), 3),
         "summary_cpu_s": round(h["summary_cpu_s"], 3), "block_bytes": h["block_bytes"],
         "encode_cpu_s": round(h["encode_cpu_s"], 3)}
        for o, h in enumerate(procs.hello)
    ]  # fmt: skip
    out["summary_points"] = sum(int(h["points"]) for h in procs.hello)
    out["summary_cpu_s"] = round(max(p["summary_cpu_s"] for p in per), 3)  # in parallel
    ranges = procs.ranges()
    release_heap()
    ws = _timed(out, "network", lambda: solve_edge_ranges(ranges, nics, leaf))
    done = procs.finish()
    n_calls = max(len(d["calls"]) for d in done)
    cpu = np.zeros((n_calls, len(done)))
    for o, (own, d) in enumerate(zip(per, done, strict=True)):
        calls = np.asarray(d["calls"], np.float64).reshape(-1, 2)
        cpu[: len(calls), o] = calls[:, 0]
        own["stages_cpu_s"] = round(float(calls[:, 0].sum()), 3)
        own["stage_bytes"] = int(calls[:, 1].sum())
        own["peak_rss_mb"] = round(float(d["peak_rss_mb"]))
    out["owners"] = per
    out["summary_peak_rss_mb"] = max(p["peak_rss_mb"] for p in per)
    out["stage_rounds"] = n_calls
    out["stages_critical_cpu_s"] = round(float(cpu.max(axis=1).sum()), 3)
    out["fit_and_solve_cpu_s"] = round(out["network_cpu_s"] + float(cpu.sum()), 3)
    out["fit_and_solve_peak_rss_mb"] = out["network_peak_rss_mb"]
    return ws


def _kept(
    src: I64, dst: I64, cfg: ClockSyncConfig, offset: npt.NDArray[np.float64],
    drift: npt.NDArray[np.float64], floor: npt.NDArray[np.float64], rng: np.random.Generator,
) -> SampleWindow:  # fmt: skip
    """What the solver's selection holds over one clock window: per directed pair and bin
    the kept coded pair (rows filled bin by bin: no concatenation of the whole)."""
    n_bins, m = cfg.bins, len(src)
    bin_ns = cfg.window_ns // n_bins
    n = 2 * m * n_bins
    cols = {k: np.empty(n, np.int64) for k in ("pair", "t1", "t2", "t3", "t4")}
    s_, d_ = np.empty(n, np.int32), np.empty(n, np.int32)
    for b in range(n_bins):
        part = window_part(src, dst, b, bin_ns, offset, drift, floor, rng, b * m)
        sl = slice(2 * m * b, 2 * m * (b + 1))
        s_[sl], d_[sl] = part.src, part.dst
        for k, col in cols.items():
            col[sl] = getattr(part, k)
        del part
    return SampleWindow(s_, d_, cols["pair"], cols["t1"], cols["t2"], cols["t3"], cols["t4"],
                        np.zeros(n, bool))  # fmt: skip


def _encode(part: SampleRows) -> bytes:
    """One window's clock parts as the partials carry them (zlib columns)."""
    from controller.fleet.codec import pack

    return pack(b"QPFP", 1, {}, part.cols(), compress=True)


def main(argv: list[str] | None = None) -> int:
    """CLI entry; returns the exit code (2 on bad options)."""
    ap = argparse.ArgumentParser(prog="python -m controller.fleet.bench", description=__doc__)
    ap.add_argument("--nics", type=int, default=10_000)
    ap.add_argument("--peers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fold-windows", type=int, default=2, help="windows folded (default 2)")
    ap.add_argument("--edge-owners", type=int, default=0,
                    help="edge owners that fold and summarize (default 0: the solver)")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.nics < 16 or a.peers < 2 or a.fold_windows < 1 or not 0 <= a.edge_owners <= a.nics:
        print("bad options: need --nics >= 16, --peers >= 2, --fold-windows >= 1, "
              "0 <= --edge-owners <= --nics", file=sys.stderr)  # fmt: skip
        return 2
    rep = run(a.nics, a.peers, a.seed, a.fold_windows, a.edge_owners)
    print(json.dumps(rep) if a.json else "\n".join(f"{k}: {v}" for k, v in rep.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
