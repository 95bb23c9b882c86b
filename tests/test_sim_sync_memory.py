"""Memory across sync windows (`testbed.sim.sync_memory`): the carry filter and the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed.sim.sync_memory import autocorr, carry

ROOT = Path(__file__).resolve().parents[1]


def test_carry_averages_independent_errors_of_a_steady_clock() -> None:
    rng = np.random.default_rng(1)
    w, n = 12, 400
    truth = np.tile(5.0 * 2.0 * np.arange(w)[:, None], (1, n))  # 5 ppb over 2 s windows
    off = truth + rng.normal(0.0, 20.0, (w, n))
    drift = 5.0 + rng.normal(0.0, 30.0, (w, n))
    known = np.ones((w, n), dtype=bool)
    est = carry(off, drift, known, 2.0, 20.0, 30.0, 1.0)
    raw_err = np.abs(off[-1] - truth[-1]).mean()
    carried_err = np.abs(est[-1] - truth[-1]).mean()
    assert carried_err < 0.6 * raw_err  # twelve windows of memory on a clock that holds
    assert np.array_equal(est[0], off[0])  # the first window has nothing to carry


def test_carry_with_huge_frequency_noise_follows_the_measurements() -> None:
    rng = np.random.default_rng(2)
    off = rng.normal(0.0, 50.0, (4, 10))
    est = carry(off, np.zeros_like(off), np.ones_like(off, dtype=bool), 2.0, 1.0, 1.0, 1e12)
    assert np.allclose(est, off, atol=0.01)


def test_carry_starts_a_nic_at_its_first_known_window_and_checks_shapes() -> None:
    off = np.array([[1.0, 2.0], [3.0, 4.0]])
    known = np.array([[False, True], [True, True]])
    est = carry(off, np.zeros_like(off), known, 2.0, 10.0, 10.0, 100.0)
    assert np.isnan(est[0, 0]) and est[1, 0] == 3.0 and est[0, 1] == 2.0
    with pytest.raises(ValueError, match="same"):
        carry(off, np.zeros(3), known, 2.0, 10.0, 10.0, 100.0)


def test_autocorr_of_persistent_and_fresh_errors() -> None:
    rng = np.random.default_rng(3)
    fixed = np.tile(rng.normal(size=500), (5, 1))
    fresh = rng.normal(size=(5, 500))
    assert autocorr(fixed)["lag_1"] == 1.0
    lag1 = autocorr(fresh)["lag_1"]
    assert lag1 is not None and abs(lag1) < 0.1
    assert autocorr(fresh[:2])["lag_3"] is None  # no pair of windows 3 apart


def test_the_command_reports_every_variant_for_both_estimators() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "testbed.sim.sync_memory", "--peers", "4", "--nics", "32",
         "--seeds", "1", "1", "--windows", "3", "--score", "2", "--histories", "2", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    rep = json.loads(out.stdout)
    s = rep["summary"]
    assert set(s) >= {"memoryless", "merged_2", "carried_best_in_hindsight"}
    for v in ("memoryless", "merged_2", "carried_best_in_hindsight"):
        for e in ("qpmesh", "ntp"):
            assert s[v][e]["seeds"] == 1 and s[v][e]["seed_median_ns"] > 0
    seed = rep["per_seed"][0]
    assert len(seed["memoryless"]["qpmesh"]) == 2  # the scored windows only
    assert len(seed["carried_grid"]) == 4 * 4 * 3


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--peers", "40", "--nics", "32"], "peers in [1, nics)"),
        (["--histories", "0"], "--histories must be >= 1"),
        (["--score", "7"], "--score <= --windows"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "testbed.sim.sync_memory", *args, "--seeds", "1", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-500:]
    last = out.stderr.strip().splitlines()[-1]
    assert says in last and "Traceback" not in out.stderr
