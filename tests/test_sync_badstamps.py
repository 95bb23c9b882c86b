"""Gross bad NIC stamps: found by being alone below a direction's floor and left out, so a
window with them syncs as one without (`sync.badstamps`, docs/sync.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mesh.fabric import FabricShape, build_fabric
from sync import badstamps
from sync.summarysolve import sync_summary
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.model import ModelKnobs
from testbed.sim.sync_stream import collect_window, window_batches, window_edges


def _groups(rng: np.random.Generator, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group 12 genuine values rising from a floor like a hot tail (spacings of tens of
    ns), and 0-3 bad ones 1-50 µs below; returns (group, value, bad) sorted as the test wants."""
    g, v, bad = [], [], []
    for k in range(n_groups):
        genuine = 80.0 * np.cumsum(rng.exponential(size=12)) ** 0.5
        nb = int(rng.integers(0, 4))
        outl = genuine[rng.integers(0, 12, nb)] - rng.uniform(1e3, 50e3, nb)
        vals = np.concatenate([genuine, outl])
        g.append(np.full(len(vals), k))
        v.append(vals)
        bad.append(np.r_[np.zeros(12, bool), np.ones(nb, bool)])
    gg, vv, bb = np.concatenate(g), np.concatenate(v), np.concatenate(bad)
    order = np.lexsort((vv, gg))
    return gg[order], vv[order], bb[order]


def test_bad_values_below_the_floor_are_dropped_and_genuine_ones_kept() -> None:
    rng = np.random.default_rng(1)
    g, v, bad = _groups(rng, 2000)
    drop = badstamps.leading_outliers(g, v)
    # every bad value that sits at least a µs under the genuine floor goes; no genuine one does
    floor = np.full(2000, np.inf)
    np.minimum.at(floor, g[~bad], v[~bad])
    clear = bad & (v < floor[g] - badstamps.OUTLIER_MIN_NS)
    assert clear.sum() > 1000 and np.all(drop[clear])
    assert not np.any(drop & ~bad)
    # never more than a group can spare
    assert np.all(np.bincount(g[drop]) <= badstamps.MAX_DROPS)
    with pytest.raises(ValueError):
        badstamps.leading_outliers(g, v, k=2)


def test_a_genuine_minimum_is_dropped_rarely_in_the_tail_model() -> None:
    # scale-free: only the ratio test, without the 1 µs floor of what is called bad
    assert badstamps.false_drop_rate(1.0) < badstamps.false_drop_rate(0.5) < 0.2


def _window(bad_prob: float) -> tuple[object, np.ndarray, np.ndarray]:
    fabric = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8))
    knobs = dataclasses.replace(ModelKnobs(), hw_bad_stamp_prob=bad_prob)
    cfg = SimConfig(load=0.9, rate_hz=50.0, peers=6, mesh_in_group=False, seed=11, model=knobs)
    sim = Simulator(fabric, cfg)
    edges, per = window_edges(sim.pairs_src, sim.pairs_dst, 32)
    t_ref = EPOCH_NS + 500_000_000
    sw = collect_window(window_batches(sim, 1.0, 0.1), edges, per * 2 * 51, 32, t_ref, 1.0, 25)
    return sw.summary, sim.true_offset_ns(0.5e9), fabric.nic_group_index.astype(np.int64)


def _p99(off: np.ndarray, truth: np.ndarray) -> float:
    e = off - truth
    return float(np.percentile(np.abs(e - np.median(e)), 99))


def test_a_window_with_bad_stamps_syncs_as_one_without() -> None:
    clean, truth, leaf = _window(0.0)
    dirty, truth_d, _ = _window(2e-3)
    assert np.array_equal(truth, truth_d)  # bad stamps are stamp errors: the clocks are the same
    base = _p99(sync_summary(32, clean, quant_ns=6.4, leaf=leaf).offset_ns, truth)
    kept = _p99(sync_summary(32, dirty, quant_ns=6.4, leaf=leaf, drop_bad=False).offset_ns, truth)
    fixed = _p99(sync_summary(32, dirty, quant_ns=6.4, leaf=leaf).offset_ns, truth)
    assert kept > 5 * base  # what they do when kept
    assert fixed < 1.2 * base + 2.0
    # on a clean window leaving out bad stamps changes nothing
    same = sync_summary(32, clean, quant_ns=6.4, leaf=leaf)
    off = sync_summary(32, clean, quant_ns=6.4, leaf=leaf, drop_bad=False)
    np.testing.assert_array_equal(same.offset_ns, off.offset_ns)
