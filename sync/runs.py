"""Values grouped by a key, sorted within each group, as dense rows: what `np.lexsort((val,
key))` gives, for the sync modules' small groups (a direction's hull points, a NIC's
directions) at a fraction of its cost. A full sort of millions of (key, value) pairs costs
seconds at 100,000 NICs; sorting rows of a few dozen values costs tens of milliseconds, and
the values come out the same (ties are equal values; NaN sorts last either way). Pure."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
PAD_FACTOR = 4  # dense rows may hold at most this many times the values (else: lexsort)


class Runs(NamedTuple):
    """The groups of a key: ``order`` puts the values in key order (in no particular order
    within a key: what reads them sorts each group's values; None when they already are in
    key order), run ``r`` is ``[starts[r], starts[r] + counts[r])`` of that order and has key
    ``keys[r]`` (ascending)."""

    order: I64 | None
    starts: I64
    counts: I64
    keys: I64


def runs_of(key: NDArray[np.integer], presorted: bool = False) -> Runs:
    """The runs of ``key`` (``presorted``: it is ascending already, no sort). The sort is an
    unstable one of 32-bit keys where they fit (~3x a stable sort of 64-bit keys)."""
    k = np.asarray(key)
    order = None if presorted else _key_sort(k)
    ks = k if order is None else k[order]
    n = len(ks)
    if not n:
        empty = np.zeros(0, np.int64)
        return Runs(order, empty, empty.copy(), empty.copy())
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    counts = np.diff(np.r_[starts, n])
    return Runs(order, starts, counts, ks[starts].astype(np.int64))


def _key_sort(k: NDArray[np.integer]) -> I64:
    """An order that sorts integer keys ``k`` (ties in any order)."""
    if len(k) and int(k.min()) >= -(2**31) and int(k.max()) < 2**31:
        return np.argsort(k.astype(np.int32)).astype(np.int64)
    return np.argsort(k).astype(np.int64)


def compact(runs: Runs) -> bool:
    """Whether the runs fit dense rows of their longest one without much padding."""
    g = len(runs.counts)
    return not g or g * int(runs.counts.max()) <= PAD_FACTOR * int(runs.counts.sum()) + 4096


def sorted_rows(runs: Runs, val: F64, width: int | None = None) -> F64:
    """Per run its values ascending (NaN last), the lowest ``width`` (all when None), as
    rows of a (runs, width) array padded with NaN: row ``r`` column ``c`` is the ``c``-th of
    run ``r`` in ``np.lexsort((val, key))`` order. Raises ValueError when ``width`` is None
    and the runs are not `compact`."""
    g = len(runs.counts)
    longest = int(runs.counts.max()) if g else 0
    w = longest if width is None else width
    v = val if runs.order is None else val[runs.order]
    if compact(runs):
        dense = np.full((g, longest), np.nan)
        dense[np.arange(longest)[None, :] < runs.counts[:, None]] = v
        dense.sort(axis=1)
        if w <= longest:
            return dense[:, :w]
        return np.concatenate([dense, np.full((g, w - longest), np.nan)], axis=1)
    if width is None:
        raise ValueError("runs too uneven for dense rows: give a width")
    run = np.repeat(np.arange(g), runs.counts)
    vs = v[np.lexsort((v, run))]
    col = np.arange(w)
    take = col[None, :] < runs.counts[:, None]
    out = np.full((g, w), np.nan)
    out[take] = vs[(runs.starts[:, None] + col[None, :])[take]]
    return out


def key_order(key: NDArray[np.integer], val: F64) -> I64:
    """``np.lexsort((val, key))``: the stable order by (key, val). Through one sort of
    complex numbers ``key + i val`` (numpy sorts them by real part, then imaginary: 2-3x
    faster than lexsort) when every value is finite and every key exact as a float."""
    k = np.asarray(key)
    if len(k) and (np.abs(k).max() < 2**53) and np.isfinite(val).all():
        z = np.empty(len(k), np.complex128)
        z.real, z.imag = k, val
        return np.argsort(z, kind="stable")
    return np.lexsort((val, k))
