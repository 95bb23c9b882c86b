"""Pair fits: accuracy on random clocks and noise, exactness against an LP, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from sync import FitStatus, PairFit, fit_pair, fit_pairs
from sync.synth import PairSamples, pair_samples


def _one(s: PairSamples, p: int) -> tuple[np.ndarray, ...]:
    f, r = s.fwd_pair == p, s.rev_pair == p
    return s.fwd_t[f], s.fwd_d[f], s.rev_t[r], s.rev_d[r]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), load=st.sampled_from([0.1, 0.4, 0.9]))
def test_batched_fit_recovers_random_offsets_and_drifts(seed: int, load: float) -> None:
    """Offsets +-1 ms, drifts +-60 ppm (relative), hw quantization, queueing tails."""
    rng = np.random.default_rng(seed)
    t0 = float(rng.uniform(0, 5e9))
    s = pair_samples(rng, 50, 100, load=load, t0_ns=t0)
    fits = fit_pairs(50, s.fwd_pair, s.fwd_t, s.fwd_d, s.rev_pair, s.rev_t, s.rev_d)
    assert fits.ok.all()
    tm = t0 + 0.5e9  # theta compared mid-window; the offset at t=0 is an extrapolation
    err = np.abs(fits.offset_ns + fits.drift * tm - (s.offset_ns + s.drift * tm))
    tol = 25.0 if load < 0.9 else 60.0
    assert err.max() < tol, err.max()
    assert np.abs(fits.drift - s.drift).max() < 1e-7
    assert np.median(err) < (3.0 if load < 0.9 else 6.0)


def test_batched_matches_exact_single_pair_fit() -> None:
    rng = np.random.default_rng(7)
    s = pair_samples(rng, 40, 150, load=0.9, window_ns=2e9, t0_ns=1e9)
    fits = fit_pairs(40, s.fwd_pair, s.fwd_t, s.fwd_d, s.rev_pair, s.rev_t, s.rev_d)
    for p in range(40):
        exact = fit_pair(*_one(s, p))
        assert exact.ok
        assert fits[p].offset_ns == pytest.approx(exact.offset_ns, abs=0.05)
        assert fits[p].drift == pytest.approx(exact.drift, abs=1e-11)
        assert fits[p].floor_ns == pytest.approx(exact.floor_ns, abs=0.05)


def _lp(tf: np.ndarray, df: np.ndarray, tr: np.ndarray, dr: np.ndarray) -> tuple[float, float]:
    """(margin, slope) by linprog over (c, m, floor): df >= c + m t + floor,
    dr >= -c - m t + floor, |m| <= 1e-3."""
    tc = 0.5 * (min(tf.min(), tr.min()) + max(tf.max(), tr.max()))
    uf, ur = (tf - tc) / 1e9, (tr - tc) / 1e9  # scale times to s for conditioning
    a = np.vstack([np.column_stack([np.ones_like(uf), uf, np.ones_like(uf)]),
                   np.column_stack([-np.ones_like(ur), -ur, np.ones_like(ur)])])  # fmt: skip
    b = np.concatenate([df, dr])
    bounds = [(None, None), (-1e6, 1e6), (None, None)]  # slope in ns/s
    res = linprog([0, 0, -1], A_ub=a, b_ub=b, bounds=bounds, method="highs")
    assert res.status == 0
    return float(res.x[2]), float(res.x[1]) / 1e9


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_exact_fit_attains_the_lp_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    s = pair_samples(rng, 1, int(rng.integers(3, 40)), load=0.7, quant_ns=20.0)
    fit = fit_pair(*_one(s, 0), max_drift=1e-3)
    margin, slope = _lp(*_one(s, 0))
    if fit.ok:
        assert fit.floor_ns == pytest.approx(margin, abs=1e-3)
    else:  # the LP optimum then sits on the slope bound too
        assert fit.status == FitStatus.DRIFT_AT_BOUND
        assert abs(slope) == pytest.approx(1e-3, rel=1e-6)


def test_uncertainty_covers_most_errors() -> None:
    rng = np.random.default_rng(3)
    s = pair_samples(rng, 2000, 100, load=0.4)
    fits = fit_pairs(2000, s.fwd_pair, s.fwd_t, s.fwd_d, s.rev_pair, s.rev_t, s.rev_d, quant_ns=6.4)
    z = np.abs(fits.offset_ns - s.offset_ns) / fits.offset_std_ns
    assert np.mean(z < 3) > 0.95
    assert np.all(fits.offset_std_ns > 0)


def test_sw_stamp_jitter_stays_within_a_microsecond() -> None:
    rng = np.random.default_rng(4)
    s = pair_samples(rng, 200, 200, load=0.4, quant_ns=0.0, queue_ns=500.0)
    jitter = rng.exponential(1500.0, (2, len(s.fwd_d)))  # sw stamps: only ever late
    fits = fit_pairs(
        200, s.fwd_pair, s.fwd_t, s.fwd_d + jitter[0], s.rev_pair, s.rev_t, s.rev_d + jitter[1]
    )
    assert np.percentile(np.abs(fits.offset_ns - s.offset_ns), 99) < 1000.0


# ------------------------------------------------------------------------------- bad input


def test_empty_and_one_directional_windows_are_unknown_not_numbers() -> None:
    rng = np.random.default_rng(5)
    s = pair_samples(rng, 4, 20)
    keep_f = s.fwd_pair != 1  # pair 1: reverse only
    keep_r = s.rev_pair != 2  # pair 2: forward only
    fits = fit_pairs(
        5,  # pair 4: no samples at all
        s.fwd_pair[keep_f], s.fwd_t[keep_f], s.fwd_d[keep_f],
        s.rev_pair[keep_r], s.rev_t[keep_r], s.rev_d[keep_r],
    )  # fmt: skip
    assert fits[0].ok and fits[3].ok
    assert fits[1].status == FitStatus.NO_FWD
    assert fits[2].status == FitStatus.NO_REV
    assert fits[4].status == FitStatus.NO_FWD
    for p in (1, 2, 4):
        assert math.isnan(fits.offset_ns[p]) and math.isnan(fits.drift[p])
        assert fits[p].reason != "ok"
    assert fit_pair([], [], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).status == FitStatus.NO_FWD
    assert fit_pair([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [], []).status == FitStatus.NO_REV


def test_nan_samples_make_the_pair_unknown_or_are_dropped_on_request() -> None:
    rng = np.random.default_rng(6)
    s = pair_samples(rng, 3, 50)
    fd = s.fwd_d.copy()
    fd[np.flatnonzero(s.fwd_pair == 1)[3]] = np.nan
    args = (3, s.fwd_pair, s.fwd_t, fd, s.rev_pair, s.rev_t, s.rev_d)
    strict = fit_pairs(*args)
    assert strict[1].status == FitStatus.NONFINITE and math.isnan(strict.offset_ns[1])
    assert strict.ok[[0, 2]].all()
    lenient = fit_pairs(*args, drop_nonfinite=True)
    assert lenient.ok.all()
    assert abs(lenient.offset_ns[1] - s.offset_ns[1]) < 25.0
    f = s.fwd_pair == 1
    assert fit_pair(s.fwd_t[f], fd[f], *_one(s, 1)[2:]).status == FitStatus.NONFINITE


def test_too_few_samples_no_span_and_unbounded_slope() -> None:
    t = [0.0, 1e6, 2e6]
    d = [100.0, 100.0, 100.0]
    assert fit_pair(t[:2], d[:2], t, d).status == FitStatus.TOO_FEW
    same = [5.0, 5.0, 5.0]
    assert fit_pair(same, d, same, d).status == FitStatus.NO_SPAN
    # forward only early, reverse only late: any steeper slope separates better
    early, late = [0.0, 1.0, 2.0], [1e6, 1e6 + 1, 1e6 + 2]
    assert fit_pair(early, d, late, d).status == FitStatus.DRIFT_AT_BOUND
    fits = fit_pairs(1, [0, 0, 0], early, d, [0, 0, 0], late, d)
    assert fits[0].status == FitStatus.DRIFT_AT_BOUND and math.isnan(fits.offset_ns[0])


def test_malformed_arrays_raise_value_error() -> None:
    with pytest.raises(ValueError, match="length"):
        fit_pairs(1, [0, 0], [1.0, 2.0, 3.0], [1.0, 2.0], [0], [1.0], [1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        fit_pairs(1, [0, 5], [1.0, 2.0], [1.0, 2.0], [0], [1.0], [1.0])
    with pytest.raises(ValueError, match="1-D"):
        fit_pair(np.zeros((2, 2)), [1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="length"):
        fit_pair([1.0, 2.0], [1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="integers"):
        fit_pairs(1, [0.5], [1.0], [1.0], [0], [1.0], [1.0])


def test_pairfit_refuses_a_number_with_unknown_status() -> None:
    with pytest.raises(ValueError):
        PairFit(1.0, 0.0, 1.0, 0.0, 0.0, 3, 3, FitStatus.NO_FWD)
    with pytest.raises(ValueError):
        PairFit(math.nan, 0.0, 1.0, 0.0, 0.0, 3, 3, FitStatus.OK)


def test_noise_free_fit_is_exact_with_a_finite_positive_std() -> None:
    t = np.linspace(0.0, 1e9, 20)
    theta = 1234.5 + 20e-6 * t
    fits = fit_pairs(1, np.zeros(20, int), t, 2000.0 + theta, np.zeros(20, int), t, 2000.0 - theta)
    assert fits[0].offset_ns == pytest.approx(1234.5, abs=0.02)  # tol_ns at the window edge
    assert fits[0].drift == pytest.approx(20e-6, abs=3e-11)  # tol_ns over half the window
    assert fits[0].floor_ns == pytest.approx(2000.0, abs=0.02)
    assert 0 < fits[0].offset_std_ns < 1.0  # floored, so 1/std^2 network weights stay finite


def test_fit_bench_reports_batched_equal_to_exact() -> None:
    from sync.bench import bench_pair_fits

    res = bench_pair_fits(300, 50, seed=2, loop_pairs=30)
    assert res["batched_vs_exact_max_gap_ns"] < 0.05
    assert res["p99_offset_err_ns"] < 25.0


def test_pairfits_refuses_numbers_on_unknown_pairs() -> None:
    from sync import PairFits

    one = np.ones(1)
    with pytest.raises(ValueError, match="finite exactly"):
        PairFits(one, one, one, one, one, np.ones(1, np.int64), np.ones(1, np.int64),
                 np.array([FitStatus.NO_REV], np.int8))  # fmt: skip
    with pytest.raises(ValueError, match="equal length"):
        PairFits(one, np.ones(2), one, one, one, np.ones(1, np.int64), np.ones(1, np.int64),
                 np.zeros(1, np.int8))  # fmt: skip
