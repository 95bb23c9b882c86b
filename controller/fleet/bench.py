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
(`EdgeStage.add`) and its rows of the clock window summarized, timed owner by owner
(``owners``: per owner CPU s, they run in parallel; ``block_bytes``: its block as it travels,
`controller.fleet.edges.SummaryBlock.encode`, zlib), and the solve is staged
(`sync.summarysolve.solve_ranges`, as `controller.fleet.edges.solve_blocks` runs it): each
owner's per-edge stages on its block timed apart (``owners[*].stages_cpu_s``, and per round
the slowest owner: ``stages_critical_cpu_s``), the solver's part the network stages
(``network_cpu_s``); no block is joined.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
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
from controller.fleet.edges import (
    EdgeInput,
    EdgeStage,
    SummaryBlock,
    first_send,
    owner_bounds,
    split_clock,
)
from controller.fleet.partial import MovedClocks
from sync.edgestage import Candidates, EdgeFit, EdgeRange, Residuals
from sync.excess import DirectionLows
from sync.summary import Summary
from sync.summarysolve import sync_summary
from sync.window import WindowSync

I64 = npt.NDArray[np.int64]
T = TypeVar("T")
EPOCH = 1_700_000_000_000_000_000


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_peak() -> None:
    """Reset the process's peak RSS (Linux: ``/proc/self/clear_refs`` 5); best effort."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _hwm_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return _peak_mb()


def _timed(out: dict[str, Any], name: str, fn: Callable[[], T]) -> T:
    _reset_peak()
    t0, w0 = time.process_time(), time.perf_counter()
    res = fn()
    out[f"{name}_cpu_s"] = round(time.process_time() - t0, 3)
    out[f"{name}_wall_s"] = round(time.perf_counter() - w0, 3)
    out[f"{name}_peak_rss_mb"] = round(_hwm_mb())
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
    _reset_peak()
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
    out["fold_peak_rss_mb"] = round(_hwm_mb())
    del cs, stages
    w = _kept(src, dst, cfg, offset, drift, floor, rng)
    out["kept_rows"] = len(w)
    t_ref = cfg.window_ns // 2 + EPOCH
    s: Summary | list[Summary]
    if bounds is None:
        s = _timed(out, "summary", functools.partial(window_summary, w, t_ref, cfg.coded_tol_hw_ns))
    else:
        out["split_cpu_s_per_window"] = round(split_cpu / fold_windows, 3)
        s = _owners(out, w, bounds, t_ref, cfg, owner_fold / fold_windows)
    del w  # the solve holds the summary, not the rows
    if isinstance(s, Summary):
        out["summary_points"] = s.n_points
        one = s
        ws = _timed(
            out, "fit_and_solve",
            lambda: sync_summary(nics, one, quant_ns=cfg.quant_hw_ns,
                                 min_samples=cfg.min_samples, min_coded=cfg.min_coded, leaf=leaf),
        )  # fmt: skip
    else:
        out["summary_points"] = sum(b.n_points for b in s)
        ws = _staged(out, nics, s, cfg, leaf)
    known = ws.known & np.isfinite(ws.offset_ns)
    out["known_nics"] = int(known.sum())
    truth = offset + drift * (t_ref - EPOCH)  # the clocks at the solve's reference instant
    err = (ws.offset_ns - truth)[known]
    err -= np.mean(err)
    out["offset_err_p99_ns"] = round(float(np.percentile(np.abs(err), 99)), 2) if len(err) else None
    out["estimator"] = ws.estimator
    out["max_rss_mb"] = round(_peak_mb())
    return out


class _Rounds:
    """The CPU each owner spends in each round of the staged solve (a round: one stage
    called on every owner, the first owner first) and the bytes its results take."""

    def __init__(self, owners: int) -> None:
        self.cpu: list[npt.NDArray[np.float64]] = []
        self.bytes = np.zeros(owners, np.int64)

    def add(self, owner: int, cpu: float, result: object) -> None:
        if owner == 0 or not self.cpu:
            self.cpu.append(np.zeros(len(self.bytes)))
        self.cpu[-1][owner] += cpu
        self.bytes[owner] += _nbytes(result)


def _nbytes(x: object) -> int:
    """Bytes of the arrays in a stage's result (tuples, lists and dataclasses opened)."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return sum(_nbytes(getattr(x, f.name)) for f in dataclasses.fields(x))
    return 0


class _TimedRange:
    """An owner's `sync.edgestage.EdgeRange`, each stage's CPU counted apart (the owners
    run in parallel, the solver waits for the slowest of each round)."""

    def __init__(self, inner: EdgeRange, owner: int, rounds: _Rounds) -> None:
        self.inner, self.owner, self.rounds = inner, owner, rounds

    @property
    def edges(self) -> I64:
        return self.inner.edges

    def _run(self, fn: Callable[[], T]) -> T:
        t0 = time.process_time()
        res = fn()
        self.rounds.add(self.owner, time.process_time() - t0, res)
        return res

    def fit(self) -> EdgeFit:
        return self._run(self.inner.fit)

    def drop_bad(self, drift: npt.NDArray[np.float64]) -> bool:
        return self._run(lambda: self.inner.drop_bad(drift))

    def candidates(
        self, drift: npt.NDArray[np.float64], offset: npt.NDArray[np.float64],
        rtt_fractions: Sequence[float],
    ) -> Candidates:  # fmt: skip
        return self._run(lambda: self.inner.candidates(drift, offset, rtt_fractions))

    def residuals(
        self, offset: npt.NDArray[np.float64], drift: npt.NDArray[np.float64]
    ) -> Residuals:
        return self._run(lambda: self.inner.residuals(offset, drift))

    def cut_nodes(self, nodes: I64) -> None:
        self._run(lambda: self.inner.cut_nodes(nodes))

    def lows(self) -> DirectionLows:
        return self._run(self.inner.lows)


def _staged(
    out: dict[str, Any], nics: int, blocks: list[Summary], cfg: ClockSyncConfig, leaf: I64
) -> WindowSync:
    """The staged solve of the owners' blocks (`sync.summarysolve.solve_ranges`): each
    owner's stages timed apart (``owners[*].stages_cpu_s``, ``stage_bytes``: what its
    results take), the rounds' critical path (``stages_critical_cpu_s``: per round the
    slowest owner) and the solver's network stages (``network_cpu_s``: the whole solve's
    CPU less every owner's)."""
    rounds = _Rounds(len(blocks))
    ranges = [_TimedRange(EdgeRange(b, fit_params(cfg)), o, rounds) for o, b in enumerate(blocks)]
    ws = _timed(out, "fit_and_solve", lambda: solve_edge_ranges(ranges, nics, leaf))
    per = np.sum(rounds.cpu, axis=0) if rounds.cpu else np.zeros(len(blocks))
    for o, own in enumerate(out["owners"]):
        own["stages_cpu_s"] = round(float(per[o]), 3)
        own["stage_bytes"] = int(rounds.bytes[o])
    out["stage_rounds"] = len(rounds.cpu)
    out["stages_critical_cpu_s"] = round(float(sum(r.max() for r in rounds.cpu)), 3)
    out["network_cpu_s"] = round(max(0.0, out["fit_and_solve_cpu_s"] - float(per.sum())), 3)
    return ws


def _owners(
    out: dict[str, Any], w: SampleWindow, bounds: I64, t_ref: int, cfg: ClockSyncConfig,
    fold: npt.NDArray[np.float64],
) -> list[Summary]:  # fmt: skip
    """Each owner's rows of the clock window summarized, timed owner by owner; returns the
    owners' blocks (their summaries: the staged solve runs on them, no join)."""
    blocks: list[Summary] = []
    per: list[dict[str, Any]] = []
    _reset_peak()
    for o, rows in enumerate(split_clock(w, bounds)):
        t0 = time.process_time()
        blocks.append(window_summary(SampleWindow(**rows.cols()), t_ref, cfg.coded_tol_hw_ns))
        cpu = time.process_time() - t0
        t0 = time.process_time()
        size = len(SummaryBlock(o, 0, len(rows), 0, 0, False, blocks[-1], np.zeros((0, 2), np.int64),
                                np.zeros(0)).encode())  # fmt: skip
        per.append({"owner": o, "rows": len(rows), "fold_cpu_s_per_window": round(fold[o], 3),
                    "summary_cpu_s": round(cpu, 3), "block_bytes": size,
                    "encode_cpu_s": round(time.process_time() - t0, 3)})  # fmt: skip
        del rows
    out["owners"] = per
    out["summary_cpu_s"] = round(max(p["summary_cpu_s"] for p in per), 3)  # in parallel
    out["summary_peak_rss_mb"] = round(_hwm_mb())
    return blocks


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
