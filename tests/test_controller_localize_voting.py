"""The 007-style voting baseline: votes from lost probes, top links alerted once."""

from __future__ import annotations

import numpy as np

from controller.observations import Observations
from controller.voting import VotingBaseline
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths

FAB = build_fabric(FabricShape())
WIN = 100_000_000


def window(k: int, rng: np.random.Generator, dead_link: int | None = None) -> Observations:
    n_nics = len(FAB.nics)
    src = rng.integers(0, n_nics, 3000)
    dst = (src + rng.integers(1, n_nics, 3000)) % n_nics
    sport = rng.integers(49152, 65536, 3000)
    fwd = flow_paths(FAB, src, dst, sport)
    rev = flow_paths(FAB, dst, src, ROCEV2_PORT, sport)
    lost = np.zeros(len(src), dtype=bool)
    if dead_link is not None:
        hops = (2 * dead_link, 2 * dead_link + 1)
        lost = np.asarray(np.isin(fwd, hops).any(axis=1) | np.isin(rev, hops).any(axis=1))
    owd = np.where(lost, np.nan, 2000.0 + rng.exponential(100.0, len(src)))
    return Observations(
        (k * WIN + rng.integers(0, WIN, len(src))).astype(np.int64),
        src.astype(np.int32),
        dst.astype(np.int32),
        sport.astype(np.int32),
        fwd,
        rev,
        lost,
        owd,
        owd.copy(),
        owd * 2,
    )


def test_dead_link_gets_the_votes_and_is_alerted_once() -> None:
    rng = np.random.default_rng(7)
    v = VotingBaseline(FAB)
    lk = FAB.link_index["leaf3-spine1"]
    out: list[str] = []
    for k in range(10):
        v.observe(window(k, rng))
        out += v.tick((k + 1) * WIN)
    assert out == []
    for k in range(10, 14):
        v.observe(window(k, rng, dead_link=lk))
        out += v.tick((k + 1) * WIN)
    assert out == ["leaf3-spine1"]
