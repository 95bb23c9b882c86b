"""Coded-probe filter: spacing test, grouping, and its effect on fits with hw stamp outliers."""

from __future__ import annotations

import numpy as np
import pytest

from sync import coded_pair_mask, coded_probe_mask, fit_pairs

EPOCH = 1_700_000_000_000_000_000  # int64 ns epoch: float64 cannot hold it exactly


def test_pair_mask_keeps_only_matching_spacing_of_arrived_pairs() -> None:
    s1 = np.array([EPOCH, EPOCH + 100, EPOCH + 200, EPOCH + 300], dtype=np.int64)
    s2 = s1 + 20_000
    r1 = s1 + 5_000
    r2 = r1 + np.array([20_000, 20_007, 19_990, 20_000])
    mask = coded_pair_mask(s1, s2, r1, r2, tol_ns=8)
    assert mask.tolist() == [True, True, False, True]
    lost = coded_pair_mask(s1, s2, r1, r2, 8, arrived_first=np.array([True, True, True, False]))
    assert lost.tolist() == [True, True, False, False]
    assert not coded_pair_mask(s1[:1], s1[:1], r1[:1], r1[:1], 8)[0]  # zero spacing


def test_probe_mask_groups_unsorted_probes_and_drops_incomplete_pairs() -> None:
    pid = np.array([7, 3, 7, 3, 9, 5, 5, 5])
    send = np.array([20_000, 0, 0, 20_000, 0, 0, 1, 2]) + EPOCH
    recv = send + 1_000
    recv[3] += 50  # pair 3 spacing broken
    first = coded_probe_mask(pid, send, recv, tol_ns=10)
    assert first.tolist() == [False, False, True, False, False, False, False, False]
    both = coded_probe_mask(pid, send, recv, tol_ns=10, keep="both")
    assert both.tolist() == [True, False, True, False, False, False, False, False]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="length"):
        coded_pair_mask([1, 2], [3], [1, 2], [3, 4], 5)
    with pytest.raises(ValueError, match="tol_ns"):
        coded_pair_mask([1], [3], [1], [3], -1)
    with pytest.raises(ValueError, match="keep"):
        coded_probe_mask([1, 1], [1, 2], [1, 2], 5, keep="last")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integers"):
        coded_probe_mask([1, 1], [1.5, 2.0], [1, 2], 5)


def _coded_stamps(
    rng: np.random.Generator, n_pairs: int, n_per_dir: int, outlier_prob: float, load: float
) -> dict[str, np.ndarray]:
    """Int64 hw stamps (6.4 ns ticks) of coded probe pairs both ways between NIC pairs; the
    spacing tolerance must cover two ticks (13 ns)."""
    off = rng.uniform(-1e6, 1e6, n_pairs)  # receiver minus sender clock at EPOCH
    drift = rng.uniform(-60e-6, 60e-6, n_pairs)
    out: dict[str, np.ndarray] = {"off": off, "drift": drift}
    for name, sign in (("fwd", 1.0), ("rev", -1.0)):
        n = n_pairs * n_per_dir
        pair = np.repeat(np.arange(n_pairs), n_per_dir)
        t = rng.uniform(0, 1e9, n)
        sends = [t, t + 20_000.0]
        recvs = []
        # back-to-back probes mostly see the same queue; sometimes the second one waits more
        queue = np.where(rng.random(n) < load, rng.exponential(500.0, n), 0.0)
        for k, ts in enumerate(sends):
            extra = np.where(rng.random(n) < 0.3 * load * k, rng.exponential(200.0, n), 0.0)
            owd = 2_000.0 + queue + extra
            hit = rng.random(n) < outlier_prob
            owd[hit] += rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(10, 300, hit.sum())
            theta = sign * (off[pair] + drift[pair] * ts)
            recvs.append(ts + owd + theta)
        tick = 6.4

        def stamp(x: np.ndarray, tick: float = tick) -> np.ndarray:
            return EPOCH + (np.floor(x / tick) * tick).round().astype(np.int64)

        out[name + "_pair"] = np.concatenate([pair, pair])
        out[name + "_pid"] = np.concatenate([np.arange(n), np.arange(n)])
        out[name + "_send"] = np.concatenate([stamp(s) for s in sends])
        out[name + "_recv"] = np.concatenate([stamp(r) for r in recvs])
    return out


def _fit(st: dict[str, np.ndarray], n_pairs: int, coded: bool) -> np.ndarray:
    cols = []
    for name in ("fwd", "rev"):
        keep = (
            coded_probe_mask(st[name + "_pid"], st[name + "_send"], st[name + "_recv"], 13)
            if coded
            else np.ones(len(st[name + "_pid"]), dtype=bool)
        )
        send, recv = st[name + "_send"][keep], st[name + "_recv"][keep]
        t = (send - EPOCH).astype(np.float64)  # relative first, then float
        cols += [st[name + "_pair"][keep], t, (recv - send).astype(np.float64)]
    fits = fit_pairs(n_pairs, *cols, quant_ns=6.4)
    assert fits.ok.all()
    return np.asarray(np.abs(fits.offset_ns + fits.drift * 5e8 - (st["off"] + st["drift"] * 5e8)))


@pytest.mark.parametrize("load", [0.4, 0.9])
def test_coded_filter_removes_stamp_outliers_from_the_fit(load: float) -> None:
    rng = np.random.default_rng(11)
    st = _coded_stamps(rng, 300, 150, outlier_prob=0.01, load=load)
    raw = _fit(st, 300, coded=False)
    coded = _fit(st, 300, coded=True)
    assert np.percentile(coded, 99) < 25.0
    assert np.percentile(raw, 99) > 2 * np.percentile(coded, 99)
