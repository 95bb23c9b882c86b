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

from controller.windows import KeyIndex
from mesh.fabric.model import hop_links

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
    """Return per directed hop (or per link if ``links``) the sum of ``per_path`` over paths
    (``hops`` -1 padded; an element >= ``n_elems`` lengthens the result). Raises ValueError
    on an element below -1."""
    m = min(len(per_path), len(hops))
    h = hops[:m]
    if links:
        h = hop_links(h).astype(np.int32, copy=False)
    vals = np.asarray(per_path[:m])
    if np.issubdtype(vals.dtype, np.integer) and h.ndim == 2 and h.size:
        # counts: float sums of integers below 2^53 are exact in any order, so the columns
        # are summed one at a time (no arrays of every cell: ~16 B a cell at 10^7 cells)
        w = vals.astype(np.float64)
        size = max(n_elems + 1, int(h.max()) + 2)
        acc = np.zeros(size)
        for c in range(h.shape[1]):
            acc += np.bincount(h[:, c] + 1, weights=w, minlength=size)
        return np.rint(acc[1:]).astype(np.int64)
    w = np.repeat(np.asarray(vals, dtype=np.float64), h.shape[1])
    out = np.bincount(h.ravel() + 1, weights=w, minlength=n_elems + 1)[1:]
    return np.rint(out).astype(np.int64)


@dataclass(eq=False)
class PathIndex:
    """Paths seen so far: signature -> dense path number (a `KeyIndex` hash table), hops and
    baseline per path (inf until folded)."""

    width: int
    base: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0, np.float64))
    hops: npt.NDArray[np.int32] = field(init=False)
    sigs: npt.NDArray[np.int64] = field(init=False)  # each number's signature
    _index: KeyIndex = field(default_factory=KeyIndex)

    def __post_init__(self) -> None:
        self.hops = np.zeros((0, self.width), np.int32)
        self.sigs = np.zeros(0, np.int64)

    @property
    def size(self) -> int:
        """Number of known paths."""
        return len(self.base)

    def lookup(self, sig: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Return the path number of each signature, -1 where unseen."""
        return self._index.lookup(sig)

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
        old = self.size
        out, n_new = self._index.insert(sig)
        if n_new:
            fresh = np.flatnonzero(out >= old)
            pos = np.empty(n_new, np.intp)  # one record per new path, in order: records of
            pos[out[fresh] - old] = fresh  # one signature are one path: any of them will do
            self.base = np.concatenate([self.base, np.full(n_new, np.inf)])
            self.hops = np.concatenate([self.hops, np.asarray(rows(pos), np.int32)])
            self.sigs = np.concatenate([self.sigs, sig[pos]])
        return out

    def install(
        self, sig: npt.NDArray[np.int64], hops: npt.NDArray[np.int32], base: npt.NDArray[np.float64]
    ) -> None:
        """Set the baselines of paths (signatures and hop rows; NaN or inf: no baseline),
        adding the unknown ones: a fleet worker adopts the baselines its solver folded."""
        rows = np.asarray(hops, np.int32)
        if rows.shape[1:] != (self.width,) or len(rows) != len(sig) or len(base) != len(sig):
            raise ValueError(f"need one hop row of width {self.width} and one baseline per path")
        ids = self.ids(np.asarray(sig, np.int64), lambda sel: rows[sel])
        self.base[ids] = np.where(np.isnan(base), np.inf, base)

    def fold(self, wmin: npt.NDArray[np.float64], dt_s: float, drift: float) -> None:
        """Fold a window's per-path minimum delays (inf = no sample): new min, or old + drift*dt."""
        m = min(len(wmin), self.size)
        w = wmin[:m]
        seen = np.isfinite(w)
        old = self.base[:m]
        grown = np.where(np.isfinite(old), old + drift * max(dt_s, 0.0), np.inf)
        self.base[:m] = np.where(seen, np.minimum(grown, w), old)


def alias_groups(
    n_links: int, hops: npt.NDArray[np.int32], *, directed: bool = False
) -> list[tuple[int, ...]]:
    """Return the groups (two or more link indices, ascending; groups in order of their first
    link) of links that the paths ``hops`` (rows of directed hop ids, -1 padding) cannot tell
    apart: every row that crosses one link of a group crosses all of them, in either
    direction. Links no row crosses are in no group.

    End-to-end measurements on these paths see a fault on any link of a group identically, so
    no localizer can name which one it is (on a fabric of two pods, for example, a super-spine
    has one link into each pod, and every path through it takes both). Each row gets two
    random weights (fixed seed) and each link the two sums of its rows' weights, added in row
    order: links crossed by the same rows get bit-identical sums, others differ but for a
    chance of ~2^-100. A row is taken to cross a link at most once (a path never turns back
    on a link). With ``directed`` the elements are the directed hops themselves (``n_links``
    is then the number of hop ids): hops that every path crossing one crosses too, whose
    queues no one-way delay tells apart. Raises ValueError on an element >= n_links.
    """
    h = np.asarray(hops)
    if h.ndim != 2:
        raise ValueError("hops must be a (paths, hops) array")
    # every cell, in row-major order, is counted in bin element + 1 (padding in bin 0,
    # dropped): each element's sums take its rows' weights in the order they had as the
    # crossings alone, with no index arrays of the crossings made
    cell = h.ravel().astype(np.intp)
    if not directed:
        cell >>= 1  # hop_links: -1 stays -1
    cell += 1
    np.maximum(cell, 0, out=cell)
    if len(cell) and int(cell.max()) > n_links:
        raise ValueError(f"a hop names link {int(cell.max()) - 1} of {n_links}")
    rng = np.random.default_rng(0x5EED)
    width = h.shape[1]
    keys = [
        np.asarray(np.bincount(cell, np.repeat(rng.random(h.shape[0]), width), n_links + 1))
        for _ in range(2)
    ]
    k0, k1 = (np.asarray(k[1:], np.float64) for k in keys)
    crossed = np.flatnonzero(np.bincount(cell, minlength=n_links + 1)[1:] > 0)
    return _same_keys(crossed, k0[crossed], k1[crossed])


def _same_keys(
    ids: npt.NDArray[np.intp], k0: npt.NDArray[np.float64], k1: npt.NDArray[np.float64]
) -> list[tuple[int, ...]]:
    """Return the groups (two or more, ascending) of ``ids`` (ascending) whose two keys are
    equal, in order of their first id: one stable sort by the keys, no loop over ids."""
    order = np.lexsort((k1, k0))  # stable: equal keys keep ascending ids
    a, b = k0[order], k1[order]
    cut = np.flatnonzero((a[1:] != a[:-1]) | (b[1:] != b[:-1])) + 1
    starts = np.concatenate([[0], cut])
    sizes = np.diff(np.concatenate([starts, [len(order)]]))
    big = np.flatnonzero(sizes > 1)
    if not len(big):
        return []
    firsts = ids[order[starts[big]]]
    members = ids[order].tolist()
    return [
        tuple(members[starts[g] : starts[g] + sizes[g]])
        for g in big[np.argsort(firsts, kind="stable")].tolist()
    ]
