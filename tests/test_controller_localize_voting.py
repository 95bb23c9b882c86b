"""The 007-style voting baseline: votes from lost probes, top links alerted once."""

from __future__ import annotations

import numpy as np

from controller.voting import VotingBaseline
from tests.test_controller_detect import FAB, WIN, window


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
