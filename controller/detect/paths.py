"""Known paths: signature -> dense path number, the path's hops and its propagation baseline.

Every probe direction travels one path (a row of directed hop ids). `PathIndex` numbers the
distinct paths with an open-addressing hash table probed with numpy gathers (a few per lookup,
no sort), keeps each path's hops (so per-hop and per-link counts are expanded from per-path
counts once per window instead of once per record) and its propagation baseline: the minimum
delay seen, allowed to creep up by ``drift * dt`` per window so a slowly drifting clock estimate
does not look like queueing, while a contention episode of seconds barely moves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

_MULT = np.uint64(0x9E3779B97F4A7C15)


def path_signature(hops: npt.NDArray[np.int32]) -> npt.NDArray[np.int64]:
    """Return a 64-bit signature per row of directed hop ids (-1 padding included).

    Hop ids below 65535 are packed exactly, four per 64-bit word; wider rows or larger ids are
    combined with a multiplicative hash.
    """
    n, width = hops.shape
    if n and width and int(hops.max()) < 0xFFFF:
        pad = (-width) % 4
        u = np.empty((n, width + pad), dtype=np.uint16)
        u[:, :width] = hops + 1
        u[:, width:] = 0
        words = u.view(np.uint64)
        if words.shape[1] == 1:
            return words[:, 0].view(np.int64)
        cols = [words[:, i] for i in range(words.shape[1])]
    else:
        cols = [(hops[:, c].astype(np.int64) + 2).view(np.uint64) for c in range(width)]
    acc = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in cols:
            acc = (acc ^ col) * _MULT
            acc ^= acc >> np.uint64(29)
    return acc.view(np.int64)


def expand(
    per_path: npt.NDArray[np.float64] | npt.NDArray[np.int64],
    hops: npt.NDArray[np.int32],
    n_elems: int,
    *,
    links: bool = False,
) -> npt.NDArray[np.int64]:
    """Return per directed hop (or per link if ``links``) the sum of ``per_path`` over paths."""
    m = min(len(per_path), len(hops))
    h = hops[:m]
    if links:
        h = h >> 1
    w = np.repeat(np.asarray(per_path[:m], dtype=np.float64), h.shape[1])
    out = np.bincount(h.ravel() + 1, weights=w, minlength=n_elems + 1)[1:]
    return np.rint(out).astype(np.int64)


def _empty_table(cap: int) -> npt.NDArray[np.int64]:
    kv = np.zeros((cap, 2), np.int64)
    kv[:, 1] = -1
    return kv


@dataclass(eq=False)
class PathIndex:
    """Paths seen so far: hash table, hops per path, baseline per path (inf until folded)."""

    width: int
    # (capacity, 2): key, value side by side so one probe touches one cache line; key 0 = empty
    _kv: npt.NDArray[np.int64] = field(default_factory=lambda: _empty_table(1024))
    base: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0, np.float64))
    hops: npt.NDArray[np.int32] = field(init=False)

    def __post_init__(self) -> None:
        self.hops = np.zeros((0, self.width), np.int32)

    @property
    def size(self) -> int:
        """Number of known paths."""
        return len(self.base)

    def _home(self, sig: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        bits = len(self._kv).bit_length() - 1  # capacity is a power of two
        u = sig.view(np.uint64)
        with np.errstate(over="ignore"):
            h = ((u ^ (u >> np.uint64(31))) * _MULT) >> np.uint64(64 - bits)
        return h.astype(np.int64)

    def lookup(self, sig: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Return the path number of each signature, -1 where unseen."""
        sig = np.where(sig == 0, 1, sig)
        pos = self._home(sig)
        kv = np.take(self._kv, pos, axis=0)  # (much faster than kv[pos] on a 2-d array)
        hit = kv[:, 0] == sig
        out = np.where(hit, kv[:, 1], -1)
        todo = np.flatnonzero(~hit & (kv[:, 0] != 0))
        pos = pos[todo]
        mask = len(self._kv) - 1
        while len(todo):
            pos = (pos + 1) & mask
            kv = np.take(self._kv, pos, axis=0)
            hit = kv[:, 0] == sig[todo]
            out[todo[hit]] = kv[hit, 1]
            more = ~hit & (kv[:, 0] != 0)
            todo, pos = todo[more], pos[more]
        return out

    def paths(self, hops: npt.NDArray[np.int32]) -> npt.NDArray[np.int64]:
        """Return the path number of each row of ``hops``, adding unseen paths."""
        if hops.shape[1] != self.width:
            fixed = np.full((len(hops), self.width), -1, np.int32)
            w = min(self.width, hops.shape[1])
            fixed[:, :w] = hops[:, :w]
            hops = fixed
        rows = hops
        return self.ids(path_signature(hops), lambda sel: rows[sel])

    def ids(
        self,
        sig: npt.NDArray[np.int64],
        rows: Callable[[npt.NDArray[np.intp]], npt.NDArray[np.int32]],
    ) -> npt.NDArray[np.int64]:
        """Return the number of each signature, adding unseen ones with ``rows(positions)``
        (the element rows, width ``self.width``, of the records at those positions)."""
        out = self.lookup(sig)
        new = out < 0
        if new.any():
            nz = np.where(sig[new] == 0, 1, sig[new])
            usig, first = np.unique(nz, return_index=True)
            self._add(usig, rows(np.flatnonzero(new)[first]))
            out[new] = self.lookup(sig[new])
        return out

    def _add(self, sig: npt.NDArray[np.int64], hops: npt.NDArray[np.int32]) -> None:
        n_new = self.size + len(sig)
        if 2 * n_new > len(self._kv):  # load factor <= 1/2
            old = self._kv
            cap = len(old)
            while 2 * n_new > cap:
                cap *= 2
            self._kv = _empty_table(cap)
            used = old[:, 0] != 0
            self._place(old[used, 0], old[used, 1])
        self._place(sig, np.arange(self.size, n_new, dtype=np.int64))
        self.base = np.concatenate([self.base, np.full(len(sig), np.inf)])
        self.hops = np.concatenate([self.hops, hops.astype(np.int32)])

    def _place(self, sig: npt.NDArray[np.int64], val: npt.NDArray[np.int64]) -> None:
        pos = self._home(sig)
        mask = len(self._kv) - 1
        while len(sig):
            free = self._kv[pos, 0] == 0
            cand = np.flatnonzero(free)
            # among keys landing on the same free slot, the first one takes it this round
            _, first = np.unique(pos[cand], return_index=True)
            win = cand[first]
            self._kv[pos[win], 0] = sig[win]
            self._kv[pos[win], 1] = val[win]
            rest = np.ones(len(sig), dtype=bool)
            rest[win] = False
            sig, val = sig[rest], val[rest]
            pos = np.where(free[rest], pos[rest], (pos[rest] + 1) & mask)

    def fold(self, wmin: npt.NDArray[np.float64], dt_s: float, drift: float) -> None:
        """Fold a window's per-path minimum delays (inf = no sample): new min, or old + drift*dt."""
        m = min(len(wmin), self.size)
        w = wmin[:m]
        seen = np.isfinite(w)
        old = self.base[:m]
        grown = np.where(np.isfinite(old), old + drift * max(dt_s, 0.0), np.inf)
        self.base[:m] = np.where(seen, np.minimum(grown, w), old)
