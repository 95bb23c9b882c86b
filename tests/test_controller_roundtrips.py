"""Round trips that clear hops (`controller.detect.roundtrips`): a round path whose round
trips are significantly under a hop's cut clears that hop; a hop that queues over its cut
half the time or more is not cleared; too few round trips, or no cut, test nothing."""

from __future__ import annotations

import numpy as np
import pytest

from controller.detect.roundtrips import cleared

# directed hops: 0 a->leaf, 1 leaf->b, 2 b->leaf, 3 leaf->a, 4 leaf->spine, 5 spine->leaf
PATHS = np.array([[0, 1], [2, 3], [0, 4], [5, 3]], np.int32)  # a->b, b->a, a->up, down->a
N_HOPS = 6


def _rts(fwd: int, rev: int, excess: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(excess)
    return np.full(n, fwd, np.int64), np.full(n, rev, np.int64), excess.astype(np.float64)


def _cut(**hops: float) -> np.ndarray:
    cut = np.full(N_HOPS, np.nan)
    for name, v in hops.items():
        cut[int(name[1:])] = v
    return cut


def test_clean_round_trips_clear_every_hop_they_cross_of_a_queue_far_over_them() -> None:
    rng = np.random.default_rng(1)
    f, r, x = _rts(0, 1, rng.uniform(1_000, 30_000, 20))  # kernel-stamp noise, no queue
    out = cleared(f, r, x, PATHS, _cut(h0=3e6, h1=3e6, h2=3e6, h3=3e6, h4=3e6),
                  min_count=8, alpha=0.01)  # fmt: skip
    assert out.tolist() == [True, True, True, True, False, False]  # 4: crossed by none


def test_a_claim_under_the_round_trips_noise_is_not_cleared() -> None:
    rng = np.random.default_rng(2)
    f, r, x = _rts(0, 1, rng.uniform(1_000, 30_000, 20))
    out = cleared(f, r, x, PATHS, _cut(h0=3e6, h1=2_000), min_count=8, alpha=0.01)
    assert out[0] and not out[1]


def test_a_hop_queued_over_its_cut_half_the_time_is_not_cleared() -> None:
    """The test's level holds: over 400 windows of a hop whose waits exceed the cut 55 %
    of the time (a queue that comes and goes), it is cleared in fewer than alpha of them."""
    times = 0
    for seed in range(400):
        rng = np.random.default_rng(seed)
        queued = rng.random(20) < 0.55
        f, r, x = _rts(0, 1, rng.uniform(0, 2_000, 20) + np.where(queued, 10_000, 0))
        times += bool(cleared(f, r, x, PATHS, _cut(h1=5_000), min_count=8, alpha=0.01)[1])
    assert times <= 4, times


def test_only_a_round_path_with_enough_round_trips_tests_and_many_tests_ask_more() -> None:
    f, r, x = _rts(0, 1, np.full(7, 100.0))
    assert not cleared(f, r, x, PATHS, _cut(h1=5_000), min_count=8, alpha=0.01).any()
    f, r, x = _rts(0, 1, np.full(10, 100.0))  # all under: 2^-10 ~ 0.001
    assert cleared(f, r, x, PATHS, _cut(h1=5_000), min_count=8, alpha=0.005)[1]  # one test
    # ... not among eight (Bonferroni over every round path and hop tested in the window)
    f2, r2, x2 = _rts(2, 3, np.full(10, 1e7))
    cut = np.full(N_HOPS, 5_000.0)
    out = cleared(np.r_[f, f2], np.r_[r, r2], np.r_[x, x2], PATHS, cut, min_count=8, alpha=0.005)
    assert not out.any()  # 0.005 / 8 < 2^-10
    assert not cleared(f, r, x, PATHS, np.full(N_HOPS, np.nan), min_count=8, alpha=0.01).any()


def test_a_round_trip_over_one_hop_s_cut_still_clears_the_others() -> None:
    # the round path a->up, down->a: the uplinks queue 5 ms, the NIC link hops do not
    f, r, x = _rts(2, 3, np.full(20, 5e6))
    out = cleared(f, r, x, PATHS, _cut(h0=3e6, h4=1e6, h5=1e6, h3=1e7), min_count=8, alpha=0.01)
    assert out.tolist() == [False, False, False, True, False, False]


def test_bad_columns_raise() -> None:
    f, r, x = _rts(0, 1, np.full(10, 1.0))
    with pytest.raises(ValueError, match="one length"):
        cleared(f, r[:5], x, PATHS, _cut(h0=1.0), min_count=8, alpha=0.01)
    with pytest.raises(ValueError, match="outside path_hops"):
        cleared(f + 9, r, x, PATHS, _cut(h0=1.0), min_count=8, alpha=0.01)
    with pytest.raises(ValueError, match="outside cut_ns"):
        cleared(f, r, x, PATHS, np.zeros(3), min_count=8, alpha=0.01)
