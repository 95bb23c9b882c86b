"""A seeded synthetic clock window for `tests/test_sync_golden.py`: the fleet bench's kept
rows (`controller.fleet.bench`) at a few thousand NICs, with gross bad stamps on some rows
and two NICs cut off, reduced by `controller.clocksolve.window_summary` and solved by
`sync.summarysolve.sync_summary`. ``python -m tests.syncgolden`` records the golden values
(`GOLDEN`); only do that on code whose results are known right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from controller.clocksolve import ClockSyncConfig, SampleWindow, window_summary
from controller.fleet.bench import EPOCH, _kept, probe_graph
from sync.summary import Summary
from sync.summarysolve import sync_summary
from sync.window import WindowSync

GOLDEN = Path(__file__).parent / "data" / "sync_golden.npz"
NICS, PEERS, SEED = 3000, 24, 7
CUT = (11, 12)  # NICs whose rows are all dropped: unknown


def golden_window(bins: int = 4) -> tuple[int, Summary, ClockSyncConfig, np.ndarray]:
    """The summary to solve: (NICs, summary, config, leaf per NIC). ``bins`` kept coded pairs
    per directed pair (16: enough exchanges per edge for the lowest-RTT drift lines; on a
    third of the NICs)."""
    n = NICS if bins == 4 else NICS // 3
    cfg = ClockSyncConfig(capacity=4_000_000, bins=bins)
    rng = np.random.default_rng(SEED)
    src, dst = probe_graph(n, PEERS, SEED)
    offset = rng.uniform(-1e6, 1e6, n)
    drift = rng.normal(0.0, 2e-8, n)
    half = rng.uniform(1000.0, 3000.0, len(src) // 2)
    floor = np.concatenate([half, half]) + rng.normal(0.0, 10.0, len(src))
    w = _kept(src, dst, cfg, offset, drift, floor, rng)
    keep = ~(np.isin(w.src, CUT) | np.isin(w.dst, CUT))
    bad = rng.random(len(w)) < 2e-3  # gross bad receive stamps, 1-50 µs early
    err = rng.uniform(1000.0, 50_000.0, len(w)).astype(np.int64)
    t2 = np.where(bad, w.t2 - err, w.t2)
    w = SampleWindow(w.src[keep], w.dst[keep], w.pair[keep], w.t1[keep], t2[keep],
                     w.t3[keep], w.t4[keep], w.sw[keep])  # fmt: skip
    t_ref = cfg.window_ns // 2 + EPOCH
    s = window_summary(w, t_ref, cfg.coded_tol_hw_ns)
    leaf = np.arange(n, dtype=np.int64) // 16
    return n, s, cfg, leaf


def solve(leaf_split: bool = True, bins: int = 4) -> WindowSync:
    """`sync_summary` on the golden window (with the leaf split or the receive part only)."""
    n, s, cfg, leaf = golden_window(bins)
    return sync_summary(n, s, quant_ns=cfg.quant_hw_ns, min_samples=cfg.min_samples,
                        min_coded=cfg.min_coded, leaf=leaf if leaf_split else None)  # fmt: skip


def values(ws: WindowSync, tag: str) -> dict[str, Any]:
    """The fields the golden file holds, keyed ``tag/field``."""
    return {f"{tag}/offset": ws.offset_ns, f"{tag}/drift": ws.drift, f"{tag}/known": ws.known,
            f"{tag}/estimator": np.array(ws.estimator), f"{tag}/drift_from": np.array(ws.drift_from),
            f"{tag}/stepped": np.asarray(ws.stepped)}  # fmt: skip


if __name__ == "__main__":
    vals = {**values(solve(True), "leaf"), **values(solve(False), "rx"),
            **values(solve(True, 16), "lines")}  # fmt: skip
    np.savez_compressed(GOLDEN, **vals)
    print({k: (v.shape, v.dtype) for k, v in vals.items()})
