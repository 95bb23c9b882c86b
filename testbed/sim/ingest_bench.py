"""``qpmesh sim ingest``: controller pipeline throughput (decode + ingest + sync + detection).

Simulates a fabric step by step (`testbed.sim.ingest_traffic`: generated as consumed, never the
whole run in memory, generation not timed, generated again identically for each repeat;
``--replay``: only the first seconds simulated, then moved on in every NIC's clock), encodes
each step's probes as the probers publish them (``--batching host``: one batch per host and
step with the host's own NIC id table; ``step``: one batch for the whole fabric per chunk) and
feeds the bytes through the service's own path on one core, time passed in as simulated time
(so clock solves and detection windows happen at their configured cadence): `decode_batch`,
the per-batch duplicate check, with host batches the coalescing queue
(`controller.coalesce.ProbeQueue`: each host's batch arrives at a fixed phase within the
step, merged groups are taken when due), then ingest / clock sync / delays / detection per
merged group, and a tick per step: the controller's own public path (`LiveController.admit`,
`flush`, `tick`), its stages timed through its ``on_stage`` hook. The first clock window is
warm-up (timed apart); the first ``--baseline-steps`` steps after it are ingested batch by
batch (the uncoalesced baseline of the same run); the headline is steady state: the records after those / CPU seconds of the
pipeline. Other baselines: decode alone (its stage time) and a naive per-record Python loop
(dict lookups, per-record one-way delays) on ~100 k records. Also reports the one-way delay
error (records ingested batch by batch, in the truth's order) and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.interrupt import finish, interruptible
from contract.records import ProbeBatch, decode_batch, merge_batches
from controller.brainlike import TeeBrain
from controller.coalesce import CoalesceConfig, ProbeQueue, plan_groups
from controller.live import STAGES as LIVE_STAGES
from controller.live import LiveConfig, LiveController, default_brain
from controller.observations import Observations
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig
from testbed.sim.ingest_traffic import host_batches, traffic
from testbed.sim.model import ModelKnobs
from testbed.sim.options import add_model_options, model_from_args

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
__all__ = ["host_batches", "run_bench", "traffic"]


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


STAGES = ("decode", *LIVE_STAGES)


class _Stages:
    """CPU seconds per stage (`time.process_time`, so a BLAS thread on another core counts
    too): `mark(name)` adds the time since the last mark (or `start`) to ``name``; the
    controller marks each stage of an ingest as it ends (`LiveController` ``on_stage``).
    ``acc``: the stage totals marks add to (the bench switches it per phase of the run)."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self._t = time.process_time()

    def start(self) -> None:
        """Start timing from now."""
        self._t = time.process_time()

    def mark(self, name: str) -> None:
        """Add the time since the last mark to stage ``name``."""
        t = time.process_time()
        self.acc[name] += t - self._t
        self._t = t


class _OwdTap:
    """The forward one-way delays the brain is handed, kept while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.owd: list[F64] = []

    def __call__(self, obs: Observations) -> None:
        if self.on:
            self.owd.append(obs.owd_fwd_ns)


def _timed_decode(stages: _Stages, payload: bytes) -> ProbeBatch:
    """`decode_batch`, timed as ``decode``."""
    stages.start()
    batch = decode_batch(payload)
    stages.mark("decode")
    return batch


def _timed_admit(
    live: LiveController,
    stages: _Stages,
    batch: ProbeBatch,
    now: int,
    queue: ProbeQueue | None = None,
) -> int:
    """`LiveController.admit` of a decoded batch: without ``queue`` ingested at once (the
    controller marks its stages; the tick is timed apart, once per step, as the service
    ticks on its own cadence: `_timed_tick`), with ``queue`` only the admission check, timed
    as ``ingest``. Returns the records ingested (0 when queued)."""
    stages.start()
    verdict = live.admit(batch, now, queue=queue)
    stages.mark("ingest")  # the check (queued), else the little after the last stage
    return 0 if queue is not None else verdict.records


def _timed_flush(live: LiveController, stages: _Stages, queue: ProbeQueue, now: int) -> int:
    """`LiveController.flush` (its stages marked by the controller: merge, then each merged
    group's ingest). Returns the records ingested."""
    stages.start()
    return live.flush(queue, now)


def _timed_tick(live: LiveController, stages: _Stages, now: int) -> None:
    """`LiveController.tick` (detection windows, history), its CPU time added to detect."""
    stages.start()
    live.tick(now)
    stages.mark("detect")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class _Run:
    """What one repeat measured."""

    warm: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    base: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    steady: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    n_warm: int = 0
    n_base: int = 0
    n_steady: int = 0
    solves_before: int = -1
    solves: int = 0
    merges: list[int] = field(default_factory=list)

    @staticmethod
    def rate(n: int, stage: dict[str, float]) -> float:
        return n / max(sum(stage.values()), 1e-9)


def run_bench(
    nics: int,
    seconds: float,
    step_s: float,
    repeats: int,
    seed: int,
    model: ModelKnobs | None = None,
    batching: str = "host",
    coalesce: CoalesceConfig | None = None,
    baseline_steps: int = 2,
    replay_s: float = 0.0,
) -> dict[str, Any]:
    """Return the benchmark figures as a JSON-ready dict.

    ``batching="host"``: one batch per host and step, arriving at a fixed per-host phase
    within the step, coalesced as the service does (`controller.coalesce.ProbeQueue`, merged
    ingests of at most ``coalesce.max_records``); the first ``baseline_steps`` steps after the
    warm-up are ingested batch by batch instead (the uncoalesced baseline, same run, same
    controller). The first clock window (``LiveConfig().sync.window_ns``, with its warm-up
    solves) is timed apart; the steady-state figure is the records after it (and after the
    baseline steps) divided by the CPU time (`time.process_time`, so a BLAS thread on
    another core counts too) of the whole pipeline.
    """
    fabric = build_fabric(FabricShape.for_nics(nics))
    knobs = ModelKnobs() if model is None else model
    cfg = SimConfig(seed=seed, model=knobs)
    co = coalesce or CoalesceConfig()
    sync_cfg = LiveConfig().sync
    warm_s = sync_cfg.window_ns / 1e9
    rng = np.random.default_rng([seed, 77])
    phase_ns = rng.uniform(0, step_s * 1e9, len(fabric.hosts)).astype(np.int64)
    host_pos = {h.id: i for i, h in enumerate(fabric.hosts)}
    runs: list[_Run] = []
    err = np.zeros(0)
    n_batches = 0
    batch_sizes: list[int] = []
    gen_s = 0.0
    first: ProbeBatch | None = None
    for rep in range(repeats):
        stages, tap = _Stages(), _OwdTap()
        brain = TeeBrain(default_brain(fabric), tap)  # the delays, for their error
        live = LiveController(  # a detection window per step
            fabric, LiveConfig(window_ns=round(step_s * 1e9)), brain=brain, on_stage=stages.mark
        )
        queue = ProbeQueue(co)
        run = _Run()
        step_i = 0
        t_gen = time.perf_counter()
        arrival = np.argsort(np.argsort(phase_ns, kind="stable"))  # host -> arrival rank
        for t_s, payloads, truth in traffic(
            fabric, cfg, seconds, step_s, batching, replay_s, arrival
        ):
            gen_s += time.perf_counter() - t_gen
            now = EPOCH_NS + int(t_s * 1e9)
            in_warm = t_s <= warm_s
            in_base = not in_warm and batching == "host" and step_i < baseline_steps
            if not in_warm:
                step_i += 1
                if run.solves_before < 0 and not in_base:
                    run.solves_before = live.solves
            stages.acc = run.warm if in_warm else run.base if in_base else run.steady
            if rep == 0:
                n_batches += len(payloads)
                batch_sizes.append(len(truth) // max(1, len(payloads)))
                if first is None and len(payloads):  # ~100 k records for the naive loop
                    m = max(1, 100_000 * len(payloads) // max(1, len(truth)))
                    some = [decode_batch(p) for p in payloads[:m]]
                    first = merge_batches(plan_groups(some, 100_000)[0])
            got = 0
            if batching == "host" and not in_base:
                # batches come in arrival order (``host_rank``): each is decoded as it
                # arrives, so only the queue's records are held decoded, not the whole step
                for j, p in enumerate(payloads):
                    b = _timed_decode(stages, p)
                    payloads[j] = b""
                    at = now + int(phase_ns[host_pos[b.origin]])
                    if queue.due(at):
                        run.merges.append(queue.records)
                        got += _timed_flush(live, stages, queue, at)
                    _timed_admit(live, stages, b, at, queue)
            else:
                if len(queue):  # the baseline starts from an empty queue
                    got += _timed_flush(live, stages, queue, now)
                tap.on = rep == 0 and not in_warm
                for j, p in enumerate(payloads):
                    b = _timed_decode(stages, p)
                    payloads[j] = b""
                    got += _timed_admit(live, stages, b, now)
                tap.on = False
            _timed_tick(live, stages, now)
            if in_warm:
                run.n_warm += got
            elif in_base:
                run.n_base += got
            else:
                run.n_steady += got
            owd, tap.owd = tap.owd, []
            if rep == 0 and owd and not in_warm:  # records in the truth's order
                d_all = np.concatenate(owd)
                if len(d_all) == len(truth):
                    ok = np.isfinite(d_all) & np.isfinite(truth)
                    err = np.abs(d_all[ok] - truth[ok])
            t_gen = time.perf_counter()
        if len(queue):
            stages.acc = run.steady
            run.n_steady += _timed_flush(live, stages, queue, live.now_ns)
        run.solves = live.solves
        runs.append(run)
        del live
    return _report(
        runs, nics, knobs, batching, co, seconds, step_s, warm_s, sync_cfg.solve_every_ns,
        n_batches, batch_sizes, err, first, repeats, gen_s, baseline_steps, replay_s,
    )  # fmt: skip


def _report(
    runs: list[_Run],
    nics: int,
    knobs: ModelKnobs,
    batching: str,
    co: CoalesceConfig,
    seconds: float,
    step_s: float,
    warm_s: float,
    solve_every_ns: int,
    n_batches: int,
    batch_sizes: list[int],
    err: F64,
    first: ProbeBatch | None,
    repeats: int,
    gen_s: float,
    baseline_steps: int,
    replay_s: float,
) -> dict[str, Any]:
    """The JSON figures of `run_bench`: medians over the repeats."""
    rates = [_Run.rate(r.n_steady, r.steady) for r in runs]
    rps = statistics.median(rates)
    steady_records = runs[-1].n_steady
    dec = [r.n_steady / max(r.steady["decode"], 1e-9) for r in runs]
    limit = 100_000
    assert first is not None
    offsets = {nid: 0.0 for nid in first.nic_ids}
    naive: list[float] = []
    for _ in range(max(repeats, 5)):
        t0 = time.process_time()
        m = _naive(first, offsets, limit)
        naive.append(m / max(time.process_time() - t0, 1e-9))
    merges = [x for r in runs for x in r.merges]
    out: dict[str, Any] = {
        "records_per_second": round(rps),
        "nics": nics,
        "model": knobs.to_dict(),
        "batching": batching,
        "coalesce_ms": co.coalesce_ms if batching == "host" else None,
        "coalesce_max_records": co.max_records if batching == "host" else None,
        "merged_ingests": len(merges) // max(1, len(runs)),
        "merged_records_median": int(np.median(merges)) if merges else None,
        "records": runs[-1].n_warm + runs[-1].n_base + runs[-1].n_steady,
        "steady_records": steady_records,
        "batches": n_batches,
        "batch_records_median": int(np.median(batch_sizes)) if batch_sizes else 0,
        "sim_seconds": seconds,
        "step_s": step_s,
        "replay_s": replay_s or None,
        "warmup_seconds": warm_s,
        "warmup_records_per_second": round(
            statistics.median(_Run.rate(r.n_warm, r.warm) for r in runs)
        ),
        "clock_window_s": warm_s,
        "clock_solve_every_s": solve_every_ns / 1e9,
        "clock_solves": runs[-1].solves,
        "steady_clock_solves": min(r.solves - max(r.solves_before, 0) for r in runs),
        "owd_error_ns_p50": round(float(np.median(err)), 1) if len(err) else None,
        "owd_error_ns_p99": round(float(np.quantile(err, 0.99)), 1) if len(err) else None,
        "decode_only_records_per_second": round(statistics.median(dec)),
        "naive_python_records_per_second": round(statistics.median(naive)),
        "speedup_vs_naive": round(rps / statistics.median(naive), 1),
        "share_of_decode_only": round(rps / statistics.median(dec), 4),
        "stage_us_per_record": {
            k: round(statistics.median(r.steady[k] for r in runs) / max(steady_records, 1) * 1e6, 3)
            for k in STAGES
        },
        "repeats": repeats,
        "generate_s": round(gen_s, 2),
        "peak_rss_mb": round(_peak_rss_mb()),
        "target_records_per_second": 1_000_000,
        "meets_target": rps >= 1_000_000,
    }
    if batching == "host" and baseline_steps > 0 and runs[-1].n_base:
        base = statistics.median(_Run.rate(r.n_base, r.base) for r in runs)
        out["per_host_baseline"] = {
            "steps": baseline_steps,
            "records": runs[-1].n_base,
            "records_per_second": round(base),
            "stage_us_per_record": {
                k: round(
                    statistics.median(r.base[k] for r in runs) / max(runs[-1].n_base, 1) * 1e6, 3
                )
                for k in STAGES
            },
        }
        out["speedup_vs_per_host"] = round(rps / base, 2)
    return out


def _cmd(args: argparse.Namespace) -> int:
    window_s = LiveConfig().sync.window_ns / 1e9
    if args.nics < 2 or args.seconds <= window_s + args.step or args.repeats < 1:
        raise ValueError(
            f"need --nics >= 2, --seconds > {window_s:g} (the clock window) + --step, "
            "--repeats >= 1"
        )
    if args.baseline_steps < 0 or (args.replay and args.replay < args.step):
        raise ValueError("need --baseline-steps >= 0 and --replay 0 or >= --step")
    coalesce = CoalesceConfig(coalesce_ms=args.coalesce_ms, max_records=args.max_records)
    res: dict[str, Any] | None = None
    with interruptible() as stop:  # the figures come at the end: none if stopped before
        res = run_bench(
            args.nics,
            args.seconds,
            args.step,
            args.repeats,
            args.seed,
            model_from_args(args),
            args.batching,
            coalesce,
            args.baseline_steps,
            args.replay,
        )
    return finish(stop, res, as_json=args.json, show=_show)


def _show(res: Mapping[str, Any]) -> None:
    base = res.get("per_host_baseline")
    vs = f"; per-host batches uncoalesced {base['records_per_second']:,}/s" if base else ""
    print(
        f"{res['records_per_second']:,} records/s (decode+ingest+sync+detection, one core)"
        f"{vs}; decode only {res['decode_only_records_per_second']:,}/s; naive Python loop "
        f"{res['naive_python_records_per_second']:,}/s ({res['speedup_vs_naive']}x); "
        f"peak RSS {res['peak_rss_mb']} MB"
    )


def register_ingest(ssub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh sim ingest``."""
    d = CoalesceConfig()
    p = ssub.add_parser(
        "ingest",
        help="benchmark the controller pipeline (decode + ingest + sync + detection) in records/s",
        description="Encode simulated probe batches as the probers publish them, then time "
        "decode, coalescing, ingest, clock sync and detection on one core; compares with the "
        "same batches ingested one by one, decode-only and a naive per-record loop.",
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
        help="host: one batch per host and step, as probers publish, arriving at a per-host "
        "phase and coalesced as the controller service does (default); step: one batch for "
        "the whole fabric per step (per chunk of at most 1,048,576 records)",
    )
    p.add_argument(
        "--coalesce-ms",
        type=float,
        default=d.coalesce_ms,
        help="host batching: merge batches arriving within this many ms, as [ingest] "
        "coalesce_ms (default %(default)s; 0: each batch alone)",
    )
    p.add_argument(
        "--max-records",
        type=int,
        default=d.max_records,
        help="host batching: most records per merged ingest, as [ingest] max_records "
        "(default %(default)s)",
    )
    p.add_argument(
        "--baseline-steps",
        type=int,
        default=2,
        help="host batching: steps after the warm-up ingested batch by batch, uncoalesced: "
        "the same-run baseline (default %(default)s; 0: none)",
    )
    p.add_argument(
        "--replay",
        type=float,
        default=0.0,
        metavar="S",
        help="simulate only the first S seconds and replay them with every NIC clock moved "
        "on (faster generation for large fabrics; see testbed/sim/ingest_traffic.py; "
        "default 0: simulate the whole run)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_model_options(p)
    p.set_defaults(func=_cmd)
