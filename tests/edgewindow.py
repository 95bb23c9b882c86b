"""A window for the staged-solve tests (`tests/test_sync_edgestage.py`,
`tests/test_fleet_edgefit.py`): the fleet bench's kept rows (`controller.fleet.bench`) with
gross bad stamps, one NIC's clock stepping half way and two NICs cut off."""

from __future__ import annotations

import numpy as np

from controller.clocksolve import ClockSyncConfig, SampleWindow
from controller.fleet.bench import EPOCH, _kept, probe_graph

NICS, PEERS, SEED = 400, 16, 11
STEPPED, STEP_NS = 37, 20_000


def stepped_window() -> tuple[SampleWindow, ClockSyncConfig, np.ndarray]:
    """(rows, config, leaf per NIC) of a window of the fleet bench's kept rows with gross
    bad stamps, NIC ``STEPPED``'s clock stepping ``STEP_NS`` ahead half way, and NICs 5
    and 6 cut off."""
    cfg = ClockSyncConfig(capacity=4_000_000, bins=8)
    rng = np.random.default_rng(SEED)
    src, dst = probe_graph(NICS, PEERS, SEED)
    offset = rng.uniform(-1e6, 1e6, NICS)
    drift = rng.normal(0.0, 2e-8, NICS)
    half = rng.uniform(1000.0, 3000.0, len(src) // 2)
    floor = np.concatenate([half, half]) + rng.normal(0.0, 10.0, len(src))
    w = _kept(src, dst, cfg, offset, drift, floor, rng)
    at = EPOCH + cfg.window_ns // 2

    def stepped(nic: np.ndarray, t: np.ndarray) -> np.ndarray:
        return np.where((nic == STEPPED) & (t > at), t + STEP_NS, t)

    bad = rng.random(len(w)) < 3e-3  # gross bad receive stamps, 1-50 µs early
    t2 = np.where(bad, w.t2 - rng.uniform(1000.0, 50_000.0, len(w)).astype(np.int64), w.t2)
    keep = ~(np.isin(w.src, (5, 6)) | np.isin(w.dst, (5, 6)))
    cols: dict[str, np.ndarray] = {
        "src": w.src, "dst": w.dst, "pair": w.pair, "sw": w.sw,
        "t1": stepped(w.src, w.t1), "t2": stepped(w.dst, t2),
        "t3": stepped(w.dst, w.t3), "t4": stepped(w.src, w.t4),
    }  # fmt: skip
    w = SampleWindow(**{k: v[keep] for k, v in cols.items()})
    return w, cfg, np.arange(NICS, dtype=np.int64) // 16
