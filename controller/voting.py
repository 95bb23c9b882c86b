"""007-style voting baseline: every bad path votes for the links it crosses; top votes blamed.

Each lost probe casts 1/k of a vote to each of the k links of its forward and reply paths;
each slow one-way delay (same baselines and threshold as the brain) casts 1/k to each of its k
links. In a window, links with votes >= ``min_votes`` and >= ``top_frac`` of the top vote are
blamed; a link blamed ``raise_windows`` windows in a row is alerted once (until it stops being
blamed). No exoneration by good paths and no set cover: that is what the baseline lacks.
"""

from __future__ import annotations

import numpy as np

from controller.detect.delay import DelayParams, DelayWindow
from controller.detect.loss import LossWindow
from controller.detect.paths import PathIndex
from controller.observations import Observations
from mesh.fabric import Fabric
from mesh.fabric.ecmp import routing_tables
from mesh.fabric.model import hop_links


def _votes(sets: np.ndarray, n: int) -> np.ndarray:  # type: ignore[type-arg]
    k = (sets >= 0).sum(axis=1)
    w = np.repeat(1.0 / np.maximum(k, 1), sets.shape[1]).reshape(sets.shape)
    m = sets >= 0
    return np.bincount(sets[m], weights=w[m], minlength=n).astype(np.float64)


class VotingBaseline:
    """Per-window link votes; `tick` returns link ids newly alerted."""

    def __init__(
        self,
        fabric: Fabric,
        *,
        min_votes: float = 2.0,
        top_frac: float = 0.5,
        raise_windows: int = 2,
        delay: DelayParams | None = None,
    ) -> None:
        self.fabric = fabric
        self.min_votes, self.top_frac, self.raise_windows = min_votes, top_frac, raise_windows
        self._delay_p = delay or DelayParams()
        self._loss = LossWindow(len(fabric.links), routing_tables(fabric).max_hops)
        self._delay = DelayWindow(fabric.n_hops)
        self._base = PathIndex(routing_tables(fabric).max_hops)
        self._streak = np.zeros(len(fabric.links), dtype=np.int64)
        self._alerted: set[int] = set()
        self._excluded = np.zeros(len(fabric.nics), dtype=bool)
        self._last: int | None = None

    def exclude(self, hosts_down: set[str]) -> None:
        """Ignore probes to/from NICs of these hosts (same presence knowledge as the brain)."""
        self._excluded = np.array([n.host in hosts_down for n in self.fabric.nics], dtype=bool)

    def observe(self, obs: Observations) -> None:
        """Fold ``obs`` into the window."""
        keep = ~(self._excluded[obs.src] | self._excluded[obs.dst])
        obs = obs.select(keep)
        pf, pr = self._base.paths(obs.hops_fwd), self._base.paths(obs.hops_rev)
        self._loss.add(pf, pr, obs.hops_fwd, obs.hops_rev, obs.lost)
        self._delay.add(
            self._base,
            pf,
            obs.hops_fwd,
            obs.owd_fwd_ns,
            (obs.src, obs.dst, obs.sport),
            self._delay_p,
            obs.coarse,  # the same clock knowledge as the brain
        )
        self._delay.add(
            self._base,
            pr,
            obs.hops_rev,
            obs.owd_rev_ns,
            (obs.dst, obs.src, obs.sport),
            self._delay_p,
            obs.coarse,
        )

    def tick(self, now_ns: int) -> list[str]:
        """Close the window; return ids of links alerted in this window."""
        n = len(self.fabric.links)
        dt = 0.0 if self._last is None else (now_ns - self._last) / 1e9
        self._last = now_ns
        votes = _votes(self._loss.lost_sets(), n)
        slow = self._delay.slow_sets()
        links = hop_links(slow)  # padding -1 stays -1
        votes += _votes(links, n)
        top = float(votes.max()) if len(votes) else 0.0
        blamed = (votes >= self.min_votes) & (votes >= self.top_frac * top)
        self._streak = np.where(blamed, self._streak + 1, 0)
        out = []
        for lk in np.flatnonzero(self._streak >= self.raise_windows):
            if int(lk) not in self._alerted:
                self._alerted.add(int(lk))
                out.append(self.fabric.links[int(lk)].id)
        self._alerted &= {int(x) for x in np.flatnonzero(blamed)}
        self._delay.fold_baselines(self._base, dt, self._delay_p)
        self._loss.reset()
        self._delay.reset()
        return out
