"""Queueing delay in two tiers: a hop whose typical probe waits a few µs is contended; a hop
where a minority of probes wait longer (incast bursts) or all wait a little is not."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from controller.brain import Brain, BrainConfig
from controller.observations import Observations
from controller.snapshot import MeshEvent
from tests.fullmesh import DST, FAB, FWD, REV, SPORT, SRC, WIN

HOP = 2 * FAB.link_index["leaf0-spine2"]  # leaf0 -> spine2


def owd(
    hops: npt.NDArray[np.int32], rng: np.random.Generator, share: float, mean_ns: float
) -> npt.NDArray[np.float64]:
    """Delays: 300 ns per hop, Exp(100 ns) per hop of queueing, and on ``HOP`` a share of
    the probes waits Exp(mean_ns) more."""
    n = len(hops)
    on = np.equal(hops, HOP).any(axis=1) & (rng.random(n) < share)
    base = 1000.0 + 300.0 * (hops >= 0).sum(axis=1)
    q = rng.exponential(100.0, hops.shape).sum(axis=1)
    return np.asarray(base + q + np.where(on, rng.exponential(mean_ns, n), 0.0), np.float64)


def run(share: float, mean_ns: float, windows: int = 30) -> list[MeshEvent]:
    rng = np.random.default_rng(7)
    brain = Brain(FAB, BrainConfig(lateness_ns=0))
    out: list[MeshEvent] = []
    for k in range(windows):
        s, m = (share, mean_ns) if k >= 10 else (0.0, 1.0)
        n = len(SRC)
        f, r = owd(FWD, rng, s, m), owd(REV, rng, s, m)
        brain.observe(
            Observations(
                (k * WIN + rng.integers(0, WIN, n)).astype(np.int64),
                SRC.astype(np.int32),
                DST.astype(np.int32),
                SPORT.astype(np.int32),
                FWD,
                REV,
                np.zeros(n, dtype=bool),
                f,
                r,
                f + r,
            )
        )
        out += brain.tick((k + 1) * WIN)
    return out


def test_a_3us_queue_is_contention_on_its_hop() -> None:
    ev = run(1.0, 3000.0)  # 26 % of its probes over the 4 µs floor, 61 % over 1.5 µs
    assert [(e.kind, e.target) for e in ev] == [("contention", "leaf0->spine2")]
    assert ev[0].flows


def test_incast_like_minority_bursts_and_small_queues_are_not() -> None:
    assert run(0.2, 5000.0) == []  # a fifth of the probes, 5 µs mean
    assert run(1.0, 400.0) == []  # everyone, 0.4 µs mean (a hot but healthy hop)
