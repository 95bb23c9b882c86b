"""Loss per flow (src NIC, dst NIC, UDP source port): is a link's loss spread over its flows,
or concentrated on a few 5-tuples?

A link that drops packets (a failing optic, a congested buffer) drops them whatever their
5-tuple, so every flow across it loses at about the same rate. Two things concentrate a
link's lost probes on a few of its flows instead:

- a *gray failure*: a switch that drops only some 5-tuples (a bad ECMP member entry, a
  corrupted hash bucket, a lookup table error: Arzani et al., *007*, NSDI 2018; Huang et
  al., *Gray failure*, HotOS 2017): those flows lose everything, the others nothing;
- *flows whose path the controller has wrong* (an ECMP hash it does not know, a path that
  moved): their losses on the link they really cross are charged to the link they are
  believed to cross, where they are a few flows losing at the faulty link's rate.

`FlowLoss` keeps per flow its probes and lost probes, decaying with time constant ``span_s``
(10 s: a flow gets ~2.5 probes a second, 10 pairs/s per peer over 8 source ports), and the
link set it was last seen with. `FlowLoss.spread` tests a link's flows against one common
rate ``p``: with ``mu = probes x p`` per flow, ``k`` is the smallest count a typical flow
reaches with chance under ``tail`` (1 %); the number of flows that lost ``k`` or more is
Poisson with mean ``E = sum P(Poisson(mu) >= k)`` if they share the rate, and the loss is
*concentrated* when there are at least ``E + z sqrt(E) + 1`` of them. A uniform loss of any
rate passes (its typical flow sets ``k``); a few flows losing at 20 % or 100 % among many
losing little do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.windows import KeyIndex, flow_key

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class FlowLossParams:
    """``span_s``: time constant of the per-flow counts; ``tail``: under one common rate, the
    chance of a typical flow losing ``k`` probes or more that sets ``k``; ``z``: standard
    deviations by which the flows losing ``k`` or more must exceed their expected number;
    ``min_lost``: lost probes a link needs (over the span) before the test says anything."""

    span_s: float = 10.0
    tail: float = 0.01
    z: float = 3.0
    min_lost: int = 10

    def __post_init__(self) -> None:
        if self.span_s <= 0 or not 0 < self.tail < 1 or self.z <= 0 or self.min_lost < 1:
            raise ValueError("span_s and z must be > 0, tail in (0, 1), min_lost >= 1")


@dataclass(frozen=True, slots=True)
class Spread:
    """How a link's loss lies over its flows: ``flows`` that crossed it, ``heavy`` of them
    that lost ``k`` probes or more where one common ``rate`` expects ``expected`` such flows,
    the ``heavy_rate`` those flows lose, and whether that is ``concentrated``."""

    flows: int
    heavy: int
    k: int
    expected: float
    heavy_rate: float
    rate: float
    concentrated: bool


def poisson_tail(mu: F64, k: int) -> F64:
    """Return P(Poisson(mu) >= k) per element of ``mu``."""
    term = np.exp(-mu)
    below = np.zeros_like(mu)
    for i in range(k):
        below += term
        term = term * mu / (i + 1)
    return np.asarray(np.clip(1.0 - below, 0.0, 1.0), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class FlowCounts:
    """One window's probes per flow: ``flow`` (n, 3: src, dst, sport), ``probes`` and
    ``lost`` per flow, and the forward and reply path numbers it was last seen on."""

    flow: I64
    probes: I64
    lost: I64
    fwd: I64
    rev: I64

    @classmethod
    def empty(cls) -> FlowCounts:
        """Return counts of no flow."""
        i64 = np.zeros(0, np.int64)
        return cls(np.zeros((0, 3), np.int64), i64, i64, i64, i64)


class FlowWindow:
    """The per-flow probe and loss counts of one detection window, as records come (`add`)
    or as another process counted them (`add_counts`); `counts` sums them per flow. Merging
    is exact: counts add; a flow's paths are those of its last record (a flow's records all
    come from its source NIC's owner, in order)."""

    def __init__(self, n_nics: int) -> None:
        self.n_nics = n_nics
        self._parts: list[FlowCounts] = []

    def add(
        self, src: I32, dst: I32, sport: I32, fwd: I64, rev: I64, lost: npt.NDArray[np.bool_]
    ) -> None:
        """Count one batch: per record its flow, forward and reply path numbers and whether
        it was lost."""
        if len(src):
            flow = np.column_stack([src, dst, sport]).astype(np.int64)
            ones = np.ones(len(src), np.int64)
            self._parts.append(FlowCounts(flow, ones, lost.astype(np.int64), fwd, rev))

    def add_counts(self, counts: FlowCounts) -> None:
        """Add counts made elsewhere (paths already in this window's numbering)."""
        if len(counts.flow):
            self._parts.append(counts)

    def counts(self) -> FlowCounts:
        """Return the window's counts, one row per flow (flows in key order)."""
        if not self._parts:
            return FlowCounts.empty()
        flow = np.concatenate([p.flow for p in self._parts])
        key = flow_key(flow[:, 0], flow[:, 1], flow[:, 2], self.n_nics)
        # one unstable sort (a stable one, or np.unique's, is ~4x slower at 10^5 rows): the
        # sums need no order, and each flow's last record is its greatest row number
        order = np.argsort(key)
        ks = key[order]
        start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        last = np.maximum.reduceat(order, start)
        probes = np.concatenate([p.probes for p in self._parts])[order]
        lost = np.concatenate([p.lost for p in self._parts])[order]
        fwd = np.concatenate([p.fwd for p in self._parts])
        rev = np.concatenate([p.rev for p in self._parts])
        return FlowCounts(
            flow[last],
            np.add.reduceat(probes, start).astype(np.int64),
            np.add.reduceat(lost, start).astype(np.int64),
            fwd[last].astype(np.int64),
            rev[last].astype(np.int64),
        )


class FlowLoss:
    """Decaying per-flow probe and loss counts with each flow's latest link set (one owner)."""

    def __init__(self, n_nics: int, params: FlowLossParams) -> None:
        self.n_nics, self.params = n_nics, params
        self._index = KeyIndex()
        self.probes = np.zeros(0, np.float32)
        self.lost = np.zeros(0, np.float32)
        self.fwd = np.zeros(0, np.int64)  # per flow: its latest forward path number
        self.rev = np.zeros(0, np.int64)  # and reply path number
        self._by_link: tuple[int, I64, I64] | None = None  # `_link_paths`

    def add(
        self, src: I32, dst: I32, sport: I32, fwd: I64, rev: I64, lost: npt.NDArray[np.bool_]
    ) -> None:
        """Count one batch: per record its flow, forward and reply path numbers
        (`controller.detect.paths.PathIndex`) and whether it was lost."""
        if not len(src):
            return
        fid, _ = self._index.insert(flow_key(src, dst, sport, self.n_nics))
        n = self._index.size
        self._grow(n)
        self.probes[:n] += np.bincount(fid, minlength=n).astype(np.float32)
        if lost.any():
            self.lost[:n] += np.bincount(fid[lost], minlength=n).astype(np.float32)
        self.fwd[fid] = fwd
        self.rev[fid] = rev

    def add_counts(self, counts: FlowCounts) -> None:
        """Count one window's per-flow counts (`FlowWindow.counts`), paths numbered as the
        owner's `controller.detect.paths.PathIndex` numbers them."""
        if not len(counts.flow):
            return
        f = counts.flow
        fid, _ = self._index.insert(flow_key(f[:, 0], f[:, 1], f[:, 2], self.n_nics))
        self._grow(self._index.size)
        n = self._index.size
        self.probes[:n] += np.bincount(fid, counts.probes, minlength=n).astype(np.float32)
        if counts.lost.any():
            self.lost[:n] += np.bincount(fid, counts.lost, minlength=n).astype(np.float32)
        self.fwd[fid] = counts.fwd
        self.rev[fid] = counts.rev

    def decay(self, dt_s: float) -> None:
        """Age the counts by ``dt_s`` (a window)."""
        if dt_s > 0:
            k = np.float32(np.exp(-dt_s / self.params.span_s))
            self.probes *= k
            self.lost *= k

    def _grow(self, n: int) -> None:
        if n > len(self.probes):
            grow = max(n, 2 * len(self.probes)) - len(self.probes)
            self.probes = np.concatenate([self.probes, np.zeros(grow, np.float32)])
            self.lost = np.concatenate([self.lost, np.zeros(grow, np.float32)])
            self.fwd = np.concatenate([self.fwd, np.full(grow, -1, np.int64)])
            self.rev = np.concatenate([self.rev, np.full(grow, -1, np.int64)])

    def _crossings(
        self, link: int, path_links: I32, explained: tuple[int, ...]
    ) -> tuple[npt.NDArray[np.bool_], I64]:
        """Return the flows (mask over flow slots) last seen crossing ``link`` and none of the
        ``explained`` links, and how many times each crosses ``link`` (forward and reply)."""
        n = self._index.size
        by_link = self._link_paths(path_links)
        on = np.zeros(len(path_links), np.int64)
        on[by_link(link)] = 1
        bad: npt.NDArray[np.bool_] | None = None
        if explained:
            bad = np.zeros(len(path_links), dtype=bool)
            for e in explained:
                bad[by_link(e)] = True
        fwd, rev = self.fwd[:n], self.rev[:n]
        ok = (fwd >= 0) & (rev >= 0) & (self.probes[:n] > 0.5)
        c = np.zeros(n, np.int64)
        c[ok] = on[fwd[ok]] + on[rev[ok]]
        sel: npt.NDArray[np.bool_] = ok & (c > 0)
        if bad is not None:
            sel[sel] = ~(bad[fwd[sel]] | bad[rev[sel]])
        return sel, c

    def _link_paths(self, path_links: I32) -> Callable[[int], I64]:
        """Return a function: a link -> the paths (rows of ``path_links``) that cross it;
        the index is rebuilt when the paths grow."""
        if self._by_link is None or self._by_link[0] != len(path_links):
            rows, cols = np.nonzero(path_links >= 0)
            links = path_links[rows, cols].astype(np.int64)
            order = np.argsort(links, kind="stable")
            links, rows = links[order], rows[order]
            self._by_link = (len(path_links), links, rows.astype(np.int64))
        _, links, rows = self._by_link

        def paths(link: int) -> I64:
            a, b = np.searchsorted(links, [link, link + 1])
            return rows[a:b]

        return paths

    def typical_probes(self, link: int, path_links: I32) -> float:
        """Return the median (decayed) probe count of the flows last seen crossing ``link``."""
        sel, _ = self._crossings(link, path_links, ())
        return float(np.median(self.probes[: len(sel)][sel])) if sel.any() else 0.0

    def spread(self, link: int, path_links: I32, explained: tuple[int, ...] = ()) -> Spread | None:
        """Return how the loss of the flows last seen crossing ``link`` and none of the
        ``explained`` links lies over them (``path_links``: each path number's links, -1
        padded; see the module docstring; a flow crossing the link both ways is expected to
        lose twice as often), or None when they lost fewer than ``min_lost`` probes."""
        sel, cross = self._crossings(link, path_links, explained)
        n = len(sel)
        probes = self.probes[:n][sel].astype(np.float64)
        lost = self.lost[:n][sel].astype(np.float64)
        c = cross[sel].astype(np.float64)
        total_lost = float(lost.sum())
        if total_lost < self.params.min_lost:
            return None
        q = min(total_lost / max(float((probes * c).sum()), 1.0), 0.999)  # per traversal
        mu = probes * (1.0 - (1.0 - q) ** c)
        p = total_lost / max(float(probes.sum()), 1.0)
        typical = np.array([float(np.median(mu))])
        k = 2
        while poisson_tail(typical, k)[0] > self.params.tail:
            k += 1
        heavy = lost >= k - 0.5
        expected = float(poisson_tail(mu, k).sum())
        count = int(heavy.sum())
        concentrated = count >= expected + self.params.z * np.sqrt(expected) + 1
        heavy_rate = float(lost[heavy].sum() / max(probes[heavy].sum(), 1.0))
        return Spread(len(probes), count, k, expected, heavy_rate, p, bool(concentrated))
