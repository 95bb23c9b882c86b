"""Path index: hash table numbering, growth, hop expansion and baselines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.detect.paths import PathIndex, alias_groups, expand, path_signature
from controller.windows import KeyIndex
from mesh.fabric import build_fabric
from testbed.sim.engine import SimConfig, Simulator
from testbed.sim.localize_bench import three_tier_shape


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**31 - 1), st.sampled_from([3, 4, 6]))
def test_same_rows_same_numbers_distinct_rows_distinct(n: int, seed: int, width: int) -> None:
    rng = np.random.default_rng(seed)
    hops = rng.integers(-1, 70_000 if width == 6 else 500, (n, width)).astype(np.int32)
    idx = PathIndex(width)
    a = idx.paths(hops)
    b = idx.paths(hops[::-1])
    assert np.array_equal(a, b[::-1])
    _, inv = np.unique(hops, axis=0, return_inverse=True)
    # equal rows <-> equal path numbers
    assert len(np.unique(a)) == len(np.unique(inv)) == idx.size
    assert np.array_equal(idx.hops[a], hops)


def test_signature_packs_exactly() -> None:
    h = np.array([[0, 1, 2, -1], [0, 1, 2, 3]], dtype=np.int32)
    s = path_signature(h)
    assert s[0] != s[1]


def test_expand_and_fold() -> None:
    idx = PathIndex(3)
    p = idx.paths(np.array([[0, 5, -1], [0, 7, 3]], dtype=np.int32))
    per_hop = expand(np.bincount(p, minlength=2) * np.array([2, 1]), idx.hops, 8)
    assert per_hop.tolist() == [3, 0, 0, 1, 0, 2, 0, 1]
    per_link = expand(np.ones(2, np.int64), idx.hops, 4, links=True)
    assert per_link.tolist() == [2, 1, 1, 1]
    idx.fold(np.array([1000.0, np.inf]), 1.0, 50.0)
    assert idx.base[0] == 1000.0 and np.isinf(idx.base[1])
    idx.fold(np.array([2000.0, 500.0]), 1.0, 50.0)  # higher: creeps up by drift only
    assert idx.base.tolist() == [1050.0, 500.0]


def test_alias_groups_are_links_every_path_crosses_together() -> None:
    # links 0..3; hop id = 2 x link + direction
    hops = np.array(
        [
            [0, 3, -1],  # links 0 and 1 (0 up, 1 down)
            [2, 1, -1],  # links 1 and 0 the other way: 0 and 1 are still crossed together
            [4, -1, -1],  # link 2 alone
            [4, 6, -1],  # links 2 and 3: 2 is crossed without 3 above, so not aliases
        ],
        dtype=np.int32,
    )
    assert alias_groups(5, hops) == [(0, 1)]  # link 4 is crossed by nothing: in no group
    assert alias_groups(5, hops[2:]) == []
    with pytest.raises(ValueError, match="names link 3 of 3"):
        alias_groups(3, hops)


def test_two_pods_leave_each_super_spine_s_two_links_unidentifiable() -> None:
    for pods, expect in ((2, 8), (4, 0)):
        fab = build_fabric(three_tier_shape(64, pods, 8))
        sim = Simulator(fab, SimConfig(seed=1))
        groups = alias_groups(len(fab.links), sim.probed_paths())
        assert len(groups) == expect
        for g in groups:  # the super-spine's link into each pod
            ends = {fab.links[i].upper for i in g}
            assert len(g) == 2 and len(ends) == 1 and next(iter(ends)).startswith("super")


def _alias_reference(n_links: int, hops: np.ndarray, directed: bool) -> list[tuple[int, ...]]:
    """Groups by the exact set of rows crossing each element (the definition), in order of
    their first element."""
    rows_of: dict[int, set[int]] = {}
    for r, row in enumerate(hops.tolist()):
        for h in row:
            if h >= 0:
                rows_of.setdefault(h if directed else h // 2, set()).add(r)
    groups: dict[frozenset[int], list[int]] = {}
    for el in sorted(rows_of):
        groups.setdefault(frozenset(rows_of[el]), []).append(el)
    return [tuple(g) for g in groups.values() if len(g) > 1]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 60), st.integers(0, 2**31 - 1), st.booleans())
def test_alias_groups_match_the_definition(n: int, seed: int, directed: bool) -> None:
    # few elements, few rows: many groups, of every size, in shuffled first-element order
    rng = np.random.default_rng(seed)
    n_links = 12
    hops = np.full((n, 4), -1, np.int32)
    for r in range(n):
        k = int(rng.integers(1, 5))
        links = rng.choice(n_links, k, replace=False)
        hops[r, :k] = 2 * links + rng.integers(0, 2, k)
    n_el = 2 * n_links if directed else n_links
    assert alias_groups(n_el, hops, directed=directed) == _alias_reference(n_el, hops, directed)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**31 - 1))
def test_path_numbers_are_first_seen_sorted_per_call_and_survive_growth(n: int, seed: int) -> None:
    # many keys on one home slot (tiny table, then doubled): every key found at its number
    rng = np.random.default_rng(seed)
    idx = PathIndex(2)
    seen: dict[tuple[int, int], int] = {}
    for _ in range(3):
        hops = rng.integers(0, 40, (n, 2)).astype(np.int32)
        got = idx.paths(hops)
        new = sorted(
            {tuple(r) for r in hops.tolist()} - set(seen),
            key=lambda r: (r[0] + 1) | ((r[1] + 1) << 16),
        )
        for r in new:
            seen[r] = len(seen)
        assert got.tolist() == [seen[tuple(r)] for r in hops.tolist()]
        assert [tuple(r) for r in idx.hops.tolist()] == list(seen)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**31 - 1))
def test_key_index_numbers_new_keys_in_key_order_after_the_known(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    idx = KeyIndex(16)
    known: list[int] = []
    for _ in range(3):  # repeats within and across calls, negative keys, table growth
        keys = rng.integers(-(2**40), 2**40, n) // int(rng.integers(1, 2**30))
        slots, n_new = idx.insert(keys)
        new = sorted(set(keys.tolist()) - set(known))
        known += new
        assert n_new == len(new)
        assert slots.tolist() == [known.index(k) for k in keys.tolist()]
        assert idx.lookup(np.array(known, np.int64)).tolist() == list(range(len(known)))
