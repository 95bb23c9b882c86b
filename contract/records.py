"""Columnar probe records: the unit that travels from prober to controller.

A `ProbeBatch` holds N probe results as numpy columns plus a string table of NIC ids (records
refer to NICs by position in that table, so a batch is self-describing and compact).

Columns (all length N):

- ``seq`` (uint32): initiator sequence number;
- ``src``, ``dst`` (uint16): index into ``nic_ids`` of initiator and responder NIC;
- ``sport`` (uint16): UDP source port of the probe (its ECMP path selector);
- ``pair`` (int32): coded-pair id, -1 when the probe is not part of a coded pair;
- ``pos`` (uint8): position inside the coded pair (0 or 1);
- ``t1``..``t4`` (int64 ns): initiator send, responder receive, responder send, initiator
  receive. t1 and t4 are in the initiator NIC's clock, t2 and t3 in the responder's;
- ``lost`` (bool): no reply before the timeout; t2..t4 are then `MISSING`.

Batch-wide: ``origin`` (the publishing host id), ``stamp`` (``hw``/``sw``/``sim``),
``dport`` (destination UDP port), ``batch_seq`` (per-origin sequence of batches, used to
drop duplicates after a spool replay).

`encode_batch` / `decode_batch` turn a batch into bytes and back: a fixed header, a JSON
string table, then the raw little-endian columns. Decoding checks every length and bound
and raises `RecordError` on anything malformed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

MAGIC = b"QPMB"
VERSION = 1
MISSING = np.iinfo(np.int64).min
STAMP_KINDS = ("hw", "sw", "sim")
MAX_RECORDS = 1 << 22
_HEADER = struct.Struct("<4sHHIQI")  # magic, version, dport, n_records, batch_seq, meta_len

COLUMNS: tuple[tuple[str, str], ...] = (
    ("seq", "<u4"),
    ("src", "<u2"),
    ("dst", "<u2"),
    ("sport", "<u2"),
    ("pair", "<i4"),
    ("pos", "u1"),
    ("t1", "<i8"),
    ("t2", "<i8"),
    ("t3", "<i8"),
    ("t4", "<i8"),
    ("lost", "?"),
)
_ROW_BYTES = sum(np.dtype(dt).itemsize for _, dt in COLUMNS)


class RecordError(ValueError):
    """A probe batch is malformed (bad bytes, bad lengths, bad indices)."""


@dataclass(frozen=True, eq=False)
class ProbeBatch:
    """N probe results as columns; validated on construction (raises `RecordError`)."""

    origin: str
    stamp: str
    nic_ids: tuple[str, ...]
    seq: npt.NDArray[np.uint32]
    src: npt.NDArray[np.uint16]
    dst: npt.NDArray[np.uint16]
    sport: npt.NDArray[np.uint16]
    pair: npt.NDArray[np.int32]
    pos: npt.NDArray[np.uint8]
    t1: npt.NDArray[np.int64]
    t2: npt.NDArray[np.int64]
    t3: npt.NDArray[np.int64]
    t4: npt.NDArray[np.int64]
    lost: npt.NDArray[np.bool_]
    dport: int = 4791
    batch_seq: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.stamp not in STAMP_KINDS:
            raise RecordError(f"stamp kind must be one of {STAMP_KINDS}, got {self.stamp!r}")
        n = len(self.seq)
        for name, dt in COLUMNS:
            col = getattr(self, name)
            if not isinstance(col, np.ndarray) or col.ndim != 1 or len(col) != n:
                raise RecordError(f"column {name} must be a 1-d array of length {n}")
            if col.dtype != np.dtype(dt):
                object.__setattr__(self, name, col.astype(dt))
        if n > MAX_RECORDS:
            raise RecordError(f"too many records: {n} > {MAX_RECORDS}")
        if n and (
            int(self.src.max()) >= len(self.nic_ids) or int(self.dst.max()) >= len(self.nic_ids)
        ):
            raise RecordError("src/dst index outside the NIC id table")
        if not 0 <= self.dport <= 0xFFFF:
            raise RecordError(f"bad dport {self.dport}")

    def __len__(self) -> int:
        return len(self.seq)

    @classmethod
    def from_columns(
        cls,
        origin: str,
        stamp: str,
        nic_ids: Sequence[str],
        columns: dict[str, npt.ArrayLike],
        *,
        dport: int = 4791,
        batch_seq: int = 0,
    ) -> ProbeBatch:
        """Build a batch from a column dict (missing ``pair``/``pos``/``lost`` get defaults).

        Raises `RecordError` if a required column is missing or lengths disagree.
        """
        n = len(np.asarray(columns["seq"])) if "seq" in columns else 0
        cols: dict[str, Any] = {}
        defaults = {"pair": -1, "pos": 0, "lost": False}
        for name, dt in COLUMNS:
            if name in columns:
                cols[name] = np.asarray(columns[name]).astype(dt, copy=False)
            elif name in defaults:
                cols[name] = np.full(n, defaults[name], dtype=dt)
            else:
                raise RecordError(f"missing column {name}")
        return cls(origin, stamp, tuple(nic_ids), dport=dport, batch_seq=batch_seq, **cols)

    @classmethod
    def empty(cls, origin: str = "", stamp: str = "sw") -> ProbeBatch:
        """Return a batch with no records."""
        return cls.from_columns(
            origin,
            stamp,
            (),
            {
                "seq": np.zeros(0, np.uint32),
                **{k: np.zeros(0) for k in ("src", "dst", "sport", "t1", "t2", "t3", "t4")},
            },
        )

    def select(self, mask: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> ProbeBatch:
        """Return a new batch with the rows picked by a boolean mask or index array."""
        cols: dict[str, Any] = {name: getattr(self, name)[mask] for name, _ in COLUMNS}
        return ProbeBatch(
            self.origin,
            self.stamp,
            self.nic_ids,
            dport=self.dport,
            batch_seq=self.batch_seq,
            **cols,
        )


def concat_batches(batches: Sequence[ProbeBatch]) -> ProbeBatch:
    """Concatenate batches that share origin, stamp kind and NIC table; raise `RecordError`."""
    if not batches:
        raise RecordError("nothing to concatenate")
    first = batches[0]
    for b in batches[1:]:
        if b.nic_ids != first.nic_ids or b.stamp != first.stamp:
            raise RecordError("batches differ in NIC table or stamp kind")
    cols: dict[str, Any] = {
        name: np.concatenate([getattr(b, name) for b in batches]) for name, _ in COLUMNS
    }
    return ProbeBatch(
        first.origin,
        first.stamp,
        first.nic_ids,
        dport=first.dport,
        batch_seq=batches[-1].batch_seq,
        **cols,
    )


MAX_NIC_IDS = 1 << 16  # src/dst are uint16 indices into the NIC id table


def merge_batches(batches: Sequence[ProbeBatch]) -> ProbeBatch:
    """Return one batch holding the records of ``batches`` in order, over the union of their
    NIC id tables (first appearance order), for ingesting many small batches at once.

    The batches may come from different origins: the result's ``origin`` is the common
    origin, or ``""`` if they differ, and its ``batch_seq`` is the last batch's (duplicate and
    replay checks are per batch, before merging: `controller.coalesce`). Raises `RecordError`
    if there is nothing to merge, the batches differ in stamp kind or destination port, or the
    union NIC table or the record count exceed what one batch can hold.
    """
    if not batches:
        raise RecordError("nothing to merge")
    first = batches[0]
    if len(batches) == 1:
        return first
    index: dict[str, int] = {}
    maps: list[npt.NDArray[np.uint16] | None] = []
    for b in batches:
        if b.stamp != first.stamp or b.dport != first.dport:
            raise RecordError("batches differ in stamp kind or destination port")
        if b.nic_ids is first.nic_ids and maps:
            maps.append(maps[0])
            continue
        ids = [index.setdefault(x, len(index)) for x in b.nic_ids]
        if len(index) > MAX_NIC_IDS:
            raise RecordError(f"merged NIC table too large: > {MAX_NIC_IDS}")
        identity = ids == list(range(len(ids)))
        maps.append(None if identity else np.asarray(ids, dtype=np.uint16))
    n = sum(len(b) for b in batches)
    if n > MAX_RECORDS:
        raise RecordError(f"too many records: {n} > {MAX_RECORDS}")
    cols: dict[str, Any] = {
        name: np.concatenate([getattr(b, name) for b in batches])
        for name, _ in COLUMNS
        if name not in ("src", "dst")
    }
    for name in ("src", "dst"):
        parts = []
        for b, m in zip(batches, maps, strict=True):
            col = getattr(b, name)
            parts.append(col if m is None else m[col])
        cols[name] = np.concatenate(parts)
    origins = {b.origin for b in batches}
    return ProbeBatch(
        first.origin if len(origins) == 1 else "",
        first.stamp,
        tuple(index),
        dport=first.dport,
        batch_seq=batches[-1].batch_seq,
        **cols,
    )


def encode_batch(batch: ProbeBatch) -> bytes:
    """Return the wire bytes of ``batch`` (header, JSON meta, raw little-endian columns)."""
    meta = json.dumps(
        {
            "origin": batch.origin,
            "stamp": batch.stamp,
            "nics": list(batch.nic_ids),
            "extra": batch.extra,
        },
        separators=(",", ":"),
    ).encode()
    head = _HEADER.pack(MAGIC, VERSION, batch.dport, len(batch), batch.batch_seq, len(meta))
    parts = [head, meta]
    parts.extend(
        np.ascontiguousarray(getattr(batch, name), dtype=dt).tobytes() for name, dt in COLUMNS
    )
    return b"".join(parts)


def decode_batch(data: bytes) -> ProbeBatch:
    """Return the batch encoded in ``data``; raise `RecordError` on any malformation."""
    if len(data) < _HEADER.size:
        raise RecordError("truncated header")
    magic, version, dport, n, batch_seq, meta_len = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise RecordError("bad magic")
    if version != VERSION:
        raise RecordError(f"unsupported batch version {version}")
    if n > MAX_RECORDS:
        raise RecordError(f"too many records: {n}")
    expect = _HEADER.size + meta_len + n * _ROW_BYTES
    if len(data) != expect:
        raise RecordError(f"length {len(data)} != expected {expect}")
    try:
        meta = json.loads(data[_HEADER.size : _HEADER.size + meta_len])
        origin, stamp, nics = meta["origin"], meta["stamp"], meta["nics"]
        extra = meta.get("extra", {})
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"bad batch metadata: {exc}") from None
    except RecursionError:  # deeply nested JSON: bad input, not a reason to stop the service
        raise RecordError("bad batch metadata: nested too deeply") from None
    if not (
        isinstance(origin, str)
        and isinstance(stamp, str)
        and isinstance(nics, list)
        and all(isinstance(x, str) for x in nics)
        and isinstance(extra, dict)
    ):
        raise RecordError("bad batch metadata types")
    off = _HEADER.size + meta_len
    cols: dict[str, Any] = {}
    for name, dt in COLUMNS:
        size = np.dtype(dt).itemsize * n
        cols[name] = np.frombuffer(data, dtype=dt, count=n, offset=off).astype(
            np.dtype(dt).newbyteorder("="), copy=True
        )
        off += size
    return ProbeBatch(
        origin, stamp, tuple(nics), dport=dport, batch_seq=batch_seq, extra=extra, **cols
    )
