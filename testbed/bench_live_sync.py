"""The controller's live clock sync against the simulator's truth (``python -m testbed.bench_live_sync``).

Feeds simulated 0.5 s batches (realistic model by default) through `controller.ingest.Ingestor`
and `controller.clocksync.ClockSync` exactly as the service does (``add``, ``maybe_solve`` at
the batch's time, ``delays``), with the default `ClockSyncConfig` (10 s window solved once per
window) unless ``--bins`` says otherwise. After the first window (warm-up) it scores every new
clock state: node offset error at the state's reference instant over the NICs the state
reports known, centred on their median (`testbed.clockerr`; p99 over NICs, per solve; the
unknown ones counted), and the one-way delays handed to detection against the simulator's
true delays (p50 / p99 over all judged delays, and how many were off by more than 1 and 4
µs). Reports medians over solves and seeds. ``--model-knob``, ``--ideal`` and
``--timestamps`` choose the model (docs/simulator.md: bad stamps, clock steps, servo
steering, CQE send stamps); ``--clock-step NIC:AT_S:NS`` steps one NIC's clock. Uses only the
public API, so the same command measures any version of the controller.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.interrupt import finish, interruptible
from controller.clocksync import ClockSync, ClockSyncConfig
from controller.ingest import Ingestor
from mesh.fabric import FabricShape, build_fabric
from testbed.clockerr import node_errors
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelError, ModelKnobs
from testbed.sim.options import add_model_options, model_from_args

F64 = npt.NDArray[np.float64]
WARMUP_S = 10.5


@dataclass
class SeedRun:
    """One seed's scores: per steady solve the p99 node error and the unknown NICs; the
    |error| of every steady delay handed to detection."""

    p99s: list[float] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    owd: list[F64] = field(default_factory=list)


def run_one(
    nics: int,
    load: float,
    seed: int,
    seconds: float,
    bins: int,
    leaf_split: bool = True,
    *,
    model: ModelKnobs | None = None,
    timestamps: str = "hw",
    steps: tuple[tuple[int, float, float], ...] = (),
) -> SeedRun:
    """One seed (see the module docstring). ``leaf_split``: give the solve the NICs' leaves
    (`ClockSync(leaf=...)`, as `controller.live.LiveController` does); False: the receive part
    alone. ``steps``: (NIC index, time s, size ns) clock steps."""
    fab = build_fabric(FabricShape.for_nics(nics, nics_per_leaf=16))
    knobs = ModelKnobs() if model is None else model
    sim = Simulator(fab, SimConfig(seed=seed, load=load, timestamps=timestamps, model=knobs))
    for nic, at_s, size in steps:
        sim.step_clock(nic, at_s, size)
    ing = Ingestor(fab)
    leaf = fab.nic_group_index if leaf_split else None
    cs = ClockSync(len(fab.nics), ClockSyncConfig(bins=bins), leaf=leaf)
    out = SeedRun()
    last = None
    for st in sim.run(seconds, 0.5):
        b = ing.ingest(st.batch)  # the simulator's batches are new: nothing to admit
        if not len(b):
            continue
        cs.add(b)
        cs.maybe_solve(int(b.t1.max()))
        if st.t1_s <= WARMUP_S:
            continue
        s = cs.state
        if s is not None and s is not last:
            last = s
            off, _ = cs.offsets(s.t_ref_ns)
            truth = sim.true_offset_ns(float(s.t_ref_ns - EPOCH_NS))
            e = node_errors(off, truth)
            if np.isfinite(e).any():
                out.p99s.append(float(np.nanpercentile(e, 99)))
                out.unknown.append(int(np.isnan(e).sum()))
        d = cs.delays(b)
        err = np.concatenate([d.owd_fwd_ns - st.true_fwd_ns, d.owd_rev_ns - st.true_rev_ns])
        out.owd.append(np.abs(err[np.isfinite(err)]))
    return out


def run_bench(
    nics: int,
    loads: list[float],
    seeds: list[int],
    seconds: float,
    bins: int,
    leaf_split: bool = True,
    *,
    model: ModelKnobs | None = None,
    timestamps: str = "hw",
    steps: tuple[tuple[int, float, float], ...] = (),
) -> dict[str, Any]:
    """Return the report: per load the per-solve p99s, their median, the unknown NICs per
    solve (median, max), owd p50/p99 and how many judged delays were off by > 1 and > 4 µs."""
    knobs = ModelKnobs() if model is None else model
    out: dict[str, Any] = {
        "nics": nics, "seconds": seconds, "bins": bins, "seeds": seeds, "leaf_split": leaf_split,
        "timestamps": timestamps, "clock_steps": [list(x) for x in steps],
        "model": knobs.to_dict(),
    }  # fmt: skip
    for load in loads:
        runs = [
            run_one(nics, load, seed, seconds, bins, leaf_split, model=knobs,
                    timestamps=timestamps, steps=steps)
            for seed in seeds
        ]  # fmt: skip
        p99s = [x for r in runs for x in r.p99s]
        unknown = [x for r in runs for x in r.unknown]
        o = np.concatenate([x for r in runs for x in r.owd] or [np.zeros(0)])
        fin = len(o) > 0
        out[f"load_{load:g}"] = {
            "solve_offset_p99_ns": [round(x, 1) for x in p99s],
            "median_solve_offset_p99_ns": round(float(np.median(p99s)), 1) if p99s else None,
            "unknown_nics_median": float(np.median(unknown)) if unknown else None,
            "unknown_nics_max": max(unknown) if unknown else None,
            "owd_error_p50_ns": round(float(np.percentile(o, 50)), 1) if fin else None,
            "owd_error_p99_ns": round(float(np.percentile(o, 99)), 1) if fin else None,
            "judged_delays": len(o),
            "judged_over_1us": int((o > 1000).sum()),
            "judged_over_4us": int((o > 4000).sum()),
        }
    return out


def _step(text: str) -> tuple[int, float, float]:
    try:
        nic, at, size = text.split(":")
        return int(nic), float(at), float(size)
    except ValueError:
        raise argparse.ArgumentTypeError(f"clock step must be NIC:AT_S:NS, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    """CLI entry; returns the exit code (2 on bad options)."""
    ap = argparse.ArgumentParser(
        prog="python -m testbed.bench_live_sync",
        description="score the controller's live clock sync (ClockSync) against the simulator's "
        "truth: node offsets per solve and the one-way delays it hands to detection",
    )
    ap.add_argument("--nics", type=int, default=64, help="fabric size (16 NICs per leaf)")
    ap.add_argument("--loads", type=float, nargs="+", default=[0.4, 0.9], help="link loads")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="simulator seeds")
    ap.add_argument("--seconds", type=float, default=41.0, help="simulated seconds per seed "
                    f"(the first {WARMUP_S} s are warm-up, not scored)")  # fmt: skip
    ap.add_argument("--bins", type=int, default=ClockSyncConfig().bins,
                    help="ClockSyncConfig.bins: kept coded pairs per directed pair and window")  # fmt: skip
    ap.add_argument("--no-leaf-split", dest="leaf_split", action="store_false",
                    help="do not give the solve the NICs' leaves (the receive-side correction "
                    "alone, as before the controller passed them)")  # fmt: skip
    ap.add_argument("--timestamps", choices=("hw", "cqe"), default="hw",
                    help="NIC stamps at the wire (hw) or CQE send stamps (cqe, the RDMA path)")  # fmt: skip
    ap.add_argument("--clock-step", type=_step, action="append", default=[], metavar="NIC:AT_S:NS",
                    help="step NIC's clock by NS at AT_S simulated seconds (repeatable)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    add_model_options(ap)
    a = ap.parse_args(argv)
    if a.nics < 4 or a.seconds <= WARMUP_S or a.bins < 1 or not all(0 < x < 1 for x in a.loads):
        print(f"bad options: need --nics >= 4, --seconds > {WARMUP_S}, --bins >= 1, loads in "
              "(0, 1)", file=sys.stderr)  # fmt: skip
        return 2
    if any(not 0 <= nic < a.nics or at < 0 for nic, at, _ in a.clock_step):
        print(f"bad options: a clock step's NIC must be in [0, {a.nics}) and its time >= 0",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        model = model_from_args(a)
    except ModelError as e:
        print(f"bad options: {e}", file=sys.stderr)
        return 2
    rep: dict[str, Any] | None = None
    with interruptible() as stop:  # the report comes at the end: none if stopped before
        rep = run_bench(a.nics, a.loads, a.seeds, a.seconds, a.bins, a.leaf_split, model=model,
                        timestamps=a.timestamps, steps=tuple(a.clock_step))  # fmt: skip
    return finish(stop, rep, as_json=a.json, show=_show)


def _show(rep: Mapping[str, Any]) -> None:
    for k, v in rep.items():
        if k.startswith("load_"):
            print(f"{k}: offset p99 (median over solves) {v['median_solve_offset_p99_ns']} ns,"
                  f" unknown NICs (max) {v['unknown_nics_max']},"
                  f" owd error p50 {v['owd_error_p50_ns']} p99 {v['owd_error_p99_ns']} ns,"
                  f" judged > 4 us off {v['judged_over_4us']}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
