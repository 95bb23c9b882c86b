"""``qpmesh sim fleet``: what a fleet of N NICs costs, measured on this machine (issue 29 item 6).

Stages, each measured here, none extrapolated from another size:

1. **worker**: one ingest core (`controller.fleet.worker.FleetWorker`: admit, ingest, close
   into partials) of the whole topology of ``--nics`` NICs (8 NICs a host, 32 a leaf, two
   tiers; ``--peers`` random peers a NIC) owning one partition of ``--partitions``: the
   probes of every such host, at the full probe rate (``--worker-rate-hz`` coded pairs a
   second per peer: 5,120 records a host batch, one batch per host and 1 s window, as the
   probers publish them). ``worker.records_per_core_second``: records / CPU seconds of admit
   + close over ``--windows`` windows after a warm-up one; making the traffic is not timed.
2. **solver, detection**: the full topology of ``--nics`` NICs, its traffic at a reduced rate
   (``--rate-hz``), split over ``--workers`` cores; their partials of one window decoded and
   merged (`controller.fleet.solver.FleetSolver.add`) and the window solved, the brain judging
   the merged detection part of the whole topology (``merge_s``, ``judge_s``), in a solver
   process of its own (spawned: it made no traffic; it gets the partials as bytes, as a
   deployed solver does; ``peak_rss_mb``: its whole life's peak resident set). It runs after
   stage 3, so the clock stage's resident set holds none of this stage's traffic.
3. **solver, clocks**: `controller.fleet.bench` at ``--nics`` x ``--peers`` on synthetic
   partials at the full rate: the fold of one window's clock parts, the summary of a clock
   window's kept rows and the network solve (``fold_s``, ``summary_s``, ``fit_and_solve_s``;
   the last two run once per clock solve and are counted whole in the window).
   ``solver.window_seconds`` = merge + judge + fold + summary + fit_and_solve (CPU s): a
   window in which the clocks are solved (``amortized_window_seconds``: the solve spread
   over the windows between two solves, ``windows_per_clock_solve``);
   ``solver.max_rss_mb``: the highest resident set of the solver's stages. With
   ``--edge-owners K`` (K >= 1, the default 4; `controller.fleet.edges`) the fold and the
   summary are the edge owners', measured owner by owner and reported apart
   (``edges.owners``: per owner its fold per window, its summary per clock solve and its
   per-edge stages of the staged solve, CPU s; ``edges.max_owner_window_seconds``: the
   busiest owner's solve window; ``edges.stages_critical_s``: per round of the staged solve
   the slowest owner, summed), and the solver's window is merge + judge + its network stages
   (``network_s``: no join of the owners' blocks; `controller.fleet.edges.solve_blocks`; the
   owners are processes of their own there, `controller.fleet.benchowners`, so ``network_s``
   includes the rounds' bytes; no owner's rows or block are in the solver's resident set).
   ``solver.max_rss_mb`` is then the detection process's peak plus the network stages' peak
   (two processes' peaks summed, each with its own interpreter: an upper bound of one solver
   process holding the window's detection state while it solves the clocks).
4. **broker**: a 3-server JetStream cluster (R3 file stream, `testbed.brokerbench`) stores
   ``--broker-messages`` batches of a full-rate host batch's size (the bytes a record takes
   in the encoded batches of stage 1 times 5,120 records: 64 M records/s over 12,500 hosts);
   ``broker.server_cpu_us_per_record``: the servers' CPU / records stored.
5. **equivalent**: `testbed.sim.fleet_equiv.check` (one controller vs 3 workers + a solver on
   a 32-NIC fabric with faults: offsets within 0.01 ns, the same events).

``cores_for_64M_records_per_second`` = 64e6 x (broker CPU per record + 1 / worker rate) +
the solver's amortized window seconds per 1 s window (its cores, sustained) + with edge owners
their sustained CPU per 1 s window (``cores.edge_owners``: the workers' split of the clock
part, every owner's fold, and every owner's summary and stages over the windows of a solve;
reading their input off the stream is not in it). ``targets`` and ``met``: the
issue's (window <= 5 s, RSS <= 12 GB, worker >= 1.5 M records per core-second, equivalent).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from contract.documents import EventDoc
from contract.interrupt import finish, interruptible
from contract.records import decode_batch
from controller.brain import Brain
from controller.clocksolve import ClockSyncConfig
from controller.detect.window import WindowPart
from controller.fleet import bench as clockbench
from controller.fleet.benchowners import hwm_mb, release_heap
from controller.fleet.config import FleetConfig
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import Partial
from controller.fleet.solver import FleetSolver
from controller.fleet.worker import FleetWorker
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

WINDOW_NS = 1_000_000_000
RECORDS_PER_HOST_BATCH = 5120  # 64 M records/s over 12,500 hosts, one batch a second each
FLEET_RECORDS_PER_S = 64_000_000
TARGETS = {"solver_window_seconds": 5.0, "solver_max_rss_mb": 12288.0,
           "worker_records_per_core_second": 1.5e6, "equivalent": True}  # fmt: skip
Progress = Callable[[str], object]


class _TimedBrain(Brain):
    """The brain, its judging timed (CPU seconds)."""

    judge_s = 0.0

    def judge(self, end_ns: int, parts: Sequence[WindowPart]) -> list[EventDoc]:
        t0 = time.process_time()
        try:
            return super().judge(end_ns, parts)
        finally:
            self.judge_s += time.process_time() - t0


def fleet_shape(nics: int) -> FabricShape:
    """Return a two-tier shape of at least ``nics`` NICs: 8 a host, 4 hosts a leaf, a spine
    per 4 leaves (2 to 64)."""
    leaves = max(1, math.ceil(nics / 32))
    return FabricShape(leaves=leaves, hosts_per_leaf=4, nics_per_host=8,
                       spines=max(2, min(64, leaves // 4)))  # fmt: skip


def _only_hosts(sim: Simulator, every: int) -> None:
    """Keep the probes of every ``every``-th host's NICs (one partition's share of the
    hosts): the pairs whose source is on such a host. Before the first step."""
    keep = np.flatnonzero(sim.fabric.nic_host_index[sim.pairs_src] % every == 0)
    sim.pairs_src, sim.pairs_dst = sim.pairs_src[keep], sim.pairs_dst[keep]
    sim.ports, sim.phase_s = sim.ports[keep], sim.phase_s[keep]


def _ingest(
    nics: int, peers: int, rate_hz: float, windows: int, workers: int, seed: int,
    progress: Progress, what: str, every: int = 1,
) -> tuple[dict[str, Any], list[bytes], int]:  # fmt: skip
    """Simulate ``windows`` + 1 one-second windows of a fleet of ``nics`` (the probes of
    every ``every``-th host) and ingest them into ``workers`` cores; return (figures, the
    last closed window's partials, that window)."""
    fabric = build_fabric(fleet_shape(nics))
    window_ns = WINDOW_NS
    config = FleetConfig(grid=WindowGrid(window_ns))
    sim = Simulator(fabric, SimConfig(seed=seed, peers=peers, rate_hz=rate_hz,
                                      ports_per_pair=1, mesh_in_group=False))  # fmt: skip
    if every > 1:
        _only_hosts(sim, every)
    owner = {h.id: i % workers for i, h in enumerate(fabric.hosts)}
    cores = [FleetWorker(fabric, config, name=f"w{i}") for i in range(workers)]
    progress(f"{what}: {len(fabric.nics)} NICs, {len(fabric.hosts)} hosts, "
             f"{len(sim.pairs_src)} probed pairs, {rate_hz} Hz, {workers} workers")  # fmt: skip
    cpu = records = nbytes = batches = 0.0
    partials: list[bytes] = []
    last_window = -1
    for i, st in enumerate(sim.run(windows + 1.0, window_ns / 1e9)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        payloads, _ = host_batches(fabric, st.batch, i + 1)
        hosts = [decode_batch(p).origin for p in payloads]
        t0 = time.process_time()
        for host, p in zip(hosts, payloads, strict=True):
            cores[owner[host]].admit(host, p, now)
        closed = [part for w in cores for part in w.close(now)]
        dt = time.process_time() - t0
        if i > 0:  # the first window warms up
            cpu += dt
            records += len(st.batch)
            nbytes += sum(len(p) for p in payloads)
            batches += len(payloads)
        if closed:
            last_window = max(part.window for part in closed)
            partials = [part.encode() for part in closed if part.window == last_window]
        progress(f"{what}: window {i + 1}/{windows + 1}, {len(st.batch)} records, "
                 f"{dt:.1f} CPU s")  # fmt: skip
    out: dict[str, Any] = {
        "nics": len(fabric.nics), "hosts": len(fabric.hosts), "workers": workers,
        "hosts_ingested": -(-len(fabric.hosts) // every),
        "rate_hz": rate_hz, "records": int(records), "cpu_s": round(cpu, 3),
        "records_per_core_second": round(records / cpu) if cpu > 0 else None,
        "records_per_batch": round(records / batches) if batches else None,
        "bytes_per_record": round(nbytes / records, 2) if records else None,
    }  # fmt: skip
    return out, partials, last_window


def worker_stage(
    nics: int, peers: int, rate_hz: float, windows: int, partitions: int, seed: int,
    progress: Progress,
) -> dict[str, Any]:  # fmt: skip
    """Stage 1: one worker core's records per CPU second at the full probe rate, owning one
    partition of ``partitions`` (every ``partitions``-th host) of the whole topology."""
    out, _, _ = _ingest(nics, peers, rate_hz, windows, 1, seed, progress, "worker", partitions)
    return out | {"partitions": partitions}


def detection_stage(
    nics: int, peers: int, rate_hz: float, workers: int, seed: int, progress: Progress
) -> dict[str, Any]:
    """Stage 2: the partials of one window of the whole topology (reduced rate) merged and
    judged by the solver, in a solver process of its own (`_solver_process`: spawned, it
    made no traffic; it gets the partials as the encoded bytes a deployed solver receives);
    returns its figures (``peak_rss_mb``: that process's whole-life peak, its interpreter,
    fabric, brain and the window's partials included). Raises RuntimeError when the solver
    process dies before it answered."""
    fig, partials, window = _ingest(nics, peers, rate_hz, 1, workers, seed, progress, "detection")
    release_heap()  # the simulator's and the workers' heap, before a second process starts
    progress(f"solver: merging {len(partials)} partials of one window and judging, "
             "in a solver process of its own")  # fmt: skip
    ctx = mp.get_context("spawn")  # a fork would share this process's traffic-made heap
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_solver_process, args=(there, nics, window), daemon=True)
    proc.start()
    there.close()
    got: dict[str, Any] | None = None
    try:
        here.send(len(partials))
        for blob in partials:
            here.send_bytes(blob)
        nbytes, count = sum(len(b) for b in partials), len(partials)
        del partials
        got = here.recv()
    except (EOFError, OSError) as exc:
        raise RuntimeError(f"the solver process died before it answered: {exc}") from exc
    finally:
        here.close()
        if got is None:  # failed or interrupted: do not wait for its judging to end
            proc.kill()
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=30)
    assert got is not None  # answered, or raised above
    return {"nics": fig["nics"], "rate_hz": rate_hz, "records": fig["records"],
            "partials": count, "partial_bytes": nbytes} | got  # fmt: skip


def _solver_process(conn: Connection, nics: int, window: int) -> None:
    """The solver's side of stage 2, in a spawned process: receive the partials' bytes,
    decode and merge them (``merge_s``, CPU), solve the window (``judge_s``: the brain's
    judging, CPU), and send back the figures with this process's peak resident set
    (``peak_rss_mb``: VmHWM since it started) and ``events``."""
    blobs = [conn.recv_bytes() for _ in range(conn.recv())]
    fabric = build_fabric(fleet_shape(nics))
    config = FleetConfig(grid=WindowGrid(WINDOW_NS))
    brain = _TimedBrain(fabric, config.detection)
    solver = FleetSolver(fabric, config, brain=brain, solve_inline=False)
    t0 = time.process_time()
    for blob in blobs:
        solver.add(Partial.decode(blob))
    merge_s = time.process_time() - t0
    res = solver.solve(window, EPOCH_NS + (window + 2) * WINDOW_NS)
    conn.send({"merge_s": round(merge_s, 3), "judge_s": round(brain.judge_s, 3),
               "events": len(res.events), "peak_rss_mb": round(hwm_mb()),
               "pid": os.getpid()})  # fmt: skip
    conn.close()


def broker(messages: int, size: int, records: int) -> dict[str, Any]:
    """Stage 4: a 3-server R3 cluster stores ``messages`` of ``size`` bytes."""
    from testbed.brokerbench import bench_nats

    with tempfile.TemporaryDirectory(prefix="qpmesh-fleet-broker-") as tmp:
        r = bench_nats(Path(tmp), 3, messages, size, 64)
    return {"engine": r.engine, "messages": r.messages, "message_bytes": size,
            "records_per_message": records, "msg_per_s": round(r.msg_per_s, 1),
            "server_cpu_us_per_msg": round(r.server_cpu_us_per_msg, 1),
            "server_cpu_us_per_record": round(r.server_cpu_us_per_msg / records, 4)}  # fmt: skip


def summarize(parts: Mapping[str, Any]) -> dict[str, Any]:
    """The report's headline fields from the stages' figures (missing stages: None)."""
    wk, det = parts.get("worker"), parts.get("detection")
    clk, brk, eq = parts.get("clocks"), parts.get("broker"), parts.get("equivalence")
    solver: dict[str, Any] = {"window_seconds": None, "max_rss_mb": None}
    if det is not None and clk is not None:
        stages = {"merge_s": det["merge_s"], "judge_s": det["judge_s"],
                  "fold_s": clk["fold_cpu_s_per_window"], "summary_s": clk["summary_cpu_s"],
                  "fit_and_solve_s": clk["fit_and_solve_cpu_s"]}  # fmt: skip
        if clk.get("owners"):  # the fold, the summary and the per-edge stages: the owners'
            own = clk["owners"]

            def owner_s(o: Mapping[str, Any]) -> float:
                return float(o["fold_cpu_s_per_window"] + o["summary_cpu_s"] + o["stages_cpu_s"])

            solver["edges"] = {
                "owners": own, "split_s_per_window": clk["split_cpu_s_per_window"],
                "max_owner_window_seconds": round(max(owner_s(o) for o in own), 3),
                "total_cpu_s": round(sum(owner_s(o) for o in own), 3),
                "stage_rounds": clk["stage_rounds"],
                "stages_critical_s": clk["stages_critical_cpu_s"],
            }  # fmt: skip
            every_k = ClockSyncConfig().solve_every_ns // WINDOW_NS
            solver["edges"]["sustained_cores"] = round(  # the split (workers') and all owners
                clk["split_cpu_s_per_window"]
                + sum(o["fold_cpu_s_per_window"] for o in own)
                + sum(o["summary_cpu_s"] + o["stages_cpu_s"] for o in own) / every_k,
                3,
            )
            stages = {"merge_s": det["merge_s"], "judge_s": det["judge_s"],
                      "network_s": clk["network_cpu_s"]}  # fmt: skip
        every = ClockSyncConfig().solve_every_ns // WINDOW_NS  # windows per clock solve
        solve = (stages.get("summary_s", 0.0) + stages.get("network_s", 0.0)
                 + stages.get("fit_and_solve_s", 0.0))  # fmt: skip
        amortized = sum(stages.values()) - solve + solve / every
        solver |= {"window_seconds": round(sum(stages.values()), 3), **stages,
                   "windows_per_clock_solve": every,
                   "amortized_window_seconds": round(amortized, 3),
                   "max_rss_mb": det["peak_rss_mb"] + clk["fit_and_solve_peak_rss_mb"]
                   if clk.get("owners")
                   else max(det["peak_rss_mb"], clk["fold_peak_rss_mb"],
                            clk["summary_peak_rss_mb"], clk["fit_and_solve_peak_rss_mb"]),
                   "detection_peak_rss_mb": det["peak_rss_mb"],
                   "clock_peak_rss_mb": clk["fit_and_solve_peak_rss_mb"],
                   "offset_err_p99_ns": clk["offset_err_p99_ns"],
                   "known_nics": clk["known_nics"]}  # fmt: skip
    rate = wk["records_per_core_second"] if wk else None
    cores = None
    if rate and brk is not None and solver["window_seconds"] is not None:
        per_rec = brk["server_cpu_us_per_record"] * 1e-6 + 1.0 / rate
        edge = solver["edges"]["sustained_cores"] if "edges" in solver else 0.0
        cores = {"broker": round(FLEET_RECORDS_PER_S * brk["server_cpu_us_per_record"] * 1e-6, 1),
                 "workers": round(FLEET_RECORDS_PER_S / rate, 1),
                 "solver": round(solver["amortized_window_seconds"], 1),
                 "total": round(FLEET_RECORDS_PER_S * per_rec + solver["amortized_window_seconds"]
                                + edge, 1)}  # fmt: skip
        if "edges" in solver:
            cores["edge_owners"] = round(edge, 1)
    equivalent = eq["equivalent"] if eq is not None else None
    met = {
        "solver_window_seconds": _le(solver["window_seconds"], TARGETS["solver_window_seconds"]),
        "solver_max_rss_mb": _le(solver["max_rss_mb"], TARGETS["solver_max_rss_mb"]),
        "worker_records_per_core_second": None if rate is None
        else rate >= TARGETS["worker_records_per_core_second"],
        "equivalent": equivalent,
    }  # fmt: skip
    return {
        "solver": solver,
        "worker": {"records_per_core_second": rate} | ({k: v for k, v in wk.items()} if wk else {}),
        "broker": brk,
        "cores_for_64M_records_per_second": cores["total"] if cores else None,
        "cores": cores,
        "equivalent": equivalent,
        "equivalence": eq,
        "targets": TARGETS,
        "met": met,
    }


def _le(v: float | None, limit: float) -> bool | None:
    return None if v is None else v <= limit


def run(args: argparse.Namespace, progress: Progress, parts: dict[str, Any]) -> None:
    """Run the stages in order, filling ``parts`` (so an interrupted run keeps the done)."""
    from testbed.sim.fleet_equiv import check

    progress("equivalence: one controller vs 3 workers + a solver, 32 NICs")
    parts["equivalence"] = check().to_dict()
    progress(f"equivalent: {parts['equivalence']['equivalent']}")
    parts["worker"] = worker_stage(args.nics, args.peers, args.worker_rate_hz, args.windows,
                                   args.partitions, args.seed, progress)  # fmt: skip
    progress(f"clocks: synthetic partials at {args.nics} NICs x {args.peers} peers")
    release_heap()  # before the detection stage's traffic: the clock stage's peak is its own
    parts["clocks"] = clockbench.run(args.nics, args.peers, args.seed, owners=args.edge_owners)
    release_heap()
    parts["detection"] = detection_stage(args.nics, args.peers, args.rate_hz, args.workers,
                                         args.seed, progress)  # fmt: skip
    if args.broker_messages > 0:
        bpr = parts["worker"]["bytes_per_record"] or 40.0
        size = min(1 << 20, round(bpr * RECORDS_PER_HOST_BATCH))
        progress(f"broker: 3-server JetStream R3, {args.broker_messages} x {size} B")
        try:
            parts["broker"] = broker(args.broker_messages, size,
                                     round(size / bpr))  # fmt: skip
        except (OSError, RuntimeError) as exc:
            progress(f"broker: not measured: {exc}")
            parts["broker"] = None


def _cmd(args: argparse.Namespace) -> int:
    bad = (args.nics < 64 or args.peers < 2 or args.workers < 1 or args.windows < 1
           or args.partitions < 1 or not 0 < args.rate_hz <= 100
           or not 0 <= args.edge_owners <= args.nics
           or not 0 < args.worker_rate_hz <= 100 or args.broker_messages < 0)  # fmt: skip
    if bad:
        print("qpmesh sim fleet: need --nics >= 64, --peers >= 2, --workers >= 1, --windows >= 1, "
              "--partitions >= 1, rates in (0, 100] Hz, --broker-messages >= 0, "
              "0 <= --edge-owners <= --nics", file=sys.stderr)  # fmt: skip
        return 2

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    parts: dict[str, Any] = {}
    t0 = time.monotonic()
    with interruptible() as stop:
        run(args, progress, parts)
    report = summarize(parts) | {"nics": args.nics, "peers": args.peers,
                                 "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    return finish(stop, report, as_json=args.json, show=_show)


def _show(r: Mapping[str, Any]) -> None:
    s = r["solver"]
    print(f"solver: {s['window_seconds']} CPU s per window, peak RSS {s['max_rss_mb']} MB")
    if s.get("edges"):
        e = s["edges"]
        print(f"edge owners: {len(e['owners'])}, the busiest {e['max_owner_window_seconds']} "
              f"CPU s per solve window, {e['total_cpu_s']} in all")  # fmt: skip
    print(f"worker: {r['worker']['records_per_core_second']} records per core-second")
    print(f"cores for 64 M records/s: {r['cores_for_64M_records_per_second']} ({r['cores']})")
    print(f"equivalent: {r['equivalent']}")
    print("met: " + ", ".join(f"{k} {v}" for k, v in r["met"].items()))


def register_fleet(ssub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh sim fleet``."""
    p = ssub.add_parser(
        "fleet",
        help="what a fleet of N NICs costs: broker, workers, solver (issue 29 item 6)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nics", type=int, default=10_000, help="NICs (default %(default)s)")
    p.add_argument("--peers", type=int, default=32, help="peers a NIC probes (default %(default)s)")
    p.add_argument(
        "--rate-hz",
        type=float,
        default=0.5,
        help="coded pairs a second per peer of the whole topology's traffic, whose window "
        "the solver merges and judges (reduced; default %(default)s)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=3,
        help="workers the whole topology's hosts are split over (default %(default)s)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=64,
        help="the worker stage's core owns one partition of this many: every such host "
        "of the whole topology (default %(default)s)",
    )
    p.add_argument(
        "--worker-rate-hz",
        type=float,
        default=10.0,
        help="its coded pairs a second per peer (the full rate: 8 NICs x 32 peers x 20 "
        "probes = 5,120 records a host batch; default %(default)s)",
    )
    p.add_argument(
        "--windows",
        type=int,
        default=2,
        help="1 s windows the worker stage times after a warm-up one (default %(default)s)",
    )
    p.add_argument(
        "--broker-messages",
        type=int,
        default=200,
        help="batches the broker stage stores (0: skip it; default %(default)s)",
    )
    p.add_argument(
        "--edge-owners",
        type=int,
        default=4,
        help="edge owners that fold and summarize the clock parts, measured apart from the "
        "solver (0: the solver does; default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd)


__all__ = ["detection_stage", "fleet_shape", "register_fleet", "run", "summarize", "worker_stage"]
