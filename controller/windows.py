"""Columnar, vectorized state containers for the controller pipeline.

- `KeyIndex`: maps int64 keys to dense slots (growing): a numpy open-addressing hash table.
- `SampleRing`: a fixed-capacity columnar ring buffer of float/int columns (oldest overwritten).
- `FlowStore`: per flow (src, dst, sport): latest one-way delay and time, the spine it crosses,
  and a windowed-minimum baseline (propagation) delay, so queueing = owd - baseline.

Nothing here reads a clock: times are passed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


def flow_key(src: NDArray[Any], dst: NDArray[Any], sport: NDArray[Any], n_nics: int) -> I64:
    """Return the int64 key of each flow (src, dst, sport) for a fabric with ``n_nics`` NICs."""
    return (src.astype(np.int64) * n_nics + dst.astype(np.int64)) * 65536 + sport.astype(np.int64)


_MULT = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = np.iinfo(np.int64).min


class KeyIndex:
    """Dense slot numbers for int64 keys, assigned in first-seen order.

    An open-addressing hash table (linear probing, load factor <= 1/2, key and slot side by
    side) probed with numpy gathers: a lookup costs a few `np.take` passes, no sort and no
    `np.unique` (those only run when new keys arrive). The key ``-2**63`` is reserved."""

    def __init__(self, capacity: int = 1024) -> None:
        cap = 1 << max(4, (capacity - 1).bit_length())
        self._kv = _empty_kv(cap)
        self._keys = np.zeros(0, np.int64)  # by slot
        self.size = 0

    def _home(self, keys: I64) -> I64:
        """Return each key's home slot (the top bits of a multiplicative hash), computed in
        one array, in place (the slot, < 2^63, read as int64: no copy)."""
        bits = len(self._kv).bit_length() - 1
        u = keys.view(np.uint64)
        h = u >> np.uint64(29)
        h ^= u
        with np.errstate(over="ignore"):
            h *= _MULT
        h >>= np.uint64(64 - bits)
        return h.view(np.int64)

    def lookup(self, keys: I64) -> I64:
        """Return the slot of each key, -1 where unknown."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        pos = self._home(keys)
        kv = np.take(self._kv, pos, axis=0)
        hit = kv[:, 0] == keys
        out = np.where(hit, kv[:, 1], -1)
        todo = np.flatnonzero(~hit & (kv[:, 0] != _EMPTY))
        pos = pos[todo]
        mask = len(self._kv) - 1
        while len(todo):
            pos = (pos + 1) & mask
            kv = np.take(self._kv, pos, axis=0)
            hit = kv[:, 0] == keys[todo]
            out[todo[hit]] = kv[hit, 1]
            more = ~hit & (kv[:, 0] != _EMPTY)
            todo, pos = todo[more], pos[more]
        return out

    def insert(self, keys: I64) -> tuple[I64, int]:
        """Return (slot of each key, number of new keys), adding unknown keys (new slots in
        ascending key order)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots = self.lookup(keys)
        miss = np.flatnonzero(slots < 0)
        if not len(miss):
            return slots, 0
        # one sort of the missing keys numbers them: no search of each in the new ones
        want = keys[miss]
        order = np.argsort(want)
        ranked = want[order]
        first = np.empty(len(ranked), dtype=bool)
        first[0] = True
        np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
        new = ranked[first]
        slots[miss[order]] = np.cumsum(first) - 1 + self.size
        n_new = self.size + len(new)
        self._keys = np.concatenate([self._keys, new])
        if 2 * n_new > len(self._kv):
            cap = len(self._kv)
            while 2 * n_new > cap:
                cap *= 2
            self._kv = _empty_kv(cap)
            self._fill(self._keys)
        elif not self.size:  # the table is empty
            self._fill(self._keys)
        else:
            new_slots = np.arange(self.size, n_new, dtype=np.int64)
            self._place(new, new_slots, self._home(new))
        self.size = n_new
        return slots, len(new)

    def _fill(self, keys: I64) -> None:
        """Place distinct ``keys``, each with its index as slot, into the table, empty
        before: in the order of their home slots each takes the first slot at or after its
        home not taken by the one before (a running maximum, no probing rounds); a run past
        the table's end wraps to its start (`_place`). One array of the keys' length is
        worked in place."""
        cap = len(self._kv)
        at = np.arange(len(keys), dtype=np.int64)
        pos = self._home(keys)  # a fresh array: shifted, sorted and accumulated in place
        if cap <= 1 << 31 and len(keys) <= 1 << 32:  # (home, index) in one word: a plain sort
            pos <<= 32
            pos |= at
            pos.sort()  # equal homes in any order: every lookup finds the same
            order = pos & 0xFFFFFFFF
            pos >>= 32
        else:
            order = np.argsort(pos)
            pos = pos[order]
        pos -= at
        np.maximum.accumulate(pos, out=pos)
        pos += at  # strictly increasing: all inside the table when the last one is
        if not len(pos) or pos[-1] < cap:
            self._kv[pos, 0] = keys[order]
            self._kv[pos, 1] = order
            return
        inside = pos < cap
        put = order[inside]
        self._kv[pos[inside], 0] = keys[put]
        self._kv[pos[inside], 1] = put
        wrap = order[~inside]  # every slot from their homes to the end is taken
        self._place(keys[wrap], wrap, np.zeros(len(wrap), np.int64))

    def _place(self, keys: I64, val: I64, pos: I64) -> None:
        """Place distinct ``keys`` (slots ``val``), not in the table yet, probing from ``pos``
        (their homes, or a slot such that every slot from a key's home up to it is taken)."""
        mask = len(self._kv) - 1
        while len(keys):
            free = self._kv[pos, 0] == _EMPTY
            cand = np.flatnonzero(free)
            # one key per free slot a round: every candidate writes its key, the one read back
            # holds the slot (keys are distinct; which one wins does not change any lookup)
            self._kv[pos[cand], 0] = keys[cand]
            win = cand[self._kv[pos[cand], 0] == keys[cand]]
            self._kv[pos[win], 1] = val[win]
            rest = np.ones(len(keys), dtype=bool)
            rest[win] = False
            keys, val = keys[rest], val[rest]
            pos = np.where(free[rest], pos[rest], (pos[rest] + 1) & mask)

    def keys_by_slot(self) -> I64:
        """Return every key, indexed by its slot."""
        return self._keys.copy()


def _empty_kv(cap: int) -> I64:
    kv = np.empty((cap, 2), np.int64)  # each column written once
    kv[:, 0] = _EMPTY
    kv[:, 1] = -1
    return kv


class SampleRing:
    """Fixed-capacity ring of named columns; appending past capacity drops the oldest rows."""

    def __init__(self, capacity: int, columns: dict[str, type[np.generic]]) -> None:
        if capacity < 1:
            raise ValueError("ring capacity must be >= 1")
        self.capacity = capacity
        self._cols = {k: np.zeros(capacity, dt) for k, dt in columns.items()}
        self._head = 0  # next write position
        self.count = 0

    def append(self, **cols: NDArray[Any]) -> None:
        """Append rows (all columns, equal lengths); raises ValueError on a mismatch."""
        if set(cols) != set(self._cols):
            raise ValueError(f"ring needs columns {sorted(self._cols)}")
        n = len(next(iter(cols.values())))
        if any(len(v) != n for v in cols.values()):
            raise ValueError("ring columns must have equal lengths")
        if n == 0:
            return
        if n > self.capacity:
            cols = {k: v[-self.capacity :] for k, v in cols.items()}
            n = self.capacity
        idx = (self._head + np.arange(n)) % self.capacity
        for k, v in cols.items():
            self._cols[k][idx] = v
        self._head = (self._head + n) % self.capacity
        self.count = min(self.capacity, self.count + n)

    def view(self) -> dict[str, NDArray[Any]]:
        """Return the stored rows, oldest first (copies)."""
        if self.count < self.capacity:
            return {k: v[: self.count].copy() for k, v in self._cols.items()}
        order = np.roll(np.arange(self.capacity), -self._head)
        return {k: v[order] for k, v in self._cols.items()}


class FlowStore:
    """Latest delay and baseline per flow slot (a flow = src, dst, sport), vectorized.

    The baseline is the minimum delay over the current and the previous baseline bucket
    (``bucket_ns`` long each), so it follows route changes within two buckets and is not pulled
    up by a burst of queueing shorter than a bucket.
    """

    def __init__(self, n_nics: int, bucket_ns: int = 60_000_000_000) -> None:
        if bucket_ns <= 0:
            raise ValueError("baseline bucket must be > 0 ns")
        self.n_nics = n_nics
        self.bucket_ns = bucket_ns
        self.size = 0
        self._cap = 0
        self.src = np.zeros(0, np.int32)
        self.dst = np.zeros(0, np.int32)
        self.sport = np.zeros(0, np.int32)
        self.spine = np.zeros(0, np.int32)
        self.last_t = np.zeros(0, np.int64)
        self.last_owd = np.zeros(0, np.float64)
        self._base_cur = np.zeros(0, np.float64)
        self._base_prev = np.zeros(0, np.float64)
        self._bucket_start: int | None = None

    def __len__(self) -> int:
        return self.size

    def _grow(self, need: int) -> None:
        if need <= self._cap:
            return
        cap = max(need, 2 * self._cap, 1024)
        fills: dict[str, float | int] = {
            "src": -1,
            "dst": -1,
            "sport": -1,
            "spine": -1,
            "last_t": np.iinfo(np.int64).min,
            "last_owd": np.nan,
            "_base_cur": np.inf,
            "_base_prev": np.inf,
        }
        for name, fill in fills.items():
            old = getattr(self, name)
            new = np.full(cap, fill, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        self._cap = cap

    def register(
        self,
        slots: I64,
        src: NDArray[Any],
        dst: NDArray[Any],
        sport: NDArray[Any],
        spine: NDArray[Any],
    ) -> None:
        """Describe flows by slot (slots are dense ids assigned by the caller, e.g. the
        ingestor's flow index); grows the store as needed."""
        if len(slots):
            self._grow(int(slots.max()) + 1)
            self.size = max(self.size, int(slots.max()) + 1)
        self.src[slots] = src
        self.dst[slots] = dst
        self.sport[slots] = sport
        self.spine[slots] = spine

    def unregistered(self, slots: I64) -> NDArray[np.bool_]:
        """Mask of slots not yet registered."""
        out = slots >= self._cap
        inside = ~out
        out[inside] = self.src[slots[inside]] < 0
        return out

    def update(self, slots: I64, t_ns: I64, owd_ns: F64, now_ns: int) -> F64:
        """Record delays (NaN = unknown, skipped) and return queueing delay above the baseline."""
        if self._bucket_start is None:
            self._bucket_start = now_ns
        elif now_ns - self._bucket_start >= self.bucket_ns:
            self._base_prev = self._base_cur
            self._base_cur = np.full(self._cap, np.inf)
            self._bucket_start = now_ns
        ok = np.isfinite(owd_ns)
        s, o = slots[ok], owd_ns[ok]
        self.last_owd[s] = o
        self.last_t[s] = t_ns[ok]
        np.minimum.at(self._base_cur, s, o)
        return owd_ns - self.baseline(slots)

    def baseline(self, slots: I64) -> F64:
        """Return the baseline delay of each slot (NaN where never measured)."""
        b = np.minimum(self._base_cur[slots], self._base_prev[slots])
        return np.where(np.isfinite(b), b, np.nan)

    def live(self, since_ns: int) -> I64:
        """Return the slots measured at or after ``since_ns``."""
        n = self.size
        return np.flatnonzero(self.last_t[:n] >= since_ns).astype(np.int64)
