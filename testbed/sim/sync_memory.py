"""What memory across sync windows can buy (issue 34 item 4), measured against the truth.

``python -m testbed.sim.sync_memory --peers K --seeds 1 16 --json`` simulates, per seed, one
run of consecutive 2 s windows (128 NICs, load 0.9, the realistic default model, as ``qpmesh
sim sync --windows``) and scores each window's offsets three ways, qpmesh and the NTP baseline
alike (the same history for both):

* ``memoryless``: each window on its own (what ``sim sync --windows`` reports);
* ``merged_H``: the summaries of the last H windows merged (`sync.summary.merge`, times moved
  onto the scored window's reference) and solved as one window, i.e. one linear clock over
  H x 2 s; NTP gets the same span (its min-RTT line through H x 8 points);
* ``carried``: each NIC's offset and frequency carried from window to window by a Kalman
  filter on the windows' own solutions (`carry`; random-walk frequency noise ``q`` ppb^2/s,
  measurement noise ``sd_offset_ns`` and ``sd_drift_ppb``). The grid of those three is run
  and **the best point in hindsight** (chosen with the truth, per estimator) reported: an
  upper bound on what this family of filters buys, not a tuned estimator.

Besides, ``error_autocorrelation``: the correlation of a NIC's error (est - truth, median
centred) between windows 1, 2, 3 apart. What memory can buy is bounded by it: an error that
does not persist averages out only if the clock can be carried across windows, and the
model's frequency wander (docs/simulator.md, ``wander_ppb_sqrt_s``) makes a 2 s carry cost
about ``wander x 2^1.5 / sqrt 3`` ns.

Each window is scored as `testbed.clockerr.error_figures` (known NICs, median-centred);
figures are the p99 per window, then the median over the scored windows per seed, then over
seeds (with the max and how many seeds are <= the bar). Pure parts: `carry`, `autocorr`; the
rest is a thin shell over the simulator and the solve.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sync import solve_network
from sync.summary import Summary, merge
from sync.summarysolve import sync_summary
from testbed.clockerr import error_figures
from testbed.sim.engine import EPOCH_NS, HW_TICK_NS, Simulator
from testbed.sim.sync_bench import ntp_line, sync_setup
from testbed.sim.sync_stream import (
    N_SUB,
    StreamedWindow,
    collect_window,
    window_batches,
    window_edges,
)

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]
GRID_SD_OFFSET_NS = (10.0, 15.0, 20.0, 30.0)
GRID_SD_DRIFT_PPB = (5.0, 10.0, 20.0, 40.0)
GRID_Q_PPB2_PER_S = (25.0, 100.0, 400.0)


@dataclass(frozen=True)
class Series:
    """One run's windows: per window the reference time, the streamed window, and per NIC the
    memoryless qpmesh offsets, drifts (ppb) and known mask, NTP offsets and known mask, and the
    true offsets at the window's middle; the probed edges."""

    t_ref: list[int]
    streamed: list[StreamedWindow]
    off: F64
    drift_ppb: F64
    known: B
    ntp_off: F64
    ntp_known: B
    truth: F64
    edges: npt.NDArray[np.int64]
    leaf: npt.NDArray[np.int64]


def carry(
    off: F64,
    drift_ppb: F64,
    known: B,
    dt_s: float,
    sd_offset_ns: float,
    sd_drift_ppb: float,
    q: float,
) -> F64:
    """Per window and NIC the offset of a Kalman filter that carries each NIC's (offset,
    frequency) across windows ``dt_s`` apart: state transition offset += frequency x dt,
    random-walk frequency noise ``q`` (ppb^2/s; offset noise q dt^3/3), measurements the
    windows' offsets and drifts with standard deviations ``sd_offset_ns`` and
    ``sd_drift_ppb``. A NIC starts at its first known window; NaN before. ``drift_ppb`` NaN
    where unknown is allowed. Arrays are (windows, NICs). Raises ValueError on shapes that
    differ."""
    if not off.shape == drift_ppb.shape == known.shape:
        raise ValueError("offsets, drifts and known must have the same (windows, NICs) shape")
    w_n, n = off.shape
    x, p = np.zeros((n, 2)), np.zeros((n, 2, 2))
    on = np.zeros(n, dtype=bool)
    f = np.array([[1.0, dt_s], [0.0, 1.0]])
    qm = q * np.array([[dt_s**3 / 3, dt_s**2 / 2], [dt_s**2 / 2, dt_s]])
    r = np.diag([sd_offset_ns**2, sd_drift_ppb**2])
    out = np.full((w_n, n), np.nan)
    for w in range(w_n):
        x, p = x @ f.T, f @ p @ f.T + qm
        z = np.stack([off[w], drift_ppb[w]], axis=1)
        k = known[w] & np.isfinite(z).all(axis=1)
        new, upd = k & ~on, k & on
        x[new], p[new] = z[new], r
        on |= new
        if upd.any():
            gain = p[upd] @ np.linalg.inv(p[upd] + r)
            x[upd] = x[upd] + np.einsum("nij,nj->ni", gain, z[upd] - x[upd])
            p[upd] = (np.eye(2) - gain) @ p[upd]
        out[w] = np.where(on, x[:, 0], np.nan)
    return out


def autocorr(err: F64, lags: Sequence[int] = (1, 2, 3)) -> dict[str, float | None]:
    """Correlation of the (windows, NICs) errors ``err`` between windows ``lag`` apart, over
    the NIC-windows finite at both (None when fewer than 3)."""
    out: dict[str, float | None] = {}
    for lag in lags:
        a, b = err[:-lag].ravel(), err[lag:].ravel()
        k = np.isfinite(a) & np.isfinite(b)
        c = np.corrcoef(a[k], b[k])[0, 1] if k.sum() >= 3 else np.nan
        out[f"lag_{lag}"] = round(float(c), 3) if np.isfinite(c) else None
    return out


def _errors(est: F64, truth: F64) -> F64:
    """(windows, NICs) signed errors: est - truth, median-centred over the finite ones."""
    d = est - truth
    return d - np.nanmedian(d, axis=1, keepdims=True)


def _p99s(est: F64, truth: F64) -> list[float]:
    """Per window the p99 of `testbed.clockerr.error_figures` (NaN when no NIC is known)."""
    return [error_figures(e, t)["p99_ns"] for e, t in zip(est, truth, strict=True)]


def simulate(
    seed: int,
    peers: int,
    windows: int,
    *,
    nics: int = 128,
    load: float = 0.9,
    window_s: float = 2.0,
    rate_hz: float = 50.0,
    timestamps: str = "hw",
) -> Series:
    """Simulate ``windows`` consecutive windows of one run and solve each on its own (qpmesh
    as ``sim sync``; NTP's min-RTT line through the same network solve). Raises ValueError as
    `testbed.sim.sync_bench.run_sync_bench` does on bad sizes."""
    if timestamps == "sw" or windows < 1 or not 1 <= peers < nics:
        raise ValueError("needs NIC stamps, windows >= 1 and peers in [1, nics)")
    fabric, cfg = sync_setup(nics, peers, load, timestamps, seed, rate_hz)
    sim = Simulator(fabric, cfg)
    n = len(fabric.nics)
    leaf = fabric.nic_group_index.astype(np.int64)
    edges, per = window_edges(sim.pairs_src, sim.pairs_dst, n)
    max_x = per * 2 * (int(np.ceil(window_s * rate_hz)) + 1)
    cols: dict[str, list[Any]] = {k: [] for k in ("t", "sw", "o", "d", "k", "no", "nk", "tr")}
    for w in range(windows):
        start = w * window_s
        t_mid = (start + window_s / 2) * 1e9
        t_ref = EPOCH_NS + int(t_mid)
        batches = window_batches(sim, window_s, 0.1, start_s=start)
        sw = collect_window(batches, edges, max_x, n, t_ref, window_s, 25)
        ws = sync_summary(n, sw.summary, quant_ns=HW_TICK_NS, leaf=leaf)
        no, nk = _ntp_solve(n, edges, [sw], [0.0])
        for key, v in (
            ("t", t_ref),
            ("sw", sw),
            ("o", ws.offset_ns),
            ("d", ws.drift * 1e9),
            ("k", ws.known),
            ("no", no),
            ("nk", nk),
            ("tr", sim.true_offset_ns(t_mid)),
        ):
            cols[key].append(v)
    arr = {k: np.array(cols[k]) for k in ("o", "d", "k", "no", "nk", "tr")}
    return Series(
        cols["t"],
        cols["sw"],
        arr["o"],
        arr["d"],
        arr["k"],
        arr["no"],
        arr["nk"],
        arr["tr"],
        edges,
        leaf,
    )


def _ntp_solve(
    n: int, edges: npt.NDArray[np.int64], wins: Sequence[StreamedWindow], shifts: Sequence[float]
) -> tuple[F64, B]:
    """NTP's min-RTT line through the eighths of ``wins`` (times moved by ``shifts`` ns onto
    the scored window's reference), through the network solve."""
    m = len(edges)
    x = np.concatenate(
        [w.ntp_sub.t_rel.reshape(m, N_SUB) + s for w, s in zip(wins, shifts, strict=True)], 1
    )
    y = np.concatenate([w.ntp_sub.theta.reshape(m, N_SUB) for w in wins], 1)
    ok = np.concatenate([np.isfinite(w.ntp_sub.rtt).reshape(m, N_SUB) for w in wins], 1)
    th, good = ntp_line(x, y, ok)
    net = solve_network(
        n, edges[good], th[good], np.ones(int(good.sum())), pin="mean", loss="huber"
    )
    return net.offset_ns, net.known


def merged(series: Series, h: int) -> tuple[F64, F64]:
    """Per window the qpmesh and NTP offsets solved on the last ``h`` windows merged (NaN where
    unknown)."""
    n = series.off.shape[1]
    qp, nt = [], []
    for w, t_ref in enumerate(series.t_ref):
        lo = max(0, w - h + 1)
        shifts = [float(series.t_ref[v] - t_ref) for v in range(lo, w + 1)]
        summ: Summary | None = None
        for v, sh in zip(range(lo, w + 1), shifts, strict=True):
            s = series.streamed[v].summary
            s = dataclasses.replace(
                s,
                clean_t=s.clean_t + sh,
                all_t=s.all_t + sh,
                x_mid=s.x_mid + sh,
                cap=s.cap * len(shifts),
            )
            summ = s if summ is None else merge(summ, s)
        assert summ is not None
        ws = sync_summary(n, summ, quant_ns=HW_TICK_NS, leaf=series.leaf)
        qp.append(np.where(ws.known, ws.offset_ns, np.nan))
        no, nk = _ntp_solve(n, series.edges, series.streamed[lo : w + 1], shifts)
        nt.append(np.where(nk, no, np.nan))
    return np.array(qp), np.array(nt)


def _seed_report(
    series: Series, score: int, histories: Sequence[int], dt_s: float
) -> dict[str, Any]:
    """One seed's per-window p99s of every variant (first ``score`` windows) and the error
    autocorrelation (all windows)."""
    tr = series.truth[:score]
    qp = np.where(series.known, series.off, np.nan)
    nt = np.where(series.ntp_known, series.ntp_off, np.nan)
    rep: dict[str, Any] = {
        "memoryless": {"qpmesh": _p99s(qp[:score], tr), "ntp": _p99s(nt[:score], tr)},
        "error_autocorrelation": {
            "qpmesh": autocorr(_errors(qp, series.truth)),
            "ntp": autocorr(_errors(nt, series.truth)),
        },
    }
    for h in histories:
        mq, mn = merged(series, h)
        rep[f"merged_{h}"] = {"qpmesh": _p99s(mq[:score], tr), "ntp": _p99s(mn[:score], tr)}
    grid = {}
    # NTP has no drift of its own per NIC here: carried on offsets alone (drift sd inf)
    for so, sd, q in itertools.product(GRID_SD_OFFSET_NS, GRID_SD_DRIFT_PPB, GRID_Q_PPB2_PER_S):
        c = carry(series.off, series.drift_ppb, series.known, dt_s, so, sd, q)
        cn = carry(
            series.ntp_off, np.zeros_like(series.ntp_off), series.ntp_known, dt_s, so, 1e9, q
        )
        grid[f"{so:g}/{sd:g}/{q:g}"] = {
            "qpmesh": _p99s(c[:score], tr),
            "ntp": _p99s(cn[:score], tr),
        }
    rep["carried_grid"] = grid
    return rep


def _median_of(vals: list[float | None]) -> float | None:
    """The median of the values that are not None (None when none are)."""
    v = [x for x in vals if x is not None]
    return round(float(np.median(v)), 3) if v else None


def _summary(per_seed: list[dict[str, Any]], bar: float) -> dict[str, Any]:
    """Over seeds: per variant and estimator the median of windows (all seeds' windows), the
    median and max of the per-seed medians, and the seeds <= ``bar``; for the carried grid
    the best point in hindsight per estimator (lowest median of per-seed medians)."""

    def fig(lists: list[list[float]]) -> dict[str, Any]:
        seeds = [float(np.nanmedian(x)) for x in lists]
        return {
            "windows_median_ns": round(float(np.nanmedian([x for li in lists for x in li])), 1),
            "seed_median_ns": round(float(np.median(seeds)), 1),
            "seed_max_ns": round(float(np.max(seeds)), 1),
            "seeds_at_or_under_bar": int(sum(s <= bar for s in seeds)),
            "seeds": len(seeds),
        }

    out: dict[str, Any] = {}
    variants = [k for k in per_seed[0] if k.startswith(("memoryless", "merged_"))]
    for v in variants:
        out[v] = {e: fig([s[v][e] for s in per_seed]) for e in ("qpmesh", "ntp")}
    best: dict[str, Any] = {}
    for e in ("qpmesh", "ntp"):
        pts = {
            g: fig([s["carried_grid"][g][e] for s in per_seed]) for g in per_seed[0]["carried_grid"]
        }
        g = min(pts, key=lambda k: pts[k]["seed_median_ns"])
        best[e] = {"point": g, **pts[g]}
    out["carried_best_in_hindsight"] = best
    out["error_autocorrelation_median"] = {
        e: {lag: _median_of([s["error_autocorrelation"][e][lag] for s in per_seed])
            for lag in per_seed[0]["error_autocorrelation"][e]}
        for e in ("qpmesh", "ntp")
    }  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); returns the exit status."""
    p = argparse.ArgumentParser(
        prog="python -m testbed.sim.sync_memory",
        description="What memory across sync windows can buy: memoryless, merged windows, and "
        "a Kalman carry (best in hindsight), qpmesh and NTP alike, against the truth.",
    )
    p.add_argument("--peers", type=int, default=12, help="K (default %(default)s)")
    p.add_argument(
        "--seeds",
        type=int,
        nargs=2,
        default=(1, 16),
        metavar=("FIRST", "LAST"),
        help="seeds FIRST..LAST (default 1 16)",
    )
    p.add_argument(
        "--windows", type=int, default=6, help="windows simulated per seed (default %(default)s)"
    )
    p.add_argument(
        "--score",
        type=int,
        default=4,
        help="windows scored per seed, from the first (default %(default)s)",
    )
    p.add_argument(
        "--histories",
        type=int,
        nargs="*",
        default=[2, 4],
        help="H of the merged variants (default 2 4)",
    )
    p.add_argument("--nics", type=int, default=128, help="NICs (default %(default)s)")
    p.add_argument("--load", type=float, default=0.9, help="load (default %(default)s)")
    p.add_argument("--bar", type=float, default=45.0, help="p99 bar in ns (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    if not 1 <= a.score <= a.windows or a.seeds[0] > a.seeds[1]:
        p.error("needs 1 <= --score <= --windows and FIRST <= LAST")
    if any(h < 1 for h in a.histories):
        p.error("--histories must be >= 1")
    per_seed = []
    for s in range(a.seeds[0], a.seeds[1] + 1):
        try:
            series = simulate(s, a.peers, a.windows, nics=a.nics, load=a.load)
        except ValueError as exc:  # bad sizes or load: one line, as argparse's own
            p.error(str(exc))
        per_seed.append({"seed": s, **_seed_report(series, a.score, a.histories, 2.0)})
        print(f"sync_memory: seed {s} done", file=sys.stderr)
    rep = {
        "peers": a.peers,
        "nics": a.nics,
        "load": a.load,
        "windows": a.windows,
        "scored_windows": a.score,
        "bar_ns": a.bar,
        "summary": _summary(per_seed, a.bar),
        "per_seed": per_seed,
    }
    if a.json:
        print(json.dumps(rep))
    else:
        print(json.dumps(rep["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
