"""``qpmesh sim ingest``: controller pipeline throughput (decode + ingest + sync + detection).

Simulates a fabric, encodes its probe batches as the probers would publish them, then feeds
the bytes through `decode_batch` and `LiveController.ingest_batch` / `tick` on one core,
with time passed in as simulated time (so clock solves and detection windows happen at
their configured cadence). The first clock window is warm-up (timed apart); the headline is
steady state: records after it / CPU seconds of decode + ingest + sync + delays + detection.
Baselines measured in the same run: decode alone, and a naive per-record Python loop (dict
lookups, per-record one-way delays) on a subset. Also reports the one-way delay error of the
last batch against the simulator's truth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from contract.records import ProbeBatch, decode_batch, encode_batch
from controller.clocksync import Delays
from controller.fabric import FabricShape, build_fabric
from controller.live import LiveConfig, LiveController
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelKnobs
from testbed.sim.options import add_model_options, model_from_args


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


STAGES = ("decode", "ingest", "sync_add", "sync_solve", "delays", "detect")


def _timed_batch(
    live: LiveController, payload: bytes, now: int, stage: dict[str, float]
) -> tuple[int, Delays | None]:
    """`LiveController.ingest_batch` + `tick`, step by step, adding CPU seconds per stage.

    Returns (records ingested, their delays)."""
    c = time.process_time
    t = c()
    batch = decode_batch(payload)
    t, stage["decode"] = c(), stage["decode"] + c() - t
    ing = live.ingestor.ingest(batch)
    t, stage["ingest"] = c(), stage["ingest"] + c() - t
    if ing is None:
        return 0, None
    live.clock.add(ing)
    t, stage["sync_add"] = c(), stage["sync_add"] + c() - t
    live.clock.maybe_solve(now)
    t, stage["sync_solve"] = c(), stage["sync_solve"] + c() - t
    d = live.clock.delays(ing)
    obs = live.observations(ing, d, now)
    t, stage["delays"] = c(), stage["delays"] + c() - t
    live.brain.observe(obs)
    live.now_ns = max(live.now_ns, now)
    live.records += len(ing)
    live.tick(now)
    stage["detect"] += c() - t
    return len(ing), d


def run_bench(
    nics: int,
    seconds: float,
    step_s: float,
    repeats: int,
    seed: int,
    model: ModelKnobs | None = None,
) -> dict[str, Any]:
    """Return the benchmark figures as a JSON-ready dict.

    The first clock window (``LiveConfig().sync.window_ns``, with its warm-up solves) is timed
    separately; the steady-state figure is the records after it divided by the CPU time
    (`time.process_time`, so a BLAS thread on another core counts too) of the whole pipeline.
    """
    fabric = build_fabric(FabricShape.for_nics(nics))
    knobs = ModelKnobs() if model is None else model
    sim = Simulator(fabric, SimConfig(seed=seed, model=knobs))
    sync_cfg = LiveConfig().sync
    warm_s = sync_cfg.window_ns / 1e9
    t_gen = time.perf_counter()
    payloads: list[tuple[float, bytes]] = []
    truth = np.zeros(0)
    for st in sim.run(seconds, step_s):
        payloads.append((st.t1_s, encode_batch(st.batch)))
        truth = st.true_fwd_ns  # of the last batch, to check the delays
    gen_s = time.perf_counter() - t_gen
    counts = [len(decode_batch(p)) for _, p in payloads]
    records = sum(counts)
    n_warm = sum(1 for t_s, _ in payloads if t_s <= warm_s)
    steady_records = sum(counts[n_warm:])
    rates: list[float] = []
    warm_rates: list[float] = []
    stages: list[dict[str, float]] = []
    steady_solves: list[int] = []
    solves = samples = 0
    err = np.zeros(0)
    for _ in range(repeats):
        live = LiveController(fabric)
        warm = dict.fromkeys(STAGES, 0.0)
        n = 0
        for t_s, p in payloads[:n_warm]:
            n += _timed_batch(live, p, EPOCH_NS + int(t_s * 1e9), warm)[0]
        warm_rates.append(n / max(sum(warm.values()), 1e-9))
        before = live.clock.solves
        stage = dict.fromkeys(STAGES, 0.0)
        n = 0
        last: Delays | None = None
        for t_s, p in payloads[n_warm:]:
            k, last = _timed_batch(live, p, EPOCH_NS + int(t_s * 1e9), stage)
            n += k
        rates.append(n / max(sum(stage.values()), 1e-9))
        stages.append(stage)
        steady_solves.append(live.clock.solves - before)
        solves, samples = live.clock.solves, live.clock.last_solve_samples
        if last is not None:
            ok = np.isfinite(last.owd_fwd_ns) & np.isfinite(truth)
            err = np.abs(last.owd_fwd_ns[ok] - truth[ok])
    dec: list[float] = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _, p in payloads:
            decode_batch(p)
        dec.append(records / max(time.process_time() - t0, 1e-9))
    limit = 100_000
    first = decode_batch(payloads[min(1, len(payloads) - 1)][1])
    offsets = {nid: 0.0 for nid in first.nic_ids}
    naive: list[float] = []
    for _ in range(max(repeats, 5)):
        t0 = time.process_time()
        m = _naive(first, offsets, limit)
        naive.append(m / max(time.process_time() - t0, 1e-9))
    rps = statistics.median(rates)
    return {
        "records_per_second": round(rps),
        "nics": nics,
        "model": knobs.to_dict(),
        "records": records,
        "steady_records": steady_records,
        "batches": len(payloads),
        "batch_records_median": int(np.median(counts)),
        "sim_seconds": seconds,
        "warmup_seconds": warm_s,
        "warmup_records_per_second": round(statistics.median(warm_rates)),
        "clock_window_s": warm_s,
        "clock_solve_every_s": sync_cfg.solve_every_ns / 1e9,
        "clock_solves": solves,
        "steady_clock_solves": min(steady_solves),
        "samples_in_last_solve": samples,
        "owd_error_ns_p50": round(float(np.median(err)), 1) if len(err) else None,
        "owd_error_ns_p99": round(float(np.quantile(err, 0.99)), 1) if len(err) else None,
        "decode_only_records_per_second": round(statistics.median(dec)),
        "naive_python_records_per_second": round(statistics.median(naive)),
        "speedup_vs_naive": round(rps / statistics.median(naive), 1),
        "share_of_decode_only": round(rps / statistics.median(dec), 4),
        "stage_us_per_record": {
            k: round(statistics.median(st[k] for st in stages) / max(steady_records, 1) * 1e6, 3)
            for k in STAGES
        },
        "repeats": repeats,
        "generate_s": round(gen_s, 2),
        "target_records_per_second": 1_000_000,
        "meets_target": rps >= 1_000_000,
    }


def _cmd(args: argparse.Namespace) -> int:
    window_s = LiveConfig().sync.window_ns / 1e9
    if args.nics < 2 or args.seconds <= window_s + args.step or args.repeats < 1:
        raise ValueError(
            f"need --nics >= 2, --seconds > {window_s:g} (the clock window) + --step, "
            "--repeats >= 1"
        )
    res = run_bench(
        args.nics, args.seconds, args.step, args.repeats, args.seed, model_from_args(args)
    )
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
        "--seconds",
        type=float,
        default=40.0,
        help="simulated traffic; the first clock window (10 s) is warm-up, timed apart "
        "(default %(default)s: 3 steady-state clock solves)",
    )
    p.add_argument(
        "--step", type=float, default=0.5, help="batch period in s (default %(default)s)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats (median; default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=1, help="random seed (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_model_options(p)
    p.set_defaults(func=_cmd)
