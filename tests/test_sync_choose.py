"""The choice of candidate (`sync.window.choose_candidate`) solves the loop closure of a
candidate only when it can still win: a candidate equal to an earlier one on every edge
reuses that one's closure scale, and one whose bias bound alone reaches the best score so
far is not solved. The choice and the solve are what scoring every candidate gives."""

from __future__ import annotations

import numpy as np
import pytest

from sync import window
from sync.pairfit import FitStatus, PairFits
from sync.window import WindowSync, choose_candidate, first_stage


def _setup() -> tuple[int, WindowSync, int, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    n = 60
    a = np.repeat(np.arange(n), 4)
    b = (a + rng.integers(1, n, len(a))) % n
    edges = np.unique(np.sort(np.stack([a, b], axis=1), axis=1), axis=0)
    m = len(edges)
    x = rng.normal(0, 1000.0, n)
    theta = x[edges[:, 1]] - x[edges[:, 0]]
    fits = PairFits(
        theta + rng.normal(0, 5.0, m), rng.normal(0, 1e-9, m), np.full(m, 3.0),
        np.full(m, 1e-10), rng.uniform(1000, 1100, m), np.full(m, 10), np.full(m, 10),
        np.full(m, FitStatus.OK, np.int8),
    )  # fmt: skip
    first, ref = first_stage(n, edges, fits, 0)
    return n, first, ref, edges, theta, rng.normal(0, 1.0, m)


def _scores(n: int, first: WindowSync, ref: int, cands: list[np.ndarray],
            excess: list[np.ndarray]) -> list[float]:  # fmt: skip
    """Every candidate's score, each solved (the reference the short cuts must match)."""
    e = first.edges
    return [
        float(np.hypot(window.closure_scale(n, e, c, ref), 0.5 * np.nanmedian(x) if k else 0.0))
        for k, (c, x) in enumerate(zip(cands, excess, strict=True))
    ]


@pytest.mark.parametrize("winner", ["envelope", "lowrtt"])
def test_only_candidates_that_can_win_are_solved(
    winner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, first, ref, edges, theta, noise = _setup()
    m = len(edges)
    env = theta + (30.0 if winner == "lowrtt" else 1.0) * noise
    low = theta + 2.0 * noise[::-1]
    cands = [env, low, low.copy(), theta + 5.0 * noise, theta + 3.0 * noise]
    excess = [np.zeros(m), np.full(m, 0.4), np.full(m, 0.4), np.full(m, 0.2), np.full(m, 500.0)]
    names = ["envelope", "lowrtt0.01", "lowrtt0.02", "lowrtt0.05", "lowrtt0.1"]
    calls: list[int] = []
    real = window.closure_scale

    def counted(*args: object, **kw: object) -> float:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(window, "closure_scale", counted)
    usable = np.ones(m, bool)
    zero = np.zeros(m)
    got = choose_candidate(n, first, ref, usable, zero, cands, excess, names, zero + 1000.0, True)
    monkeypatch.setattr(window, "closure_scale", real)
    scores = _scores(n, first, ref, cands, excess)
    best = int(np.argmin(scores))  # the first of the lowest
    assert got.estimator == names[best] == ("envelope" if winner == "envelope" else "lowrtt0.01")
    # the copy of candidate 1 and the one whose bias alone (250 ns) beats nothing: not solved
    assert len(calls) == 3
    # the chosen candidate's own closure solve (started at the first stage's offsets)
    again = window.closure_scale(n, edges, cands[best], ref, start=first.offset_ns)
    assert got.closure_scale_ns == again
    assert again == pytest.approx(window.closure_scale(n, edges, cands[best], ref), rel=1e-5)
