"""Ingest: admitted probe batches -> fabric-indexed columns with forward and reply paths.

`Ingestor.ingest(batch)` maps the batch's NIC id table to fabric indices once (records naming
NICs the fabric does not know are dropped and counted) and attaches per record the directed
hops of the probe (src -> dst, sport -> dport) and of its reply (dst -> src, sport 4791 ->
probe sport): from a `PathTable` filled by the probers' path discovery where it knows the
flow, else from the fabric model's ECMP hash (`flow_paths`), else all -1 (detection then
localizes to NIC / host / group). Records that cannot be placed in time (a `MISSING` ``t1``
from a prober older than the refused-send fix, or a reply missing a stamp) are dropped and
counted, never read as a time. Which batches get here (decode, origin, replays, duplicates)
is `controller.admission`'s call. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from contract.records import MISSING, ProbeBatch
from controller.windows import KeyIndex, flow_key
from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths, routing_tables

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]


class IngestError(ValueError):
    """A batch cannot be ingested (e.g. path table rows of the wrong width)."""


class PathTable:
    """Discovered paths: (src, dst, sport) -> directed hop ids (-1 padded to ``max_hops``)."""

    def __init__(self, n_nics: int, max_hops: int) -> None:
        self.n_nics = n_nics
        self.max_hops = max_hops
        self._index = KeyIndex()
        self._hops = np.zeros((0, max_hops), np.int32)

    def __len__(self) -> int:
        return self._index.size

    def update(self, src: I64, dst: I64, sport: I64, hops: I32) -> None:
        """Set (or replace) the hops of flows; raises `IngestError` on a shape mismatch."""
        hops = np.asarray(hops, dtype=np.int32)
        if hops.ndim != 2 or hops.shape[0] != len(src) or hops.shape[1] > self.max_hops:
            raise IngestError(f"hops must have shape ({len(src)}, <= {self.max_hops})")
        slots, _ = self._index.insert(flow_key(src, dst, sport, self.n_nics))
        if self._index.size > len(self._hops):
            grown = np.full((max(self._index.size, 2 * len(self._hops)), self.max_hops), -1)
            grown[: len(self._hops)] = self._hops
            self._hops = grown.astype(np.int32)
        self._hops[slots] = -1
        self._hops[slots, : hops.shape[1]] = hops

    def lookup(self, src: I64, dst: I64, sport: I64) -> tuple[I32, NDArray[np.bool_]]:
        """Return (hops (n, max_hops), found mask); rows not found are all -1."""
        slots = self._index.lookup(flow_key(src, dst, sport, self.n_nics))
        found = slots >= 0
        out = np.full((len(src), self.max_hops), -1, np.int32)
        out[found] = self._hops[slots[found]]
        return out, found


@dataclass(frozen=True, eq=False)
class Ingested:
    """One ingested batch: columns over its kept records (fabric NIC indices)."""

    origin: str
    stamp: str
    batch_seq: int
    src: I32
    dst: I32
    sport: I32
    pair: I64  # coded-pair key unique within the batch (src << 32 | pair), -1 if not coded
    t1: I64
    t2: I64
    t3: I64
    t4: I64
    lost: NDArray[np.bool_]
    hops_fwd: I32
    hops_rev: I32
    path_known: NDArray[np.bool_]  # from discovery or the model (False = hops all -1)
    flow: I64  # dense flow slot of (src, dst, sport), stable for the ingestor's lifetime
    part: I32 | None = None  # merged batch: the part (`Ingestor.ingest` ``parts``) of each row

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class IngestStats:
    """Counters: batches and records ingested, per origin the records ingested, unknown-NIC
    records dropped, and unstamped records dropped (a `MISSING` ``t1``, as probers before the
    refused-send fix sent for a loss, or a reply without all of ``t2``..``t4``: no time to
    file them under)."""

    batches: int = 0
    records: int = 0
    unknown_nic_records: int = 0
    unstamped_records: int = 0
    origins: dict[str, int] = field(default_factory=dict)


class Ingestor:
    """Maps batches onto ``fabric``; see the module docstring. ``use_model_paths=False``
    disables the ECMP hash model (paths only from ``paths``)."""

    def __init__(
        self,
        fabric: Fabric,
        paths: PathTable | None = None,
        *,
        use_model_paths: bool = True,
    ) -> None:
        self.fabric = fabric
        self.n_nics = len(fabric.nics)
        self.max_hops = routing_tables(fabric).max_hops
        self.paths = paths if paths is not None else PathTable(self.n_nics, self.max_hops)
        # reply hops keyed by the *probe's* flow (src, dst, sport): with L4 ECMP hashing the
        # reply path depends on the probe's sport (the reply's dport), which `paths` cannot key
        self.reply_paths = PathTable(self.n_nics, self.max_hops)
        self.use_model_paths = use_model_paths
        self.stats = IngestStats()
        self._table_cache: tuple[tuple[str, ...], I64] | None = None
        # flows (src, dst, sport) -> dense slots; model (hash) paths of probe and reply for
        # the RoCEv2 dport never change for a fabric, so they are computed once per flow
        self.flows = KeyIndex()
        self._fhops = np.full((0, self.max_hops), -1, np.int32)
        self._rhops = np.full((0, self.max_hops), -1, np.int32)
        self._known_flows = 0

    def _map_table(self, nic_ids: tuple[str, ...]) -> I64:
        cached = self._table_cache
        if cached is not None and (cached[0] is nic_ids or cached[0] == nic_ids):
            return cached[1]
        idx = self.fabric.nic_index
        table = np.array([idx.get(x, -1) for x in nic_ids], dtype=np.int64)
        self._table_cache = (nic_ids, table)
        return table

    def paths_for(
        self, src: I64, dst: I64, sport: I64, dport: int
    ) -> tuple[I32, I32, NDArray[np.bool_], I64]:
        """Return (forward hops, reply hops, known mask, flow slots) for probes src -> dst,
        registering flows not seen before."""
        slots, added = self.flows.insert(flow_key(src, dst, sport, self.n_nics))
        if added:
            self._grow_flows(src, dst, sport, slots)
        model = None
        if self.use_model_paths and dport == ROCEV2_PORT:  # cached per flow
            model = np.take(self._fhops, slots, axis=0), np.take(self._rhops, slots, axis=0)
        fwd, rev, known = self._paths(src, dst, sport, dport, model)
        return fwd, rev, known, slots

    def lookup(
        self, src: I64, dst: I64, sport: I64, dport: int = ROCEV2_PORT
    ) -> tuple[I32, I32, NDArray[np.bool_]]:
        """Return (forward hops, reply hops, known mask) that probes src -> dst (sport ->
        dport) would be given now, without registering their flows (read-only)."""
        return self._paths(src, dst, sport, dport, None)

    def _paths(
        self, src: I64, dst: I64, sport: I64, dport: int, model: tuple[I32, I32] | None
    ) -> tuple[I32, I32, NDArray[np.bool_]]:
        """Model paths (``model``: already looked up), overlaid with the discovered ones."""
        n = len(src)
        if self.use_model_paths:
            if model is not None:
                fwd, rev = model
            else:
                fwd = flow_paths(self.fabric, src, dst, sport, dport)
                rev = flow_paths(self.fabric, dst, src, dport, sport)  # reply: ports swapped
            known = np.ones(n, bool)
        else:
            fwd = np.full((n, self.max_hops), -1, np.int32)
            rev = fwd.copy()
            known = np.zeros(n, bool)
        if len(self.paths):
            dfwd, f_found = self.paths.lookup(src, dst, sport)
            drev, r_found = self.paths.lookup(dst, src, np.full(n, dport, np.int64))
            fwd[f_found] = dfwd[f_found]
            rev[r_found] = drev[r_found]
            known |= f_found & r_found
        if len(self.reply_paths):
            drep, p_found = self.reply_paths.lookup(src, dst, sport)
            rev[p_found] = drep[p_found]
            if len(self.paths):
                known |= f_found & p_found
        return fwd, rev, known

    def _grow_flows(self, src: I64, dst: I64, sport: I64, slots: I64) -> None:
        size = self.flows.size
        if size > len(self._fhops):
            cap = max(size, 2 * len(self._fhops), 1024)
            for name in ("_fhops", "_rhops"):
                old = getattr(self, name)
                new = np.full((cap, self.max_hops), -1, np.int32)
                new[: len(old)] = old
                setattr(self, name, new)
        if not self.use_model_paths:
            self._known_flows = size
            return
        fresh = slots >= self._known_flows  # new slots are numbered after the known ones
        _, first = np.unique(slots[fresh], return_index=True)
        idx = np.flatnonzero(fresh)[first]
        s, d, p = src[idx], dst[idx], sport[idx]
        self._fhops[slots[idx]] = flow_paths(self.fabric, s, d, p, ROCEV2_PORT)
        self._rhops[slots[idx]] = flow_paths(self.fabric, d, s, ROCEV2_PORT, p)
        self._known_flows = size

    def ingest(self, batch: ProbeBatch, parts: Sequence[tuple[str, int]] | None = None) -> Ingested:
        """Return ``batch`` ingested (admitted before: `controller.admission`).

        ``parts``: for a merged batch (`contract.records.merge_batches`), (origin, records)
        of the batches it holds in order, for the per-origin counters; default: one part,
        the batch's own origin."""
        table = self._map_table(batch.nic_ids)
        src = table[batch.src] if len(batch) else np.zeros(0, np.int64)
        dst = table[batch.dst] if len(batch) else np.zeros(0, np.int64)
        ok = (src >= 0) & (dst >= 0) & (src != dst)
        stamped = _stamped(batch)
        keep: slice | NDArray[np.bool_] = slice(None)
        every = bool(ok.all()) and bool(stamped.all())
        if not every:
            self.stats.unknown_nic_records += int((~ok).sum())
            self.stats.unstamped_records += int((ok & ~stamped).sum())
            ok &= stamped
            keep = ok
            src, dst = src[ok], dst[ok]
        sport = batch.sport[keep].astype(np.int64)
        fwd, rev, known, slots = self.paths_for(src, dst, sport, batch.dport)
        pair = batch.pair[keep].astype(np.int64)
        pair = np.where(pair >= 0, (src << 32) | pair, -1)
        parts = parts if parts is not None else ((batch.origin, len(batch)),)
        self.stats.batches += len(parts)
        self.stats.records += len(src)
        if every:
            kept = [n for _, n in parts]
        else:
            run = np.concatenate([[0], np.cumsum(ok)])  # records kept before each row
            ends = np.cumsum([n for _, n in parts])
            kept = [int(x) for x in np.diff(run[np.concatenate([[0], ends])])]
        origins = self.stats.origins
        for (origin, _), k in zip(parts, kept, strict=True):
            origins[origin] = origins.get(origin, 0) + k
        part = None
        if len(parts) > 1:
            part = np.repeat(np.arange(len(parts), dtype=np.int32), [n for _, n in parts])[keep]
        return Ingested(
            batch.origin,
            batch.stamp,
            batch.batch_seq,
            src.astype(np.int32),
            dst.astype(np.int32),
            sport.astype(np.int32),
            pair,
            batch.t1[keep],
            batch.t2[keep],
            batch.t3[keep],
            batch.t4[keep],
            batch.lost[keep],
            fwd,
            rev,
            known,
            slots,
            part,
        )


def _stamped(batch: ProbeBatch) -> NDArray[np.bool_]:
    """Return, per record, whether it can be placed in time: ``t1`` is a stamp, and a record
    that is not lost has all of ``t2``..``t4`` (a lost one has them `MISSING` by contract)."""
    has_t1: NDArray[np.bool_] = batch.t1 != MISSING
    reply: NDArray[np.bool_] = (batch.t2 != MISSING) & (batch.t3 != MISSING) & (batch.t4 != MISSING)
    return has_t1 & (batch.lost | reply)
