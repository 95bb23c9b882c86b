"""The prober benchmark runs briefly and reports its figures against a same-run baseline."""

from __future__ import annotations

import json

import pytest

from prober.bench import measure, run_bench


def test_run_bench_prints_json_with_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_bench(0.6, json=True)
    printed = json.loads(capsys.readouterr().out)
    assert printed == result
    pps = result["probes_per_second"]
    base = result["baseline_probes_per_second"]
    assert isinstance(pps, int) and isinstance(base, int) and pps > 0 and base > 0
    assert result["timestamp_overhead_ratio"] == pytest.approx(base / pps, rel=1e-2)
    assert isinstance(result["session_probes_per_second"], int)
    assert result["session_probes_per_second"] > 0
    assert isinstance(result["endpoint_probes_per_second"], int)
    assert result["endpoint_probes_per_second"] > 0


def test_measure_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        measure(0)
