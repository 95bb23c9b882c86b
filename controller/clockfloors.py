"""What the live clock sync remembers across windows: each directed pair's round-trip floor.

A round trip ``(t4 - t1) - (t3 - t2)`` needs no clock (the offsets cancel), and a path's fixed
delay does not change while queues come and go, so the lowest round trip a directed pair
has shown over the last minute is its floor: the sum of its two directions' fixed delays,
up to the little queueing its best probe still met. Against that floor a window tells what
one window alone cannot:

* a **raised floor**: when every probe of a pair queues for a whole window (a standing
  queue: a leaf whose uplinks are all congested), its best round trip sits above the
  remembered floor by the queueing, which is a bound on that pair's offset error (each
  direction's share is at most the sum). `controller.clocksolve` turns the raises into an
  honest uncertainty per NIC and splits them by NIC (``queued_ns``);
* **least-queued exchanges**: a probe whose round trip is within a little of its floor met
  almost no queue either way, so its one-way delays against the clock models show where a
  clock has moved (`controller.clocksteps`).

`FloorMemory` keeps per directed-pair slot the ``EPOCH_RANK`` lowest round trips of the
current epoch (``epoch_ns``, a window) and, for the last ``epochs`` epochs, each epoch's
``EPOCH_RANK``-th lowest: bad stamps (which can lower a round trip by microseconds) do not
make a floor. The floor is the second lowest of those. At 1e-3 bad stamps a directed pair
(~200 round trips an epoch at 10 pairs/s) has ~0.4 round-trip-lowering ones an epoch, so
four in one epoch are rare (0.1 %), and two such epochs rarer still; a path that changed for
good (an ECMP re-hash) is forgotten after ``epochs`` epochs. Arrays in, arrays out; time is passed in.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, dijkstra

from sync.excess import node_midmean

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
EPOCH_RANK = 4  # an epoch's floor: its fourth lowest round trip
# ... where the round trips folded are already each a bin's lowest (a fleet solver folds its
# workers' selections: a few per directed pair and window), its second lowest
WINNER_RANK = 2


class FloorMemory:
    """Per directed-pair slot the round-trip floor over the last ``epochs`` epochs."""

    def __init__(self, epoch_ns: int, epochs: int = 6, rank: int = EPOCH_RANK) -> None:
        """``rank``: an epoch's floor is its ``rank``-th lowest round trip (``EPOCH_RANK``
        for every probe's, ``WINNER_RANK`` for bins' lowest). Raises ValueError for a
        non-positive epoch, count or rank."""
        if epoch_ns <= 0 or epochs < 1 or rank < 1:
            raise ValueError("epoch_ns, epochs and rank must be > 0")
        self.epoch_ns, self.epochs, self.rank = epoch_ns, epochs, rank
        self._low = np.full((0, rank), np.inf)  # the current epoch's lowest, sorted
        self._cur = np.full(0, np.inf)  # ... and its floor (the highest of them it has)
        self._hist = np.full((0, epochs), np.inf)  # past epochs' floors
        self._h1 = np.full(0, np.inf)  # the lowest two of those, per slot
        self._h2 = np.full(0, np.inf)
        self._pos = 0
        self._epoch: int | None = None  # index of the current epoch (t // epoch_ns)

    def _grow(self, size: int) -> None:
        if size <= len(self._low):
            return
        extra = max(size, 2 * len(self._low), 1024) - len(self._low)
        inf = np.full(extra, np.inf)
        self._low = np.concatenate([self._low, np.full((extra, self.rank), np.inf)])
        self._hist = np.concatenate([self._hist, np.full((extra, self.epochs), np.inf)])
        self._cur, self._h1, self._h2 = (
            np.concatenate([a, inf]) for a in (self._cur, self._h1, self._h2)
        )

    def _roll(self, t_ns: int) -> None:
        e = t_ns // self.epoch_ns
        if self._epoch is None:
            self._epoch = e
        if self._epoch >= e:
            return
        while self._epoch < e:  # close the current epoch (and any empty ones after it)
            self._hist[:, self._pos] = self._cur
            self._pos = (self._pos + 1) % self.epochs
            self._low.fill(np.inf)
            self._cur.fill(np.inf)
            self._epoch += 1
            if e - self._epoch > self.epochs:
                self._hist.fill(np.inf)
                self._epoch = e
        two = np.partition(self._hist, 1, axis=1) if self.epochs > 1 else self._hist
        self._h1 = two[:, 0].copy()
        self._h2 = two[:, 1].copy() if self.epochs > 1 else np.full(len(two), np.inf)

    def observe(
        self, slot: I64, rtt: NDArray[np.integer] | F64, t_ns: int | NDArray[np.integer]
    ) -> None:
        """Fold round trips ``rtt`` (ns) of directed-pair slots ``slot`` seen at ``t_ns``
        (one time for all, or one per round trip: each falls in its own epoch, the epochs
        folded in order, so the floors do not depend on how round trips are batched).
        Raises ValueError on arrays of different lengths or a negative slot."""
        slot = np.asarray(slot, np.int64)
        r = np.asarray(rtt, np.float64)
        if len(slot) != len(r) or (len(slot) and int(slot.min()) < 0):
            raise ValueError("slot and rtt must have one entry each, slots >= 0")
        if not len(slot):
            return
        if not isinstance(t_ns, int):
            t = np.asarray(t_ns, np.int64)
            if len(t) != len(slot):
                raise ValueError("t_ns must be one time or one per round trip")
            e = t // self.epoch_ns
            for ee in np.unique(e).tolist():
                sel = e == ee
                self._fold(slot[sel], r[sel], int(ee) * self.epoch_ns)
            return
        self._fold(slot, r, t_ns)

    def _fold(self, slot: I64, r: F64, t_ns: int) -> None:
        self._grow(int(slot.max()) + 1)
        self._roll(t_ns)
        # the batch's lowest ``rank`` per slot, merged with the epoch's
        s, v = _by_slot_then_value(slot, r)
        first = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        u = s[first]  # the slots this batch touches
        count = np.diff(np.r_[first, len(s)])
        batch = np.full((len(u), self.rank), np.inf)
        for k in range(self.rank):
            has = count > k
            batch[has, k] = v[first[has] + k]
        low = np.sort(np.concatenate([self._low[u], batch], axis=1), axis=1)[:, : self.rank]
        self._low[u] = low
        have = np.isfinite(low).sum(axis=1)
        self._cur[u] = low[np.arange(len(u)), np.maximum(have - 1, 0)]

    def floor(self, slot: I64, *, settled: bool = False) -> F64:
        """The floor of each slot: the second lowest over the remembered epochs (the current
        one included, unless ``settled``: closed epochs only) of their floors, or the lowest
        where only one epoch has any (NaN where none yet). An epoch that has seen a few
        round trips only has a high fourth lowest: where a floor decides that a round trip
        is impossible, it should be ``settled``."""
        slot = np.asarray(slot, np.int64)
        ok = (slot >= 0) & (slot < len(self._low))
        s = np.where(ok, slot, 0)
        h1 = np.where(ok, self._h1[s] if len(self._h1) else np.inf, np.inf)
        h2 = np.where(ok, self._h2[s] if len(self._h2) else np.inf, np.inf)
        if settled:
            f = np.where(np.isfinite(h2), h2, h1)
        else:
            c = np.where(ok, self._cur[s] if len(self._cur) else np.inf, np.inf)
            second = np.where(c <= h1, h1, np.where(c <= h2, c, h2))
            f = np.where(np.isfinite(second), second, np.minimum(c, h1))
        return np.where(np.isfinite(f), f, np.nan)


def _by_slot_then_value(slot: I64, r: F64) -> tuple[I64, F64]:
    """Return ``slot`` and ``r`` sorted by slot, then value: ``np.lexsort((r, slot))``'s
    order, the same values. Probes arrive nearly in slot order, a few per slot: one stable
    sort of the slots, then one of a key that orders each slot's values (slot rank times
    more than their range, plus the value); where that key moves a value out of its slot or
    ties two different values of one, or a value is not positive and finite, the lexsort
    itself (3-4x slower)."""
    o = np.argsort(slot, kind="stable")
    s, v = slot[o], r[o]
    lo, hi = float(v.min()), float(v.max())
    if lo > 0 and np.isfinite(hi):
        new = np.r_[True, s[1:] != s[:-1]]
        g = np.cumsum(new) - 1
        o2 = np.argsort(g * (2.0 * (hi - lo) + 1.0) + (v - lo), kind="stable")
        v2, same = v[o2], ~new[1:]
        if np.array_equal(g[o2], g) and bool(np.all(v2[1:][same] >= v2[:-1][same])):
            return s, v2
    order = np.lexsort((r, slot))
    return slot[order], r[order]


TIGHT_NS = 200.0  # edges whose floor is raised by at most this tie NICs into the core


def edge_raises(
    n_nics: int, src: I64, dst: I64, rtt: F64, floor: F64, t_ns: I64 | None = None, bins: int = 4
) -> tuple[I64, F64]:
    """Per edge (i < j) of the rows ``src -> dst``: how far its best round trips in the window
    sit above the pair's remembered floor (ns, >= 0; the lowest of the floors of its two
    directed pairs), the median over ``bins`` equal parts of the window (by the rows' send
    stamps ``t_ns``; one part without them): a clock solved through a window that was mostly
    queued is off however unqueued its first seconds were, and one part's passing hot spot
    does not raise it. Returns (edges (m, 2), raise); edges without a known floor left out."""
    ok = np.isfinite(rtt) & np.isfinite(floor)
    if not ok.any():
        return np.zeros((0, 2), np.int64), np.zeros(0)
    s, d = np.asarray(src, np.int64)[ok], np.asarray(dst, np.int64)[ok]
    key = np.minimum(s, d) * n_nics + np.maximum(s, d)
    uniq, e = np.unique(key, return_inverse=True)
    m = len(uniq)
    low = np.full(m, np.inf)
    np.minimum.at(low, e, floor[ok])
    if t_ns is None or bins < 2:
        part = np.zeros(len(e), np.int64)
        bins = 1
    else:
        t = np.asarray(t_ns, np.int64)[ok]
        lo, span = int(t.min()), max(int(t.max() - t.min()), 1)
        part = np.minimum((t - lo) * bins // span, bins - 1)
    best = np.full(m * bins, np.inf)
    np.minimum.at(best, e * bins + part, rtt[ok])
    raised = np.maximum(best.reshape(m, bins) - low[:, None], 0.0)
    with np.errstate(invalid="ignore"):
        med = np.nanmedian(np.where(np.isfinite(raised), raised, np.nan), axis=1)
    edges = np.stack([uniq // n_nics, uniq % n_nics], axis=1)
    return edges, med


def node_bounds(n_nics: int, edges: I64, bound: F64) -> F64:
    """Per NIC a bound (ns) on its offset error from the queueing its paths carry now: the
    cheapest path, in the sum of the edges' bounds (half their raise), from the core (the
    largest part of the fabric tied together by edges raised by at most ``TIGHT_NS``, or by
    the median edge's bound where that is more), 0 in the core. A NIC whose every path is
    queued (a leaf whose uplinks are all congested: its NICs tie to each other, not to the
    core) gets the least queueing any of its paths to the rest carries. inf where no path
    with a known floor leads to the core, NaN without edges."""
    out = np.full(n_nics, np.nan)
    if not len(edges):
        return out
    tight = max(TIGHT_NS, float(np.median(bound)))
    i, j = edges[:, 0], edges[:, 1]
    t = bound <= tight
    adj = coo_matrix((np.ones(int(t.sum())), (i[t], j[t])), shape=(n_nics, n_nics))
    _, comp = connected_components(adj, directed=False)
    on = np.zeros(n_nics, bool)
    on[edges.ravel()] = True
    sizes = np.bincount(comp[on], minlength=int(comp.max()) + 1)
    core = np.flatnonzero(on & (comp == int(np.argmax(sizes))))
    w = np.maximum(bound, 1e-3)  # zero weights would vanish from the sparse graph
    g = coo_matrix((w, (i, j)), shape=(n_nics, n_nics)).tocsr()
    dist = dijkstra(g, directed=False, indices=core, min_only=True)
    out[on] = dist[on]
    out[core] = 0.0
    return out


def split_raise(n_nics: int, edges: I64, raise_ns: F64, rounds: int = 8) -> F64:
    """Per NIC its share of the raised floors of its edges: ``raise ~ q[i] + q[j]``, fitted by
    backfitting with interquartile means (`sync.excess.node_midmean`): where standing
    queueing sits (NaN for NICs without an edge)."""
    q = np.zeros(n_nics)
    i, j = edges[:, 0], edges[:, 1]
    node = np.concatenate([i, j])
    for _ in range(max(1, rounds)):
        other = np.concatenate([q[j], q[i]])
        q = np.nan_to_num(node_midmean(n_nics, node, np.concatenate([raise_ns, raise_ns]) - other))
        q = np.maximum(q, 0.0)
    has = np.bincount(node, minlength=n_nics) > 0
    return np.where(has, q, np.nan)
