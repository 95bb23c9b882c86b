"""The second stage (`controller.fleet.edges`): edge owners' summary blocks laid end to end
are the summary one process holding every kept pair makes, and solve to the same clocks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from controller.clocksolve import ClockSyncConfig, solve_summary, window_summary
from controller.clocksync import ClockSync
from controller.fleet.bench import EPOCH, probe_graph, window_part
from controller.fleet.edges import EdgeStage, join, owner_bounds, split_clock
from sync.summary import Summary


def test_owners_blocks_join_to_the_one_process_summary() -> None:
    n, width = 96, 1_000_000_000
    cfg = ClockSyncConfig()
    rng = np.random.default_rng(4)
    src, dst = probe_graph(n, 12, 4)
    offset, drift = rng.uniform(-1e6, 1e6, n), rng.normal(0.0, 2e-8, n)
    half = rng.uniform(1000.0, 3000.0, len(src) // 2)
    floor = np.concatenate([half, half])
    parts = [
        window_part(src, dst, k, width, offset, drift, floor, rng, k * len(src)) for k in range(6)
    ]
    first = int(min(int(p.t1.min()) for p in parts))
    one = ClockSync(n, cfg, first_stamp=first)
    bounds = owner_bounds(n, 3)
    stages = [EdgeStage(n, cfg, first_stamp=first) for _ in range(3)]
    for p in parts:
        one.add_pairs(p)
        for stage, piece in zip(stages, split_clock(p, bounds), strict=True):
            stage.add(piece)
    since, t_ref = EPOCH + width, EPOCH + 3 * width  # the solver's cut, on the grid
    w = one.window(since)
    assert w is not None
    whole = window_summary(w, t_ref, cfg.coded_tol_hw_ns)
    blocks = [s.summary(since, t_ref, cfg.coded_tol_hw_ns) for s in stages]
    assert sum(rows for _, rows in blocks) == len(w)
    joined = join([b for b, _ in blocks])
    for f in dataclasses.fields(Summary):
        a, b = getattr(whole, f.name), getattr(joined, f.name)
        assert a.dtype == b.dtype and np.array_equal(a, b), f.name
    x, y = solve_summary(whole, n, cfg), solve_summary(joined, n, cfg)
    assert np.array_equal(x.offset_ns, y.offset_ns, equal_nan=True) and x.known.all()


def test_owner_bounds_and_join_refuse_what_cannot_be_laid_end_to_end() -> None:
    assert owner_bounds(10, 3).tolist() == [0, 3, 7, 10]
    with pytest.raises(ValueError):
        owner_bounds(4, 5)
    with pytest.raises(ValueError):
        join([None])
