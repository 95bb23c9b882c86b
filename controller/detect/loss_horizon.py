"""Loss evidence over a horizon of detection windows, and losses that mis-pathed probes leak.

A 100 ms window holds too few probes per link to see a small loss: at 1 % per traversal a
leaf-spine link of a 16-NIC fabric loses ~2 of ~100 probes per window, under the window's
``LossParams.min_rate`` (5 %, set so that background loss and a burst's tail stay silent). A
short flap (a 50 ms down) loses half of one window at most, never "dead", and is gone by the
next. `LossHorizon` keeps the closed windows that ended within the last ``HorizonParams.span_ns``
(1 s: 10 windows of the benchmark's 100 ms, one of a service ticking every second), their probe
totals and lost-probe link sets, and localizes their sum with the same tomography (`greedy_cover`) at a
lower rate floor, ``min_rate`` (0.5 %: ~6x the ~8e-4 per-probe loss a background of 1e-4 per
hop traversal gives a probe crossing ~8 directed hops) and at least ``min_lost`` lost probes
unexplained, so sparse background losses do not add up to a finding.

`mispath_leaks` removes what the controller's own path errors invent. A probe whose real path
is not the one the controller holds (an ECMP path it did not discover) and that dies on a
faulty switch-to-switch link L is charged to the links of the path the controller believes:
in a leaf-spine fabric the same two leaves through another spine, and the same two NIC links.
Those links concentrate the charges (the sibling uplinks of L's leaf get them for every such
flow of the leaf, a NIC link for every such flow of its NIC, and on a small fabric each other
leaf's downlink from another spine a third of them), so with ~5 % wrong paths they show a few
percent of L's loss rate. A link M not under L's upper switch (a link under the same spine is
on the same path as L, not on an alternative) whose *unexplained* loss rate is at most
``sibling_leak`` of L's loss rate is taken as that leak and not blamed. A NIC link is never
the source of a leak: it is on every path of its NIC, so no path error moves its losses. The
price: a real fault that small beside a much larger one is not reported until the larger
one's evidence leaves the horizon (docs/benchmarks.md measures it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.localize import Cover, greedy_cover


@dataclass(frozen=True, slots=True)
class HorizonParams:
    """``span_ns``: closed windows that ended this recently are summed; a link is blamed
    over the horizon when its unexplained lost probes are >= ``min_lost`` and >= ``min_rate``
    of its probes; ``sibling_leak``: see `mispath_leaks` (0 disables it); ``leak_hold``: a
    loss up to this share of an alternative link's is held while the per-flow test cannot yet
    tell it from that link's leak (`controller.brain.Brain._undecided_leak`); ``fresh_ns``:
    a link not yet raised is blamed over the horizon only while its loss goes on: the
    windows that ended within the last ``fresh_ns`` hold lost probes across it, at least
    ``min_rate`` of its probes there (`LossHorizon.recent`; 0 disables). Without it a burst
    the windows did not raise can be raised up to a span later, stale, when older loss on
    the links beside it leaves the horizon and its lost probes are charged to it anew."""

    span_ns: int = 1_000_000_000
    min_rate: float = 0.005
    min_lost: int = 10
    sibling_leak: float = 0.1
    leak_hold: float = 0.25
    max_faults: int = 8
    fresh_ns: int = 500_000_000

    def __post_init__(self) -> None:
        if self.span_ns <= 0 or self.min_lost < 1:
            raise ValueError("span_ns must be > 0 and min_lost >= 1")
        if self.fresh_ns < 0:
            raise ValueError("fresh_ns must be >= 0 (over span_ns: the whole horizon)")
        if not 0 <= self.min_rate <= 1 or not 0 <= self.sibling_leak <= self.leak_hold < 1:
            raise ValueError("min_rate must be in [0, 1] and 0 <= sibling_leak <= leak_hold < 1")


def resid_rate(cover: Cover) -> dict[int, float]:
    """Return per picked element its unexplained bad count at pick time over its total."""
    return {
        int(e): int(b) / max(int(cover.total[e]), 1)
        for e, b in zip(cover.picked, cover.picked_bad, strict=True)
    }


def mispath_leaks(
    cover: Cover,
    link_nodes: npt.NDArray[np.int64],
    switch_link: npt.NDArray[np.bool_],
    leak: float,
    concentrated: Callable[[int, tuple[int, ...]], bool] | None = None,
) -> set[int]:
    """Return the picked links of ``cover`` that are leaks of another picked link's loss.

    ``link_nodes`` (n_links, 2) numbers each link's (lower, upper) ends; ``switch_link`` marks
    links between two switches, the only ones whose losses a path error moves. A picked link
    M is a leak when a picked switch link L != M has another upper end (M can be on an ECMP
    alternative of a path through L) and M's unexplained loss rate is <= ``leak`` x L's loss
    rate (over all its probes), or M's loss the other picks leave unexplained is
    ``concentrated(M, other picks)`` on a few of its flows (`controller.detect.flowloss`: the
    flows whose real path is L's lose at L's rate, the rest nothing; how large a share of M's
    probes that is grows with the share of wrong paths).
    """
    if leak <= 0 or len(cover.picked) < 2:
        return set()
    rate = cover.rate
    resid = resid_rate(cover)
    sources = [int(e) for e in cover.picked if switch_link[int(e)]]
    out = set()
    for m in (int(e) for e in cover.picked):
        alts = [lk for lk in sources if lk != m and link_nodes[lk, 1] != link_nodes[m, 1]]
        others = tuple(int(e) for e in cover.picked if int(e) != m)
        if any(resid[m] <= leak * rate[lk] for lk in alts) or (
            alts and concentrated is not None and concentrated(m, others)
        ):
            out.add(m)
    return out


class LossHorizon:
    """The loss evidence of the windows that ended in the last ``params.span_ns`` (one owner;
    not thread-safe)."""

    def __init__(self, n_links: int, params: HorizonParams) -> None:
        self.n_links = n_links
        self.params = params
        self._wins: deque[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int32]]] = deque()
        self._total = np.zeros(n_links, dtype=np.int64)

    def push(
        self, end_ns: int, totals: npt.NDArray[np.int64], lost_sets: npt.NDArray[np.int32]
    ) -> None:
        """Add one closed window (ending ``end_ns``): probes per link and its lost probes'
        link sets (m, K; -1 padded); forget the windows that ended ``params.span_ns`` or more
        before it."""
        t = np.zeros(self.n_links, dtype=np.int64)
        t[: min(len(totals), self.n_links)] = totals[: self.n_links]
        self._wins.append((end_ns, t, lost_sets))
        self._total += t
        while self._wins[0][0] <= end_ns - self.params.span_ns:
            _, old, _ = self._wins.popleft()
            self._total -= old

    @property
    def totals(self) -> npt.NDArray[np.int64]:
        """Probes across each link over the horizon."""
        return self._total.copy()

    @property
    def start_ns(self) -> int | None:
        """End of the oldest window held (None when empty)."""
        return self._wins[0][0] if self._wins else None

    def lost_sets(self) -> npt.NDArray[np.int32]:
        """Return the lost probes' link sets over the horizon, (m, K), -1 padded."""
        sets = [s for _, _, s in self._wins if len(s)]
        if not sets:
            return np.zeros((0, 1), dtype=np.int32)
        width = max(s.shape[1] for s in sets)
        return np.concatenate(
            [np.pad(s, ((0, 0), (0, width - s.shape[1])), constant_values=-1) for s in sets]
        ).astype(np.int32)

    def recent(self, since_ns: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Return per link, over the windows held that ended after ``since_ns``, the probes
        across it and the lost probes whose link set holds it (each set names a link once)."""
        total = np.zeros(self.n_links, dtype=np.int64)
        lost = np.zeros(self.n_links, dtype=np.int64)
        for end_ns, t, sets in self._wins:
            if end_ns > since_ns:
                total += t
                links = sets[(sets >= 0) & (sets < self.n_links)]
                lost += np.bincount(links, minlength=self.n_links)
        return total, lost

    def verdict(self) -> Cover:
        """Localize the horizon's loss: the cover at the horizon's thresholds."""
        p = self.params
        return greedy_cover(
            self._total.copy(),
            self.lost_sets(),
            min_rate=p.min_rate,
            min_bad=p.min_lost,
            max_picks=p.max_faults,
        )
