"""The limit of the receive reading (docs/sync.md, "The limit of the reading"): in the tail model
the correction reads (`sync.excess.tail_factor`), a NIC's correction is as good as its data
allow, and what is left is the luck of each direction's best sample, which `receive_luck`
reports."""

from __future__ import annotations

import numpy as np
import pytest

from sync import excess, summary
from sync.excess import luck_cv, receive_luck, tail_factor
from sync.summary import Summary

K = summary.RX_K


def test_luck_cv_is_the_spread_of_the_best_samples_excess() -> None:
    """``x_(1) - F = c Γ_1^beta``: its sd over its mean, 1 for a density at the floor."""
    assert luck_cv(1.0) == pytest.approx(1.0)
    e = np.random.default_rng(5).exponential(size=400_000) ** 0.5
    assert luck_cv(0.5) == pytest.approx(e.std() / e.mean(), rel=0.02)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError):
            luck_cv(bad)


def test_the_nic_reading_is_at_its_efficiency_in_the_tail_model() -> None:
    """NICs of 30 incoming directions whose best samples rise from the floor like the square
    root of a unit Poisson process's arrivals (beta 1/2, a load-0.9 window's pooled index),
    scales spread over NICs: the rule (`tail_factor` times the mean lowest-six range) misses
    the realized mean excess by 1.46x what knowing each NIC's scale would (the luck alone),
    and no linear reading of all five NIC-mean spacings does more than a few % better."""
    rng = np.random.default_rng(8)
    nics, dirs, beta = 6000, 30, 0.5
    g = np.cumsum(rng.exponential(size=(nics, dirs, K)), axis=2) ** beta
    c = np.exp(rng.normal(0.0, 0.5, size=nics))
    x = c[:, None, None] * g  # the floor at 0
    realized = x[:, :, 0].mean(axis=1)
    spacings = (x[:, :, 1:] - x[:, :, :1]).mean(axis=1)  # NIC means of x_(r) - x_(1), r = 2..K

    def rmse(est: np.ndarray) -> float:
        return float(np.sqrt(np.mean(((est - realized) / c) ** 2)))

    rule = rmse(float(tail_factor(K, beta)) * spacings[:, -1])
    oracle = rmse(c * g[:, :, 0].mean())  # each NIC's scale known exactly: the luck alone
    w, *_ = np.linalg.lstsq(spacings, realized, rcond=None)  # the best linear reading (in-sample)
    best_linear = rmse(spacings @ w)
    assert 1.3 < rule / oracle < 1.65
    assert best_linear > 0.95 * rule
    # the luck alone is what `receive_luck`'s formula gives (here for the mean, not half)
    assert oracle == pytest.approx(
        luck_cv(beta) * float(g[:, :, 0].mean()) / np.sqrt(dirs), rel=0.05
    )


def _power_law_summary(
    rng: np.random.Generator, scale: np.ndarray, copies: int
) -> tuple[Summary, np.ndarray, np.ndarray]:
    """A summary of ``copies`` disjoint complete graphs on ``len(scale)`` NICs whose
    directions' delays rise from a floor of 1000 ns like ``scale[receiver] * U^(1/2)`` (300
    samples each, the lowest ``K`` stored); per direction its receiver and its true
    best-sample excess."""
    n = len(scale)
    one = np.array([(i, j) for i in range(n) for j in range(i + 1, n)])
    edges = (one[None] + n * np.arange(copies)[:, None, None]).reshape(-1, 2)
    grp = np.arange(2 * len(edges))
    _, dst = excess.direction_ends(edges, grp)
    q = scale[dst % n, None] * np.sort(rng.random((len(grp), 300)), axis=1)[:, :K] ** 0.5
    z, zi, g32 = np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
    s = Summary(edges, np.ones(len(edges), np.int64), g32, z, z, np.repeat(grp, K).astype(np.int32),
                rng.uniform(-1e9, 1e9, len(grp) * K), (1000.0 + q).ravel(),
                np.zeros(len(grp), np.int64), np.full(len(grp), 300), zi, z, z, z)  # fmt: skip
    return s, dst, q[:, 0]


def test_receive_luck_is_the_spread_the_best_samples_leave_on_an_offset() -> None:
    """Over many windows of the same NICs (disjoint copies of one fabric), half the mean of a
    NIC's incoming best-sample excesses (what its offset carries) spreads by what
    `receive_luck` predicts from the data alone."""
    rng = np.random.default_rng(12)
    n, copies = 10, 200
    scale = rng.uniform(50.0, 400.0, n)
    s, dst, best = _power_law_summary(rng, scale, copies)
    total = n * copies
    carried = (0.5 * np.bincount(dst, best, total) / np.bincount(dst, minlength=total)).reshape(
        copies, n
    )
    predicted = receive_luck(total, s, np.zeros(len(s.edges))).reshape(copies, n)
    ratio = np.std(carried, axis=0) / np.median(predicted, axis=0)
    assert 0.75 < float(np.median(ratio)) < 1.3
    assert np.all((ratio > 0.5) & (ratio < 2.0))
    # a NIC nobody probes has no figure
    assert np.isnan(receive_luck(total + 1, s, np.zeros(len(s.edges)))[total])
