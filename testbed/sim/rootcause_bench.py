"""``qpmesh sim rootcause``: anomaly flags and the named root cause per slowed job, scored
against the simulator's truth, for qpmesh and two baselines in the same run.

Per seed: one run with injected causes (`testbed.sim.signals_causes`) and one healthy run of
the same length (another fleet draw, no cause). Every window the simulator's signals go
through the prober's counter rules (`testbed.sim.signals_model.CounterLayer`) into

- **qpmesh**: `controller.anomaly.AnomalyDetector` per entity kind, and for every job that
  attribution calls slow (step time >= ``slow_ratio`` x its baseline) the cross-layer walk
  `controller.rootcause.chain.explain` with the detector's anomalies and the mesh's findings;
- **static_thresholds**: fixed limits per signal (`testbed.sim.static_baseline`) in place of
  the detector; a slow job's cause is the job's alert furthest over its limit, as such
  alerts name it (`naive_root_cause`: no walk, no mesh);
- **mesh_only**: today's `controller.attribution.attribute` on the mesh's findings alone;
- **static_chain** (an ablation, not a baseline): the static limits' flags fed to qpmesh's
  walk with the mesh's findings: what the walk alone is worth.

Scores (pooled over seeds): ``root_cause_accuracy`` over (cause, slowed job) pairs: the
estimator's answer (its most frequent one over the job's slowed windows after the first
``persist``) names a class and target the cause accepts (``unobservable`` wants
``unknown``); ``anomaly_precision``: flag episodes on an entity the cause's counters
touched while it acted (+ grace) over all flag episodes; ``anomaly_recall``: causes with a
flag on a touched entity; ``false_flags_per_100_host_hours`` on the healthy runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract.documents import EventDoc
from contract.remediation import PerfDoc
from contract.signals import Entity
from controller.anomaly.detector import Anomaly, DetectorConfig
from controller.anomaly.fleet import FleetDetector, job_moves
from controller.anomaly.frame import SignalFrame
from controller.attribution import AttributionConfig, JobPerf, attribute
from controller.jobs import Job
from controller.rootcause.chain import ChainConfig, explain
from controller.rootcause.graph import CrossLayerGraph, build_graph
from testbed.sim.signals_causes import (
    ACCEPT,
    EFFECTS,
    KINDS,
    Cause,
    World,
    background_findings,
    draw_causes,
)
from testbed.sim.signals_model import (
    NORMAL,
    CounterLayer,
    NormalModel,
    build_fleet,
    missing_masks,
    schedule_jobs,
)
from testbed.sim.static_baseline import StaticFlags, naive_root_cause

ESTIMATORS = ("qpmesh", "static_thresholds", "mesh_only", "static_chain")
FLAGGING = ("qpmesh", "static_thresholds")
SLOW_RATIO = 1.15
STEP_NOISE = 0.02  # lognormal sigma of a job's step time per window


@dataclass(frozen=True, slots=True)
class RunConfig:
    """One run: fleet size, length, window, causes, detector."""

    nics: int = 1024
    duration_s: float = 3 * 3600.0
    window_s: float = 10.0
    causes: int = 16
    warm_s: float = 1200.0
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    normal: Mapping[str, float] = field(default_factory=lambda: dict(NORMAL))


@dataclass
class RunResult:
    """What one run produced for scoring."""

    flags: dict[str, list[tuple[str, int]]]  # estimator -> (entity, window)
    answers: dict[str, dict[tuple[int, int], str]]  # estimator -> (job, window) -> "cls|target"
    slowed: dict[tuple[int, int], list[int]]  # (cause, job) -> windows it slowed the job
    affected: list[set[str]]
    causes: list[Cause]
    hosts: int
    hours: float
    false_slow: int
    examples: list[str]
    unseen_pairs: int = 0


def _job(j: Any, fleet: Any) -> Job:
    nics = [fleet.nics[i] for i in np.flatnonzero(np.isin(fleet.nic_host, j.hosts))]
    return Job(j.id, "sim", tuple((n,) for n in nics))


def _mesh_answer(graph: CrossLayerGraph, a: Any) -> str:
    if a is None or a.cause != "fabric" or not a.links:
        return "unknown|"
    link = graph.link(a.links[0]) or a.links[0]
    if "is down" in a.text:
        return f"link_down|{link}"
    if "flapping" in a.text:
        return f"link_flap|{link}"
    return f"link_contention|{link}"


def run_once(
    cfg: RunConfig, seed: int, faulty: bool, trace: dict[tuple[int, int], float] | None = None
) -> RunResult:
    """Run one simulation (see the module docstring) and return what scoring needs;
    ``trace`` (optional) receives each measured (job, window)'s step-time ratio."""
    rng = np.random.default_rng(seed)
    fleet = build_fleet(cfg.nics, rng, params=cfg.normal)
    windows = int(cfg.duration_s / cfg.window_s)
    dt = cfg.window_s
    jobs = schedule_jobs(fleet, windows, dt, rng)
    model = NormalModel(fleet, jobs, dt, rng, cfg.normal)
    world = World(fleet, jobs, model, dt, rng)
    causes = draw_causes(world, cfg.causes, int(cfg.warm_s / dt), windows) if faulty else []
    masks = missing_masks(fleet, rng)
    layers = {k: CounterLayer(k, masks[k], rng,
                              cfg.normal["reset_per_window"] if k == Entity.NIC else 0.0,
                              cfg.normal["read_fail"])
              for k in Entity}  # fmt: skip
    ents = {Entity.NIC: fleet.nics, Entity.GPU: fleet.gpus, Entity.HOST: fleet.hosts}
    host_of = {Entity.NIC: fleet.nic_host, Entity.GPU: fleet.nic_host,
               Entity.HOST: np.arange(len(fleet.hosts))}  # fmt: skip
    fleet_det = FleetDetector(cfg.detector)
    signals = {k: d.signals for k, d in fleet_det.detectors.items()}
    static = {k: StaticFlags(k, cfg.detector.persist, cfg.detector.threshold) for k in Entity}
    chain_cfg = ChainConfig(threshold=cfg.detector.threshold)
    attr_cfg = AttributionConfig(slow_ratio=SLOW_RATIO)
    graphs: dict[int, tuple[Job, CrossLayerGraph]] = {}
    baseline: dict[int, float] = {}
    first_seen: dict[int, int] = {}
    flags: dict[str, list[tuple[str, int]]] = {e: [] for e in ESTIMATORS}
    answers: dict[str, dict[tuple[int, int], str]] = {e: {} for e in ESTIMATORS}
    slowed: dict[tuple[int, int], list[int]] = {}
    affected: list[set[str]] = [set() for _ in causes]
    recent: list[EventDoc] = []
    examples: list[str] = []
    false_slow = 0
    leaf_ids = np.array(fleet.leaves)
    for w in range(windows):
        now = world.t_ns(w)
        rates = model.window(w)
        slow = np.ones(len(jobs))
        cause_of_job: dict[int, int] = {}
        touched: set[int] = set()
        found = background_findings(world, w)
        for ci, c in enumerate(causes):
            if not c.active(w):
                continue
            eff = EFFECTS[c.kind](world, c, w, rates)
            affected[ci] |= eff.affected
            found += eff.findings
            for k, s in eff.slow.items():
                slow[k] *= s
                touched.add(k)
                if s >= SLOW_RATIO:
                    cause_of_job[k] = ci
        recent = [f for f in recent if now - f.t_ns <= chain_cfg.window_ns] + found
        groups_h = np.where(rates.host_job >= 0,
                            np.array([f"job:{jobs[k].id}" if k >= 0 else "" for k in rates.host_job]),
                            np.char.add("leaf:", leaf_ids[fleet.host_leaf]))  # fmt: skip
        active: dict[str, dict[str, Anomaly]] = {"qpmesh": {}, "static_thresholds": {}}
        frames = {}
        for kind in Entity:
            vals = layers[kind].read(rates.of(kind), dt)
            frames[kind] = SignalFrame(kind, ents[kind], signals[kind], vals)
            new, st = static[kind].step(frames[kind], now)
            flags["static_thresholds"] += [(e, w) for e in new]
            active["static_thresholds"].update(st)
        res = fleet_det.step(frames, {k: list(groups_h[host_of[k]]) for k in Entity}, now,
                             {k: list(leaf_ids[fleet.host_leaf][host_of[k]]) for k in Entity},
                             {k: [fleet.hosts[h] for h in host_of[k]] for k in Entity})  # fmt: skip
        flags["qpmesh"] += [(a.entity, w) for a in res.new]
        active["qpmesh"].update(res.active)
        moves = res.moves
        for k, j in enumerate(jobs):
            if not j.start <= w < j.end or rates.host_phase[j.hosts[0]] != 0:
                continue  # not running, or no steps in evaluation / checkpoint
            step = j.step_s * slow[k] * float(np.exp(STEP_NOISE * rng.standard_normal()))
            base = min(baseline.get(k, step), step)
            baseline[k] = base
            first_seen.setdefault(k, w)
            if trace is not None:
                trace[(k, w)] = step / base
            if k in cause_of_job:
                slowed.setdefault((cause_of_job[k], k), []).append(w)
            if step / base < SLOW_RATIO:
                continue
            if k not in touched:
                false_slow += 1
            if k not in graphs:
                job = _job(j, fleet)
                graphs[k] = (job, build_graph(fleet.fabric, job))
            job, graph = graphs[k]
            cls, tgt = naive_root_cause(graph, active["static_thresholds"])
            answers["static_thresholds"][(k, w)] = f"{cls}|{tgt}"
            for est, flagged in (("qpmesh", "qpmesh"), ("static_chain", "static_thresholds")):
                moved = job_moves(moves, j.id) if est == "qpmesh" else None
                rc = explain(
                    graph, step / base, active[flagged], recent, now, chain_cfg, job, moved
                )
                answers[est][(k, w)] = f"{rc.cause}|{rc.target}"
                if (
                    est == "qpmesh"
                    and len(examples) < 12
                    and rc.cause != "unknown"
                    and (not examples or not examples[-1].startswith(f"{j.id}:"))
                ):
                    examples.append(f"{j.id}: {rc.text}")
            perf = JobPerf({0: PerfDoc(j.id, 0, now, 10, step)}, baseline_s=base)
            answers["mesh_only"][(k, w)] = _mesh_answer(
                graph, attribute(job, perf, recent, now, attr_cfg)
            )
    # a job first seen while a cause already slowed it has that pace as its baseline: never
    # "slow", for any estimator; such pairs are left out of the scores and counted apart
    unseen = [p for p in slowed if first_seen.get(p[1], 0) >= causes[p[0]].start]
    for p in unseen:
        del slowed[p]
    return RunResult(flags, answers, slowed, affected, causes, len(fleet.hosts),
                     cfg.duration_s / 3600, false_slow, examples, len(unseen))  # fmt: skip


def score_root_causes(r: RunResult, est: str, persist: int) -> list[tuple[str, bool, str]]:
    """Return per (cause, slowed job) pair: the cause's kind, whether the estimator named it,
    and its answer (the most frequent over the pair's windows after the first ``persist``)."""
    out = []
    for (ci, k), ws in sorted(r.slowed.items()):
        c = r.causes[ci]
        use = ws[persist:] if len(ws) > persist else ws
        said = Counter(r.answers[est].get((k, w), "none|") for w in use).most_common(1)[0][0]
        cls, _, tgt = said.partition("|")
        ok = cls in ACCEPT[c.kind] and (tgt in c.targets or c.kind == "unobservable")
        out.append((c.kind, ok, said))
    return out


def score_flags(r: RunResult, est: str, grace: int) -> dict[str, Any]:
    """Return true / false flag episodes, causes found (a flag on a touched entity) and the
    causes found per kind (``by_kind``)."""
    true = false = 0
    found = [False] * len(r.causes)
    for ent, w in r.flags[est]:
        hit = False
        for ci, c in enumerate(r.causes):
            if c.start <= w <= c.end + grace and ent in r.affected[ci]:
                hit = found[ci] = True
        true += hit
        false += not hit
    observable = [i for i, c in enumerate(r.causes) if c.kind != "unobservable"]
    by_kind = Counter(r.causes[i].kind for i in observable if found[i])
    return {"true": true, "false": false, "causes": len(observable),
            "found": sum(found[i] for i in observable), "by_kind": dict(by_kind)}  # fmt: skip


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def run_bench(cfg: RunConfig, seeds: list[int]) -> dict[str, Any]:
    """Run every seed (faulty and healthy) and return the report (the module docstring)."""
    wall = time.perf_counter()
    det = cfg.detector
    grace = det.persist + det.clear
    pairs: dict[str, list[tuple[str, bool, str]]] = {e: [] for e in ESTIMATORS}
    fl: dict[str, Counter[str]] = {e: Counter() for e in ESTIMATORS}
    healthy_flags: Counter[str] = Counter()
    found_kind: dict[str, Counter[str]] = {e: Counter() for e in FLAGGING}
    causes_kind: Counter[str] = Counter()
    host_hours = 0.0
    runs = []
    examples: list[str] = []
    false_slow = unseen = 0
    for seed in seeds:
        r = run_once(cfg, seed, faulty=True)
        h = run_once(cfg, seed + 100_000, faulty=False)
        host_hours += h.hosts * h.hours
        false_slow += r.false_slow + h.false_slow
        unseen += r.unseen_pairs
        examples += r.examples[:4]
        per_seed: dict[str, Any] = {"seed": seed, "causes": [[c.kind, c.target] for c in r.causes]}
        causes_kind.update(c.kind for c in r.causes)
        for est in ESTIMATORS:
            got = score_root_causes(r, est, det.persist)
            pairs[est] += got
            per_seed[est] = _ratio(sum(ok for _, ok, _ in got), len(got))
            if est in FLAGGING:
                got_flags = score_flags(r, est, grace)
                fl[est].update({k: v for k, v in got_flags.items() if k != "by_kind"})
                for kind, n_found in got_flags["by_kind"].items():
                    found_kind[est][kind] += n_found
                healthy_flags[est] += len(h.flags[est])
        runs.append(per_seed)
    est_out: dict[str, dict[str, Any]] = {}
    for est in ESTIMATORS:
        got = pairs[est]
        f = fl[est]
        flagged = f["true"] + f["false"]
        est_out[est] = {
            "root_cause_accuracy": _ratio(sum(ok for _, ok, _ in got), len(got)),
            "root_cause_named": sum(ok for _, ok, _ in got),
            "anomaly_precision": _ratio(f["true"], flagged) if est in FLAGGING else None,
            "anomaly_recall": _ratio(f["found"], f["causes"]) if est in FLAGGING else None,
            "flags": flagged if est in FLAGGING else None,
            "false_flags_faulty_runs": f["false"] if est in FLAGGING else None,
            "false_flags_healthy_runs": healthy_flags[est] if est in FLAGGING else None,
            "false_flags_per_100_host_hours": round(100 * healthy_flags[est] / host_hours, 3)
            if est in FLAGGING else None,
        }  # fmt: skip
    per_kind: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        row: dict[str, Any] = {"pairs": sum(1 for k, _, _ in pairs["qpmesh"] if k == kind)}
        for est in ESTIMATORS:
            oks = [ok for k, ok, _ in pairs[est] if k == kind]
            row[est] = _ratio(sum(oks), len(oks))
        for est in FLAGGING:
            row[f"{est}_anomaly_recall"] = (
                _ratio(found_kind[est][kind], causes_kind[kind]) if kind != "unobservable" else None
            )
        wrong = Counter(s for k, ok, s in pairs["qpmesh"] if k == kind and not ok)
        row["qpmesh_wrong"] = dict(wrong.most_common(3))
        per_kind[kind] = row
    return {
        "seeds": seeds,
        "fabric": {"nics": cfg.nics, "hosts": -(-cfg.nics // 8), "gpus": cfg.nics},
        "duration_s": cfg.duration_s,
        "window_s": cfg.window_s,
        "causes_per_run": cfg.causes,
        "slowed_job_pairs": len(pairs["qpmesh"]),
        "healthy_host_hours": round(host_hours, 1),
        "false_slow_windows": false_slow,
        "pairs_never_seen_at_pace": unseen,
        "estimators": est_out,
        "per_kind": per_kind,
        "detector": {k: getattr(det, k) for k in det.__dataclass_fields__},
        "model": dict(cfg.normal),
        "model_changed": {k: v for k, v in cfg.normal.items() if NORMAL[k] != v},
        "runs": runs,
        "examples": examples[:8],
        "wall_s": round(time.perf_counter() - wall, 1),
    }


def _rootcause(args: argparse.Namespace) -> int:
    if args.nics < 16 or args.duration <= 0 or args.window <= 0 or args.seeds < 1:
        raise ValueError("--nics >= 16, --duration, --window and --seeds must be positive")
    normal = dict(NORMAL)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in NORMAL:
            raise ValueError(
                f"--set {item!r}: expected KEY=NUMBER with KEY one of {', '.join(NORMAL)}"
            )
        try:
            normal[key] = float(value)
        except ValueError:
            raise ValueError(f"--set {item!r}: {value!r} is not a number") from None
    cfg = RunConfig(nics=args.nics, duration_s=args.duration, window_s=args.window,
                    causes=args.causes, warm_s=min(1200.0, args.duration / 4), normal=normal)  # fmt: skip
    out = run_bench(cfg, [args.seed + i for i in range(args.seeds)])
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for est, m in out["estimators"].items():
        extra = ""
        if m["anomaly_precision"] is not None:
            extra = (f", anomaly precision {m['anomaly_precision']} recall {m['anomaly_recall']}, "
                     f"{m['false_flags_per_100_host_hours']} false flags / 100 host-hours")  # fmt: skip
        print(f"{est:18s} root cause {m['root_cause_accuracy']} ({m['root_cause_named']} of "
              f"{out['slowed_job_pairs']} slowed jobs){extra}")  # fmt: skip
    print(f"wall {out['wall_s']} s")
    return 0


def register_rootcause(ssub: Any) -> None:
    """Register ``qpmesh sim rootcause``."""
    p = ssub.add_parser(
        "rootcause",
        help="hardware-signal anomalies and root causes of slowed jobs vs two baselines",
        description="Simulate a fleet's hardware signals with injected causes, run qpmesh's "
        "anomaly detector and root-cause walk, static thresholds and mesh-only attribution, "
        "and score them against the truth.",
    )
    p.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    p.add_argument("--seeds", type=int, default=1, help="number of seeds (default 1)")
    p.add_argument("--nics", type=int, default=1024, help="NICs, 8 per host (default 1024)")
    p.add_argument("--duration", type=float, default=3 * 3600.0,
                   help="simulated seconds per run (default 10800)")  # fmt: skip
    p.add_argument("--window", type=float, default=10.0, help="window, s (default 10)")
    p.add_argument("--causes", type=int, default=16, help="causes per faulty run (default 16)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=NUMBER",
                   help="change a normal-model parameter (testbed.sim.signals_model.NORMAL), "
                   "e.g. burst_start=0.004: how the scores move with an assumption")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_rootcause)


def kinds_table(out: Mapping[str, Any]) -> str:
    """Return the per-kind accuracies of a report as a Markdown table (for the docs)."""
    lines = ["| cause | pairs | qpmesh | static | mesh-only |", "|---|---|---|---|---|"]
    for kind, row in out["per_kind"].items():
        lines.append(f"| {kind} | {row['pairs']} | {row['qpmesh']} | "
                     f"{row['static_thresholds']} | {row['mesh_only']} |")  # fmt: skip
    return "\n".join(lines)
