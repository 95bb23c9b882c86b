"""Time series against a real server: Debian's victoria-metrics (InfluxDB v2 write API).

The ``vm`` fixture starts victoria-metrics on a free loopback port with its own temporary
storage directory and stops it by PID (also when the test fails). Points written through
`TsdbWriter` (influxdb-client) are read back with ``/api/v1/export`` and compared line by
line with what the controller produced: none may be missing, also across a 30 s outage.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.timeseries.recorder import TimeseriesRecorder
from controller.timeseries.writer import TsdbWriter
from mqttlink.reconnect import Backoff
from testbed.sim.demo_runner import DemoRunner, demo_scenario
from tests.servers import free_port

VM = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
EPOCH_S = 1_700_000_000


class VictoriaMetrics:
    """One private victoria-metrics process: ``start()``, ``stop()`` (by PID), queries."""

    def __init__(self, storage: Path, log: Path) -> None:
        self.storage = storage
        self.log = log
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int | None = None, timeout_s: float = 30.0) -> None:
        """Start on ``port`` (default: a free one; a lost race retries with another)."""
        for _ in range(5):
            self.port = port or free_port()
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    [
                        VM,
                        f"-storageDataPath={self.storage}",
                        f"-httpListenAddr=127.0.0.1:{self.port}",
                        "-retentionPeriod=100y",  # the simulator's epoch is in 2023
                        "-search.latencyOffset=0s",
                        "-search.disableCache",
                        "-loggerLevel=ERROR",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"{self.url}/health", timeout=1) as r:
                        if r.status == 200:
                            return
                except OSError:
                    time.sleep(0.1)
            self.stop()
            if port is not None:
                time.sleep(1.0)  # same port wanted (restart): wait for it to free up
        raise RuntimeError(f"victoria-metrics did not start; see {self.log}")

    def stop(self) -> None:
        """Stop the process by its PID (SIGTERM, then SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None

    def get(self, path: str, **params: Any) -> bytes:
        q = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=60) as r:
            return bytes(r.read())

    def flush(self) -> None:
        """Make everything ingested searchable."""
        self.get("/internal/force_flush")

    def export(self, match: str = '{__name__=~"qpmesh_.*"}') -> list[dict[str, Any]]:
        self.flush()
        end = str(int(time.time()) + 86_400)  # the demo's sim time can run ahead of now
        body = self.get("/api/v1/export", **{"match[]": match, "start": "0", "end": end})
        return [json.loads(ln) for ln in body.splitlines() if ln.strip()]

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[Any]:
        doc = json.loads(
            self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)
        )
        assert doc["status"] == "success", doc
        return list(doc["data"]["result"])


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    """A private victoria-metrics on a free loopback port; stopped by PID at the end."""
    if not Path(VM).exists():
        pytest.skip("victoria-metrics not installed (.ci/setup installs it)")
    server = VictoriaMetrics(tmp_path / "vm-data", tmp_path / "vm.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---- expected samples from the line protocol we produced ---------------------------------
def _unescape_split(s: str, sep: str) -> list[str]:
    out, cur, esc = [], "", False
    for ch in s:
        if esc:
            cur += ch
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == sep:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def expected_samples(
    bodies: list[bytes],
) -> dict[tuple[str, frozenset[tuple[str, str]], int], float]:
    """Return {(metric name, labels, timestamp ms): value} for every field of every line."""
    out: dict[tuple[str, frozenset[tuple[str, str]], int], float] = {}
    for body in bodies:
        for line in body.decode().splitlines():
            head, fields, t = _unescape_split(line, " ")
            meas, *tags = _unescape_split(head, ",")
            labels = frozenset(tuple(kv.split("=", 1)) for kv in tags)
            for kv in fields.split(","):
                k, v = kv.split("=", 1)
                val = float(v[:-1]) if v.endswith("i") else float(v)
                out[(f"{meas}_{k}", labels, int(t) // 1_000_000)] = val  # type: ignore[misc]
    return out


def exported_samples(
    rows: list[dict[str, Any]],
) -> Counter[tuple[str, frozenset[tuple[str, str]], int]]:
    got: Counter[tuple[str, frozenset[tuple[str, str]], int]] = Counter()
    values: dict[tuple[str, frozenset[tuple[str, str]], int], float] = {}
    for row in rows:
        m = dict(row["metric"])
        name = m.pop("__name__")
        labels = frozenset(m.items())
        for ts, v in zip(row["timestamps"], row["values"], strict=True):
            got[(name, labels, int(ts))] += 1
            values[(name, labels, int(ts))] = float(v)
    exported_samples.values = values  # type: ignore[attr-defined]
    return got


def assert_none_missing(bodies: list[bytes], server: VictoriaMetrics) -> int:
    want = expected_samples(bodies)
    got = exported_samples(server.export())
    values = exported_samples.values  # type: ignore[attr-defined]
    missing = [k for k in want if got[k] < 1]
    assert not missing, f"{len(missing)} of {len(want)} samples missing, e.g. {missing[:3]}"
    for k, v in want.items():
        assert math.isclose(values[k], v, rel_tol=1e-9, abs_tol=1e-9), (k, values[k], v)
    return len(want)


def _run_demo(
    writer_sink: Any,
    seconds: float,
    *,
    interval_s: float = 2.0,
    pace_s: float = 0.0,
    during: Any = None,
) -> tuple[DemoRunner, TimeseriesRecorder, list[bytes]]:
    """Play the demo scenario (flap, contention, NIC down) for ``seconds`` simulated seconds,
    recording time series; return the runner, recorder and every body produced."""
    runner = DemoRunner(demo_scenario(None, nics=None, seed=7), step_s=0.5)
    bodies: list[bytes] = []

    def sink(body: bytes) -> None:
        bodies.append(body)
        writer_sink(body)

    rec = TimeseriesRecorder(runner.fabric, sink, interval_ns=int(interval_s * 1e9))
    runner.record_to(rec)  # as the demo does: its remediation actions are written too
    while runner.t_s < seconds - 1e-9:
        runner.step()  # observations, events, verdicts and intervals reach the recorder
        if during is not None:
            during(runner, rec)
        if pace_s:
            time.sleep(pace_s)  # the outage test: intervals keep coming while the server is down
    return runner, rec, bodies


# ---- tests --------------------------------------------------------------------------------
def test_round_trip_through_influxdb_client_loses_nothing(vm: VictoriaMetrics) -> None:
    w = TsdbWriter(vm.url, org="o", bucket="b", token="t", batch_bytes=256 * 1024)
    try:
        _, rec, bodies = _run_demo(w.offer, 30.0)
        assert w.flush(120.0), w.stats()
    finally:
        w.close(5.0)
    n = assert_none_missing(bodies, vm)
    assert n > 10_000 and rec.intervals == 14
    st = w.stats()
    assert st.dropped_lines == 0 and st.rejected_lines == 0
    assert st.written_lines == sum(b.count(b"\n") for b in bodies)


@pytest.mark.slow
def test_nothing_lost_across_a_30s_server_outage(vm: VictoriaMetrics) -> None:
    w = TsdbWriter(vm.url, backoff=Backoff(0.2, 2.0), timeout_s=5.0)
    state: dict[str, float] = {}

    def outage(runner: DemoRunner, rec: TimeseriesRecorder) -> None:
        if runner.t_s >= 10.0 and "down" not in state:
            vm.stop()
            state["down"] = time.monotonic()
        if "down" in state and "up" not in state and time.monotonic() - state["down"] >= 30.0:
            vm.start(vm.port)  # same port and storage: the writer's URL stays valid
            state["up"] = time.monotonic()

    try:
        # paced: 100 steps of >= 0.5 s wall; the 30 s outage starts at step 20
        _, _rec, bodies = _run_demo(w.offer, 50.0, pace_s=0.5, during=outage)
        assert "up" in state
        assert w.flush(180.0), w.stats()
    finally:
        w.close(5.0)
    st = w.stats()
    assert st.failures >= 1, "the outage was not noticed"
    assert st.dropped_lines == 0 and st.rejected_lines == 0
    assert_none_missing(bodies, vm)


# ---- the Grafana dashboard ----------------------------------------------------------------
DASHBOARD = Path(__file__).parent.parent / "docs" / "grafana" / "qpmesh-dashboard.json"
FLAP = "leaf1-spine2"  # the demo scenario's flapping link
LEAF1 = {f"nic{i}" for i in range(8, 16)} | {f"host{i}" for i in range(8, 16)}
LEAF2 = {f"nic{i}" for i in range(16, 24)}


def _has(key: str, pred: Any) -> Any:
    return lambda series: any(pred(s["metric"].get(key, "")) for s in series)


# What each panel and annotation must show for the faulted run (by title / name). A panel
# without an entry fails the test: a new panel needs its expectation here.
NIC_DOWN = "nic27"  # the scenario's failed NIC
EXPECT: dict[str, Any] = {
    "Mesh heatmap: one-way delay p99 by source NIC": _has("src", LEAF1.__contains__),
    "Delay matrix: latest p99 one-way delay (src x dst)": _has("src", LEAF1.__contains__),
    # contention on leaf2->spine1: the worst queue pairs start on leaf2
    "Worst queue pairs: p99 queueing delay over the path baseline": _has("src", LEAF2.__contains__),
    "Switch paths: p99 one-way delay (top 10)": _has("path", lambda p: "leaf2>spine1" in p),
    # the links the brain blamed: the flapping one and the failed NIC's, not every link
    # their lost probes crossed
    "Loss per link the brain blames (degraded, flapping, down)": lambda series: (
        FLAP in {s["metric"]["link"] for s in series}
        and {s["metric"]["link"] for s in series} <= {FLAP, f"{NIC_DOWN}-leaf3"}
    ),
    "Loss per switch path": _has("path", lambda p: "leaf1>spine2" in p or "spine2>leaf1" in p),
    "Flaps per link": _has("link", FLAP.__eq__),
    "Link states, worst in each step (1 unknown, 2 degraded, 3 contended, 4 flapping, 5 down)": (
        lambda series: any(
            s["metric"]["link"] == FLAP and float(s["values"][-1][1]) >= 4 for s in series
        )
    ),
    "Clock offsets": _has("nic", LEAF1.__contains__),
    "Clock uncertainty": _has("nic", LEAF1.__contains__),
    "Prober presence": _has("host", LEAF1.__contains__),
    "NICs not up, worst in each step (1 unknown, 2+ unhealthy)": lambda series: any(
        s["metric"]["nic"] == NIC_DOWN and float(s["values"][-1][1]) == 5 for s in series
    ),
    "GPU health": _has("host", LEAF1.__contains__),
    "Probers present": lambda series: any(float(v) == 32 for s in series for _, v in s["values"]),
    "annotation:Events": _has("target", FLAP.__eq__),
    # the demo's own remediation: contention reported, the failed NIC moved off
    "annotation:Remediation": lambda series: (
        {s["metric"]["target"] for s in series} >= {"leaf2->spine1", NIC_DOWN}
    ),
}
RUN_S = 40  # every scripted fault is over by 28 s: each is shorter than one 40 s step


def test_every_dashboard_query_shows_a_fault_shorter_than_its_step(vm: VictoriaMetrics) -> None:
    """Every panel and annotation, evaluated once at the end of a 40 s step: the flap, the
    contention and the failed NIC (all over before the step ends, each shorter than it) are
    there. The old raw state queries miss them: checked at the end."""
    dash = json.loads(DASHBOARD.read_text())
    queries: list[tuple[str, str]] = []
    for p in dash["panels"]:
        assert p["datasource"]["type"] == "prometheus"
        assert p["targets"], p["title"]
        queries += [(p["title"], t["expr"]) for t in p["targets"]]
    for a in dash["annotations"]["list"]:
        queries.append((f"annotation:{a['name']}", a["expr"]))
    assert {t for t, _ in queries} == set(EXPECT), "every panel needs an expectation"

    w = TsdbWriter(vm.url)
    try:
        runner, _rec, _ = _run_demo(w.offer, RUN_S, interval_s=1.0)
        assert w.flush(120.0), w.stats()
    finally:
        w.close(5.0)
    assert runner.remediation.log.records(), "the demo remediated nothing"
    vm.flush()
    step = f"{RUN_S}s"
    end = EPOCH_S + RUN_S  # one evaluation, at the end of the step
    for title, expr in queries:
        series = vm.query_range(expr.replace("$__interval", step), end, end, step)
        assert series, f"{title}: {expr} returned no data"
        assert EXPECT[title](series), f"{title}: {expr} lacks the faulted element: {series[:3]}"
    # the same step with the old panels' raw samples: the faults are gone by then
    for old, key, gone in (("qpmesh_link_state > 0", "link", FLAP),
                           ("qpmesh_nic_state > 0", "nic", NIC_DOWN)):  # fmt: skip
        assert not _has(key, gone.__eq__)(vm.query_range(old, end, end, step)), old
    # and every link a lost probe crossed, not localized: what "Loss per link" used to plot
    crossed = vm.query_range(f"max_over_time(qpmesh_link_loss_ratio[{step}]) > 0", end, end, step)
    assert len(crossed) > 10


def test_demo_writes_its_time_series_stamped_now(
    vm: VictoriaMetrics, capsys: pytest.CaptureFixture[str]
) -> None:
    from qpmesh.cli import main

    t0 = time.time()
    rc = main(["demo", "--headless", "--duration", "6", "--json", "--timeseries", vm.url])
    t1 = time.time()
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ts = out["timeseries"]
    assert ts["written_lines"] > 0 and ts["dropped_lines"] == ts["buffered_lines"] == 0
    assert out["wall_s"] >= 5.5  # real time: the points are stamped as they happen
    rows = vm.export('{__name__="qpmesh_link_state"}')
    stamps = [t / 1000 for r in rows for t in r["timestamps"]]
    assert stamps and min(stamps) >= t0 - 5  # sim time mapped onto the wall clock
    assert max(stamps) <= t1 + 0.5  # never in the future (it ran 2.9 s and wrote to now+60 s)
    assert sum(len(r["timestamps"]) for r in rows) == 5 * 48  # 5 intervals x 48 links


# ---- the controller service writes while it runs ------------------------------------------
@pytest.mark.broker
@pytest.mark.slow
async def test_controller_service_writes_a_flap_and_serves_metrics(
    mosquitto: tuple[str, int], vm: VictoriaMetrics, tmp_path: Path
) -> None:
    import asyncio

    import aiomqtt

    from contract.origin import split_by_host
    from contract.records import encode_batch
    from contract.topics import Topics
    from controller.config import load_config
    from controller.dispatch import JsonLog, nic_hosts
    from controller.service import Broker, run_service
    from mesh.fabric import FabricShape, build_fabric
    from testbed.scenario import Fault, FaultKind
    from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
    from testbed.sim.model import ModelKnobs

    host, port = mosquitto
    shape = FabricShape(leaves=3, hosts_per_leaf=4, nics_per_host=1, spines=2)
    fab = build_fabric(shape)
    link = "leaf1-spine1"
    flap = Fault(FaultKind.FLAP, link, 1.0, 6.0, down_s=1.0, up_s=1.0)
    # flows do not re-hash off the flapping link (ECMP moves them within 10-300 ms, and a
    # down then shows as a loss burst): the flap is what the series must carry here
    model = ModelKnobs(rehash=False)
    sim = Simulator(fab, SimConfig(peers=4, seed=3, model=model), faults=(flap,))
    steps = list(sim.run(8.0, 0.5))
    conf = tmp_path / "controller.toml"
    conf.write_text(
        "[fabric]\nleaves = 3\nhosts_per_leaf = 4\nnics_per_host = 1\nspines = 2\n"
        "[controller]\ntick_s = 0.1\n"
        "[thresholds]\nlateness_ns = 0\n"
        f'[timeseries]\nurl = "{vm.url}"\ninterval_s = 1.0\n'
        '[metrics]\nlisten = "127.0.0.1:0"\n'
    )
    config = load_config(conf)
    assert config.timeseries is not None and config.metrics_listen == "127.0.0.1:0"
    topics = Topics("qpmesh/tstest")
    t0 = time.monotonic_ns()

    def clock() -> int:  # the simulator's timebase, advancing in real time
        return EPOCH_NS + (time.monotonic_ns() - t0)

    log_path = tmp_path / "log.jsonl"
    with log_path.open("w") as log_file:
        svc = asyncio.create_task(
            run_service(Broker(host, port, topics), config, log=JsonLog(log_file), clock=clock)
        )
        try:
            for _ in range(400):
                if "connected" in log_path.read_text():
                    break
                await asyncio.sleep(0.05)
            async with aiomqtt.Client(host, port) as client:
                for h in fab.hosts:
                    await client.publish(topics.presence(h.id), b'{"alive": true}', qos=1)
                for st in steps:  # each step's batch once the clock has passed its end
                    while clock() < EPOCH_NS + int(st.t1_s * 1e9):
                        await asyncio.sleep(0.02)
                    for h, b in split_by_host(st.batch, nic_hosts(fab)).items():
                        await client.publish(topics.probes(h), encode_batch(b), qos=1)
            metrics = next(
                json.loads(x) for x in log_path.read_text().splitlines() if '"metrics"' in x
            )
            mport = int(metrics["listen"].rsplit(":", 1)[1])
            records = sum(len(st.batch) for st in steps)
            want = f"qpmesh_ingest_records_total {float(records)}".encode()

            def scrape() -> bytes:
                url = f"http://127.0.0.1:{mport}/metrics"
                return bytes(urllib.request.urlopen(url, timeout=10).read())

            def intervals() -> int:
                return log_path.read_text().count('"msg": "timeseries"')

            deadline = time.monotonic() + 60  # generous: a busy machine, not a timing check
            while want not in await asyncio.to_thread(scrape) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            done = intervals()
            while intervals() < done + 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)  # two more intervals close after the last batch
            text = await asyncio.to_thread(scrape)
        finally:
            svc.cancel()
            with pytest.raises(asyncio.CancelledError):
                await svc
    assert want in text
    assert b"qpmesh_tsdb_buffer_fill_ratio" in text
    vm.flush()
    events = vm.export('{__name__="qpmesh_event_count"}')
    kinds = {(r["metric"]["kind"], r["metric"]["target"]) for r in events}
    assert any(t == link and k in ("link_down", "link_flap") for k, t in kinds), kinds
    flaps = vm.export(f'{{__name__="qpmesh_link_flaps",link="{link}"}}')
    assert flaps and max(v for r in flaps for v in r["values"]) >= 1
    health = [json.loads(x) for x in log_path.read_text().splitlines() if '"timeseries"' in x]
    assert health and health[-1]["dropped_lines"] == 0
