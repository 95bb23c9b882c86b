"""An edge owner's share of one worker's partial, on the wire (pure).

A worker's partial (`controller.fleet.partial.Partial`) holds every edge's clock rows; edge
owner ``k`` (`controller.fleet.edges`) keeps only its block's (`split_partial`), plus what
every owner reads: the clocks the worker found moved, the earliest send of the worker's whole
clock part (where a clock folding it first puts its warm-up bins) and the batches the
partial covers (`controller.fleet.owner.OwnerCore` drops a partial whose batches another of
the window covers). An `OwnerShare` is exactly that, cut by the worker (`cut_shares`) so an
owner decodes its share alone instead of every worker's whole partial.

`OwnerShare.encode` writes the fleet's columnar frame (`controller.fleet.codec`, magic
``QPOS``); `OwnerShare.decode` reads one back equal, and raises `ShareError` (one line) on
every malformed payload. Values in, bytes out and back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.clocksolve import SAMPLE_COLUMNS, SampleRows
from controller.fleet.codec import CodecError, pack, unpack
from controller.fleet.edges import EdgeInput, split_partial
from controller.fleet.partial import Covers, MovedClocks, Partial

I64 = npt.NDArray[np.int64]

MAGIC = b"QPOS"
VERSION = 1


class ShareError(CodecError):
    """A payload that is not an owner share this version reads (the reason in one line)."""


@dataclass(frozen=True, eq=False)
class OwnerShare:
    """What edge owner ``owner`` needs of worker ``worker``'s partial of ``window``: its
    edges' clock ``rows``, the ``moved`` clocks, ``first`` (the earliest coded send of the
    worker's whole clock part; None: none) and the batches the partial ``covers``."""

    owner: int
    window: int
    worker: str
    first: int | None
    covers: Covers
    rows: SampleRows
    moved: MovedClocks

    def input(self) -> EdgeInput:
        """Return the share as the owner's `EdgeInput` (what `split_partial` returns)."""
        return EdgeInput(self.window, self.worker, self.rows, self.moved, self.first)

    def encode(self, *, compress: bool = True) -> bytes:
        """Return the share as bytes (`decode` reads them back to an equal share)."""
        head = {"owner": self.owner, "window": self.window, "worker": self.worker,
                "first": self.first, "origins": list(self.covers.origins)}  # fmt: skip
        cols: dict[str, npt.NDArray[Any]] = {
            "cov.origin": self.covers.origin,
            "cov.seq": self.covers.seq,
            "mov.nic": self.moved.nic,
            "mov.since": self.moved.since,
        }
        for k in SAMPLE_COLUMNS:
            cols[f"clk.{k}"] = getattr(self.rows, k)
        return pack(MAGIC, VERSION, head, cols, compress=compress)

    @classmethod
    def decode(cls, data: bytes) -> OwnerShare:
        """Return the share of ``data``. Raises `ShareError` (one line) on any payload that
        is not a well-formed share of a version this code reads."""
        try:
            _, head, cols = unpack(data, MAGIC, frozenset({VERSION}))
        except CodecError as exc:
            raise ShareError(str(exc)) from None
        return _build(head, cols)


def cut_shares(p: Partial, bounds: I64) -> list[OwnerShare]:
    """Return ``p``'s share for each owner of ``bounds`` (`controller.fleet.edges.
    owner_bounds`), in owner order; an owner with none of the partial's rows still gets
    its (empty) share, so it knows the window is complete for this partial."""
    return [OwnerShare(k, e.window, e.worker, e.first, p.covers, e.rows, e.moved)
            for k, e in enumerate(split_partial(p, bounds))]  # fmt: skip


def solver_part(p: Partial) -> Partial:
    """Return ``p`` as the solver needs it once the owners hold its clock rows: the same,
    its clock part cut to the earliest coded pair (both rows: the solver reads only that
    pair's send, `controller.fleet.edges.first_send`, for the fleet's solve cadence)."""
    coded = np.flatnonzero(p.clock.pair >= 0)
    if not len(coded):
        return dataclasses.replace(p, clock=p.clock.take(np.zeros(0, np.int64)))
    i = int(coded[np.argmin(p.clock.t1[coded])])  # a pair's earlier send: its first row
    return dataclasses.replace(p, clock=p.clock.take(np.array([i, i + 1], np.int64)))


def rejoin(part: Partial, shares: Sequence[OwnerShare]) -> Partial:
    """Return the whole partial of a `solver_part` and its every owner's share: the clock
    rows of the shares in owner order (the order a fold takes them in does not depend on
    it: `controller.fleet.edges.fold_order`). Raises ValueError when the shares are not one
    per owner of ``part``'s window and worker."""
    if [s.owner for s in shares] != list(range(len(shares))) or any(
        (s.window, s.worker) != (part.window, part.worker) for s in shares
    ):
        raise ValueError(f"shares of {part.worker} window {part.window} are not one per owner")
    return dataclasses.replace(part, clock=SampleRows.concat([s.rows for s in shares]))


@dataclass(frozen=True)
class WireCut:
    """What a worker sends of one partial with edge owners on: the solver's ``part`` and
    one share per owner (``shares``, owner order), encoded."""

    part: bytes
    shares: tuple[bytes, ...]


@dataclass(frozen=True, eq=False)
class OwnerCut:
    """Cuts a worker's partials for ``bounds``' owners (`controller.fleet.edges.
    owner_bounds`): `controller.fleet.workerloop.WorkerLoop`'s ``cut``."""

    bounds: I64

    def __call__(self, p: object) -> WireCut:
        """Return ``p``'s `WireCut`. Raises TypeError unless ``p`` is a `Partial`."""
        if not isinstance(p, Partial):
            raise TypeError(f"only a Partial is cut for owners, not {type(p).__name__}")
        shares = tuple(s.encode() for s in cut_shares(p, self.bounds))
        return WireCut(solver_part(p).encode(), shares)


def _int(head: dict[str, Any], key: str, *, none: bool = False) -> Any:
    v = head.get(key)
    if none and v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ShareError(f"head field {key!r} is missing or not an integer")
    return v


def _build(head: dict[str, Any], cols: dict[str, npt.NDArray[Any]]) -> OwnerShare:
    owner, window, first = _int(head, "owner"), _int(head, "window"), _int(head, "first", none=True)
    worker, origins = head.get("worker"), head.get("origins")
    if owner < 0:
        raise ShareError(f"owner {owner} is negative")
    if not isinstance(worker, str):
        raise ShareError("head field 'worker' is missing or not a string")
    if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
        raise ShareError("head field 'origins' is missing or not a list of strings")

    def col(name: str, dt: str) -> npt.NDArray[Any]:
        a = cols.pop(name, None)
        if a is None:
            raise ShareError(f"column {name} is missing")
        if a.dtype.str != dt or a.ndim != 1:
            raise ShareError(f"column {name} is {a.dtype.str} {a.ndim}-d, not {dt} 1-d")
        return a

    cov_o, cov_s = col("cov.origin", "<i4"), col("cov.seq", "<i8")
    mov_n, mov_s = col("mov.nic", "<i8"), col("mov.since", "<i8")
    clk = {k: col(f"clk.{k}", dt) for k, dt in SAMPLE_COLUMNS.items()}
    if cols:
        raise ShareError(f"unknown column {sorted(cols)[0]}")
    if len(cov_o) != len(cov_s) or len(mov_n) != len(mov_s):
        raise ShareError("covers or moved clocks: columns of unequal lengths")
    if len({len(a) for a in clk.values()}) > 1:
        raise ShareError("clock rows: columns of unequal lengths")
    if len(cov_o) and not (cov_o.min() >= 0 and cov_o.max() < len(origins)):
        raise ShareError("a covered batch names no origin")
    if int((clk["pair"] >= 0).sum()) % 2:
        raise ShareError("clock pairs must come as two rows each")
    covers = Covers(tuple(origins), cov_o, cov_s)
    return OwnerShare(owner, window, worker, first, covers, SampleRows(**clk),
                      MovedClocks(mov_n, mov_s))  # fmt: skip


__all__ = ["MAGIC", "VERSION", "OwnerCut", "OwnerShare", "ShareError", "WireCut", "cut_shares",
           "rejoin", "solver_part"]  # fmt: skip
