"""Time series inside the controller: config tables, the runtime (recorder + writer, jobs off
the loop) fed by the simulator, and the Prometheus metrics runtime."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from contract.tomlcheck import Table
from controller.timeseries.config import TimeseriesConfig, read_metrics, read_timeseries
from controller.timeseries.metrics import ControllerMetrics
from controller.timeseries.runtime import TRUST, MetricsRuntime, Observability, TimeseriesRuntime
from controller.timeseries.writer import TsdbWriter
from mqttlink.reconnect import Backoff
from testbed.sim.demo_runner import DemoRunner, demo_scenario


def _ts(doc: dict, base: Path | None = None):  # type: ignore[no-untyped-def, type-arg]
    root = Table.root(doc, "c.toml")
    return read_timeseries(root.table("timeseries"), base)


def test_timeseries_table_is_read_and_validated(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("s3cret\n")
    cfg = _ts(
        {"timeseries": {
            "url": "http://127.0.0.1:8428", "org": "o", "bucket": "b", "token_file": "tok",
            "interval_s": 5, "buffer_mb": 1.5, "path_detail": "top", "pairs": False,
        }},
        tmp_path,
    )  # fmt: skip
    assert cfg == TimeseriesConfig(
        "http://127.0.0.1:8428", "o", "b", "s3cret", 5.0, 1572864, "top", False
    )
    assert _ts({}) is None
    assert _ts({"timeseries": {"url": "http://h"}}) == TimeseriesConfig("http://h")
    root = Table.root({"metrics": {"listen": "127.0.0.1:9464"}}, "c.toml")
    assert read_metrics(root.table("metrics")) == "127.0.0.1:9464"
    assert read_metrics(Table.root({}, "c.toml").table("metrics")) is None


@pytest.mark.parametrize(
    ("table", "msg"),
    [
        ({"org": "x"}, "c.toml: timeseries.url: is required"),
        ({"url": "ftp://x"}, "timeseries.url: must be an http(s)://HOST[:PORT] URL"),
        ({"url": "http://x", "interval_s": 0}, "timeseries.interval_s: must be a number > 0"),
        ({"url": "http://x", "interval_s": "10"}, "timeseries.interval_s: must be a number > 0"),
        ({"url": "http://x", "pairs": 1}, "timeseries.pairs: must be true or false"),
        ({"url": "http://x", "buffer_mb": True}, "timeseries.buffer_mb"),
        (
            {"url": "http://x", "path_detail": "all"},
            "timeseries.path_detail: must be full or top or off",
        ),
        (
            {"url": "http://x", "token_file": "/nonexistent/tok"},
            "timeseries.token_file: cannot read",
        ),
        ({"url": "http://x", "bukket": "b"}, "timeseries.bukket: unknown key"),
    ],
)
def test_bad_timeseries_tables_give_one_line_errors(table, msg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as exc:
        _ts({"timeseries": table})
    assert msg in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("table", [{"listen": "9464"}, {"listen": 9464}, {"port": 1}])
def test_bad_metrics_tables(table) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"c\.toml: metrics"):
        read_metrics(Table.root({"metrics": table}, "c.toml").table("metrics"))


def test_controller_config_takes_the_two_tables(tmp_path: Path) -> None:
    from controller.config import ConfigError, load_config

    conf = tmp_path / "c.toml"
    conf.write_text(
        "[fabric]\nleaves = 2\n"  # the time series need a declared fabric (not a learned one)
        '[timeseries]\nurl = "http://127.0.0.1:8428"\ninterval_s = 5\n'
        '[metrics]\nlisten = "127.0.0.1:9464"\n'
    )
    cfg = load_config(conf)
    assert cfg.timeseries == TimeseriesConfig("http://127.0.0.1:8428", interval_s=5.0)
    assert cfg.metrics_listen == "127.0.0.1:9464"
    assert load_config(None).timeseries is None and load_config(None).metrics_listen is None
    conf.write_text('[fabric]\nleaves = 2\n[timeseries]\nurl = "http://h"\nbuffer = 3\n')
    with pytest.raises(ConfigError, match=r"timeseries\.buffer: unknown key"):
        load_config(conf)


async def test_runtime_writes_intervals_with_events_off_the_loop() -> None:
    bodies: list[bytes] = []
    threads: set[str] = set()

    def post(body: bytes) -> None:
        bodies.append(body)

    writer = TsdbWriter("http://unused", post=post, backoff=Backoff(0.01, 0.1))
    cfg = TimeseriesConfig("http://unused", interval_s=2.0)
    runner = DemoRunner(demo_scenario(None, nics=None, seed=7), step_s=0.5)
    live = runner.controller
    rt = TimeseriesRuntime(runner.fabric, cfg, writer=writer)
    live.brain = rt.brain(live.brain)
    orig = rt.recorder.finish

    def finish(body: bytes) -> int:
        threads.add(threading.current_thread().name)
        return orig(body)

    rt.recorder.finish = finish  # type: ignore[method-assign]
    try:
        while runner.t_s < 30:
            runner.step()
            await rt.step(live, runner.now_ns)
        assert writer.flush(30.0)
    finally:
        rt.close(2.0)
    assert rt.recorder.intervals == 14
    assert threading.current_thread().name not in threads  # rendered in a worker thread
    text = b"".join(bodies).decode()
    assert "qpmesh_event,kind=link_flap,severity=critical,target=leaf1-spine2" in text
    assert "qpmesh_link,link=leaf1-spine2," in text
    h = rt.health()
    assert h["dropped_lines"] == 0 and h["written_lines"] == text.count("\n")


async def test_runtime_passes_the_series_knobs_on() -> None:
    bodies: list[bytes] = []
    writer = TsdbWriter("http://unused", post=bodies.append)
    cfg = TimeseriesConfig("http://unused", interval_s=1.0, pairs=False, path_detail="top")
    runner = DemoRunner(demo_scenario(None, nics=None, seed=7), step_s=0.5)
    rt = TimeseriesRuntime(runner.fabric, cfg, writer=writer)
    obs = Observability(runner.fabric, None, None)
    obs.timeseries = rt
    runner.controller.brain = obs.brain(runner.controller.brain)
    try:
        while runner.t_s < 3:
            runner.step()
            if runner.t_s == 1.0:
                obs.action(
                    {"t_ns": runner.now_ns, "kind": "replace_link", "link": "leaf1-spine2",
                     "disposition": "send"}
                )  # fmt: skip
            await rt.step(runner.controller, runner.now_ns)
        assert writer.flush(30.0)
    finally:
        rt.close(2.0)
    text = b"".join(bodies).decode()
    assert "qpmesh_path,path=spine1,spine=spine1 " in text
    assert "qpmesh_remediation,action=replace_link,status=send,target=leaf1-spine2" in text
    assert "qpmesh_pair," not in text and "qpmesh_link," in text


def test_metrics_runtime_copies_totals_once() -> None:
    reg = CollectorRegistry()
    mr = MetricsRuntime(ControllerMetrics(reg))
    mr.sync(100, {"probes": 3, "duplicate": 1, "bad:probes": 2, "bad": 1}, None, [90, 4, 6])
    mr.sync(250, {"probes": 5, "duplicate": 1, "bad:probes": 2, "bad": 1}, None, [230, 9, 11])
    mr.solve(0.25)
    obs = Observability(None, None, None)  # type: ignore[arg-type]
    obs.metrics = mr
    obs.websocket_clients(4)
    assert reg.get_sample_value("qpmesh_websocket_clients") == 4
    assert reg.get_sample_value("qpmesh_ingest_records_total") == 250
    assert reg.get_sample_value("qpmesh_ingest_batches_total") == 5
    assert reg.get_sample_value("qpmesh_batches_dropped_total") == 1
    assert reg.get_sample_value("qpmesh_decode_errors_total", {"topic_kind": "probes"}) == 2
    assert reg.get_sample_value("qpmesh_decode_errors_total", {"topic_kind": "any"}) == 1
    assert reg.get_sample_value("qpmesh_clock_solve_seconds_count") == 1
    trust = {t: reg.get_sample_value("qpmesh_delays_total", {"trust": t}) for t in TRUST}
    assert trust == {"fine": 230, "coarse": 9, "withheld": 11}
