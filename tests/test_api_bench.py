"""``qpmesh sim api-bench`` on a tiny fabric: both runs happen, the clients attach and the
figures the benchmark reports are there and consistent (the speed itself is a benchmark
figure, never asserted in a test)."""

from __future__ import annotations

import pytest

from testbed.sim.api_bench import run_api_bench


def test_api_bench_reports_both_rates_latency_and_ratio() -> None:
    res = run_api_bench(nics=16, sim_s=1.0, duration_s=1.5, repeats=1, clients=2, poll_hz=10,
                        tick_s=0.2)  # fmt: skip
    assert res["ingest_no_api_records_per_s"] > 0 and res["ingest_api_records_per_s"] > 0
    assert res["api_over_no_api"] == pytest.approx(
        res["ingest_api_records_per_s"] / res["ingest_no_api_records_per_s"]
    )
    assert res["snapshot_requests"] > 0 and res["snapshot_p99_ms"] >= res["snapshot_p50_ms"] > 0
    (clients,) = res["per_repeat"]["clients"]
    assert clients["ws_messages"] >= 2 and clients["errors"] == 0  # both websockets fed
    assert res["ws_clients"] == 2  # the API process counted both
    assert res["ingest_process_cpu_api_records_per_s"] > 0 and res["api_process_cpu_share"] > 0


def test_api_bench_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError):
        run_api_bench(nics=1)
    with pytest.raises(ValueError):
        run_api_bench(repeats=0)
