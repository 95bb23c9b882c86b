"""Speedups of the hardware-stamp solve must not move its results: `sync_summary` on a seeded
synthetic window of 3,000 NICs (bad stamps, two NICs cut off; `tests/syncgolden.py`) gives
the offsets recorded within 0.01 ns, the same known NICs, drifts within 0.001 ppb and the
same estimator names. Recorded from main before the speedups (95a53f8), and again when the
network solve's conjugate gradients got block preconditioning (2026-11-29): each solve stops
at the same relative residual, but the Huber solve's unsettled rounds carry what is left
of it into the next round's weights, so the offsets moved by up to 1.9 ns (p99 0.25, median
0.02) on this window; against the same rounds solved to 1e-14 (the exact reweighting) the
new values are closer than the old (p99 0.089 against 0.275 ns, max 1.18 against 1.87).
And again the same day, when CG's stop read every row on equal terms (the residual over
each node's weight) and held the most weight-connected node of a component: a node with
light edges only had been left up to 60 ns off (tests/test_sync_network.py); the offsets
moved p99 0.34 ns (max 3.3, median 0.014) here."""

from __future__ import annotations

import numpy as np
import pytest

from sync.badstamps import without_bad
from tests.syncgolden import GOLDEN, golden_window, solve, values


@pytest.mark.parametrize(("tag", "leaf_split", "bins"), [("leaf", True, 4), ("rx", False, 4),
                                                        ("lines", True, 16)])  # fmt: skip
def test_sync_summary_matches_golden(tag: str, leaf_split: bool, bins: int) -> None:
    want = np.load(GOLDEN)
    got = values(solve(leaf_split, bins), tag)
    for k in ("estimator", "drift_from", "stepped", "known"):
        assert np.array_equal(got[f"{tag}/{k}"], want[f"{tag}/{k}"]), k
    off, ref = got[f"{tag}/offset"], want[f"{tag}/offset"]
    assert np.array_equal(np.isnan(off), np.isnan(ref))
    assert np.nanmax(np.abs(off - ref)) <= 0.01
    dr, ref_d = got[f"{tag}/drift"], want[f"{tag}/drift"]
    assert np.array_equal(np.isnan(dr), np.isnan(ref_d))
    assert np.nanmax(np.abs(dr - ref_d)) <= 1e-12


def test_golden_window_has_bad_stamps() -> None:
    """The window exercises the bad-stamp rounds (else the golden misses a hot spot)."""
    _, s, _, _ = golden_window()
    s2, lost, _ = without_bad(s, np.zeros(len(s.edges)))
    assert s2 is not s and lost.sum() > 0
