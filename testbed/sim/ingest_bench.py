"""``qpmesh sim ingest``: controller pipeline throughput (decode + ingest + sync + detection).

Simulates a fabric step by step, encodes each step's probes as the probers would publish them
(``--batching host``: one batch per host and step, with the host's own NIC id table, as a
prober publishes; ``step``: one batch for the whole fabric), and feeds the bytes through
`decode_batch` and `LiveController.ingest_batch` / `tick` on one core, with time passed in as
simulated time (so clock solves and detection windows happen at their configured cadence).
Traffic is generated as it is consumed (a step at a time, never the whole run in memory;
generation is not timed) and generated again, identically, for each repeat. The first clock
window is warm-up (timed apart); the headline is steady state: records after it / CPU seconds
of decode + ingest + sync + delays + detection. Baselines measured in the same run: decode
alone (its stage time), and a naive per-record Python loop (dict lookups, per-record one-way
delays) on a subset. Also reports the one-way delay error of the last step against the
simulator's truth and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.records import ProbeBatch, decode_batch, encode_batch
from controller.clocksync import Delays
from controller.fabric import Fabric, FabricShape, build_fabric
from controller.live import LiveConfig, LiveController
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelKnobs
from testbed.sim.options import add_model_options, model_from_args

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


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
    """`LiveController.ingest_batch`, stage by stage, adding CPU seconds per stage (the tick
    is timed apart, once per step, as the service ticks on its own cadence: `_timed_tick`).

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
    stage["detect"] += c() - t
    return len(ing), d


def _timed_tick(live: LiveController, now: int, stage: dict[str, float]) -> None:
    """`LiveController.tick` (detection windows, history), its CPU time added to detect."""
    t = time.process_time()
    live.tick(now)
    stage["detect"] += time.process_time() - t


def host_batches(fabric: Fabric, batch: ProbeBatch, seq: int) -> tuple[list[bytes], I64]:
    """Split ``batch`` by the host of its probing NIC, as the hosts' probers publish it: one
    encoded batch per host (origin = host id, ``batch_seq`` = ``seq``, a NIC id table of only
    the NICs it names). Returns (payloads, row order: the batch's rows in payload order)."""
    host = np.asarray(fabric.nic_host_index)[batch.src.astype(np.int64)]
    order = np.argsort(host, kind="stable")
    hs = host[order]
    cuts = np.flatnonzero(np.diff(hs)) + 1
    out = []
    names = batch.nic_ids
    for rows in np.split(order, cuts):
        if not len(rows):
            continue
        s, d = batch.src[rows], batch.dst[rows]
        ids, inv = np.unique(np.concatenate([s, d]), return_inverse=True)
        cols: dict[str, Any] = {
            k: getattr(batch, k)[rows]
            for k in ("seq", "sport", "pair", "pos", "t1", "t2", "t3", "t4", "lost")
        }
        cols["src"], cols["dst"] = inv[: len(rows)], inv[len(rows) :]
        hb = ProbeBatch.from_columns(
            fabric.hosts[int(host[rows[0]])].id,
            batch.stamp,
            tuple(names[int(i)] for i in ids),
            cols,
            dport=batch.dport,
            batch_seq=seq,
        )
        out.append(encode_batch(hb))
    return out, order


def traffic(
    fabric: Fabric, cfg: SimConfig, seconds: float, step_s: float, batching: str
) -> Iterator[tuple[float, list[bytes], F64]]:
    """Yield per simulated step: (end time s, encoded batches, true forward delays of their
    rows in order). One step in memory at a time."""
    sim = Simulator(fabric, cfg)
    for i, st in enumerate(sim.run(seconds, step_s)):
        if batching == "host":
            payloads, order = host_batches(fabric, st.batch, i + 1)
            yield st.t1_s, payloads, st.true_fwd_ns[order]
        else:
            yield st.t1_s, [encode_batch(st.batch)], st.true_fwd_ns


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_bench(
    nics: int,
    seconds: float,
    step_s: float,
    repeats: int,
    seed: int,
    model: ModelKnobs | None = None,
    batching: str = "host",
) -> dict[str, Any]:
    """Return the benchmark figures as a JSON-ready dict.

    The first clock window (``LiveConfig().sync.window_ns``, with its warm-up solves) is timed
    separately; the steady-state figure is the records after it divided by the CPU time
    (`time.process_time`, so a BLAS thread on another core counts too) of the whole pipeline.
    """
    fabric = build_fabric(FabricShape.for_nics(nics))
    knobs = ModelKnobs() if model is None else model
    cfg = SimConfig(seed=seed, model=knobs)
    sync_cfg = LiveConfig().sync
    warm_s = sync_cfg.window_ns / 1e9
    rates: list[float] = []
    warm_rates: list[float] = []
    stages: list[dict[str, float]] = []
    steady_solves: list[int] = []
    solves = samples = 0
    err = np.zeros(0)
    records = steady_records = n_batches = 0
    batch_sizes: list[int] = []
    gen_s = 0.0
    first: ProbeBatch | None = None
    for rep in range(repeats):
        live = LiveController(fabric)
        warm = dict.fromkeys(STAGES, 0.0)
        stage = dict.fromkeys(STAGES, 0.0)
        n_warm = n_steady = 0
        before = -1
        t_gen = time.perf_counter()
        for t_s, payloads, truth in traffic(fabric, cfg, seconds, step_s, batching):
            gen_s += time.perf_counter() - t_gen
            now = EPOCH_NS + int(t_s * 1e9)
            in_warm = t_s <= warm_s
            if not in_warm and before < 0:
                before = live.clock.solves
            owd: list[F64] = []
            for p in payloads:
                k, d = _timed_batch(live, p, now, warm if in_warm else stage)
                if in_warm:
                    n_warm += k
                else:
                    n_steady += k
                if d is not None:
                    owd.append(d.owd_fwd_ns)
            _timed_tick(live, now, warm if in_warm else stage)
            if rep == 0:
                n_batches += len(payloads)
                batch_sizes.append(len(truth) // max(1, len(payloads)))
                if first is None and len(payloads):
                    first = decode_batch(payloads[len(payloads) // 2])
            if owd and not in_warm:
                got = np.concatenate(owd)
                if len(got) == len(truth):
                    ok = np.isfinite(got) & np.isfinite(truth)
                    err = np.abs(got[ok] - truth[ok])
            t_gen = time.perf_counter()
        warm_rates.append(n_warm / max(sum(warm.values()), 1e-9))
        rates.append(n_steady / max(sum(stage.values()), 1e-9))
        stages.append(stage)
        steady_solves.append(live.clock.solves - max(before, 0))
        solves, samples = live.clock.solves, live.clock.last_solve_samples
        records, steady_records = n_warm + n_steady, n_steady
        del live
    dec = [steady_records / max(st["decode"], 1e-9) for st in stages]
    limit = 100_000
    assert first is not None
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
        "batching": batching,
        "records": records,
        "steady_records": steady_records,
        "batches": n_batches,
        "batch_records_median": int(np.median(batch_sizes)) if batch_sizes else 0,
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
        "peak_rss_mb": round(_peak_rss_mb()),
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
        args.nics,
        args.seconds,
        args.step,
        args.repeats,
        args.seed,
        model_from_args(args),
        args.batching,
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
    p.add_argument(
        "--batching",
        choices=("host", "step"),
        default="host",
        help="host: one batch per host and step, as probers publish (default); step: one "
        "batch for the whole fabric per step (at most 4,194,304 records)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_model_options(p)
    p.set_defaults(func=_cmd)
