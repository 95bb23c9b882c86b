"""`sync.summarysolve.solve_ranges` on a window cut into edge ranges (as edge owners hold
it) gives what `sync_summary` gives on the whole window, to the bit: with bad stamps, a NIC
whose clock stepped, two NICs cut off, with and without the leaf split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from controller.clocksolve import ClockSyncConfig, window_summary
from controller.fleet.bench import EPOCH
from sync.badstamps import without_bad
from sync.edgestage import EdgeRange, FitParams, edge_range
from sync.summary import Summary
from sync.summarysolve import solve_ranges, sync_summary
from sync.window import WindowSync
from tests.edgewindow import NICS, STEPPED, stepped_window


@pytest.fixture(scope="module")
def window() -> tuple[Summary, ClockSyncConfig, np.ndarray]:
    w, cfg, leaf = stepped_window()
    return window_summary(w, cfg.window_ns // 2 + EPOCH, cfg.coded_tol_hw_ns), cfg, leaf


def _same(a: WindowSync, b: WindowSync) -> None:
    for f in ("offset_ns", "drift", "offset_std_ns", "known", "theta_ns", "flagged",
              "stepped", "step_at_ns"):  # fmt: skip
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=f not in
                              ("known", "flagged", "stepped")), f  # fmt: skip
    assert (a.estimator, a.drift_from) == (b.estimator, b.drift_from)
    assert a.closure_scale_ns == b.closure_scale_ns or (
        np.isnan(a.closure_scale_ns) and np.isnan(b.closure_scale_ns)
    )
    for f in ("offset_ns", "drift", "offset_std_ns", "status", "n_fwd", "n_rev"):
        assert np.array_equal(getattr(a.fits, f), getattr(b.fits, f), equal_nan=True), f


def test_the_window_has_bad_stamps_and_a_step(
    window: tuple[Summary, ClockSyncConfig, np.ndarray],
) -> None:
    s, cfg, leaf = window
    s2, lost, _ = without_bad(s, np.zeros(len(s.edges)))
    assert s2 is not s and lost.sum() > 0
    ws = sync_summary(NICS, s, quant_ns=cfg.quant_hw_ns, min_samples=cfg.min_samples,
                      min_coded=cfg.min_coded, leaf=leaf)  # fmt: skip
    assert STEPPED in ws.stepped and not ws.known[[5, 6, *ws.stepped]].any()
    assert ws.known.sum() == NICS - 2 - len(ws.stepped)


@pytest.mark.parametrize("leaf_split", [True, False])
@pytest.mark.parametrize("ranges", [1, 2, 4, 7])
def test_ranges_solve_as_the_whole_window(
    window: tuple[Summary, ClockSyncConfig, np.ndarray], ranges: int, leaf_split: bool
) -> None:
    s, cfg, leaf = window
    p = FitParams(cfg.quant_hw_ns, cfg.min_samples, cfg.min_coded)
    lf = leaf if leaf_split else None
    whole = sync_summary(NICS, s, quant_ns=p.quant_ns, min_samples=p.min_samples,
                         min_coded=p.min_coded, leaf=lf)  # fmt: skip
    cuts = np.linspace(0, len(s.edges), ranges + 1).astype(int)
    if ranges > 1:  # a small first range, and one with no edge where there are 7
        cuts[1] = 3
    if ranges == 7:
        cuts[2] = cuts[1]
    parts = [EdgeRange(edge_range(s, int(a), int(b)), p) for a, b in itertools.pairwise(cuts)]
    _same(solve_ranges(NICS, parts, leaf=lf), whole)


def test_edge_range_cuts_and_checks(window: tuple[Summary, ClockSyncConfig, np.ndarray]) -> None:
    s, _, _ = window
    a, b = edge_range(s, 0, 100), edge_range(s, 100, len(s.edges))
    assert a.n_points + b.n_points == s.n_points
    assert b.x_edge.min() == 0 and b.all_g.min() >= 0 and len(b.n_all) == 2 * len(b.edges)
    with pytest.raises(ValueError):
        edge_range(s, 5, 2)
    with pytest.raises(ValueError):
        solve_ranges(NICS, [])
