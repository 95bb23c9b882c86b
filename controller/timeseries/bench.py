"""``python -m controller.timeseries.bench``: what the time series cost the controller.

On a 1,024-NIC two-tier fabric (32 leaves x 32 NICs, 8 spines) with synthetic probe outcomes
(each NIC probes its 31 group peers and 16 others on ~80 source ports; delays: propagation
plus gamma-distributed queueing; 0.1% loss), it times on one core (process time):

- the baseline: `Brain.observe` (detection) per record, first pass (every path new) and
  steady state (paths known);
- `IntervalStats.observe` (what the recorder adds on the ingest path) per record, the same;
- one 10 s interval at 1 M records/s: `cut` (on the loop), `summarize` + `render` (the job a
  worker thread runs), and the body's size raw and compressed.

Prints JSON with ``--json``. Figures depend on the machine: compare the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contract.interrupt import finish, interruptible
from controller.brain import Brain
from controller.observations import Observations
from controller.timeseries.points import MeshState, PointBuilder
from controller.timeseries.stats import IntervalStats, summarize
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import flow_paths, routing_tables
from mesh.snapshot import GpuHealth, Health


def synthetic(n_records: int, nics: int, seed: int) -> tuple[Any, list[Observations]]:
    """Return (fabric, batches of ~100 k observations) totalling ``n_records``."""
    fab = build_fabric(FabricShape.for_nics(nics, nics_per_leaf=32))
    n = len(fab.nics)
    rng = np.random.default_rng(seed)
    group = fab.nic_group_index
    peers = []
    for i in range(n):
        same = np.flatnonzero((group == group[i]) & (np.arange(n) != i))
        other = rng.choice(np.flatnonzero(group != group[i]), 16, replace=False)
        peers.append(np.concatenate([same, other]))
    width = routing_tables(fab).max_hops
    batches = []
    per = 100_000
    t = 0
    for k in range(0, n_records, per):
        m = min(per, n_records - k)
        src = rng.integers(0, n, m)
        dst = np.array([peers[s][j] for s, j in zip(src, rng.integers(0, 47, m), strict=True)])
        sport = rng.integers(49152, 49152 + 80, m)
        hf = flow_paths(fab, src, dst, sport, 4791)
        hr = flow_paths(fab, dst, src, 4791, sport)

        def pad(h: Any, rows: int = m) -> Any:
            out = np.full((rows, width), -1, np.int32)
            out[:, : h.shape[1]] = h
            return out

        lost = rng.random(m) < 0.001
        base = 2000.0 + 200.0 * (hf >= 0).sum(axis=1)
        owd_f = np.where(lost, np.nan, base + rng.gamma(1.5, 300.0, m))
        owd_r = np.where(lost, np.nan, base + rng.gamma(1.5, 300.0, m))
        batches.append(
            Observations(
                np.full(m, t, np.int64),
                src.astype(np.int32),
                dst.astype(np.int32),
                sport.astype(np.int32),
                pad(hf),
                pad(hr),
                lost,
                owd_f,
                owd_r,
                owd_f + owd_r,
            )
        )
        t += 100_000_000
    return fab, batches


def run(records: int = 10_000_000, nics: int = 1024, seed: int = 1) -> dict[str, Any]:
    """Run the benchmark; return the figures."""
    fab, batches = synthetic(records, nics, seed)
    brain = Brain(fab)
    stats = IntervalStats(fab, routing_tables(fab).max_hops)
    t0 = time.process_time()
    for b in batches:  # first pass: every path is new
        brain.observe(b)
    brain_first_s = time.process_time() - t0
    t0 = time.process_time()
    for b in batches:
        stats.observe(b)
    first_s = time.process_time() - t0
    stats.close(1)  # baselines folded
    t0 = time.process_time()
    for b in batches:  # steady state: paths known
        brain.observe(b)
    brain_s = time.process_time() - t0
    t0 = time.process_time()
    for b in batches:
        stats.observe(b)
    observe_s = time.process_time() - t0
    t0 = time.process_time()
    raw = stats.cut(10_000_000_000)
    cut_s = time.process_time() - t0
    n = len(fab.nics)
    state = MeshState(
        10_000_000_000, (Health.UP,) * n, np.full(n, 3000.0), np.full(n, 3000.0),
        np.zeros(n), np.ones(n), {}, {}, {h.id: GpuHealth(True) for h in fab.hosts},
        {h.id: True for h in fab.hosts},
    )  # fmt: skip
    t0 = time.process_time()
    summary, _ = summarize(raw)
    body = PointBuilder(fab).render(state, summary)
    job_s = time.process_time() - t0
    t0 = time.process_time()
    packed = zlib.compress(body, 1)
    zip_s = time.process_time() - t0
    m = records / 1e6
    return {
        "nics": n,
        "records": records,
        "first_pass_brain_observe_us_per_record": round(brain_first_s / records * 1e6, 4),
        "first_pass_recorder_observe_us_per_record": round(first_s / records * 1e6, 4),
        "brain_observe_us_per_record": round(brain_s / records * 1e6, 4),
        "recorder_observe_us_per_record": round(observe_s / records * 1e6, 4),
        "recorder_over_brain": round(observe_s / brain_s, 3),
        "recorder_core_share_at_1M_per_s": round(observe_s / m, 4),
        "interval_cut_s": round(cut_s, 4),
        "interval_job_s": round(job_s, 3),
        "interval_compress_s": round(zip_s, 3),
        "interval_lines": body.count(b"\n"),
        "interval_bytes": len(body),
        "interval_bytes_compressed": len(packed),
        "pairs": len(summary.pair_src),
        "paths": len(summary.path_label),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--records``, ``--nics``, ``--seed``, ``--json``."""
    p = argparse.ArgumentParser(
        prog="python -m controller.timeseries.bench",
        description="Time the time-series recorder against detection's own observe, and one "
        "interval's cut, render and compression, on synthetic probe outcomes.",
    )
    p.add_argument("--records", type=int, default=10_000_000, help="records (default 10 M)")
    p.add_argument("--nics", type=int, default=1024, help="NICs (default 1024)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    a = p.parse_args(argv)
    if a.records < 100_000 or a.nics < 64:
        print("bench: error: --records >= 100000 and --nics >= 64", file=sys.stderr)
        return 2
    out: dict[str, Any] | None = None
    with interruptible() as stop:  # the figures come at the end: none if stopped before
        out = run(a.records, a.nics, a.seed)
    return finish(stop, out, as_json=a.json, show=_show)


def _show(out: Mapping[str, Any]) -> None:
    for k, v in out.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    sys.exit(main())
