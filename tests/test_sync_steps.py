"""Clock steps inside a window are found, and the stepped NIC is reported unknown instead of
somewhere between its two levels (`sync.steps`, docs/sync.md)."""

from __future__ import annotations

import numpy as np
import pytest

from mesh.fabric import FabricShape, build_fabric
from sync import steps
from sync.steps import MIN_PER_SIDE, best_split, cell_medians, exchange_residuals, find_steps
from sync.summarysolve import sync_summary
from testbed.clockerr import error_figures
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.sync_stream import collect_window, window_batches, window_edges


@pytest.mark.parametrize("uneven", [False, True])
def test_cell_medians_are_the_medians_of_a_sort_by_key_and_value(
    uneven: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # dense rows over several blocks of cells (even counts, ties) and, when one cell holds
    # most values, the one sort by (key, value): the same medians to the bit either way
    monkeypatch.setattr(steps, "CELL_CHUNK", 64)
    rng = np.random.default_rng(5)
    cells = 1000
    key = rng.integers(0, cells, 6000)
    key[key % 7 == 0] += 1  # cells 0, 7, 14, ... empty
    sorted_alone: list[int] = []
    if uneven:  # one crowded cell: its values alone sorted by (key, value), the rest dense
        key = np.concatenate([key, np.full(200_000, 11)])
        key_order = steps.key_order

        def counted(k: np.ndarray, v: np.ndarray) -> np.ndarray:
            sorted_alone.append(len(k))
            return key_order(k, v)

        monkeypatch.setattr(steps, "key_order", counted)
    else:  # the dense rows alone

        def no_sort(*_: object) -> None:
            raise AssertionError("sorted by (key, value)")

        monkeypatch.setattr(steps, "key_order", no_sort)
    val = np.round(rng.normal(0, 50.0, len(key)), 1)
    got, cnt = cell_medians(key, val, cells)
    order = np.lexsort((val, key))
    k, v = key[order], val[order]
    want = np.full(cells, np.nan)
    for c in range(cells):
        x = v[k == c]
        if len(x):
            want[c] = 0.5 * (x[(len(x) - 1) // 2] + x[len(x) // 2])
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(cnt, np.bincount(key, minlength=cells))
    assert np.isnan(got[0]) and np.isfinite(got[3])
    assert sorted_alone == ([int(cnt[11])] if uneven else [])


def _split_loop(w: np.ndarray, y: np.ndarray, cnt: np.ndarray) -> tuple[np.ndarray, ...]:
    """The per-split loop `best_split` replaced (one weighted 3 x 3 solve per split, splits in
    turn, a later split taking over only when its score is higher): the reference."""
    n, nb = y.shape
    tb = (np.arange(nb) + 0.5) / nb
    best, at, score = np.zeros(n), np.zeros(n, np.int64), np.zeros(n)
    for split in range(1, nb):
        side = (np.arange(nb) >= split).astype(np.float64)
        x = np.stack([np.ones(nb), tb - 0.5, side], axis=1)
        a = np.einsum("nb,bi,bj->nij", w, x, x) + 1e-9 * np.eye(3)
        coef = np.linalg.solve(a, np.einsum("nb,bi,nb->ni", w, x, y)[..., None])[..., 0]
        res = np.where(w > 0, np.abs(y - coef @ x.T), np.inf)
        k = (w > 0).sum(axis=1)
        srt = np.sort(res, axis=1)
        rows = np.arange(n)
        mid = 0.5 * (srt[rows, np.maximum(k - 1, 0) // 2] + srt[rows, np.maximum(k, 1) // 2])
        scale = np.where(k > 0, 1.4826 * mid, np.nan)
        enough = (
            (cnt[:, :split].sum(axis=1) >= MIN_PER_SIDE)
            & (cnt[:, split:].sum(axis=1) >= MIN_PER_SIDE)
            & (k >= 5)
        )
        jump = np.where(enough, coef[:, 2], 0.0)
        z = np.abs(jump) / np.maximum(np.nan_to_num(scale, nan=np.inf), 1.0)
        better = enough & (z > score)
        best, at, score = (np.where(better, jump, best), np.where(better, split, at),
                           np.where(better, z, score))  # fmt: skip
    return best, at, score


def test_all_splits_at_once_choose_as_the_loop_over_splits_did() -> None:
    # traces with a level shift, without, with empty and thin bins: the same split, the
    # same shift but for rounding (the normal equations now come from suffix sums)
    rng = np.random.default_rng(11)
    n, nb = 3000, 16
    cnt = rng.integers(0, 12, (n, nb)).astype(np.float64)
    cnt[rng.random((n, nb)) < 0.2] = 0.0
    cnt[:50, 3:] = 0.0  # too few filled bins
    y = rng.normal(0, 40.0, (n, nb)) + rng.normal(0, 5.0, (n, 1)) * np.arange(nb)
    shift_at = rng.integers(1, nb, n)
    y += np.where(np.arange(nb) >= shift_at[:, None], rng.uniform(-3000, 3000, (n, 1)), 0.0)
    y[rng.random(n) < 0.1] = 0.0  # flat: no split scores
    w = cnt.copy()
    y = np.where(w > 0, y, 0.0)
    got_best, got_at, got_score = best_split(w, y, cnt)
    ref_best, ref_at, ref_score = _split_loop(w, y, cnt)
    assert (ref_score > 0).sum() > n // 2 and (ref_score == 0).sum() > 50  # both kinds tried
    assert np.array_equal(got_at, ref_at)
    np.testing.assert_allclose(got_best, ref_best, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got_score, ref_score, rtol=1e-9, atol=1e-12)


def test_a_level_shift_in_one_nics_exchanges_is_a_step_and_noise_is_not() -> None:
    rng = np.random.default_rng(3)
    n, m = 40, 400
    a = rng.integers(0, n, m)
    b = (a + rng.integers(1, n, m)) % n
    edges = np.sort(np.stack([a, b], axis=1), axis=1)
    edges = np.unique(edges, axis=0)
    per = 30
    x_edge = np.repeat(np.arange(len(edges)), per)
    x_mid = rng.uniform(-1e9, 1e9, len(x_edge))
    resid = rng.normal(0, 80.0, len(x_edge))  # exchange noise around the solved lines
    assert len(find_steps(n, edges, x_edge, x_mid, resid)) == 0
    # NIC 7's clock jumps 2 us ahead at +0.4 s: + on edges where it is the second end
    at = x_mid > 0.4e9
    on_j, on_i = edges[x_edge, 1] == 7, edges[x_edge, 0] == 7
    stepped = resid + np.where(at & on_j, 2000.0, 0.0) - np.where(at & on_i, 2000.0, 0.0)
    found = find_steps(n, edges, x_edge, x_mid, stepped)
    assert found.nodes.tolist() == [7]
    assert found.size_ns[0] == pytest.approx(2000.0, rel=0.15)
    assert abs(found.at_ns[0] - 0.4e9) < 0.15e9
    with pytest.raises(ValueError):
        find_steps(n, edges, x_edge, x_mid[:-1], resid)


def test_exchange_residuals_are_what_the_solved_lines_leave_centred_per_edge() -> None:
    edges = np.array([[0, 1], [1, 2]])
    offset, drift = np.array([0.0, 100.0, 50.0]), np.array([0.0, 1e-6, 0.0])
    x_edge = np.array([0, 0, 1, 1])
    x_mid = np.array([0.0, 1e9, 0.0, 1e9])
    line = np.array([100.0, 100.0 + 1e3, -50.0 + 1e-6 * 100.0, -50.0 - 1e-6 * (1e9 - 100.0)])
    r = exchange_residuals(edges, x_edge, x_mid, line + np.array([5.0, -5.0, 3.0, -3.0]),
                           offset, drift)  # fmt: skip
    np.testing.assert_allclose(r, [5.0, -5.0, 3.0, -3.0], atol=1e-6)


@pytest.mark.parametrize("size_ns", [3_000.0, -100_000.0])
def test_the_stepped_nic_is_unknown_and_the_others_are_as_good_as_without(size_ns: float) -> None:
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8))
    leaf = fab.nic_group_index.astype(np.int64)

    def solve(step: bool) -> tuple[object, np.ndarray]:
        sim = Simulator(fab, SimConfig(load=0.4, rate_hz=50, peers=8, mesh_in_group=False, seed=4))
        if step:
            sim.step_clock(9, 0.6, size_ns)
        edges, per = window_edges(sim.pairs_src, sim.pairs_dst, 32)
        sw = collect_window(
            window_batches(sim, 1.0, 0.1), edges, per * 2 * 51, 32, EPOCH_NS + 500_000_000, 1.0, 25
        )  # fmt: skip
        return sync_summary(32, sw.summary, quant_ns=6.4, leaf=leaf), sim.true_offset_ns(0.5e9)

    clean, truth = solve(False)
    ws, truth_s = solve(True)
    assert ws.stepped.tolist() == [9] and not ws.known[9] and np.isnan(ws.offset_ns[9])
    assert abs(ws.step_at_ns[0] - 0.1e9) < 0.1e9  # 0.6 s is 0.1 s after the reference
    fig, base = (
        error_figures(ws.offset_ns, truth_s, ws.known),
        error_figures(clean.offset_ns, truth, clean.known),
    )
    assert fig["unknown"] == 1 and fig["p99_ns"] < 1.5 * base["p99_ns"] + 5.0
    # without looking for steps the NIC is known and far off
    blind = Simulator(fab, SimConfig(load=0.4, rate_hz=50, peers=8, mesh_in_group=False, seed=4))
    blind.step_clock(9, 0.6, size_ns)
    edges, per = window_edges(blind.pairs_src, blind.pairs_dst, 32)
    sw = collect_window(
        window_batches(blind, 1.0, 0.1), edges, per * 2 * 51, 32, EPOCH_NS + 500_000_000, 1.0, 25
    )  # fmt: skip
    off = sync_summary(32, sw.summary, quant_ns=6.4, leaf=leaf, clock_steps=False)
    assert off.known[9] and error_figures(off.offset_ns, truth_s)["max_ns"] > abs(size_ns) / 10
