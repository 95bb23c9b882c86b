"""The live clock held against the testbed's truth (`testbed.clockcheck`, `testbed.replay.clock_check`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.clockcheck import ClockCheck
from testbed.replay import CAPTURE, clock_check, replay, write_capture
from testbed.vclock import VirtualClock, write_truth

NAN, INF = float("nan"), float("inf")


def test_tiers_and_overconfident_ticks_are_counted_against_the_truth() -> None:
    check = ClockCheck([("idle", 0, 10), ("congested", 10, 20)], 1000.0, 10_000.0)
    truth = np.array([0.0, 100.0, 200.0, 300.0, 400.0])
    # NIC 0..2 right (errors 0 after the median), NIC 3 off by 5 us stated fine: overconfident;
    # NIC 4 unknown
    off = truth + np.array([7.0, 7.0, 7.0, 5007.0, NAN])
    check.observe(5, off, np.array([50.0, 50.0, 50.0, 50.0, NAN]), truth)
    # the same error stated coarse (3 us): within 10 us, honest; NIC 2 unconfirmed: withheld
    check.observe(15, off, np.array([50.0, 50.0, INF, 3000.0, NAN]), truth)
    # tiers per clock, as the controller trusts one (a delay's bound covers its two clocks):
    # 800 ns stated is not fine under a 1 us tier (800 > 1000 / sqrt 2) but coarse, and its
    # error of 1.5 us is then within the coarse 10 us
    check.observe(25, truth + np.array([7.0, 7.0, 7.0, 1507.0, NAN]),
                  np.array([700.0, 50.0, 50.0, 800.0, NAN]), truth)  # fmt: skip
    rep = check.report()
    idle, cong = rep["idle"], rep["congested"]
    assert (idle["fine"], idle["coarse"], idle["withheld"], idle["unknown"]) == (4, 0, 0, 1)
    assert idle["overconfident"] == idle["overconfident_fine"] == 1
    assert (cong["fine"], cong["coarse"], cong["withheld"], cong["unknown"]) == (2, 1, 1, 1)
    assert cong["overconfident"] == 0
    assert cong["trusted_error"] == {"p50_ns": 0.0, "p99_ns": 4900.0, "max_ns": 5000.0}
    assert idle["ticks"] == cong["ticks"] == 1
    edge = rep["other"]
    assert (edge["fine"], edge["coarse"], edge["overconfident"]) == (3, 1, 0)
    # the worst trusted NIC-tick against its tier's bound: 5 us off stated fine (1 us), and
    # 1.5 us off stated coarse (10 us)
    assert idle["worst_over_bound"] == 5.0 and edge["worst_over_bound"] == 0.15


def test_an_observation_outside_every_span_is_other_and_bad_bounds_are_refused() -> None:
    check = ClockCheck([("idle", 0, 10)], 1000.0, 2000.0)
    check.observe(50, np.zeros(3), np.zeros(3), np.zeros(3))
    assert set(check.report()) == {"other"}
    with pytest.raises(ValueError, match="coarse"):
        ClockCheck([], 2000.0, 1000.0)
    with pytest.raises(ValueError, match="one entry per NIC"):
        check.observe(1, np.zeros(3), np.zeros(2), np.zeros(3))


def test_clock_check_reads_the_runs_truth_and_spans(tmp_path: Path) -> None:
    assert clock_check(tmp_path)[0] is None  # no truth file: nothing to check
    (tmp_path / "controller.toml").write_text("[fabric]\nleaves = 2\nhosts_per_leaf = 2\n")
    hosts = [f"host{i}" for i in range(4)]
    clocks = {
        h: VirtualClock(offset_ns=1000.0 * i, drift=0.0, t0_ns=0) for i, h in enumerate(hosts)
    }
    write_truth(tmp_path / "clocks.json", clocks, {f"nic{i}": h for i, h in enumerate(hosts)})
    (tmp_path / "report.json").write_text(json.dumps({"sync_windows": [["idle", 0, 10**12]]}))
    # two messages 3 s apart (not ones the controller takes): ticks in between, no solve
    write_capture(tmp_path / CAPTURE, [(10**9, "x/y", b""), (4 * 10**9, "x/y", b"")])
    check, on_tick = clock_check(tmp_path)
    assert check is not None and check.spans == (("idle", 0, 10**12),)
    assert check.max_unc_ns > 0
    replay(tmp_path, on_tick=on_tick)
    idle = check.report()["idle"]
    assert int(str(idle["ticks"])) >= 3  # every tick observed the clock of the four NICs
    assert idle["unknown"] == 4 * int(str(idle["ticks"])) and idle["fine"] == 0
