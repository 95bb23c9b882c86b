"""The controller's live clock sync against the simulator's truth (``python -m testbed.bench_live_sync``).

Feeds simulated 0.5 s batches (realistic model by default) through `controller.ingest.Ingestor`
and `controller.clocksync.ClockSync` exactly as the service does (``add``, ``maybe_solve`` at
the batch's time, ``delays``), with the default `ClockSyncConfig` (10 s window solved once per
window) unless ``--bins`` says otherwise. After the first window (warm-up) it scores every new
clock state: node offset error at the state's reference instant after removing the common
offset (p99 over NICs, per solve), and the one-way delays handed to detection against the
simulator's true delays (p50 / p99 over all judged delays). Reports medians over solves and
seeds. Uses only the public API, so the same command measures any version of the controller.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.interrupt import finish, interruptible
from controller.clocksync import ClockSync, ClockSyncConfig
from controller.ingest import Ingestor
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]
WARMUP_S = 10.5


def run_one(
    nics: int, load: float, seed: int, seconds: float, bins: int, leaf_split: bool = True
) -> tuple[list[float], F64]:
    """One seed: (p99 node offset error per steady solve, |owd error| of steady delays).
    ``leaf_split``: give the solve the NICs' leaves (`ClockSync(leaf=...)`, as
    `controller.live.LiveController` does); False: the receive part alone."""
    fab = build_fabric(FabricShape.for_nics(nics, nics_per_leaf=16))
    sim = Simulator(fab, SimConfig(seed=seed, load=load, model=ModelKnobs()))
    ing = Ingestor(fab)
    leaf = fab.nic_group_index if leaf_split else None
    cs = ClockSync(len(fab.nics), ClockSyncConfig(bins=bins), leaf=leaf)
    p99s: list[float] = []
    owd: list[F64] = []
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
            k = np.isfinite(off)
            if k.any():
                e = np.abs((off[k] - off[k].mean()) - (truth[k] - truth[k].mean()))
                p99s.append(float(np.percentile(e, 99)))
        d = cs.delays(b)
        err = np.concatenate([d.owd_fwd_ns - st.true_fwd_ns, d.owd_rev_ns - st.true_rev_ns])
        owd.append(np.abs(err[np.isfinite(err)]))
    return p99s, np.concatenate(owd) if owd else np.zeros(0)


def run_bench(
    nics: int,
    loads: list[float],
    seeds: list[int],
    seconds: float,
    bins: int,
    leaf_split: bool = True,
) -> dict[str, Any]:
    """Return the report: per load the per-solve p99s, their median, owd p50/p99."""
    out: dict[str, Any] = {
        "nics": nics, "seconds": seconds, "bins": bins, "seeds": seeds, "leaf_split": leaf_split
    }  # fmt: skip
    for load in loads:
        p99s: list[float] = []
        owd: list[F64] = []
        for seed in seeds:
            p, o = run_one(nics, load, seed, seconds, bins, leaf_split)
            p99s += p
            owd.append(o)
        o = np.concatenate(owd)
        fin = len(o) > 0
        out[f"load_{load:g}"] = {
            "solve_offset_p99_ns": [round(x, 1) for x in p99s],
            "median_solve_offset_p99_ns": round(float(np.median(p99s)), 1) if p99s else None,
            "owd_error_p50_ns": round(float(np.percentile(o, 50)), 1) if fin else None,
            "owd_error_p99_ns": round(float(np.percentile(o, 99)), 1) if fin else None,
            "judged_delays": len(o),
        }
    return out


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
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args(argv)
    if a.nics < 4 or a.seconds <= WARMUP_S or a.bins < 1 or not all(0 < x < 1 for x in a.loads):
        print(f"bad options: need --nics >= 4, --seconds > {WARMUP_S}, --bins >= 1, loads in "
              "(0, 1)", file=sys.stderr)  # fmt: skip
        return 2
    rep: dict[str, Any] | None = None
    with interruptible() as stop:  # the report comes at the end: none if stopped before
        rep = run_bench(a.nics, a.loads, a.seeds, a.seconds, a.bins, a.leaf_split)
    return finish(stop, rep, as_json=a.json, show=_show)


def _show(rep: Mapping[str, Any]) -> None:
    for k, v in rep.items():
        if k.startswith("load_"):
            print(f"{k}: offset p99 (median over solves) {v['median_solve_offset_p99_ns']} ns,"
                  f" owd error p50 {v['owd_error_p50_ns']} p99 {v['owd_error_p99_ns']} ns")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
