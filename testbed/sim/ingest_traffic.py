"""Probe traffic for ``qpmesh sim ingest``, generated as it is consumed.

`traffic` yields one step at a time (never the whole run): the step's probes split per host as
the probers publish them (`host_batches`: one batch per host with its own NIC id table) or as
one batch per generated chunk (``step``). A step of a large fabric (10,000 NICs: ~4.7 M probes
per 0.5 s, more than one `ProbeBatch` holds) is simulated in chunks of time and joined before
it is split per host.

``replay_s``: only the first ``replay_s`` seconds are simulated; later steps replay them with
every stamp moved on by a multiple k x ``replay_s`` of true time *in each NIC's own clock*
(t1/t4 by k x replay_s x (1 + drift of the initiator), t2/t3 by the responder's), new batch
sequence numbers and coded-pair ids, so the controller sees the same fabric, the same flows
and clocks that keep running along their (linear) models. Only the small clock wander
(sinusoids of a few ns, the frequency random walk) restarts at each replay boundary. The
controller's work per record does not depend on the values being new (the same columns go
through the same numpy calls), so throughput figures hold; delay-error figures of a replayed
run carry that wander restart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.records import COLUMNS, MAX_RECORDS, MISSING, ProbeBatch, encode_batch
from mesh.fabric import Fabric
from testbed.sim.engine import SimConfig, Simulator

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
CHUNK_RECORDS = 1 << 20  # records per simulated chunk of a step (well under MAX_RECORDS)
_PAIR_STRIDE = 1 << 26  # coded-pair id offset per replay (ids stay unique within a batch)


def _columns(batches: list[ProbeBatch]) -> dict[str, Any]:
    """The batches' columns joined (all share the simulator's NIC table)."""
    return {name: np.concatenate([getattr(b, name) for b in batches]) for name, _ in COLUMNS}


def split_hosts(
    fabric: Fabric,
    nic_ids: tuple[str, ...],
    cols: dict[str, Any],
    seq: int,
    stamp: str,
    host_rank: I64 | None = None,
) -> tuple[list[ProbeBatch], I64]:
    """Split columns (src/dst index ``nic_ids``) by the host of the probing NIC: one batch per
    host (origin = host id, ``batch_seq`` = ``seq``, a NIC table of only the NICs it names).
    Returns (batches, row order: the rows in batch order). Empties ``cols`` as it goes.
    ``host_rank``: per host index, its place in the order of the batches (default: host
    index order), e.g. the order in which the hosts' batches arrive."""
    src = cols["src"].astype(np.int64)
    host = np.asarray(fabric.nic_host_index)[src]
    key = host if host_rank is None else host_rank[host]
    order = np.argsort(key, kind="stable")
    hs = host[order]
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    del key
    bounds = np.concatenate([[0], cuts, [len(order)]])
    s_all, d_all = src[order], cols["dst"].astype(np.int64)[order]
    del src, host
    # sorted one column at a time, each unsorted column released as soon as it is sorted
    # (``cols`` is the caller's to give away: at 10,000 NICs a step is ~250 MB)
    rest = {k: cols.pop(k)[order] for k in ("seq", "sport", "pair", "pos", "t1", "t2", "t3",
                                             "t4", "lost")}  # fmt: skip
    out = []
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        s, d = s_all[a:b], d_all[a:b]
        ids, inv = np.unique(np.concatenate([s, d]), return_inverse=True)
        part: dict[str, Any] = {k: v[a:b] for k, v in rest.items()}
        part["src"], part["dst"] = inv[: b - a], inv[b - a :]
        out.append(
            ProbeBatch.from_columns(
                fabric.hosts[int(hs[a])].id,
                stamp,
                tuple(nic_ids[int(i)] for i in ids),
                part,
                batch_seq=seq,
            )
        )
    return out, order


def host_batches(fabric: Fabric, batch: ProbeBatch, seq: int) -> tuple[list[bytes], I64]:
    """Split ``batch`` by the host of its probing NIC, as the hosts' probers publish it: one
    encoded batch per host (`split_hosts`). Returns (payloads, row order)."""
    cols = {name: getattr(batch, name) for name, _ in COLUMNS}
    batches, order = split_hosts(fabric, batch.nic_ids, cols, seq, batch.stamp)
    return [encode_batch(b) for b in batches], order


@dataclass(frozen=True, eq=False)
class _Kept:
    """A simulated step kept for replay: its batches, their NICs' drifts, the truth."""

    batches: list[ProbeBatch]
    drift: list[F64]  # per batch: drift of each entry of its NIC table
    truth: F64


def _shifted(b: ProbeBatch, drift: F64, dt_ns: float, k: int, seq: int) -> ProbeBatch:
    """``b`` moved on by ``dt_ns`` of true time in each NIC's clock (see the module)."""
    d_src = np.rint(dt_ns * (1.0 + drift[b.src])).astype(np.int64)
    d_dst = np.rint(dt_ns * (1.0 + drift[b.dst])).astype(np.int64)
    cols: dict[str, Any] = {name: getattr(b, name) for name, _ in COLUMNS}
    for name, d in (("t1", d_src), ("t2", d_dst), ("t3", d_dst), ("t4", d_src)):
        col = cols[name]
        cols[name] = np.where(col == MISSING, MISSING, col + d)
    pair = cols["pair"].astype(np.int64)
    cols["pair"] = np.where(pair >= 0, (pair + k * _PAIR_STRIDE) % (1 << 31), -1)
    return replace(b, batch_seq=seq, **cols)


def _generate(
    sim: Simulator,
    fabric: Fabric,
    names: tuple[str, ...],
    i: int,
    t0_s: float,
    dt_s: float,
    chunks: int,
    batching: str,
    host_rank: I64 | None = None,
) -> tuple[list[ProbeBatch], F64]:
    """Simulate step ``i`` in ``chunks`` pieces of time; return (its batches, true forward
    delays of their rows in order). A function of its own so that the simulator's per-step
    truth (paths, delays) is freed on return, not kept alive by a suspended generator."""
    dt = dt_s / chunks
    parts: list[ProbeBatch] = []
    truths: list[F64] = []
    for j in range(chunks):  # keep only the batch and its truth of each chunk
        st = sim.step(t0_s + j * dt, dt)
        parts.append(st.batch)
        truths.append(st.true_fwd_ns)
        del st
    truth = np.concatenate(truths)
    if batching == "host":
        cols = _columns(parts)
        del parts
        batches, order = split_hosts(fabric, names, cols, i + 1, sim.config.timestamps, host_rank)
        return batches, truth[order]
    return [replace(b, batch_seq=i * chunks + j + 1) for j, b in enumerate(parts)], truth


def traffic(
    fabric: Fabric,
    cfg: SimConfig,
    seconds: float,
    step_s: float,
    batching: str,
    replay_s: float = 0.0,
    host_rank: I64 | None = None,
) -> Iterator[tuple[float, list[bytes], F64]]:
    """Yield per simulated step: (end time s, encoded batches, true forward delays of their
    rows in order); host batches in the order of ``host_rank`` (`split_hosts`). One step in memory at a time (plus the replayed steps with ``replay_s``:
    see the module docstring)."""
    sim: Simulator | None = Simulator(fabric, cfg)
    assert sim is not None
    per_step = len(sim.pairs_src) * cfg.rate_hz * step_s * 2
    chunks = max(1, math.ceil(per_step * 1.05 / CHUNK_RECORDS))
    n = int(np.ceil(seconds / step_s - 1e-9))
    n_gen = n if replay_s <= 0 else max(1, min(n, round(replay_s / step_s)))
    kept: list[_Kept] = []
    nic_idx = fabric.nic_index
    names = tuple(x.id for x in fabric.nics)  # the simulator's NIC table
    if n_gen < n:
        # replay: simulate what is replayed first, then drop the simulator (its paths and
        # models), before the consumer's state grows: the peak is one or the other, not both
        for i in range(n_gen):
            t0 = i * step_s
            batches, truth = _generate(
                sim, fabric, names, i, t0, step_s, chunks, batching, host_rank
            )
            drift = [sim.drift[[nic_idx[x] for x in b.nic_ids]] for b in batches]
            kept.append(_Kept(batches, drift, truth))
        sim = None
    for i in range(n):
        t1_s = min((i + 1) * step_s, seconds)
        if sim is not None:
            batches, truth = _generate(
                sim, fabric, names, i, i * step_s, t1_s - i * step_s, chunks, batching, host_rank
            )
        elif i < n_gen:
            batches, truth = kept[i].batches, kept[i].truth
        else:
            k, j = divmod(i, n_gen)
            src = kept[j]
            dt_ns = k * n_gen * step_s * 1e9
            batches = [
                _shifted(b, d, dt_ns, k, i + 1 if batching == "host" else i * chunks + c + 1)
                for c, (b, d) in enumerate(zip(src.batches, src.drift, strict=True))
            ]
            truth = src.truth
        assert all(len(b) <= MAX_RECORDS for b in batches)
        payloads = [encode_batch(b) for b in batches]
        del batches  # the consumer may empty ``payloads`` once decoded: only one copy lives
        yield t1_s, payloads, truth
