"""The second stage of a large fleet's clock work: edge owners between the workers and the
solver.

An edge (i, j) is probed from both ends, and the two ends' batches go to different workers;
its kept pairs meet where the edge is owned. At 100,000 NICs x 32 peers the work per pair
(folding each window's kept pairs into the selection, and reducing a solve window's rows to
hulls and lowest-RTT exchanges) is ~56 % of the clock work of a solve window and needs no
other edge (docs/architecture.md, "The fleet seam"), so it can run on as many cores as there
are owners, each owning the edges whose lower NIC lies in its range:

- a worker splits each window's clock part by owner (`split_clock`);
- an owner (`EdgeStage`) folds the parts it gets (`controller.clocksync.ClockSync.add_pairs`,
  the warm-up bins where the solver has them: ``first_stamp``) and, when the solver asks for a
  solve window (its start and reference instant, on the grid), reduces its rows to a
  `sync.summary.Summary` block (`controller.clocksolve.window_summary`);
- the solver lays the blocks end to end in owner order (`join`) and solves the whole
  (`controller.clocksolve.solve_summary`, `state_of`).

The joined summary is the summary one process holding every row makes (a window's summary is
per edge, and edges sorted by (lower, upper) NIC are the owners' blocks in order):
tests/test_fleet_edges.py checks it. Pure: arrays in, values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.clocksolve import ClockSyncConfig, SampleRows, window_summary
from controller.clocksync import ClockSync
from sync.summary import Summary

I64 = npt.NDArray[np.int64]


def owner_bounds(n_nics: int, owners: int) -> I64:
    """Return ``owners + 1`` bounds: owner k holds edges whose lower NIC is in
    [bounds[k], bounds[k + 1]). Raises ValueError unless 1 <= owners <= n_nics."""
    if not 1 <= owners <= n_nics:
        raise ValueError(f"need 1 to {n_nics} edge owners, got {owners}")
    return np.linspace(0, n_nics, owners + 1).round().astype(np.int64)


def split_clock(part: SampleRows, bounds: I64) -> list[SampleRows]:
    """Return ``part``'s rows by owner of their edge (both probes of a pair share an edge,
    so pairs stay whole and in order)."""
    lo = np.minimum(part.src, part.dst)
    owner = np.searchsorted(bounds, lo, side="right") - 1
    return [part.take(np.flatnonzero(owner == k)) for k in range(len(bounds) - 1)]


class EdgeStage:
    """One edge owner: the kept pairs of its edges from every worker, one `Summary` block
    per solve window. ``first_stamp``: the solver's (where the warm-up's bins are)."""

    def __init__(
        self, n_nics: int, config: ClockSyncConfig, first_stamp: int | None = None
    ) -> None:
        self.clock = ClockSync(n_nics, config, first_stamp=first_stamp)

    def add(self, part: SampleRows) -> int:
        """Fold a worker's clock part of this owner's edges; return the pairs that became the
        best of their bin."""
        return self.clock.add_pairs(part) if len(part) else 0

    def summary(self, since_ns: int, t_ref: int, coded_tol_ns: int) -> tuple[Summary | None, int]:
        """Return the summary block of this owner's rows sent from ``since_ns`` on, at
        reference instant ``t_ref`` (None: no rows) and how many rows it reduced."""
        w = self.clock.window(since_ns)
        if w is None:
            return None, 0
        return window_summary(w, t_ref, coded_tol_ns), len(w)


def join(blocks: Sequence[Summary | None]) -> Summary:
    """Lay the owners' blocks end to end, in owner order (their edges are disjoint and
    sorted): the summary of every owner's rows at once. Raises ValueError without a block
    or when the blocks' edges are not in order."""
    parts = [b for b in blocks if b is not None and len(b.edges)]
    if not parts:
        raise ValueError("no summary blocks to join")
    offs = np.cumsum([0] + [len(b.edges) for b in parts])
    edges = np.concatenate([b.edges for b in parts])
    key = edges[:, 0] * (int(edges.max()) + 1) + edges[:, 1]
    if len(key) > 1 and not (np.diff(key) > 0).all():
        raise ValueError("summary blocks' edges are not disjoint and in order")

    def cat(name: str, shift: int = 0) -> npt.NDArray[Any]:
        return np.concatenate(
            [getattr(b, name) + shift * o for b, o in zip(parts, offs, strict=False)]
        )

    # hull groups are 2 edge + direction, exchanges are by edge: shifted by the edges before
    kw: dict[str, Any] = {f: cat(f) for f in ("cap", "clean_t", "clean_d", "all_t", "all_d",
                                               "n_clean", "n_all", "x_rtt", "x_off", "x_mid")}  # fmt: skip
    kw["clean_g"] = cat("clean_g", 2).astype(np.int32)
    kw["all_g"] = cat("all_g", 2).astype(np.int32)
    kw["x_edge"] = cat("x_edge", 1)
    return Summary(edges, **kw)
