"""``qpmesh sim ingest``: controller pipeline throughput (decode + ingest + sync + detection).

Simulates a fabric, encodes its probe batches as the probers would publish them, then feeds
the bytes through `decode_batch` and `LiveController.ingest_batch` / `tick` on one core,
with time passed in as simulated time (so clock solves and detection windows happen at
their configured cadence). Baselines measured in the same run: decode alone, and a naive
per-record Python loop (dict lookups, per-record one-way delays) on a subset.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from controller.fabric import FabricShape, build_fabric
from controller.live import LiveController
from prober.records import ProbeBatch, decode_batch, encode_batch
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator


def _naive(batch: ProbeBatch, offsets: dict[str, float], limit: int) -> int:
    """Per-record Python loop doing the same mapping and delay arithmetic (the baseline)."""
    out: dict[tuple[str, str, int], float] = {}
    for i in range(min(limit, len(batch))):
        s = batch.nic_ids[int(batch.src[i])]
        d = batch.nic_ids[int(batch.dst[i])]
        if batch.lost[i]:
            continue
        owd = float(batch.t2[i] - batch.t1[i]) - (offsets.get(d, 0.0) - offsets.get(s, 0.0))
        key = (s, d, int(batch.sport[i]))
        out[key] = max(out.get(key, 0.0), owd)
    return min(limit, len(batch))


def _timed_batch(live: LiveController, payload: bytes, now: int, stage: dict[str, float]) -> int:
    """`LiveController.ingest_batch` + `tick`, step by step, adding seconds per stage."""
    c = time.perf_counter
    t = c()
    batch = decode_batch(payload)
    t, stage["decode"] = c(), stage["decode"] + c() - t
    ing = live.ingestor.ingest(batch)
    t, stage["ingest"] = c(), stage["ingest"] + c() - t
    if ing is None:
        return 0
    live.clock.add(ing)
    t, stage["sync_add"] = c(), stage["sync_add"] + c() - t
    live.clock.maybe_solve(now)
    t, stage["sync_solve"] = c(), stage["sync_solve"] + c() - t
    obs = live.observations(ing, live.clock.delays(ing), now)
    t, stage["delays"] = c(), stage["delays"] + c() - t
    live.brain.observe(obs)
    live.now_ns = max(live.now_ns, now)
    live.records += len(ing)
    live.tick(now)
    stage["detect"] += c() - t
    return len(ing)


def run_bench(nics: int, seconds: float, step_s: float, repeats: int, seed: int) -> dict[str, Any]:
    """Return the benchmark figures as a JSON-ready dict."""
    fabric = build_fabric(FabricShape.for_nics(nics))
    sim = Simulator(fabric, SimConfig(seed=seed))
    t_gen = time.perf_counter()
    payloads = [(st.t1_s, encode_batch(st.batch)) for st in sim.run(seconds, step_s)]
    gen_s = time.perf_counter() - t_gen
    records = sum(len(decode_batch(p)) for _, p in payloads)
    rates: list[float] = []
    warm_s: list[float] = []
    stages: list[dict[str, float]] = []
    solves = 0
    window_samples = 0
    for _ in range(repeats):
        live = LiveController(fabric)
        # warm-up: first batch fills the path caches and runs the first clock solve
        t0 = time.perf_counter()
        live.ingest_batch(decode_batch(payloads[0][1]), EPOCH_NS + int(payloads[0][0] * 1e9))
        warm_s.append(time.perf_counter() - t0)
        stage = dict.fromkeys(
            ("decode", "ingest", "sync_add", "sync_solve", "delays", "detect"), 0.0
        )
        t0 = time.perf_counter()
        n = 0
        for t_s, p in payloads[1:]:
            now = EPOCH_NS + int(t_s * 1e9)
            n += _timed_batch(live, p, now, stage)
        rates.append(n / (time.perf_counter() - t0))
        solves = live.clock.solves
        stages.append(stage)
        window_samples = live.clock.last_solve_samples
    dec: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _, p in payloads:
            decode_batch(p)
        dec.append(records / (time.perf_counter() - t0))
    limit = 100_000
    first = decode_batch(payloads[1][1])
    offsets = {nid: 0.0 for nid in first.nic_ids}
    naive: list[float] = []
    for _ in range(max(repeats, 5)):
        t0 = time.perf_counter()
        m = _naive(first, offsets, limit)
        naive.append(m / (time.perf_counter() - t0))
    rps = statistics.median(rates)
    return {
        "records_per_second": round(rps),
        "nics": nics,
        "records": records,
        "batches": len(payloads),
        "batch_records_median": int(np.median([len(decode_batch(p)) for _, p in payloads])),
        "sim_seconds": seconds,
        "clock_solves": solves,
        "samples_in_last_solve": window_samples,
        "warmup_first_batch_s": round(statistics.median(warm_s), 3),
        "decode_only_records_per_second": round(statistics.median(dec)),
        "naive_python_records_per_second": round(statistics.median(naive)),
        "speedup_vs_naive": round(rps / statistics.median(naive), 1),
        "share_of_decode_only": round(rps / statistics.median(dec), 4),
        "stage_us_per_record": {
            k: round(statistics.median(st[k] for st in stages) / records * 1e6, 3)
            for k in stages[0]
        },
        "repeats": repeats,
        "generate_s": round(gen_s, 2),
        "target_records_per_second": 1_000_000,
        "meets_target": rps >= 1_000_000,
    }


def _cmd(args: argparse.Namespace) -> int:
    if args.nics < 2 or args.seconds <= args.step or args.repeats < 1:
        raise ValueError("need --nics >= 2, --seconds > --step, --repeats >= 1")
    res = run_bench(args.nics, args.seconds, args.step, args.repeats, args.seed)
    if args.json:
        json.dump(res, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(
            f"{res['records_per_second']:,} records/s (decode+ingest+sync+detection, one core); "
            f"decode only {res['decode_only_records_per_second']:,}/s; naive Python loop "
            f"{res['naive_python_records_per_second']:,}/s ({res['speedup_vs_naive']}x)"
        )
    return 0


def register_ingest(ssub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh sim ingest``."""
    p = ssub.add_parser(
        "ingest",
        help="benchmark the controller pipeline (decode + ingest + sync + detection) in records/s",
        description="Encode simulated probe batches, then time decode, ingest, clock sync and "
        "detection on one core; compares with decode-only and a naive per-record loop.",
    )
    p.add_argument(
        "--nics", type=int, default=1024, help="NICs in the fabric (default %(default)s)"
    )
    p.add_argument(
        "--seconds", type=float, default=6.0, help="simulated traffic (default %(default)s)"
    )
    p.add_argument(
        "--step", type=float, default=0.5, help="batch period in s (default %(default)s)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats (median; default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd)
