"""``qpmesh sim fleet`` (issue 29 item 6) at a small size: the report's fields, the targets
judged from them, the equivalence check run in the same command, one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

from qpmesh.cli import main
from testbed.sim.fleet_bench import summarize


@pytest.mark.skipif(shutil.which("nats-server") is None and not __import__("os").path.exists(
    "/usr/sbin/nats-server"), reason="needs nats-server")  # fmt: skip
def test_sim_fleet_reports_every_stage_and_judges_the_targets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["sim", "fleet", "--nics", "64", "--partitions", "2", "--windows", "1",
               "--broker-messages", "5", "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert r["interrupted"] is False
    assert r["solver"]["window_seconds"] > 0 and r["solver"]["max_rss_mb"] > 0
    assert r["solver"]["known_nics"] == 64
    assert r["worker"]["records_per_core_second"] > 0
    assert 0 < r["worker"]["records_per_batch"] <= 5120  # 5,120: a full-rate host batch
    assert r["broker"]["server_cpu_us_per_record"] > 0
    assert r["cores_for_64M_records_per_second"] == r["cores"]["total"] > 0
    assert r["equivalent"] is True and r["equivalence"]["max_offset_diff_ns"] <= 0.01
    assert set(r["met"]) == set(r["targets"])
    assert r["met"]["equivalent"] is True
    assert "equivalence:" in err and "worker:" in err  # progress on stderr


def test_targets_are_judged_from_the_figures() -> None:
    worker = {"records_per_core_second": 1_000_000}
    det = {"merge_s": 1.0, "judge_s": 1.0, "peak_rss_mb": 100}
    clk = {"fold_cpu_s_per_window": 1.0, "summary_cpu_s": 1.0, "fit_and_solve_cpu_s": 2.0,
           "fold_peak_rss_mb": 200, "summary_peak_rss_mb": 13000, "fit_and_solve_peak_rss_mb": 1,
           "offset_err_p99_ns": 1.0, "known_nics": 10}  # fmt: skip
    brk = {"server_cpu_us_per_record": 0.5}
    r = summarize({"worker": worker, "detection": det, "clocks": clk, "broker": brk,
                   "equivalence": {"equivalent": False}})  # fmt: skip
    assert r["solver"]["window_seconds"] == 6.0 and r["solver"]["max_rss_mb"] == 13000
    assert r["solver"]["amortized_window_seconds"] == 3.3  # the clock solve over 10 windows
    assert r["cores"] == {"broker": 32.0, "workers": 64.0, "solver": 3.3, "total": 99.3}
    assert r["met"] == {"solver_window_seconds": False, "solver_max_rss_mb": False,
                        "worker_records_per_core_second": False, "equivalent": False}  # fmt: skip
    assert summarize({})["cores_for_64M_records_per_second"] is None  # nothing measured


def test_with_edge_owners_the_solver_window_leaves_the_per_edge_work_to_them() -> None:
    det = {"merge_s": 1.0, "judge_s": 1.0, "peak_rss_mb": 100}
    own = [{"owner": o, "rows": 10, "fold_cpu_s_per_window": 0.5, "summary_cpu_s": 1.0 + o,
            "stages_cpu_s": 0.5} for o in range(2)]  # fmt: skip
    clk = {"fold_cpu_s_per_window": 1.0, "summary_cpu_s": 2.0, "fit_and_solve_cpu_s": 2.0,
           "fold_peak_rss_mb": 200, "summary_peak_rss_mb": 13000, "fit_and_solve_peak_rss_mb": 300,
           "offset_err_p99_ns": 1.0, "known_nics": 10, "owners": own, "network_cpu_s": 0.25,
           "split_cpu_s_per_window": 0.1, "stage_rounds": 5,
           "stages_critical_cpu_s": 0.5}  # fmt: skip
    worker = {"records_per_core_second": 1e6}
    r = summarize({"worker": worker, "detection": det, "clocks": clk,
                   "broker": {"server_cpu_us_per_record": 0.5}})  # fmt: skip
    s = r["solver"]
    # the owners' cores are counted: split 0.1 + folds 1.0 + (summaries 3.0 + stages 1.0) / 10
    assert s["edges"]["sustained_cores"] == 1.5 and r["cores"]["edge_owners"] == 1.5
    assert r["cores"]["total"] == round(32.0 + 64.0 + s["amortized_window_seconds"] + 1.5, 1)
    assert s["window_seconds"] == 2.25 and "fold_s" not in s and s["network_s"] == 0.25
    assert "fit_and_solve_s" not in s and "join_s" not in s  # the per-edge work is the owners'
    # the owners' fold and summary peaks are theirs; the solver's detection process and its
    # network stages count together, as one solver process holds both
    assert s["max_rss_mb"] == 100 + 300
    assert s["detection_peak_rss_mb"] == 100 and s["clock_peak_rss_mb"] == 300
    assert s["edges"]["max_owner_window_seconds"] == 3.0 and s["edges"]["total_cpu_s"] == 5.0
    assert s["edges"]["stages_critical_s"] == 0.5


@pytest.mark.parametrize(
    "bad", [["--nics", "10"], ["--rate-hz", "0"], ["--workers", "0"], ["--edge-owners", "-1"]]
)
def test_bad_options_are_one_line_and_exit_2(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "fleet", *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("qpmesh sim fleet:")


def test_the_detection_stage_merges_and_judges_in_a_solver_process_of_its_own() -> None:
    import os

    from testbed.sim.fleet_bench import detection_stage

    got = detection_stage(64, 8, 2.0, 2, 1, lambda _m: None)
    assert got["pid"] != os.getpid()  # not this traffic-making process's heap
    assert got["partials"] == 2 and got["partial_bytes"] > 0 and got["records"] > 0
    assert got["merge_s"] >= 0 and got["judge_s"] > 0 and got["peak_rss_mb"] > 0
