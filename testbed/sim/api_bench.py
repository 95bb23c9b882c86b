"""``qpmesh sim api-bench``: what serving the API costs a controller under full ingest.

A simulated fabric (default 1,024 NICs) gives probe batches, split per host as the probers
publish them; the controller core takes them as `qpmesh controller` does (each admitted on
arrival, queued, ingested merged when the queue is due: `controller.coalesce`, the default
``[ingest]``; decoding the MQTT payloads is not timed here, `sim ingest` times it) as fast as
it can on this thread, with ``tick`` every ``tick_s`` of wall time. Each repeat has its own controller, API process and clients and
runs ``duration_s`` of each of two modes in alternating phases of ~``phase_s`` (no API, API,
no API, ...: a busy machine's load drifts alike over both, which separate runs minutes
apart do not see):

- **no API** (the baseline): ingest and tick only; nothing is published to the API process
  and nobody asks it anything (it and the clients sit idle, using no CPU);
- **API**: as `qpmesh controller` does with ``[api]``: the API is served by its own process
  (`controller.api.process.ApiProcess`, the same as the service's `ApiRuntime` starts), after
  every tick the snapshot and new events are handed to it (its writer thread pickles and
  sends them); one client process (`testbed.sim.api_bench_clients`, at nice 19: those
  readers stand for remote users, whose CPU is not the controller host's, but here they share
  its cores) keeps ``clients`` websockets open (each receives every coalesced snapshot, at
  most 4/s) and another (not niced) times ``GET /api/v1/snapshot`` (``poll_hz`` per second,
  latency = request to last byte).

The first pass over the simulated batches (which creates every flow) is an untimed warm-up;
clock solves run between the timed calls, untimed (the service runs them in a worker thread;
inline, a solve of several seconds landed in whichever phase was running and swamped the
ratio);
batches are then replayed in cycles (stamps shifted, sequence numbers raised, outside the timed
ingest calls) so a run can last longer than the simulated traffic. The ingest rate is records
per wall second spent in the ingest, tick and publish calls (wall, not CPU: the API's
threads and processes take cores and the interpreter lock from them, which is the cost to
measure); the ratio API/no-API is the figure that survives a busy machine. CPU rates divide
by the ingest thread's and the whole ingest process's CPU time (the latter includes the
writer thread that pickles snapshots for the API); the API and client processes' CPU is
reported beside. Returns JSON-ready figures with medians over repeats.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from contract.documents import EventDoc
from contract.interrupt import finish, interruptible
from contract.records import COLUMNS, ProbeBatch
from controller.api.app import ApiOptions
from controller.api.auth import Principal, TokenTable
from controller.api.config import ApiConfig
from controller.api.feed import SharedState
from controller.api.process import ApiProcess
from controller.coalesce import CoalesceConfig, ProbeQueue
from controller.live import LiveConfig, LiveController
from mesh.fabric import Fabric, FabricShape, build_fabric
from testbed.sim.engine import SimConfig, Simulator
from testbed.sim.ingest_traffic import split_hosts


def _host_batches(fabric: Fabric, batches: list[ProbeBatch]) -> list[ProbeBatch]:
    """The steps' batches split per host, as the hosts' probers publish them
    (`testbed.sim.ingest_traffic.split_hosts`), in step order."""
    out: list[ProbeBatch] = []
    for b in batches:
        cols = {name: getattr(b, name) for name, _ in COLUMNS}
        out += split_hosts(fabric, b.nic_ids, cols, b.batch_seq, b.stamp)[0]
    return out


def _cycles(batches: list[ProbeBatch], span_ns: int) -> Iterator[ProbeBatch]:
    """The batches again and again, stamps shifted by ``span_ns`` and sequence numbers raised
    per cycle, so the controller sees new traffic, never duplicates."""
    k = 0
    while True:
        shift = k * span_ns
        for b in batches:
            if k == 0:
                yield b
                continue
            yield dataclasses.replace(
                b, batch_seq=b.batch_seq + k * 1_000_000, t1=b.t1 + shift, t2=b.t2 + shift,
                t3=b.t3 + shift, t4=b.t4 + shift,
            )  # fmt: skip
        k += 1


class _Feed:
    """Host batches into the controller as `qpmesh controller` takes them: each admitted on
    arrival (duplicate and replay checks), queued, and ingested merged when the queue is due
    (`controller.coalesce.ProbeQueue`, the service's default ``[ingest]``; wall time)."""

    def __init__(self, live: LiveController, config: CoalesceConfig) -> None:
        self.live, self.queue = live, ProbeQueue(config)

    def take(self, batch: ProbeBatch, now_ns: int) -> int:
        """Take one host batch; return the records ingested now (a due queue's)."""
        live, queue = self.live, self.queue
        wall = time.time_ns()  # UNIX time, as the service's clock (admission checks it)
        live.admit(batch, wall, queue=queue)  # queued on the wall clock, ingested on now_ns
        return live.flush(queue, now_ns) if queue.due(wall) else 0


@dataclasses.dataclass
class IngestRun:
    """One timed ingest: records, wall seconds in ingest + tick, ticks, publish seconds."""

    records: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    process_cpu_s: float = 0.0
    ticks: int = 0
    publish_s: float = 0.0

    def add(self, other: IngestRun) -> None:
        """Add ``other``'s figures to these."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def rate(self) -> float:
        """Records per wall second of ingest + tick (+ publish, when the API is on)."""
        return self.records / max(self.busy_s, 1e-9)

    @property
    def cpu_rate(self) -> float:
        """Records per CPU second of the ingest thread (no waiting for the GIL or a core)."""
        return self.records / max(self.cpu_s, 1e-9)

    @property
    def process_cpu_rate(self) -> float:
        """Records per CPU second of the whole ingest process over the run (every thread)."""
        return self.records / max(self.process_cpu_s, 1e-9)


def _ingest(
    feed: _Feed,
    source: Iterator[ProbeBatch],
    duration_s: float,
    tick_s: float,
    publish: Callable[[LiveController, list[EventDoc]], None] | None,
) -> IngestRun:
    run = IngestRun()
    live = feed.live
    pc = time.perf_counter
    p0, untimed = _process_cpu(), 0.0
    end = pc() + duration_s
    next_tick = pc() + tick_s
    while pc() < end:
        u0 = time.thread_time()
        batch = next(source)  # shifting a replayed batch is not ingest: untimed
        job = live.start_solve(live.now_ns)
        if job is not None:  # the service solves in a worker thread: not ingest, untimed
            live.install_clock(job())
        now = int(batch.t4.max()) if len(batch) else live.now_ns
        t0, c0 = pc(), time.thread_time()
        untimed += c0 - u0
        run.records += feed.take(batch, now)
        if pc() >= next_tick:
            new = live.tick(live.now_ns)
            run.ticks += 1
            if publish is not None:
                t1 = pc()
                publish(live, new)
                run.publish_s += pc() - t1
            next_tick += tick_s
        run.busy_s += pc() - t0
        run.cpu_s += time.thread_time() - c0
    run.process_cpu_s = _process_cpu() - p0 - untimed
    return run


def _process_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _publisher(api: ApiProcess) -> Callable[[LiveController, list[EventDoc]], None]:
    """What the service does after a tick with ``[api]``: the snapshot and new events to the
    API process (`controller.api.runtime.ApiRuntime.publish`)."""

    def publish(live: LiveController, new: list[EventDoc]) -> None:
        api.publish(live.snapshot(), tuple(new), None)

    return publish


WS_NICE = 19


def _no_writes(op: str, args: tuple[Any, ...]) -> Any:
    raise RuntimeError("the benchmark accepts no writes")


def _clients(
    url: str, token: str, clients: int, poll_hz: float, compress: bool, nice: int = 0
) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "testbed.sim.api_bench_clients", url, token, str(clients),
           str(poll_hz), "1" if compress else "0", str(nice)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip


def _command(proc: subprocess.Popen[str], line: str) -> None:
    """Send a clients process ``pause`` or ``resume`` and wait for its ``ok``."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    if proc.stdout.readline().strip() != "ok":
        raise RuntimeError(f"bench clients did not take {line!r}")


def _pct(v: list[float], q: float) -> float | None:
    return float(np.percentile(v, q)) if v else None


def run_api_bench(
    *,
    nics: int = 1024,
    sim_s: float = 4.0,
    step_s: float = 0.5,
    duration_s: float = 20.0,
    repeats: int = 3,
    clients: int = 20,
    poll_hz: float = 20.0,
    tick_s: float = 1.0,
    phase_s: float = 5.0,
    seed: int = 1,
    compress: bool = True,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Return the figures (see the module docstring). Raises ValueError on bad arguments,
    RuntimeError if the client process fails."""
    if (nics < 2 or min(sim_s, duration_s, tick_s, phase_s) <= 0 or repeats < 1
            or clients < 0):  # fmt: skip
        raise ValueError(
            "nics >= 2, sim_s, duration_s, tick_s, phase_s > 0, repeats >= 1, clients >= 0"
        )
    fabric = build_fabric(FabricShape.for_nics(nics))
    t0 = time.perf_counter()
    steps = [st.batch for st in Simulator(fabric, SimConfig(seed=seed)).run(sim_s, step_s)]
    batches = _host_batches(fabric, steps)
    log(f"simulated {sim_s:g} s of {nics} NICs in {time.perf_counter() - t0:.1f} s "
        f"({sum(len(b) for b in batches)} records in {len(batches)} host batches)")  # fmt: skip
    span_ns = int(sim_s * 1e9)
    coalesce = CoalesceConfig()  # the service's default [ingest]
    token = secrets.token_urlsafe(18)
    tokens = TokenTable({token: Principal("operator", "bench")})
    config = ApiConfig("127.0.0.1", 0, tokens, ApiOptions(rate_per_s=1e6, burst=1e6))
    off: list[IngestRun] = []
    on: list[IngestRun] = []
    lat: list[list[float]] = []
    client_stats: list[dict[str, Any]] = []
    side_cpu: list[dict[str, float]] = []
    for r in range(repeats):
        live = LiveController(
            fabric, LiveConfig(solve_inline=False, wait_ns=0)
        )  # windows on the grid: a replay
        feed = _Feed(live, coalesce)
        source = _cycles(batches, span_ns)
        for _ in batches:  # untimed warm-up: the first pass creates every flow
            b = next(source)
            feed.take(b, int(b.t4.max()) if len(b) else live.now_ns)
        live.flush(feed.queue, live.now_ns)
        live.tick(live.now_ns)
        api = ApiProcess(config, fabric, live.snapshot(), SharedState, handle=_no_writes)
        port = api.start()
        procs: list[subprocess.Popen[str]] = []
        try:
            api.wait_ready()
            url = f"http://127.0.0.1:{port}/api/v1/"
            # the websockets (niced: their readers stand for remote users, whose CPU is not
            # the controller host's), then the poller (not niced: its latency is measured)
            for n, hz, nice in ((clients, 0.0, WS_NICE), (0, poll_hz, 0)):
                procs.append(_clients(url, token, n, hz, compress, nice))
                ready = procs[-1].stdout.readline() if procs[-1].stdout else ""
                if not ready.startswith("ready"):
                    raise RuntimeError(f"bench clients did not start: {ready.strip()!r}")
            poller = procs[1]
            _command(poller, "pause")
            assert api.proc is not None
            pids = [api.proc.pid, *(p.pid for p in procs)]
            run_off, run_on = IngestRun(), IngestRun()
            cpu, w0, sent0 = [0.0, 0.0, 0.0], api.publish_s, api.sent
            phases = max(1, round(duration_s / phase_s))
            for k in range(2 * phases):  # off, on, off, on, ...: the load drifts alike
                if k % 2 == 0:
                    run_off.add(_ingest(feed, source, duration_s / phases, tick_s, None))
                    continue
                _command(poller, "resume")
                c0 = [_proc_cpu_s(p) for p in pids]
                run_on.add(_ingest(feed, source, duration_s / phases, tick_s, _publisher(api)))
                cpu = [a + _proc_cpu_s(p) - b for a, p, b in zip(cpu, pids, c0, strict=True)]
                _command(poller, "pause")
            off.append(run_off)
            on.append(run_on)
            side_cpu.append({
                "api_process_cpu_s": cpu[0],
                "clients_process_cpu_s": cpu[1] + cpu[2],
                "feed_writer_cpu_s": api.publish_s - w0,
                "snapshots_sent": api.sent - sent0,
            })  # fmt: skip
            docs = []
            for p in reversed(procs):  # the poller asks /health while the websockets are open
                out, _ = p.communicate("stop\n", timeout=120)
                docs.append(json.loads(out.strip().splitlines()[-1]))
            poll_doc, ws_doc = docs
            doc = {**ws_doc, "latencies_s": poll_doc["latencies_s"],
                   "ws_clients": poll_doc["ws_clients"],
                   "errors": ws_doc["errors"] + poll_doc["errors"]}  # fmt: skip
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            api.stop()
        log(f"repeat {r + 1}: no API {off[-1].rate / 1e6:.3f} M records/s")
        lat.append(doc.pop("latencies_s"))
        client_stats.append(doc)
        log(f"repeat {r + 1}: API {on[-1].rate / 1e6:.3f} M records/s, snapshot p99 "
            f"{(_pct(lat[-1], 99) or 0) * 1e3:.1f} ms over {len(lat[-1])} requests, "
            f"{doc['ws_messages']} websocket messages")  # fmt: skip
    rate_off = [x.rate for x in off]
    rate_on = [x.rate for x in on]
    ratios = [b / a for a, b in zip(rate_off, rate_on, strict=True)]
    p99 = [(_pct(v, 99) or float("nan")) * 1e3 for v in lat]
    p50 = [(_pct(v, 50) or float("nan")) * 1e3 for v in lat]
    return {
        "nics": nics,
        "host_batches_per_step": len(batches) // max(len(steps), 1),
        "records_per_host_batch": round(sum(len(b) for b in batches) / max(len(batches), 1)),
        "coalesce_ms": coalesce.coalesce_ms,
        "coalesce_max_records": coalesce.max_records,
        "duration_s": duration_s,
        "repeats": repeats,
        "clients": clients,
        "tick_s": tick_s,
        "phase_s": duration_s / max(1, round(duration_s / phase_s)),
        "ws_compress": compress,
        "ws_clients": statistics.median([d["ws_clients"] for d in client_stats]),
        "ingest_cpu_no_api_records_per_s": statistics.median([x.cpu_rate for x in off]),
        "ingest_cpu_api_records_per_s": statistics.median([x.cpu_rate for x in on]),
        "ingest_process_cpu_no_api_records_per_s": statistics.median(
            [x.process_cpu_rate for x in off]
        ),
        "ingest_process_cpu_api_records_per_s": statistics.median([x.process_cpu_rate for x in on]),
        "api_process_cpu_share": statistics.median(
            [c["api_process_cpu_s"] / duration_s for c in side_cpu]
        ),
        "clients_process_cpu_share": statistics.median(
            [c["clients_process_cpu_s"] / duration_s for c in side_cpu]
        ),
        "ingest_no_api_records_per_s": statistics.median(rate_off),
        "ingest_api_records_per_s": statistics.median(rate_on),
        "api_over_no_api": statistics.median(ratios),
        "api_cost_percent": 100 * (1 - statistics.median(ratios)),
        "snapshot_p99_ms": statistics.median(p99),
        "snapshot_p50_ms": statistics.median(p50),
        "snapshot_requests": sum(len(v) for v in lat),
        "publish_ms_per_tick": statistics.median([1e3 * x.publish_s / max(x.ticks, 1) for x in on]),
        "feed_writer_ms_per_snapshot": statistics.median(
            [1e3 * c["feed_writer_cpu_s"] / max(c["snapshots_sent"], 1) for c in side_cpu]
        ),
        "per_repeat": {
            "no_api": rate_off,
            "api": rate_on,
            "ratio": ratios,
            "p99_ms": p99,
            "p50_ms": p50,
            "clients": client_stats,
            "cpu": side_cpu,
        },
        "targets": {"ingest_records_per_s": 1e6, "snapshot_p99_ms": 50.0, "api_cost_percent": 10},
    }


def _cmd(args: Any) -> int:
    res: dict[str, Any] | None = None
    with interruptible() as stop:  # the figures come at the end: none if stopped before
        res = run_api_bench(
            nics=args.nics, sim_s=args.sim_seconds, duration_s=args.duration,
            repeats=args.repeats, clients=args.clients, poll_hz=args.poll_hz, tick_s=args.tick,
            phase_s=args.phase, seed=args.seed, compress=not args.no_ws_compress,
            log=lambda m: print(f"api-bench: {m}", file=sys.stderr, flush=True),
        )  # fmt: skip
    return finish(stop, res, as_json=args.json, show=_show)


def _show(res: Mapping[str, Any]) -> None:
    print(
        f"{res['nics']} NICs, {res['clients']} websocket clients: ingest "
        f"{res['ingest_api_records_per_s'] / 1e6:.3f} M records/s with the API vs "
        f"{res['ingest_no_api_records_per_s'] / 1e6:.3f} M without "
        f"(x{res['api_over_no_api']:.3f}, API costs {res['api_cost_percent']:.1f}%); "
        f"snapshot p50 {res['snapshot_p50_ms']:.1f} ms, p99 {res['snapshot_p99_ms']:.1f} ms; "
        f"{res['ws_clients']:g} websocket clients attached"
    )


def register_api_bench(ssub: Any) -> None:
    """Register ``qpmesh sim api-bench``."""
    p = ssub.add_parser(
        "api-bench",
        help="what serving the API (20 websockets, snapshot polling) costs full-rate ingest",
        description="Ingest simulated probe batches as fast as possible with and without the "
        "HTTP API served by its own process as qpmesh controller serves it (websocket clients "
        "and a snapshot poller in a third process); reports both ingest rates, their ratio, "
        "the snapshot latency p50/p99, the websocket clients attached and the CPU rates.",
    )
    p.add_argument("--nics", type=int, default=1024, help="NICs (default %(default)s)")
    p.add_argument("--sim-seconds", type=float, default=4.0,
                   help="simulated traffic, replayed in cycles (default %(default)s)")  # fmt: skip
    p.add_argument("--duration", type=float, default=20.0,
                   help="wall seconds of ingest per repeat with the API, and as many without "
                   "(default %(default)s)")  # fmt: skip
    p.add_argument("--phase", type=float, default=5.0,
                   help="the duration is run in phases of about this many s, alternating "
                   "without and with the API (default %(default)s)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3,
                   help="repeats, each with its own controller, API process and clients "
                   "(default %(default)s)")  # fmt: skip
    p.add_argument("--clients", type=int, default=20, help="websocket clients (default 20)")
    p.add_argument("--poll-hz", type=float, default=20.0,
                   help="GET /snapshot per second to time (default %(default)s)")  # fmt: skip
    p.add_argument("--tick", type=float, default=1.0,
                   help="controller tick in wall s: detection + API publish (default 1)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="simulator seed (default 1)")
    p.add_argument("--no-ws-compress", action="store_true",
                   help="clients do not offer permessage-deflate (the server then sends "
                   "snapshots uncompressed)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd)
