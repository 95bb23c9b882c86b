"""Streamed collection of one sync window for ``qpmesh sim sync`` (hardware stamps).

The simulator's steps are reduced as they come: each step's probes are oriented onto the
window's edges and folded into a `sync.summary.Summary` (lower hulls, lowest-RTT exchanges,
counts) and into the NTP baselines' per-cell min-RTT exchanges. Nothing of the raw window is
held, so peak memory is one step plus the summaries (issue 10: 10,000 NICs at the default rate
held ~7 GB of raw probes before). A step's batch is dropped before the merge, and the heap's
freed pages are given back after each step (`testbed.sim.heap`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contract.records import ProbeBatch
from sync import ntp_offsets
from sync.summary import Summary, merge, reduce_chunk, rtt_cap
from sync.window import orient_samples
from testbed.sim.engine import SimStep, Simulator
from testbed.sim.heap import release_free_heap

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
N_SUB = 8  # NTP baseline: min-RTT exchange per eighth of the window


@dataclass(frozen=True)
class NtpCells:
    """Per cell (edge x sub-window, or edge) the min-RTT exchange: its RTT (inf: none), NTP
    offset ``((t2-t1)-(t4-t3))/2`` and time ``t1 - t_ref``, oriented onto the edge (i, j)."""

    rtt: F64
    theta: F64
    t_rel: F64

    @staticmethod
    def empty(n: int) -> NtpCells:
        """Cells with no exchange yet."""
        return NtpCells(np.full(n, np.inf), np.full(n, np.nan), np.full(n, np.nan))

    def merge(self, later: NtpCells) -> NtpCells:
        """Cells of both; on equal RTT the earlier exchange wins (as `ntp_offsets` picks)."""
        b = later.rtt < self.rtt
        return NtpCells(
            np.where(b, later.rtt, self.rtt),
            np.where(b, later.theta, self.theta),
            np.where(b, later.t_rel, self.t_rel),
        )


@dataclass(frozen=True)
class StreamedWindow:
    """What the benchmark keeps of a window: the summary, NTP cells per (edge, eighth) and per
    edge, and how many probes went by."""

    summary: Summary
    ntp_sub: NtpCells
    ntp_plain: NtpCells
    probes: int


def window_edges(pairs_src: I64, pairs_dst: I64, n_nodes: int) -> tuple[I64, I64]:
    """Unordered edges (i < j) of the probed pairs, sorted, and per edge how many directed
    pairs probe it."""
    lo, hi = np.minimum(pairs_src, pairs_dst), np.maximum(pairs_src, pairs_dst)
    keys, per = np.unique(lo * n_nodes + hi, return_counts=True)
    return np.stack([keys // n_nodes, keys % n_nodes], axis=1), per.astype(np.int64)


def window_batches(
    sim: Simulator,
    window_s: float,
    step_s: float,
    *,
    start_s: float = 0.0,
    progress: bool = False,
    observe: Callable[[SimStep], None] | None = None,
) -> Iterator[ProbeBatch]:
    """The probe batches of ``sim``'s steps over ``[start_s, start_s + window_s)``, one per
    step, as simulated.

    Neither a step nor its batch is held once handed on: the step's truth columns are freed
    at once and the batch when the consumer drops it, so the next step is simulated without
    the last one in memory (a generator's local, or `enumerate`'s reused result tuple, would
    keep it). ``observe`` sees each step (truth included) before it is dropped; ``progress``:
    a line on stderr every 5 steps."""
    total = int(np.ceil(window_s / step_s - 1e-9))
    done = 0

    def batch_of(st: SimStep) -> ProbeBatch:
        nonlocal done
        if observe is not None:
            observe(st)
        done += 1
        if progress and done % 5 == 0:
            print(f"sim sync: simulated {done}/{total} steps", file=sys.stderr)
        return st.batch

    return map(batch_of, sim.run(window_s, step_s, start_s))


def _ntp_cells(n_cells: int, cell: I64, s: tuple[I64, I64, I64, I64], t_ref: int) -> NtpCells:
    o = ntp_offsets(n_cells, cell, *s, t_ref)
    return NtpCells(np.where(o.ok, o.rtt_ns, np.inf), o.theta_ns, o.t_rel_ns)


def _reduce_step(
    b: ProbeBatch,
    edges: I64,
    keys: I64,
    cap: I64,
    n_nodes: int,
    t_ref: int,
    window_s: float,
    coded_tol_ns: int,
) -> tuple[Summary, NtpCells, NtpCells, int]:
    """One step's probes as a summary and NTP cells (per eighth, per edge), and their count."""
    m = len(edges)
    smp = orient_samples(
        b.src, b.dst, b.pair, b.t1, b.t2, b.t3, b.t4, b.lost, t_ref,
        coded_tol_ns=coded_tol_ns, min_coded=0,
    )  # fmt: skip
    local = smp.edges[:, 0] * n_nodes + smp.edges[:, 1]
    edge_of = np.searchsorted(keys, local)
    if np.any(edge_of >= m) or np.any(keys[np.minimum(edge_of, m - 1)] != local):
        raise ValueError("a probe's pair is not among the window's edges")
    part = reduce_chunk(smp, edge_of, edges, cap)
    # NTP baselines: the same probes oriented onto the edge, min-RTT exchange per cell
    arr = ~np.asarray(b.lost, dtype=bool)
    e = edge_of[smp.edge][arr]
    del smp
    fwd = np.asarray(b.src)[arr] == edges[e, 0]
    t1, t2, t3, t4 = (np.asarray(x, dtype=np.int64)[arr] for x in (b.t1, b.t2, b.t3, b.t4))
    s = (np.where(fwd, t1, t3), np.where(fwd, t2, t4), np.where(fwd, t3, t1), np.where(fwd, t4, t2))
    del t1, t2, t3, t4, fwd
    rel = (s[0] - t_ref).astype(np.float64)
    k = np.clip(((rel / 1e9 + window_s / 2) / window_s * N_SUB).astype(np.int64), 0, N_SUB - 1)
    sub = _ntp_cells(m * N_SUB, e * N_SUB + k, s, t_ref)
    plain = _ntp_cells(m, e, s, t_ref)
    return part, sub, plain, len(b.t1)


def collect_window(
    steps: Iterable[SimStep | ProbeBatch],
    edges: I64,
    max_exchanges: I64,
    n_nodes: int,
    t_ref: int,
    window_s: float,
    coded_tol_ns: int,
) -> StreamedWindow:
    """Reduce the probes of one sync window (the simulator's steps, or their batches: see
    `window_batches`) onto ``edges``. ``max_exchanges``: an upper bound per edge on its
    exchanges in the window (sets the lowest-RTT cap). Raises ValueError on a probe of a pair
    outside ``edges``."""
    m = len(edges)
    keys = edges[:, 0] * n_nodes + edges[:, 1]
    cap = rtt_cap(max_exchanges)
    summ: Summary | None = None
    sub, plain = NtpCells.empty(m * N_SUB), NtpCells.empty(m)
    probes = 0
    for st in steps:  # with `window_batches` nothing else holds it: freed once reduced
        b = st.batch if isinstance(st, SimStep) else st
        del st
        part, sub_part, plain_part, n = _reduce_step(b, edges, keys, cap, n_nodes, t_ref, window_s,
                                                     coded_tol_ns)  # fmt: skip
        del b
        probes += n
        summ = part if summ is None else merge(summ, part)
        sub, plain = sub.merge(sub_part), plain.merge(plain_part)
        del part, sub_part, plain_part
        release_free_heap()  # the step's and the merge's freed temporaries
    if summ is None:
        raise ValueError("no probes in the window")
    return StreamedWindow(summ, sub, plain, probes)
