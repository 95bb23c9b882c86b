"""`qpmesh sim sync --windows N`: consecutive windows of one run, each scored on its own."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qpmesh.cli import main
from testbed.bench_live_sync import run_bench

ARGS = ["sim", "sync", "--nics", "32", "--peers", "4", "--window", "0.5", "--rate", "20",
        "--load", "0.9", "--seed", "3", "--truth-breakdown", "--json"]  # fmt: skip
TIMINGS = {"simulate_seconds", "estimate_seconds", "fit_and_solve_seconds", "solve_seconds",
           "solve_huber_seconds", "max_rss_mb"}  # fmt: skip


def test_windows_go_on_from_the_first_and_report_their_medians(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(ARGS) == 0
    one = json.loads(capsys.readouterr().out)
    assert "windows" not in one and one["window_start_s"] == 0.0
    assert main([*ARGS, "--windows", "3"]) == 0
    three = json.loads(capsys.readouterr().out)
    # the first window is the single-window run, figure for figure
    for key in set(one) - TIMINGS:
        assert three[key] == one[key], key
    lines = three["windows"]
    assert [w["start_s"] for w in lines] == [0.0, 0.5, 1.0]
    assert lines[0]["qpmesh_p99_ns"] == one["estimators"]["qpmesh"]["p99_ns"]
    assert lines[0]["perfect_split_p99_ns"] == one["truth_breakdown"]["perfect_split_p99_ns"]
    # later windows are other probes and other truth: their figures differ from the first's
    assert len({w["qpmesh_p99_ns"] for w in lines}) == 3
    ow = three["over_windows"]
    assert ow["windows"] == 3
    for key in ("qpmesh_p99_ns", "ntp_baseline_p99_ns", "perfect_split_p99_ns"):
        assert ow[f"median_{key}"] == round(float(np.median([w[key] for w in lines])), 2)


def test_windows_must_be_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--windows", "0"]) == 2
    err = capsys.readouterr().err
    assert "--windows must be >= 1" in err and len(err.strip().splitlines()) == 1


def test_no_leaf_split_is_the_receive_part_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGS) == 0
    split = json.loads(capsys.readouterr().out)
    assert main([*ARGS, "--no-leaf-split"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert split["estimator"].endswith("+rx+uplink")
    assert alone["estimator"] == split["estimator"].removesuffix("+uplink")
    # the same probes and truth: only the correction differs
    assert alone["estimators"]["ntp_baseline"] == split["estimators"]["ntp_baseline"]
    assert alone["estimators"]["qpmesh"] != split["estimators"]["qpmesh"]


def test_live_sync_bench_runs_with_and_without_the_leaf_split() -> None:
    """`python -m testbed.bench_live_sync` on a small two-leaf fabric: both solves score, and
    the leaves reach the solve (its offsets move)."""
    reps = {split: run_bench(32, [0.9], [1], 12.0, 4, leaf_split=split) for split in (True, False)}
    for split, rep in reps.items():
        assert rep["leaf_split"] is split
        assert rep["load_0.9"]["judged_delays"] > 0
    with_leaf, without = (reps[s]["load_0.9"]["solve_offset_p99_ns"] for s in (True, False))
    assert with_leaf and without and with_leaf != without
