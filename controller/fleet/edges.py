"""The second stage of a large fleet's clock work: edge owners between the workers and the
solver.

An edge (i, j) is probed from both ends, and the two ends' batches go to different workers;
its kept pairs meet where the edge is owned. At 100,000 NICs x 32 peers the work per pair
(folding each window's kept pairs into the selection, and reducing a solve window's rows to
hulls and lowest-RTT exchanges) is ~56 % of the clock work of a solve window and needs no
other edge (docs/architecture.md, "The fleet seam"), so it can run on as many cores as there
are owners, each owning the edges whose lower NIC lies in its range
(``FleetConfig.edge_owners`` of them, `owner_bounds`):

- a worker's partial is split by owner (`split_partial`: each owner's `EdgeInput` holds the
  clock rows of its edges, the clocks the worker found moved and where the worker's whole
  clock part starts, so every owner places the warm-up bins where one process does);
- an owner (`EdgeStage`) takes every worker's input of a window at once (`EdgeStage.add`: the
  moves marked, the rows folded in `fold_order`, the order that does not depend on which
  worker sent what), installs the solver's clock states (`EdgeStage.install`: what they
  re-solved after a move), and at a solve window (`solve_due`: a cadence on the grid every
  owner and the solver compute alike) reduces its rows sent from the window's cut on
  (`solve_cut`) to a `SummaryBlock` (`EdgeStage.block`: the `sync.summary.Summary` of its
  edges, its rows' span, and its edges' floor raises);
- the solver solves the window in rounds with the owners (`solve_blocks`:
  `controller.clocksolve.solve_edge_ranges`, `state_of`): each owner runs the per-edge
  stages on its block (`EdgeStage.stages`, a `sync.edgestage.EdgeRange`: pair fits,
  bad-stamp rounds, candidates, residuals, lowest values) with the node vectors the solver
  sends, and returns small per-edge arrays; the solver runs the network stages on them laid
  end to end. No block of rows is joined (`join` stays, for a check and for tools).

The blocks laid end to end are the summary one process holding every row makes (a window's
summary is per edge, and edges sorted by (lower, upper) NIC are the owners' blocks in order),
and the staged solve of the blocks is `sync_summary` of that summary, to the bit. Two things
an owner computes on its own rows (the floor raises' time bins, `edge_raises`; a moved clock's
"enough data since" against its latest stamp) depend on which rows it holds, so solves agree to
the bit between processes with the same number of owners (tests/test_fleet_equivalence.py,
tests/test_fleet_edges.py), and to within those between different numbers. A window with a
software-stamped row is not summarized (`EdgeStage.block` counts it; the solve waits).
`SummaryBlock.encode`/`decode`: the fleet's one columnar frame (`controller.fleet.codec`).
Pure: arrays in, values out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.clockfloors import WINNER_RANK, edge_raises, node_bounds, split_raise
from controller.clocksolve import (
    ClockState,
    ClockSyncConfig,
    SampleRows,
    fit_params,
    solve_edge_ranges,
    state_of,
    window_summary,
)
from controller.clocksync import ClockSync
from controller.fleet.codec import CodecError, pack, unpack
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import MovedClocks, Partial
from sync.edgestage import EdgeRange, RangeStages
from sync.summary import Summary

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

BLOCK_MAGIC = b"QPSB"
BLOCK_VERSION = 1


class BlockError(CodecError):
    """A payload that is not a summary block this version reads (the reason in one line)."""


def owner_bounds(n_nics: int, owners: int) -> I64:
    """Return ``owners + 1`` bounds: owner k holds edges whose lower NIC is in
    [bounds[k], bounds[k + 1]), about as many edges each where peers are spread evenly (the
    lower end of an edge between two NICs taken at random lies at x of the NICs with density
    2 (1 - x): the bounds are its quantiles). Raises ValueError unless 1 <= owners <=
    n_nics."""
    if not 1 <= owners <= n_nics:
        raise ValueError(f"need 1 to {n_nics} edge owners, got {owners}")
    q = 1.0 - np.sqrt(1.0 - np.linspace(0.0, 1.0, owners + 1))
    b = np.round(q * n_nics).astype(np.int64)
    for k in range(1, owners):  # every owner at least one NIC
        b[k] = min(max(b[k], b[k - 1] + 1), n_nics - (owners - k))
    return b


def split_clock(part: SampleRows, bounds: I64) -> list[SampleRows]:
    """Return ``part``'s rows by owner of their edge (both probes of a pair share an edge,
    so pairs stay whole and in order)."""
    lo = np.minimum(part.src, part.dst)
    owner = np.searchsorted(bounds, lo, side="right") - 1
    return [part.take(np.flatnonzero(owner == k)) for k in range(len(bounds) - 1)]


def fold_order(parts: Sequence[SampleRows]) -> SampleRows | None:
    """Return the rows of a window's clock parts in the order they are folded whatever the
    split: coded pairs sorted by (src, dst, first send), uncoded rows after (None: no rows)."""
    clocks = [p for p in parts if len(p)]
    if not clocks:
        return None
    every = SampleRows.concat(clocks)
    cols = every.cols()
    coded = np.flatnonzero(cols["pair"] >= 0)
    first = coded[0::2]
    order = np.lexsort((cols["t1"][first], cols["dst"][first], cols["src"][first]))
    rows = np.stack([first[order], first[order] + 1], axis=1).reshape(-1)
    loose = np.flatnonzero(cols["pair"] < 0)
    if len(loose):
        lo = np.lexsort((cols["t1"][loose], cols["dst"][loose], cols["src"][loose]))
        rows = np.concatenate([rows, loose[lo]])
    return every.take(rows)


def first_send(part: SampleRows) -> int | None:
    """Return the earliest send stamp of ``part``'s coded pairs (where a clock that folds
    it first puts its warm-up bins; None: no coded pair)."""
    coded = part.pair >= 0
    return int(part.t1[coded].min()) if coded.any() else None


@dataclass(frozen=True, eq=False)
class EdgeInput:
    """One worker's share of one window for one owner: the clock ``rows`` of the owner's
    edges, the clocks the worker found moved (``moved``, every owner gets them) and the
    earliest send of the worker's whole clock part (``first``: None without a coded pair)."""

    window: int
    worker: str
    rows: SampleRows
    moved: MovedClocks
    first: int | None


def split_partial(p: Partial, bounds: I64) -> list[EdgeInput]:
    """Return ``p``'s input for each owner of ``bounds`` (an empty one where it holds none
    of the owner's edges: the owner knows the window is complete)."""
    first = first_send(p.clock)
    return [EdgeInput(p.window, p.worker, rows, p.moved, first)
            for rows in split_clock(p.clock, bounds)]  # fmt: skip


def solve_due(k: int, first_window: int, grid: WindowGrid, config: ClockSyncConfig) -> bool:
    """Return True when window ``k`` ends with a clock solve, counted from
    ``first_window``, the first window with clock rows: every ``solve_every_ns`` on the grid,
    and while the data span is shorter than the clock window each time it doubles (1, 2, 4,
    ... windows), as `controller.clocksync.ClockSync.due` does on its own clock."""
    j = k - first_window
    if j < 0:
        return False
    if (j + 1) * grid.width_ns < config.window_ns and (j + 1) & j == 0:
        return True
    return k % max(1, config.solve_every_ns // grid.width_ns) == 0


def solve_cut(
    k: int, first_stamp: int, grid: WindowGrid, config: ClockSyncConfig
) -> tuple[int, int]:
    """Return (since, t_ref) of window ``k``'s solve: the rows sent from ``since`` on (the
    clock window before the window's end, not before the first stamp), reduced at the middle
    of that span."""
    end = grid.end(k)
    since = max(end - config.window_ns, first_stamp)
    return since, since + max(0, end - since) // 2


@dataclass(frozen=True, eq=False)
class SummaryBlock:
    """One owner's reduction of a solve window: ``summary`` of its rows (None: none, or
    some software-stamped: ``sw``), how many ``rows``, their send span (``t_lo``,
    ``t_hi``), and its edges' floor raises (``raise_edges`` (m, 2), ``raised`` ns:
    `controller.clockfloors.edge_raises`)."""

    owner: int
    window: int
    rows: int
    t_lo: int
    t_hi: int
    sw: bool
    summary: Summary | None
    raise_edges: I64
    raised: F64

    def encode(self, *, compress: bool = True) -> bytes:
        """Return the block as bytes (`decode` reads them back to an equal block)."""
        head = {"owner": self.owner, "window": self.window, "rows": self.rows,
                "t_lo": self.t_lo, "t_hi": self.t_hi, "sw": self.sw,
                "summary": self.summary is not None}  # fmt: skip
        cols: dict[str, npt.NDArray[Any]] = {"raise_edges": self.raise_edges,
                                             "raised": self.raised}  # fmt: skip
        if self.summary is not None:
            for f in dataclasses.fields(Summary):
                cols[f"s.{f.name}"] = getattr(self.summary, f.name)
        return pack(BLOCK_MAGIC, BLOCK_VERSION, head, cols, compress=compress)

    @classmethod
    def decode(cls, data: bytes) -> SummaryBlock:
        """Return the block of ``data``. Raises `BlockError` (one line) on any payload that
        is not a well-formed block of a version this code reads."""
        try:
            _, head, cols = unpack(data, BLOCK_MAGIC, frozenset({BLOCK_VERSION}))
        except CodecError as exc:
            raise BlockError(str(exc)) from None
        ints: dict[str, int] = {}
        for k in ("owner", "window", "rows", "t_lo", "t_hi"):
            v = head.get(k)
            if not isinstance(v, int) or isinstance(v, bool):
                raise BlockError(f"head field {k!r} is missing or not an integer")
            ints[k] = v
        if not isinstance(head.get("sw"), bool) or not isinstance(head.get("summary"), bool):
            raise BlockError("head fields sw and summary must be booleans")
        edges = _col(cols, "raise_edges", "<i8", 2)
        raised = _col(cols, "raised", "<f8", 1)
        if edges.shape[1:] != (2,) or len(edges) != len(raised):
            raise BlockError("raise_edges must be (m, 2) beside m raises")
        summary = None
        if head["summary"]:
            kw = {}
            for f in dataclasses.fields(Summary):
                a = cols.pop(f"s.{f.name}", None)
                if a is None:
                    raise BlockError(f"column s.{f.name} is missing")
                kw[f.name] = a
            try:
                summary = Summary(**kw)
            except (TypeError, ValueError) as exc:
                raise BlockError(f"bad summary ({exc})") from None
        if cols:
            raise BlockError(f"unknown column {sorted(cols)[0]}")
        return cls(ints["owner"], ints["window"], ints["rows"], ints["t_lo"], ints["t_hi"],
                   head["sw"], summary, edges, raised)  # fmt: skip


def _col(cols: dict[str, npt.NDArray[Any]], name: str, dt: str, ndim: int) -> npt.NDArray[Any]:
    a = cols.pop(name, None)
    if a is None or a.dtype.str != dt or a.ndim != ndim:
        raise BlockError(f"column {name} missing or not {dt} {ndim}-d")
    return a


class EdgeStage:
    """One edge owner (``owner`` of the fleet's): every worker's kept pairs of its edges, one
    `SummaryBlock` per solve window (module docstring). Not thread-safe."""

    def __init__(
        self, n_nics: int, config: ClockSyncConfig, owner: int = 0, first_stamp: int | None = None
    ) -> None:
        """``first_stamp``: the fleet's first coded send when known already (an owner that
        replays a stream no longer holding it: the solver's published state has it), where
        the warm-up bins are; None: the first window with clock rows sets it."""
        self.n_nics, self.config, self.owner = n_nics, config, owner
        self._seed = first_stamp
        self.clock: ClockSync | None = None  # made at the first window with clock rows
        self.first_window: int | None = None
        self._moves: list[MovedClocks] = []  # moves before the clock was made
        self.sw_windows = 0  # solve windows not summarized: a software-stamped row

    @property
    def first_stamp(self) -> int | None:
        """Return where the warm-up bins are (the fleet's first coded send; None: not yet)."""
        return None if self.clock is None else self.clock.first_stamp

    def add(self, inputs: Sequence[EdgeInput]) -> int:
        """Take every worker's input of one window (windows in order): their moves marked,
        their rows folded at once in `fold_order`. Return the pairs that became the best of
        their bin. Raises ValueError on inputs of different windows."""
        if len({i.window for i in inputs}) > 1:
            raise ValueError("inputs of one window at a time")
        ordered = sorted(inputs, key=lambda i: i.worker)
        firsts = [i.first for i in ordered if i.first is not None]
        if self.clock is None and firsts:
            t0 = min(firsts) if self._seed is None else self._seed
            self.clock = ClockSync(self.n_nics, self.config, first_stamp=t0,
                                   floor_rank=WINNER_RANK)  # fmt: skip
            self.first_window = ordered[0].window
        self._moves += [i.moved for i in ordered if len(i.moved)]
        if self.clock is None:
            return 0
        for m in self._moves:
            self.clock.note_moves(m.nic, m.since)
        self._moves = []
        rows = fold_order([i.rows for i in ordered])
        return self.clock.add_pairs(rows) if rows is not None else 0

    def install(self, state: ClockState | None) -> None:
        """Install a state the solver solved (the clocks it re-solved after a move)."""
        if self.clock is not None:
            self.clock.install(state)

    def block(self, window: int, since_ns: int, t_ref: int) -> SummaryBlock:
        """Return the block of this owner's rows sent from ``since_ns`` on, reduced at
        ``t_ref`` (`solve_cut`)."""
        none = SummaryBlock(self.owner, window, 0, 0, 0, False, None,
                            np.zeros((0, 2), np.int64), np.zeros(0))  # fmt: skip
        w = None if self.clock is None else self.clock.window(since_ns)
        if w is None:
            return none
        t_lo, t_hi = int(w.t1.min()), int(w.t1.max())
        if w.sw.any():
            self.sw_windows += 1
            return dataclasses.replace(none, rows=len(w), t_lo=t_lo, t_hi=t_hi, sw=True)
        s = window_summary(w, t_ref, self.config.coded_tol_hw_ns)
        e, raised = np.zeros((0, 2), np.int64), np.zeros(0)
        if w.floor is not None:
            rtt = ((w.t4 - w.t1) - (w.t3 - w.t2)).astype(np.float64)
            e, raised = edge_raises(self.n_nics, w.src.astype(np.int64),
                                    w.dst.astype(np.int64), rtt, w.floor, w.t1)  # fmt: skip
        return SummaryBlock(self.owner, window, len(w), t_lo, t_hi, False, s, e, raised)

    def stages(self, block: SummaryBlock) -> RangeStages | None:
        """Return the per-edge stages of this owner's ``block`` (`sync.edgestage.EdgeRange`
        on its summary), which the solver's rounds call (`solve_blocks`); None: no summary
        or no edge."""
        return edge_ranges([block], self.config)[0]


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


def edge_ranges(
    blocks: Sequence[SummaryBlock], config: ClockSyncConfig
) -> list[RangeStages | None]:
    """Return per block (same order) the per-edge stages of its summary
    (`sync.edgestage.EdgeRange`: what its owner runs in the rounds of `solve_blocks`; None:
    a block without a summary or edges)."""
    return [None if b.summary is None or not len(b.summary.edges)
            else EdgeRange(b.summary, fit_params(config)) for b in blocks]  # fmt: skip


def solve_blocks(
    blocks: Sequence[SummaryBlock],
    n_nics: int,
    config: ClockSyncConfig,
    t_ref: int,
    now_ns: int,
    *,
    leaf: I64 | None = None,
    moved_since: I64 | None = None,
    ranges: Sequence[RangeStages | None] | None = None,
) -> ClockState | None:
    """Return the clock state of a solve window from every owner's block, reduced at
    ``t_ref``, as `controller.clocksolve.compute_state` makes it from the rows
    (``moved_since``: the solver's moved clocks, kept in the state). The blocks' summaries
    are not joined: each owner's per-edge stages (``ranges``, one per block, its owner's
    `EdgeStage.stages`; by default made here from the blocks, `edge_ranges`) run in rounds
    with the solver's network stages (`controller.clocksolve.solve_edge_ranges`), and the
    result is the whole window's to the bit. None: fewer than two rows, a software-stamped
    row, or no pair could be fitted. Raises ValueError when the blocks' edges are not
    disjoint and in owner order."""
    rows = sum(b.rows for b in blocks)
    if rows < 2 or any(b.sw for b in blocks):
        return None
    if ranges is None:
        ranges = edge_ranges(blocks, config)
    if len(ranges) != len(blocks):
        raise ValueError("one edge range per block")
    by_owner = sorted(range(len(blocks)), key=lambda i: blocks[i].owner)
    ordered = [blocks[i] for i in by_owner]
    stages = [r for i in by_owner if (r := ranges[i]) is not None]
    if not stages:
        raise ValueError("no summary blocks to solve")
    _check_order([r.edges for r in stages])
    ws = solve_edge_ranges(stages, n_nics, leaf)
    points = sum(b.summary.n_points for b in ordered if b.summary is not None)
    e = np.concatenate([b.raise_edges for b in ordered])
    raised = np.concatenate([b.raised for b in ordered])
    bounds = (None, None) if not len(e) else (node_bounds(n_nics, e, 0.5 * raised),
                                              split_raise(n_nics, e, raised))  # fmt: skip
    span = (min(b.t_lo for b in blocks if b.rows), max(b.t_hi for b in blocks if b.rows))
    state = state_of(ws, t_ref, now_ns, n_samples=rows, span=span, points=points,
                     bounds=bounds)  # fmt: skip
    return None if state is None else dataclasses.replace(state, moved_since=moved_since)


def _check_order(parts: Sequence[I64]) -> None:
    """Raise ValueError unless the ranges' edges, laid end to end, are sorted and distinct
    (the owners' blocks of one window, in owner order)."""
    edges = np.concatenate(parts)
    key = edges[:, 0] * (int(edges.max(initial=0)) + 1) + edges[:, 1]
    if len(key) > 1 and not (np.diff(key) > 0).all():
        raise ValueError("summary blocks' edges are not disjoint and in order")
