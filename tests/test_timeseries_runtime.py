"""Time series inside the controller: config tables, the runtime (recorder + writer, jobs off
the loop) fed by the simulator, and the Prometheus metrics runtime."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controller.timeseries.config import TimeseriesConfig, metrics_config, timeseries_config
from controller.timeseries.metrics import ControllerMetrics
from controller.timeseries.runtime import MetricsRuntime, TimeseriesRuntime
from controller.timeseries.writer import Backoff, TsdbWriter
from testbed.sim.demo_runner import DemoRunner, demo_scenario


def test_timeseries_table_is_read_and_validated(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("s3cret\n")
    cfg = timeseries_config(
        {
            "url": "http://127.0.0.1:8428", "org": "o", "bucket": "b", "token_file": "tok",
            "interval_s": 5, "buffer_mb": 1.5, "path_detail": "top", "pairs": False,
        },
        tmp_path,
    )  # fmt: skip
    assert cfg == TimeseriesConfig(
        "http://127.0.0.1:8428", "o", "b", "s3cret", 5.0, 1572864, "top", False
    )
    assert timeseries_config(None) is None and timeseries_config({}) is None
    assert metrics_config({"listen": "127.0.0.1:9464"}) == "127.0.0.1:9464"


@pytest.mark.parametrize(
    ("table", "msg"),
    [
        ({"org": "x"}, "url is required"),
        ({"url": "ftp://x"}, "http"),
        ({"url": "http://x", "interval_s": 0}, "interval_s"),
        ({"url": "http://x", "interval_s": "10"}, "interval_s must be a number"),
        ({"url": "http://x", "pairs": 1}, "pairs must be true or false"),
        ({"url": "http://x", "buffer_mb": True}, "buffer_mb must be a number"),
        ({"url": "http://x", "path_detail": "all"}, "path_detail"),
        ({"url": "http://x", "token_file": "/nonexistent/tok"}, "token_file"),
        ({"url": "http://x", "bukket": "b"}, "unknown timeseries key(s): bukket"),
    ],
)
def test_bad_timeseries_tables_give_one_line_errors(table, msg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=None) as exc:
        timeseries_config(table)
    assert msg in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("table", [{"listen": "9464"}, {"listen": 9464}, {"port": 1}])
def test_bad_metrics_tables(table) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        metrics_config(table)


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
    runner.controller.brain = rt.brain(runner.controller.brain)
    try:
        while runner.t_s < 3:
            runner.step()
            await rt.step(runner.controller, runner.now_ns)
        assert writer.flush(30.0)
    finally:
        rt.close(2.0)
    text = b"".join(bodies).decode()
    assert "qpmesh_path,path=spine1,spine=spine1 " in text
    assert "qpmesh_pair," not in text and "qpmesh_link," in text


def test_metrics_runtime_copies_totals_once() -> None:
    reg = CollectorRegistry()
    mr = MetricsRuntime(ControllerMetrics(reg))
    mr.sync(100, {"probes": 3, "duplicate": 1, "bad:probes": 2, "bad": 1})
    mr.sync(250, {"probes": 5, "duplicate": 1, "bad:probes": 2, "bad": 1})
    mr.solve(0.25)
    assert reg.get_sample_value("qpmesh_ingest_records_total") == 250
    assert reg.get_sample_value("qpmesh_ingest_batches_total") == 5
    assert reg.get_sample_value("qpmesh_batches_dropped_total") == 1
    assert reg.get_sample_value("qpmesh_decode_errors_total", {"topic_kind": "probes"}) == 2
    assert reg.get_sample_value("qpmesh_decode_errors_total", {"topic_kind": "any"}) == 1
    assert reg.get_sample_value("qpmesh_clock_solve_seconds_count") == 1
