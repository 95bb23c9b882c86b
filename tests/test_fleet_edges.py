"""The second stage (`controller.fleet.edges`): edge owners' summary blocks laid end to end
are the summary one process holding every kept pair makes, and solve to the same clocks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from controller.clockfloors import WINNER_RANK
from controller.clocksolve import ClockSyncConfig, compute_state, solve_summary, window_summary
from controller.clocksync import ClockSync
from controller.fleet.bench import EPOCH, probe_graph, window_part
from controller.fleet.edges import (
    BlockError,
    EdgeInput,
    EdgeStage,
    SummaryBlock,
    first_send,
    join,
    owner_bounds,
    solve_blocks,
    solve_due,
    split_clock,
)
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import MovedClocks
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
    one = ClockSync(n, cfg, floor_rank=WINNER_RANK)
    bounds = owner_bounds(n, 3)
    stages = [EdgeStage(n, cfg, k) for k in range(3)]
    none = MovedClocks.empty()
    for k, p in enumerate(parts):
        one.add_pairs(p)
        # two workers' shares of the window, each split by owner
        halves = [p.take(np.arange(0, len(p) // 2)), p.take(np.arange(len(p) // 2, len(p)))]
        ins = [[EdgeInput(k, f"w{h}", piece, none, first_send(half))
                for piece in split_clock(half, bounds)] for h, half in enumerate(halves)]  # fmt: skip
        for o, stage in enumerate(stages):
            stage.add([i[o] for i in ins])
    assert all(s.first_stamp == one.first_stamp for s in stages)
    since, t_ref = EPOCH + width, EPOCH + 3 * width  # the solver's cut, on the grid
    w = one.window(since)
    assert w is not None
    whole = window_summary(w, t_ref, cfg.coded_tol_hw_ns)
    blocks = [SummaryBlock.decode(s.block(5, since, t_ref).encode()) for s in stages]
    assert sum(b.rows for b in blocks) == len(w)
    joined = join([b.summary for b in blocks])
    for f in dataclasses.fields(Summary):
        a, b = getattr(whole, f.name), getattr(joined, f.name)
        assert a.dtype == b.dtype and np.array_equal(a, b), f.name
    x, y = solve_summary(whole, n, cfg), solve_summary(joined, n, cfg)
    assert np.array_equal(x.offset_ns, y.offset_ns, equal_nan=True) and x.known.all()
    # one owner: the state is the one the rows make (same floors, span, bounds)
    solo = EdgeStage(n, cfg, 0)
    for k, p in enumerate(parts):
        solo.add([EdgeInput(k, "w", p, none, first_send(p))])
    tm = int(w.t1.min()) + (int(w.t1.max()) - int(w.t1.min())) // 2  # compute_state's t_ref
    b = solo.block(5, since, tm)
    a, c = compute_state(w, n, cfg, 7), solve_blocks([b], n, cfg, tm, 7)
    assert a is not None and c is not None and a.n_samples == c.n_samples
    assert np.array_equal(a.models.offset_ns, c.models.offset_ns, equal_nan=True)
    assert np.array_equal(a.models.offset_std_ns, c.models.offset_std_ns, equal_nan=True)


def test_blocks_travel_and_bad_ones_are_refused() -> None:
    stage = EdgeStage(8, ClockSyncConfig(), 1)
    empty = SummaryBlock.decode(stage.block(3, 0, 0).encode())
    assert (empty.owner, empty.window, empty.rows, empty.summary) == (1, 3, 0, None)
    good = empty.encode(compress=False)
    for bad in (b"", good[:10], b"QPFP" + good[4:], good.replace(b'"rows":0', b'"rows":"0"')):
        with pytest.raises(BlockError):
            SummaryBlock.decode(bad)


def test_solve_cadence_doubles_then_follows_the_grid() -> None:
    cfg, grid = ClockSyncConfig(), WindowGrid(1_000_000_000)
    every = cfg.solve_every_ns // grid.width_ns
    due = [k for k in range(100, 100 + 4 * every) if solve_due(k, 100, grid, cfg)]
    doubling = [j for j in (0, 1, 3, 7, 15) if (j + 1) * grid.width_ns < cfg.window_ns]
    assert due == sorted({100 + j for j in doubling} | {k for k in range(100, 100 + 4 * every)
                                                          if k % every == 0})  # fmt: skip
    assert not solve_due(99, 100, grid, cfg)


def test_owner_bounds_and_join_refuse_what_cannot_be_laid_end_to_end() -> None:
    assert owner_bounds(10, 3).tolist() == [0, 2, 4, 10]  # lower ends lie low
    for n, k in ((4, 4), (10, 8), (100_000, 64)):
        b = owner_bounds(n, k)
        assert b[0] == 0 and b[-1] == n and (np.diff(b) > 0).all()
    with pytest.raises(ValueError):
        owner_bounds(4, 5)
    with pytest.raises(ValueError):
        join([None])
