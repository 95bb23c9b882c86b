"""Greedy tomography: fewest links explaining the bad paths, exoneration by good paths."""

from __future__ import annotations

import numpy as np
import pytest

from controller.localize import greedy_cover, neutral_rate, unique_rows


def paths(rng: np.random.Generator, n: int) -> np.ndarray:  # type: ignore[type-arg]
    # 4 sources (links 0-3), 4 middles (4-7), 4 destinations (8-11): three links per path
    return np.column_stack(
        [rng.integers(0, 4, n), rng.integers(4, 8, n), rng.integers(8, 12, n)]
    ).astype(np.int32)


def cover_for(sets: np.ndarray, bad: np.ndarray) -> list[int]:  # type: ignore[type-arg]
    total = np.bincount(sets.ravel(), minlength=12).astype(np.int64)
    c = greedy_cover(total, sets[bad], min_rate=0.05, min_bad=3)
    return sorted(int(x) for x in c.picked)


@pytest.mark.parametrize("faulty", [[5], [1, 6], [2, 5, 9]])
def test_faulty_links_found_with_noise(faulty: list[int]) -> None:
    rng = np.random.default_rng(len(faulty))
    sets = paths(rng, 3000)
    crosses = np.isin(sets, faulty).any(axis=1)
    bad = (crosses & (rng.random(len(sets)) < 0.3)) | (rng.random(len(sets)) < 0.002)
    assert cover_for(sets, bad) == sorted(faulty)


def test_clean_paths_exonerate() -> None:
    rng = np.random.default_rng(3)
    sets = paths(rng, 2000)
    bad = rng.random(len(sets)) < 0.003  # scattered background: nobody to blame
    assert cover_for(sets, bad) == []


def test_unique_rows_and_bounds() -> None:
    u = unique_rows(np.array([[3, 1, 3, -1]], dtype=np.int32))
    assert sorted(int(x) for x in u[0] if x >= 0) == [1, 3]
    with pytest.raises(ValueError):
        greedy_cover(np.zeros(2, np.int64), np.array([[5]]), min_rate=0.1, min_bad=1)


def test_a_tie_in_count_goes_to_the_higher_bad_rate_not_the_lower_id() -> None:
    # element 0 carries the 10 bad measurements and 10 good ones (50 %); element 1 carries
    # the same 10 bad ones and nothing else (100 %): 1 is the cause, whatever its id
    total = np.array([20, 10], np.int64)
    bad = np.tile(np.array([[0, 1]], np.int32), (10, 1))
    cover = greedy_cover(total, bad, min_rate=0.3, min_bad=2)
    assert cover.picked.tolist() == [1]


def test_the_pick_has_the_most_evidence_not_the_most_bad() -> None:
    # the b16 capture's window: a NIC link (0) carries the uplink's (1) 78 slow delays, 6 of
    # the background's and 74 clean ones (53 %); the uplink carries the 78 slow ones alone
    # (its leaf-mate's delays withheld); 40 other elements carry 1 % slow delays. Counting
    # bad delays picks the NIC link (84 > 78); its clean delays are evidence against it
    total = np.array([158, 78] + [300] * 40, np.int64)
    bad = np.array(
        [[0, 1]] * 78 + [[0, 2 + k] for k in range(6)] + [[2 + k % 40, -1] for k in range(114)],
        np.int32,
    )
    cover = greedy_cover(total, bad, min_rate=0.5, min_bad=3)
    assert cover.picked.tolist() == [1]


def test_a_barred_element_is_never_picked_and_its_sets_go_to_the_others() -> None:
    # a NIC link (0) and two uplinks (1, 2) carry the same slow delays: the NIC link is the
    # one element that explains them all, unless its round trips cleared it (barred)
    total = np.array([40, 20, 20], np.int64)
    bad = np.array([[0, 1]] * 20 + [[0, 2]] * 20, np.int32)
    assert greedy_cover(total, bad, min_rate=0.5, min_bad=3).picked.tolist() == [0]
    barred = np.array([True, False, False])
    cover = greedy_cover(total, bad, min_rate=0.5, min_bad=3, barred=barred)
    assert sorted(cover.picked.tolist()) == [1, 2]
    with pytest.raises(ValueError, match="one flag per element"):
        greedy_cover(total, bad, min_rate=0.5, min_bad=3, barred=barred[:2])


def test_the_neutral_rate_lies_between_the_background_and_the_fault() -> None:
    c = neutral_rate(0.02, 0.5)
    assert 0.02 < c < 0.5 and c == pytest.approx(0.173, abs=0.001)
    assert neutral_rate(0.001, 0.05) == pytest.approx(0.0127, abs=0.0002)
    assert neutral_rate(0.6, 0.5) == 0.5 and neutral_rate(0.0, 0.5) == 0.5
