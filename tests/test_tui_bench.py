"""The frame benchmark runs and reports medians, the baseline and their ratio."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

from qpmesh.cli import main
from tui.bench import bench


def test_bench_reports_ratio_against_small_fabric() -> None:
    r = bench(256, 32, frames=3, width=120)
    assert r["nics"] == 256 and r["baseline_nics"] == 32
    assert isinstance(r["median_frame_ms"], float) and r["median_frame_ms"] > 0
    assert r["ratio_vs_baseline"] is not None


def test_bench_cli_json() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["tui", "bench", "--nics", "128", "--frames", "2", "--json"]) == 0
    doc = json.loads(out.getvalue())
    assert doc["nics"] == 128 and "within_budget" in doc
