"""One clock-error definition (`testbed.clockerr`): known NICs only, centred on their median,
so an unknown or far-off NIC moves no other NIC's figure, in the simulator's report and the
testbed's alike."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.bench_sync_real import window_errors
from testbed.clockerr import error_figures, node_errors
from testbed.vclock import VirtualClock


def test_an_unknown_nic_is_counted_and_moves_no_other_figure() -> None:
    rng = np.random.default_rng(1)
    truth = rng.uniform(-1e6, 1e6, 64)
    est = truth + 1234.0 + rng.normal(0, 5.0, 64)  # the common offset is not an error
    base = error_figures(est, truth)
    assert base["p99_ns"] < 15.0 and base["unknown"] == 0 and base["known"] == 64
    est[7] = np.nan  # a NIC down: unknown, not scored, and the others' figures stand
    known = np.ones(64, bool)
    known[9] = False
    fig = error_figures(est, truth, known)
    assert fig["unknown"] == 2 and fig["known"] == 62
    assert fig["p99_ns"] == pytest.approx(base["p99_ns"], abs=3.0)


def test_one_nic_far_off_does_not_shift_the_others() -> None:
    truth = np.zeros(100)
    est = np.zeros(100)
    est[0] = 100_000.0  # a step the solve has not seen
    e = node_errors(est, truth)
    assert e[0] == 100_000.0 and np.all(e[1:] == 0.0)  # with the mean: 1,000 ns on every NIC
    with pytest.raises(ValueError):
        node_errors(est, truth[:-1])


def test_the_testbed_report_leaves_a_silent_nic_out() -> None:
    """`testbed.bench_sync_real.window_errors` (what `qpmesh testbed run` reports): a NIC that
    sent and answered nothing in the window is unknown, counted, and not in the node errors."""
    rng = np.random.default_rng(2)
    n = 5
    clocks = [VirtualClock(float(o), float(d), 1_000_000_000) for o, d in
              zip(rng.uniform(-1e5, 1e5, n), rng.uniform(-2e-5, 2e-5, n), strict=True)]  # fmt: skip
    rows: dict[str, list[int]] = {k: [] for k in ("src", "dst", "pair", "t1", "t2", "t3", "t4")}
    for k in range(400):
        a, b = rng.choice(n - 1, 2, replace=False)  # NIC n - 1 is silent
        t = 1_000_000_000 + k * 1_000_000
        for pos in range(2):  # a coded pair, 20 us apart, 3 us each way
            t1 = t + pos * 20_000
            rows["src"].append(int(a))
            rows["dst"].append(int(b))
            rows["pair"].append(k)
            rows["t1"].append(t1)
            rows["t2"].append(t1 + 3_000)
            rows["t3"].append(t1 + 5_000)
            rows["t4"].append(t1 + 8_000)
    w = {k: np.asarray(v, np.int64) for k, v in rows.items()}
    w["lost"] = np.zeros(len(w["src"]), np.int64)
    e = window_errors(w, clocks, coded_tol_ns=2000)
    assert e["unknown"] == [1.0] and len(e["node"]) == n - 1
    assert max(abs(x) for x in e["node"]) < 50.0
