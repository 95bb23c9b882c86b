"""`sync.runs` and the sorts built on it give exactly the orders and values of the lexsorts
they replace (ties, NaN, uneven groups, nothing at all)."""

from __future__ import annotations

import numpy as np
import pytest

from sync.runs import compact, key_order, runs_of, sorted_rows
from sync.summary import _by_group_t_d


@pytest.mark.parametrize("n", [0, 1, 2, 57, 4000])
def test_sorted_rows_are_the_lexsort_values(n: int) -> None:
    rng = np.random.default_rng(n)
    key = rng.integers(0, max(n // 6, 1), n)
    val = rng.integers(0, 5, n).astype(np.float64)  # many ties
    val[rng.random(n) < 0.05] = np.nan
    want = val[np.lexsort((val, key))]
    r = runs_of(key)
    rows = sorted_rows(r, val)
    got = rows[np.arange(rows.shape[1])[None, :] < r.counts[:, None]]
    np.testing.assert_array_equal(got, want)
    ks = np.sort(key)
    low = sorted_rows(runs_of(ks, presorted=True), val[np.argsort(key, kind="stable")], 3)
    assert low.shape == (len(r.counts), 3)
    np.testing.assert_array_equal(low, rows[:, :3] if rows.shape[1] >= 3 else low)


def test_uneven_runs_fall_back_to_one_sort() -> None:
    key = np.r_[np.zeros(20_000, np.int64), np.arange(1, 3000)]
    val = np.random.default_rng(1).normal(size=len(key))
    r = runs_of(key)
    assert not compact(r)
    low = sorted_rows(r, val, 4)
    np.testing.assert_array_equal(low[0], np.sort(val[:20_000])[:4])
    assert np.isnan(low[1:, 1:]).all() and np.array_equal(low[1:, 0], val[20_000:])
    with pytest.raises(ValueError):
        sorted_rows(r, val)


def test_key_order_and_hull_order_are_the_lexsort_orders() -> None:
    rng = np.random.default_rng(2)
    for n in (0, 1, 3, 5000):
        g = rng.integers(0, max(n // 8, 1), n).astype(np.int32)
        t = rng.integers(0, 20, n).astype(np.float64)
        d = rng.integers(0, 4, n).astype(np.float64)
        np.testing.assert_array_equal(key_order(g, t), np.lexsort((t, g)))
        np.testing.assert_array_equal(_by_group_t_d(g, t, d), np.lexsort((d, t, g)))
        t[: n // 2] = np.nan
        np.testing.assert_array_equal(key_order(g, t), np.lexsort((t, g)))
        np.testing.assert_array_equal(_by_group_t_d(g, t, d), np.lexsort((d, t, g)))


def test_runs_of_keys_past_32_bits_group_as_small_ones() -> None:
    """Keys that do not fit 32 bits take the 64-bit sort: the same runs as the small keys they
    map to in order (cut to 32 bits, these keys would sort backwards)."""
    rng = np.random.default_rng(3)
    key = rng.integers(0, 50, 2000)
    val = rng.normal(0.0, 1.0, 2000)
    small, big = runs_of(key), runs_of(key * 2**32 + (49 - key))
    np.testing.assert_array_equal(small.counts, big.counts)
    np.testing.assert_array_equal(small.keys * 2**32 + (49 - small.keys), big.keys)
    np.testing.assert_array_equal(sorted_rows(small, val), sorted_rows(big, val))
