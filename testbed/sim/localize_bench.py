"""``qpmesh sim localize``: fault localization accuracy of the brain versus a voting baseline.

Runs the simulator with faults (a scenario file or ``--random-faults K``), turns every step into
`Observations` (truth-clocks adapter: the step's stamps with the simulator's true clock offsets
removed, paths as the controller sees them: the fabric's ECMP model, corrected where path
discovery found the real path (`SimStep.seen_fwd`); the ingest pipeline sees the model's
paths only), feeds the same
observations to `controller.brain.Brain` and to the 007-style `controller.voting.VotingBaseline`,
and scores both: a fault is found when an event names its target while active (+ ``GRACE_S``);
an event naming a non-faulty target is a false alert.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from contract.interrupt import finish, interruptible
from contract.records import COLUMNS, encode_batch
from controller.brain import Brain, BrainConfig
from controller.brainlike import TeeBrain
from controller.coalesce import CoalesceConfig, ProbeQueue
from controller.detect.paths import alias_groups
from controller.live import LiveConfig, LiveController
from controller.observations import Observations
from controller.voting import VotingBaseline
from mesh.fabric import Fabric, FabricError, FabricShape, NodeKind, build_fabric
from testbed.scenario import Fault, FaultKind, load_scenario, random_faults
from testbed.sim.engine import EPOCH_NS, SimConfig, SimStep, Simulator
from testbed.sim.ingest_traffic import split_hosts
from testbed.sim.localize_score import (
    GRACE_S,
    Alert,
    CongestionTruth,
    Scorer,
    accepted_targets,
    normalize,
    reroute_targets,
)
from testbed.sim.model import ModelKnobs
from testbed.sim.options import add_model_options, model_from_args, nics_fabric, number, positive

__all__ = ["normalize", "register_localize", "reroute_targets", "run_once", "three_tier_shape"]


def observations_from_step(sim: Simulator, st: SimStep) -> Observations:
    """Return the step's probes as `Observations` with delays from the true clock offsets
    (kernel-stamped when the simulator's stamps are)."""
    b = st.batch
    lost = b.lost.copy()
    t = st.true_t_ns
    src, dst = b.src.astype(np.int64), b.dst.astype(np.int64)
    off_s, off_d = sim.true_offset_ns(t, src), sim.true_offset_ns(t, dst)
    with np.errstate(invalid="ignore"):
        fwd = (b.t2 - b.t1).astype(np.float64) - (off_d - off_s)
        rev = (b.t4 - b.t3).astype(np.float64) - (off_s - off_d)
        rtt = ((b.t4 - b.t1) - (b.t3 - b.t2)).astype(np.float64)
    nan = np.nan
    return Observations(
        t.astype(np.int64),
        src.astype(np.int32),
        dst.astype(np.int32),
        b.sport.astype(np.int32),
        (st.hops_fwd if st.seen_fwd is None else st.seen_fwd).astype(np.int32),
        (st.hops_rev if st.seen_rev is None else st.seen_rev).astype(np.int32),
        lost,
        np.where(lost, nan, fwd),
        np.where(lost, nan, rev),
        np.where(lost, nan, rtt),
        sw=np.full(len(lost), sim.config.timestamps == "sw"),
    )


_ERR_EDGES = np.concatenate([[0.0], np.logspace(0, 6, 241)])  # ns, 40 bins per decade


@dataclass
class ClockError:
    """The controller's one-way delays against the simulator's truth, over a run: how many
    arrived delays were judged (not withheld by clock trust) and how far off they were."""

    hist: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(len(_ERR_EDGES), np.int64))
    arrived: int = 0
    judged: int = 0
    worst: float = 0.0
    first_judged_s: float | None = None

    def add(self, t_s: float, owd: npt.NDArray[np.float64], true: npt.NDArray[np.float64]) -> None:
        """Fold one step's delays (NaN = withheld or lost) and their truth (NaN = lost)."""
        arrived = np.isfinite(true)
        err = np.abs(owd - true)[arrived & np.isfinite(owd)]
        self.arrived += int(arrived.sum())
        self.judged += len(err)
        if len(err):
            self.first_judged_s = t_s if self.first_judged_s is None else self.first_judged_s
            self.worst = max(self.worst, float(err.max()))
            idx = np.searchsorted(_ERR_EDGES, err, side="right") - 1
            self.hist += np.bincount(idx, minlength=len(_ERR_EDGES))

    def _q(self, q: float) -> float | None:
        if not self.judged:
            return None
        k = int(np.searchsorted(np.cumsum(self.hist), q * self.judged))
        return round(float(_ERR_EDGES[min(k + 1, len(_ERR_EDGES) - 1)]), 1)  # bin's upper edge

    def to_dict(self) -> dict[str, object]:
        """Summary: judged fraction, |error| p50 / p99 (upper bin edges, 6 %) and max, counts
        over 1 and 4 µs (the delay floor), time of the first judged delay."""
        over = [int(self.hist[np.searchsorted(_ERR_EDGES, x) :].sum()) for x in (1e3, 4e3)]
        return {
            "judged_frac": round(self.judged / self.arrived, 4) if self.arrived else None,
            "first_judged_s": self.first_judged_s,
            "owd_err_p50_ns": self._q(0.5),
            "owd_err_p99_ns": self._q(0.99),
            "owd_err_max_ns": round(self.worst, 1),
            "over_1us": over[0],
            "over_4us": over[1],
        }


def run_once(
    fabric: Fabric,
    faults: Sequence[Fault],
    *,
    duration_s: float,
    load: float,
    seed: int,
    step_s: float,
    timestamps: str = "hw",
    pipeline: str = "truth-clocks",
    model: ModelKnobs | None = None,
    brain_config: BrainConfig | None = None,
) -> dict[str, object]:
    """Simulate ``duration_s`` with ``faults``; return the scores of both estimators.

    ``pipeline``: "ingest" runs the controller's real ingest + clock sync
    (`controller.live.LiveController`, holding the paths the probers discovered:
    `Simulator.discovered_paths`) and feeds its observations to both estimators;
    "truth-clocks" removes the simulator's true clock offsets instead. ``brain_config``:
    the brain's thresholds (default `BrainConfig` with ``lateness_ns`` 0: each step is
    delivered complete).
    """
    run = LocalizeRun(
        fabric,
        faults,
        load=load,
        seed=seed,
        step_s=step_s,
        timestamps=timestamps,
        pipeline=pipeline,
        model=model,
        brain_config=brain_config,
    )
    for st in run.sim.run(duration_s, step_s):
        run.feed(st)
    return run.report(duration_s)


class LocalizeRun:
    """One ``sim localize`` run fed step by step: the simulator, the controller's detection
    (the brain, or a `LiveController` in front of it), the voting baseline (unless
    ``voting`` is False: it then sees nothing and raises nothing) and what they raised.
    `run_once` feeds every step of ``sim.run``; `testbed.sim.day` feeds a day in hours.

    ``pipeline``: as `run_once`'s, or "wire": the `LiveController` of "ingest" fed as the
    service is (`_arrive`): each host's batch encoded, admitted as bytes at the host's
    phase in the step into a coalescing queue, flushed when due and before each tick."""

    def __init__(
        self,
        fabric: Fabric,
        faults: Sequence[Fault],
        *,
        load: float,
        seed: int,
        step_s: float,
        timestamps: str = "hw",
        pipeline: str = "truth-clocks",
        model: ModelKnobs | None = None,
        brain_config: BrainConfig | None = None,
        voting: bool = True,
    ) -> None:
        self.fabric, self.faults = fabric, tuple(faults)
        self.knobs = knobs = ModelKnobs() if model is None else model
        cfg = SimConfig(load=load, seed=seed, timestamps=timestamps, model=knobs)
        self.sim = Simulator(fabric, cfg, faults)
        self.brain = Brain(fabric, brain_config or BrainConfig(lateness_ns=0))
        self.voter = VotingBaseline(fabric) if voting else None
        self.live: LiveController | None = None
        self.epoch = 0
        self._seen: list[Observations] = []  # what the live pipeline handed the brain in a step
        self.clock_err = ClockError()
        self._queue: ProbeQueue | None = None
        if pipeline == "wire":  # each host's batch encoded, at its own phase in the step
            self._queue = ProbeQueue(CoalesceConfig())
            rng = np.random.default_rng([seed, 32, 5])
            self._phase_ns = rng.uniform(0, step_s * 1e9, len(fabric.hosts)).astype(np.int64)
            self._host_pos = {h.id: i for i, h in enumerate(fabric.hosts)}
        if pipeline in ("ingest", "wire"):
            # the voting baseline sees what the brain sees
            taps = (
                [self._seen.append]
                if self.voter is None
                else [self.voter.observe, self._seen.append]
            )
            self.live = LiveController(  # a detection window per step, as the truth-clocks brain's
                fabric,
                LiveConfig(window_ns=round(step_s * 1e9)),
                brain=TeeBrain(self.brain, *taps),
            )
            self.epoch = EPOCH_NS
            # the paths the probers discovered (TTL probes), as a real controller holds them
            src, dst, sport, fwd, rev = self.sim.discovered_paths()
            self.live.learn_paths(src, dst, sport, fwd, rev)
        self.hosts = {h.id for h in fabric.hosts}
        self._alive, self._gpu_bad = set(self.hosts), set[str]()
        self.ours: list[Alert] = []
        self.theirs: list[Alert] = []
        self.truth = CongestionTruth(fabric.n_hops)
        self._raised: dict[str, int] = {}  # target -> index in ``ours`` of its standing alert
        self.blamed_first: dict[str, float] = {}
        self.n_probes = 0
        self.t_brain = 0.0

    def feed(self, st: SimStep) -> list[EventDoc]:
        """Hand one simulator step to the detection and the baseline; return the events the
        controller raised or cleared at its end."""
        brain, voter, live, fabric = self.brain, self.voter, self.live, self.fabric
        now = self.epoch + round(st.t1_s * 1e9)
        sink: Brain | LiveController = brain if live is None else live
        alive, gpu_bad = self._alive, self._gpu_bad
        for h in sorted(alive - st.alive_hosts):
            sink.presence(h, False, now)
        for h in sorted(st.alive_hosts - alive):
            sink.presence(h, True, now)
        self._alive = set(st.alive_hosts)
        for h in sorted(st.gpu_faults - gpu_bad):
            sink.gpu(h, False, "NVML errors", now)
        for h in sorted(gpu_bad - st.gpu_faults):
            sink.gpu(h, True, "", now)
        self._gpu_bad = set(st.gpu_faults)
        if voter is not None:
            voter.exclude(self.hosts - self._alive)
        self.n_probes += len(st.batch)
        c0 = time.perf_counter()
        if live is None:
            obs = observations_from_step(self.sim, st)
            brain.observe(obs)
            if voter is not None:
                voter.observe(obs)
            events = brain.tick(now)
        else:
            seen = self._seen
            if st.discovered is not None:  # the probers' traces of this step (path discovery)
                live.learn_paths(*st.discovered)
            if self._queue is None:
                live.admit(st.batch, now)
            else:
                self._arrive(live, self._queue, st, now)
            events = live.tick(now)
            if len(seen) == 1 and len(seen[0]) == len(st.batch):  # rows in batch order
                self.clock_err.add(st.t1_s, seen[0].owd_fwd_ns, st.true_fwd_ns)
                self.clock_err.add(st.t1_s, seen[0].owd_rev_ns, st.true_rev_ns)
            seen.clear()
        self.t_brain += time.perf_counter() - c0
        self.truth.add(st.t0_s, st.t1_s, st.hop_queue_ns)
        ours, raised = self.ours, self._raised
        for ev in events:
            if ev.kind != "clear":
                raised[ev.target] = len(ours)
                ours.append(Alert.of_event(st.t1_s, ev))
            elif ev.target in raised:
                i = raised.pop(ev.target)
                ours[i] = dataclasses.replace(ours[i], until_s=st.t1_s)
        if voter is not None:
            self.theirs += [Alert(st.t1_s, lk) for lk in voter.tick(now)]
            for ev in events:  # host findings come from presence / NVML: give them to both
                if ev.kind in ("prober_down", "gpu_fault"):
                    self.theirs.append(Alert(st.t1_s, ev.target, ev.kind))
        _track_blamed(brain, fabric, self.faults, st.t1_s, self.blamed_first)
        return events

    def _arrive(self, live: LiveController, queue: ProbeQueue, st: SimStep, now: int) -> None:
        """Hand the step's probes to ``live`` as the service gets them: one encoded batch per
        probing host (`split_hosts`), arriving at the host's phase within the step, through
        `LiveController.admit` (decoded, checked against the host, queued) with ``queue``
        flushed when due and, as the service's ticker does, before the tick."""
        b = st.batch
        cols = {name: getattr(b, name) for name, _ in COLUMNS}
        batches, _ = split_hosts(self.fabric, b.nic_ids, cols, b.batch_seq, b.stamp)
        t0 = self.epoch + round(st.t0_s * 1e9)
        arrivals = sorted(
            (t0 + int(self._phase_ns[self._host_pos[x.origin]]), x.origin, encode_batch(x))
            for x in batches
        )
        del batches
        for at, host, payload in arrivals:
            if queue.due(at):
                live.flush(queue, at)
            live.admit(payload, at, host=host, queue=queue)
        if len(queue):
            live.flush(queue, now)

    def scorer(self, duration_s: float) -> Scorer:
        """Close the congestion truth and return the scorer of a run of ``duration_s`` (call
        once, after the last step)."""
        self.truth.close()
        return Scorer(
            self.fabric,
            self.faults,
            self.truth,
            self.sim.loss_bursts(0.0, duration_s),
            reroute_targets(self.fabric, self.faults, self.sim.real and self.knobs.redistribute),
            warmup_s=min(5.0, duration_s * 0.2),  # random faults start no earlier either
        )

    def report(self, duration_s: float) -> dict[str, object]:
        """Return `run_once`'s report of the steps fed (call once, after the last step)."""
        fabric, faults, sim = self.fabric, self.faults, self.sim
        scorer = self.scorer(duration_s)
        ours, theirs = self.ours, self.theirs
        ours_s, theirs_s = scorer.evaluate(ours), scorer.evaluate(theirs)
        fault_rows = []
        for i, f in enumerate(faults):
            first = ours_s["_first"][i]  # type: ignore[index]
            det = self.blamed_first.get(f"fault{i}")
            det = first if det is None or (first is not None and first < det) else det
            fault_rows.append(
                {
                    "kind": str(f.kind),
                    "target": f.target,
                    "start_s": round(f.start_s, 3),
                    "end_s": round(f.end_s, 3),
                    "detected_s": None if det is None else round(det, 3),
                    "localized_s": None if first is None else round(first, 3),
                    "latency_s": None if first is None else round(first - f.start_s, 3),
                    "found": bool(ours_s["_found"][i]),  # type: ignore[index]
                    "found_by_voting": bool(theirs_s["_found"][i]),  # type: ignore[index]
                }
            )
        missed, false = ours_s["_missed"], ours_s["_false"]
        for s in (ours_s, theirs_s):
            for k in ("_found", "_first", "_missed", "_false"):
                s.pop(k)
        aliases = alias_groups(len(fabric.links), sim.probed_paths())
        t_brain, n_probes = self.t_brain, self.n_probes
        return {
            "estimators": {"qpmesh": ours_s, "voting_baseline": theirs_s},
            "faults": fault_rows,
            "unidentifiable": [[fabric.links[i].id for i in g] for g in aliases],
            "false_alerts": ours_s["false_alerts"],
            "false": [
                {"t_s": round(a.t_s, 3), "target": a.target, "kind": a.kind}
                for a in false[:20]  # type: ignore[index]
            ],
            "congestion_missed": [
                {"hop": fabric.hop_name(h), "start_s": round(a, 2), "end_s": round(b, 2)}
                for h, a, b in missed[:20]  # type: ignore[index]
            ],
            "clock": self.clock_err.to_dict() if self.live is not None else None,
            "probes": n_probes,
            "pipeline_probes_per_s": round(n_probes / t_brain) if t_brain else None,
            "alerts": [
                {"t_s": round(a.t_s, 3), "target": a.target, "kind": a.kind} for a in ours[:50]
            ],
        }


def _track_blamed(
    brain: Brain, fabric: Fabric, faults: Sequence[Fault], t_s: float, first: dict[str, float]
) -> None:
    """Record per fault the first window whose tomography blamed its target (detection)."""
    for i, f in enumerate(faults):
        key = f"fault{i}"
        if key in first or not f.start_s <= t_s <= f.end_s + GRACE_S:
            continue
        if brain.last_blamed & accepted_targets(fabric, f) or (
            f.kind == FaultKind.PROBER_DOWN and f.target in brain.hosts_down()
        ):
            first[key] = t_s


def _fabric(args: argparse.Namespace) -> Fabric:
    if args.pods > 1 or args.superspines:
        return build_fabric(three_tier_shape(args.nics or 32, args.pods, args.superspines or 8))
    if args.nics:
        return nics_fabric(args.nics)
    return build_fabric(FabricShape())


def three_tier_shape(nics: int, pods: int, superspines: int) -> FabricShape:
    """Return a three-tier shape with at least ``nics`` NICs (one per host) over ``pods``
    pods, each of 4 spines and as many leaves of up to 32 NICs as it needs, joined by
    ``superspines`` super-spines (``superspines / 4`` in each of the 4 planes).

    Raises `FabricError` for fewer than 2 NICs per pod or super-spines that are not a
    positive multiple of 4."""
    if pods < 1 or nics < 2 * pods:
        raise FabricError(f"need at least 2 NICs per pod, got {nics} NICs over {pods} pods")
    per_pod = -(-nics // pods)
    per_leaf = min(32, max(2, per_pod // 4))
    leaves = -(-per_pod // per_leaf)
    return FabricShape(
        leaves=leaves, hosts_per_leaf=per_leaf, nics_per_host=1, spines=4, pods=pods,
        superspines=superspines,
    )  # fmt: skip


_ALERT_COUNTS = (
    "false_alerts",
    "false_fault_alerts",
    "false_congestion_alerts",
    "wrong_cause_alerts",
    "wrong_direction_alerts",
    "congestion_loss_alerts",
    "near_congestion_alerts",
    "burst_alerts",
    "reroute_alerts",
    "congestion_episodes",
    "congestion_found",
)
_RATES = ("congestion_recall_from_start",)
_SCORES = tuple(
    f"{p}{m}" for p in ("", "congestion_", "overall_") for m in ("precision", "recall", "f1")
)


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4) if xs else float("nan")


def _localize(args: argparse.Namespace) -> int:
    seeds = [args.seed + i for i in range(args.seeds)]
    runs = []
    valid = [k.value for k in FaultKind]
    names = [k.strip() for k in args.kinds.split(",")] if args.kinds else []
    unknown = [k for k in names if k not in valid]
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r} (one of: {', '.join(valid)})")
    kinds = (
        [FaultKind(k) for k in names]
        if names
        else [FaultKind.FLAP, FaultKind.CONGEST, FaultKind.LOSS, FaultKind.NIC_DOWN]
    )
    if args.scenario and (args.pods != 1 or args.superspines):
        raise ValueError(
            "--pods and --superspines shape random-fault fabrics; a scenario has its own [fabric]"
        )
    wall = time.perf_counter()
    model = model_from_args(args)
    with interruptible() as stop:  # a signal ends the seeds early: the report covers those done
        for seed in seeds:
            if args.scenario:
                sc = load_scenario(args.scenario)
                fabric, faults = sc.fabric(), sc.faults
                duration = args.duration or sc.duration_s
                load = sc.load if args.load is None else args.load
            else:
                fabric = _fabric(args)
                duration = args.duration or 30.0
                faults = random_faults(
                    fabric,
                    args.random_faults,
                    seed=seed,
                    duration_s=duration,
                    kinds=kinds,
                    congest_magnitude=args.queue_us,
                    loss_percent=args.loss_percent,
                    flap_down_s=args.flap_down_ms / 1e3,
                    gray_percent=args.gray_percent,
                    optic_percent=args.optic_percent,
                )
                load = 0.4 if args.load is None else args.load
            r = run_once(
                fabric,
                faults,
                duration_s=duration,
                load=load,
                seed=seed,
                step_s=args.step,
                timestamps=args.timestamps,
                pipeline=args.pipeline,
                model=model,
            )
            r["seed"] = seed
            runs.append(r)
    if not runs:
        return finish(stop, None, as_json=args.json)
    out: dict[str, object] = {
        "fabric": {
            "nics": len(fabric.nics),
            "tiers": 3 if any(n.kind == NodeKind.SUPERSPINE for n in fabric.switches) else 2,
            "links": len(fabric.links),
        },
        "pipeline": args.pipeline,
        "seeds": [r["seed"] for r in runs],
        "step_s": args.step,
        "model": model.to_dict(),
        "magnitudes": {
            "loss_percent": args.loss_percent,
            "queue_us": args.queue_us,
            "flap_down_ms": args.flap_down_ms,
            "gray_percent": args.gray_percent,
            "optic_percent": args.optic_percent,
        },
    }
    est: dict[str, dict[str, float]] = {}
    for name in ("qpmesh", "voting_baseline"):
        per = {
            m: [float(r["estimators"][name][m]) for r in runs]  # type: ignore[index]
            for m in (*_SCORES, *_RATES, *_ALERT_COUNTS)
        }
        # medians over seeds under the plain names (the shape `testbed run` shares); means of
        # the scores and sums of the alert counts beside them, named so
        est[name] = {m: _median(v) for m, v in per.items()}
        est[name].update(
            {f"{m}_mean": round(statistics.fmean(per[m]), 4) for m in (*_SCORES, *_RATES) if per[m]}
        )
        est[name].update({f"{m}_total": sum(per[m]) for m in _ALERT_COUNTS})
    out["estimators"] = est
    # links no end-to-end measurement on the probed paths tells apart (the first seed's paths)
    out["unidentifiable"] = runs[0]["unidentifiable"] if runs else []
    out["faults"] = [f for r in runs for f in r["faults"]]  # type: ignore[attr-defined]
    out["false_alerts"] = sum(int(r["false_alerts"]) for r in runs)  # type: ignore[call-overload]
    lat = [f["latency_s"] for f in out["faults"] if f["latency_s"] is not None]  # type: ignore[attr-defined, index]
    out["median_latency_s"] = _median(lat)
    out["mean_latency_s"] = round(statistics.fmean(lat), 4) if lat else None
    out["pipeline_probes_per_s_median"] = _median(
        [float(r["pipeline_probes_per_s"] or 0) for r in runs]  # type: ignore[arg-type]
    )
    out["wall_s"] = round(time.perf_counter() - wall, 2)
    out["runs"] = (
        runs
        if args.verbose
        else [
            {
                "seed": r["seed"],
                "estimators": r["estimators"],
                "clock": r["clock"],
                "alerts": r["alerts"][:10],  # type: ignore[index]
                "congestion_missed": r["congestion_missed"][:10],  # type: ignore[index]
                "false": r["false"][:10],  # type: ignore[index]
            }
            for r in runs
        ]
    )
    return finish(stop, out, as_json=args.json, show=_show, indent=1)


def _show(out: Mapping[str, Any]) -> None:
    for name, m in out["estimators"].items():
        print(
            f"{name:16s} faults P {m['precision']:.3f} R {m['recall']:.3f} "
            f"(means {m['precision_mean']:.3f} / {m['recall_mean']:.3f}); congestion P "
            f"{m['congestion_precision']:.3f} R {m['congestion_recall']:.3f} (means "
            f"{m['congestion_precision_mean']:.3f} / {m['congestion_recall_mean']:.3f}); "
            f"false alerts {m['false_alerts_total']:g} (all seeds)"
        )
    print(
        f"localization latency median {out['median_latency_s']} s, mean "
        f"{out['mean_latency_s']} s, wall {out['wall_s']} s"
    )


def _percent(text: str) -> float:
    v = positive(text)
    if v > 100:
        raise argparse.ArgumentTypeError(f"a percent in (0, 100]: {text}")
    return v


def _queue_us(text: str) -> float:
    v = number(text)
    if not v > 1:
        raise argparse.ArgumentTypeError(f"must be > 1 µs (<= 1 is extra utilisation): {text}")
    return v


def register_localize(ssub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh sim localize``."""
    p = ssub.add_parser(
        "localize",
        help="localization benchmark: qpmesh brain vs 007-style voting on simulated faults",
        description="Simulate faults, run the controller's detection and a voting baseline on "
        "the same probes, and score precision / recall / F1, latency and false alerts.",
    )
    p.add_argument("scenario", nargs="?", help="scenario TOML (default: random faults)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--random-faults", type=int, default=1, help="faults to draw (default 1)")
    p.add_argument("--kinds", default="", help="comma list of fault kinds to draw from")
    p.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    p.add_argument("--seeds", type=int, default=1, help="number of seeds to run (default 1)")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (default 30)")
    p.add_argument("--nics", type=int, default=0, help="NICs (default: 4 leaves x 4 NICs)")
    p.add_argument(
        "--pods",
        type=int,
        default=1,
        help="three tiers: this many pods of 4 spines each, --nics split over them (default "
        "1: two tiers, unless --superspines is given)",
    )
    p.add_argument(
        "--superspines",
        type=int,
        default=0,
        help="super-spines joining the pods, a multiple of 4 (default 8 with --pods > 1)",
    )
    p.add_argument("--load", type=float, default=None, help="background load (default 0.4)")
    p.add_argument("--step", type=float, default=0.1, help="detection window, s (default 0.1)")
    p.add_argument(
        "--timestamps",
        choices=("hw", "sw"),
        default="hw",
        help="NIC (hw) or kernel (sw) stamps (default %(default)s)",
    )
    p.add_argument(
        "--pipeline",
        choices=("ingest", "truth-clocks"),
        default="ingest",
        help="ingest: the controller's ingest + clock sync (default); truth-clocks: the "
        "simulator's true clock offsets (isolates localization)",
    )
    p.add_argument("--verbose", action="store_true", help="include every run in the JSON")
    p.add_argument(
        "--loss-percent",
        type=_percent,
        default=20.0,
        help="random loss faults drop this percent of traversals (default %(default)s)",
    )
    p.add_argument(
        "--queue-us",
        type=_queue_us,
        default=20.0,
        help="random congest faults add an exponential queue of this mean, µs, > 1 "
        "(default %(default)s; the simulator reads <= 1 as extra utilisation)",
    )
    p.add_argument(
        "--flap-down-ms",
        type=positive,
        default=1000.0,
        help="random flaps go down this long, ms, every 2 s up (default %(default)s)",
    )
    p.add_argument(
        "--gray-percent",
        type=_percent,
        default=5.0,
        help="random gray faults drop this percent of the link's 5-tuples (default %(default)s)",
    )
    p.add_argument(
        "--optic-percent",
        type=_percent,
        default=0.5,
        help="random optic faults lose this percent on average, in bursts (default %(default)s)",
    )
    add_model_options(p)
    p.set_defaults(func=_localize)
