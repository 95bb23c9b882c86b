"""The clock bench's edge owners as processes (`controller.fleet.benchowners`): the staged
solve over their pipes is the solve with the owners in process, to the bit (bad stamps, a
stepped clock, NICs cut off), the caller keeps no rows, and a dead owner is one error."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from controller.clocksolve import SampleWindow, fit_params, solve_edge_ranges, window_summary
from controller.fleet.bench import EPOCH
from controller.fleet.benchowners import OwnerProcs
from controller.fleet.edges import owner_bounds, split_clock
from sync.edgestage import EdgeRange
from tests.edgewindow import NICS, STEPPED, stepped_window


def test_owner_processes_solve_what_owners_in_process_solve() -> None:
    w, cfg, leaf = stepped_window()
    t_ref = cfg.window_ns // 2 + EPOCH
    bounds = owner_bounds(NICS, 3)
    local = [
        EdgeRange(window_summary(SampleWindow(**p.cols()), t_ref, cfg.coded_tol_hw_ns),
                  fit_params(cfg))
        for p in split_clock(w, bounds)
    ]  # fmt: skip
    want = solve_edge_ranges(local, NICS, leaf)
    pieces = split_clock(w, bounds)
    with OwnerProcs(pieces, t_ref, cfg.coded_tol_hw_ns, fit_params(cfg)) as procs:
        assert pieces == []  # the caller's list no longer holds the rows
        assert sum(h["rows"] for h in procs.hello) == len(w)
        got = solve_edge_ranges(procs.ranges(), NICS, leaf)
        done = procs.finish()
    assert STEPPED in want.stepped and np.array_equal(got.stepped, want.stepped)
    for f in ("offset_ns", "drift", "offset_std_ns", "known"):
        assert np.array_equal(getattr(got, f), getattr(want, f), equal_nan=f != "known"), f
    assert got.estimator == want.estimator
    for d in done:  # each owner answered every round and says what it spent
        assert len(d["calls"]) >= 5 and all(cpu >= 0 and size > 0 for cpu, size in d["calls"])
        assert d["peak_rss_mb"] > 0


def test_a_dead_owner_is_one_error_and_nothing_is_left_running() -> None:
    w, cfg, _ = stepped_window()
    t_ref = cfg.window_ns // 2 + EPOCH
    procs = OwnerProcs(split_clock(w, owner_bounds(NICS, 2)), t_ref, cfg.coded_tol_hw_ns,
                       fit_params(cfg))  # fmt: skip
    with procs:
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(RuntimeError, match="edge owner 1 died"):
            procs.finish()
    assert procs.running() == 0
