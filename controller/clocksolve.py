"""The pure clock solve of the controller: one window of kept probe rows -> per-NIC clock models.

The estimator is the one the sync benchmark measures (`qpmesh sim sync`, docs/benchmarks.md),
with the same two drivers, chosen by how the records were stamped (`contract.records`: each
batch says ``hw``, ``sw`` or ``sim``; the prober says ``hw`` only when every NIC of its host
stamps in hardware):

* **hardware stamps** (``hw``; ``sim`` too): the rows are oriented onto edges with the
  hardware coded-pair tolerance and reduced, block of edges by block, into one bounded
  `sync.summary.Summary` (`reduce_chunk`: lower hulls per direction, lowest-RTT exchanges),
  then `sync.summarysolve.sync_summary` (pair fits on the hulls, drifts from the envelopes
  and the lowest-RTT lines, the correction for the queueing left in the best samples);
* **software stamps** (any ``sw`` row in the window): `sync.window.sync_window` on the oriented
  rows (the per-direction lowest-fraction means need every sample), candidates scored with
  the bias bound as for hardware stamps (`sync.window.sync_window`).

A software-stamped window also says how far each NIC's model sits from the window's newest rows
(`recent_errors`): a host whose kernel stamps one way slower for a few seconds (a busy receive
path) shifts its apparent offset, which two-way probes cannot tell from a drifting clock, so
the fit takes it as drift and states the drift it fits; extrapolated seconds past the window,
the model is off by far more than stated (docs/controller.md, "Clock trust").

`compute_state` is pure and safe in a worker thread (`controller.clocksync.ClockSync` hands
out the window with `start_solve` and adopts the result with `install`).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from controller.clockfloors import edge_raises, node_bounds, split_raise
from sync import ClockModels
from sync.edgestage import FitParams, RangeStages
from sync.steps import cell_medians
from sync.summary import Summary, reduce_chunk, rtt_cap
from sync.summarysolve import solve_ranges, sync_summary
from sync.window import (
    WindowSync,
    drift_std_per_node,
    orient_samples,
    sync_window,
)

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
I32 = NDArray[np.int32]
BLOCK_ROWS = 1 << 17  # rows reduced at a time into the summary (bounds the sort temporaries)


@dataclass(frozen=True)
class ClockSyncConfig:
    """Window and solve cadence (ns), coded-pair tolerances, bins per window, ring bound (rows).

    The default solves once per window (10 s), so each sample is solved once: the solve's cost
    is amortized over every probe of the window. An owner that reports each solve's cost
    (the service: the CPU time of the thread that ran it, `timed_solve`) gets solves as often
    as ``solve_budget`` of a core allows, down to ``min_solve_every_ns``: on a small fabric a
    solve takes milliseconds, and a model extrapolated 2 s instead of 10-15 s stays within the
    clock-trust bounds (docs/controller.md, "Clock trust"); at 10,000 NICs it stays once per
    window. Until the first window is full, a solve is also due whenever the data span has
    doubled since the last one (warm-up: a model from the first 0.1 s would otherwise be
    extrapolated for a whole window). ``coded_tol_ns`` is the
    coded-pair tolerance of software stamps, ``coded_tol_hw_ns`` of hardware stamps (both as
    `qpmesh sim sync` uses them); ``quant_hw_ns`` is the hardware stamp resolution the pair
    fits allow for (6.4 ns: the simulator's NIC clock tick)."""

    window_ns: int = 10_000_000_000
    solve_every_ns: int = 10_000_000_000
    # when the owner reports what solves cost (`ClockSync.install(cost_ns=)`), solve as often
    # as solve_budget of one core allows, but not more often than min_solve_every_ns
    min_solve_every_ns: int = 2_000_000_000
    solve_budget: float = 0.05
    coded_tol_ns: int = 2_000
    coded_tol_hw_ns: int = 25
    quant_hw_ns: float = 6.4
    use_uncoded: bool = False  # also keep probes that are not part of a coded pair (all of them)
    capacity: int = 4_000_000  # rows kept at most (oldest batches dropped first)
    min_samples: int = 3
    bins: int = 4  # time bins per window; per bin and directed pair one coded pair is kept
    min_coded: int = 8  # thin-edge fallback (`orient_samples`, `sync_summary`)
    refine: bool = True  # second stage of `sync_window` (software stamps)
    warmup_bins: int = 8  # the first bin after start is split in this many (drift observable)
    max_unc_ns: float = 1000.0  # delays less certain than this are not judged finely
    # ... and delays less certain than this are withheld (between the two: coarse delays,
    # judged against the slow tier's 4 us floor only: docs/controller.md "Clock trust")
    coarse_unc_ns: float = 2000.0
    min_span_ns: int = 1_000_000_000  # a solve over less data cannot see drift: not trusted
    floor_epochs: int = 6  # windows a directed pair's round-trip floor is remembered over

    def __post_init__(self) -> None:
        if self.window_ns <= 0 or self.solve_every_ns <= 0 or self.capacity < 16:
            raise ValueError("window and solve period must be > 0 and capacity >= 16")
        if self.min_solve_every_ns <= 0 or not 0 < self.solve_budget <= 1:
            raise ValueError("min_solve_every must be > 0 and solve_budget in (0, 1]")
        if self.coded_tol_ns < 0 or self.coded_tol_hw_ns < 0 or not self.quant_hw_ns >= 0:
            raise ValueError("coded-pair tolerances and quant_hw_ns must be >= 0")
        if self.bins < 1 or self.warmup_bins < 1:
            raise ValueError("bins and warmup_bins must be >= 1")
        if not self.max_unc_ns > 0 or self.min_span_ns < 0:
            raise ValueError("max_unc_ns must be > 0 and min_span_ns >= 0")
        if not self.coarse_unc_ns >= self.max_unc_ns:
            raise ValueError("coarse_unc_ns must be >= max_unc_ns")
        if self.floor_epochs < 1:
            raise ValueError("floor_epochs must be >= 1")

    @property
    def bin_ns(self) -> int:
        """The length of a selection bin (``window_ns / bins``, at least 1 ns)."""
        return max(1, self.window_ns // self.bins)


@dataclass(frozen=True, eq=False)
class ClockState:
    """Per-NIC clock models from one solve (`sync.ClockModels`, unknown NICs NaN)."""

    models: ClockModels
    center_ns: float  # middle of the solved window, relative to models.t_ref_ns
    solved_at_ns: int
    n_pairs: int
    n_samples: int = 0
    estimator: str = ""
    span_ns: int = 0  # time covered by the solved samples (initiator clocks)
    end_ns: int = 0  # latest send stamp of the solved samples (initiator clocks)
    summary_points: int = 0  # size of the hw summary the solve read (0: sw driver)
    # NICs whose clocks stepped inside the window (unknown) and when (initiator clocks, ns)
    stepped: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    step_at_ns: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    # per NIC: the bound on its offset error from its paths' raised floors (in offset_std)
    # and its share of the raised floors (NaN: no remembered floor)
    bound_ns: F64 | None = None
    queued_ns: F64 | None = None
    moved_since: I64 | None = None  # the window's (`SampleWindow.moved_since`)
    # per NIC how far its model sits from the window's newest rows (`recent_errors`; NaN:
    # too few of them; None: a hardware-stamped window, not measured), and the middle of
    # those rows (initiator clocks)
    recent_ns: F64 | None = None
    recent_at_ns: int = 0

    @property
    def t_ref_ns(self) -> int:
        """Reference instant of the models (middle of the solved window, initiator clocks)."""
        return self.models.t_ref_ns


SAMPLE_COLUMNS: dict[str, str] = {
    "src": "<i4", "dst": "<i4", "pair": "<i8", "t1": "<i8", "t2": "<i8", "t3": "<i8",
    "t4": "<i8", "sw": "|b1",
}  # fmt: skip
"""The columns of `SampleRows` and their dtypes (numpy's ``dtype.str``)."""


@dataclass(frozen=True, eq=False)
class SampleRows:
    """Raw probe rows for the clock solve, all arrived: both probes of each kept coded pair
    on adjacent rows (the earlier send first); ``pair`` -1: an uncoded probe kept as it is;
    ``sw`` marks rows from software-stamped batches. One shape wherever kept rows travel: a
    fleet worker's window selection in its partial (`controller.fleet.partial.Partial.clock`,
    encoded column by column with `SAMPLE_COLUMNS`), what `controller.clocksync.ClockSync`
    folds (`add_pairs`) and, with the solver's extras, a window to solve (`SampleWindow`)."""

    src: I32
    dst: I32
    pair: I64
    t1: I64
    t2: I64
    t3: I64
    t4: I64
    sw: NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.src)

    def cols(self) -> dict[str, NDArray[Any]]:
        """Return the eight columns by name (those of `SAMPLE_COLUMNS`, in its order)."""
        return {k: getattr(self, k) for k in SAMPLE_COLUMNS}

    def rows(self) -> SampleRows:
        """Return the eight columns alone (a `SampleWindow` less its extras)."""
        return SampleRows(**self.cols())

    def take(self, rows: I64) -> SampleRows:
        """Return rows ``rows`` (indices, in that order)."""
        return SampleRows(**{k: np.take(v, rows) for k, v in self.cols().items()})

    @classmethod
    def of(cls, cols: Mapping[str, Any]) -> SampleRows:
        """Return the rows of ``cols`` (array-likes named as `SAMPLE_COLUMNS`), each in its
        dtype. Raises ValueError on a column missing or of another length."""
        missing = [k for k in SAMPLE_COLUMNS if k not in cols]
        if missing:
            raise ValueError(f"sample rows need column {missing[0]}")
        out = {k: np.asarray(cols[k], np.dtype(dt)) for k, dt in SAMPLE_COLUMNS.items()}
        if len({len(v) for v in out.values()}) > 1:
            raise ValueError("sample columns of unequal lengths")
        return cls(**out)

    @classmethod
    def empty(cls) -> SampleRows:
        """Return no rows."""
        return cls.of({k: () for k in SAMPLE_COLUMNS})

    @classmethod
    def concat(cls, parts: Sequence[SampleRows]) -> SampleRows:
        """Return ``parts`` one after another (`empty` for none)."""
        if not parts:
            return cls.empty()
        return cls.of({k: np.concatenate([getattr(p, k) for p in parts]) for k in SAMPLE_COLUMNS})


@dataclass(frozen=True, eq=False)
class SampleWindow(SampleRows):
    """The rows of one window to solve (`SampleRows`) and what the solve needs beside
    them."""

    floor: F64 | None = None  # per row its directed pair's remembered round-trip floor
    # per NIC since when its clock moved (-1: it did not), as the window left out its rows
    # from before then (`controller.clocksync.ClockSync.window`)
    moved_since: I64 | None = None


def window_summary(
    w: SampleWindow, t_ref: int, coded_tol_ns: int, block_rows: int = BLOCK_ROWS
) -> Summary:
    """The rows of ``w`` oriented onto their edges (coded filter at ``coded_tol_ns``, the thin
    fallback left to `sync_summary`) and reduced into one `Summary`. Edges are independent in
    a summary, so the rows are reduced block by block of edges (by the lower NIC of the edge,
    about ``block_rows`` rows a block) and the blocks' summaries laid end to end: the summary
    of the window held at once, with no merge and no temporary that grows with the window.
    Every edge keeps as many lowest-RTT exchanges as the largest lowest-RTT fraction of its
    exchanges needs. Raises ValueError on an empty window."""
    n = len(w)
    if not n:
        raise ValueError("no rows to summarize")
    src, dst = w.src.astype(np.int64), w.dst.astype(np.int64)
    big = int(max(src.max(), dst.max())) + 1  # as `orient_samples` keys its edges
    lo = np.minimum(src, dst)
    keys, per = np.unique(lo * big + np.maximum(src, dst), return_counts=True)
    del src, dst
    edges = np.stack([keys // big, keys % big], axis=1)
    cap = rtt_cap(per)
    # blocks of NICs (edges sorted by their lower NIC), about block_rows rows each; rows in
    # arrival order within a block (ties between exchanges are kept in arrival order)
    order = np.argsort(lo, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(lo, minlength=big))])
    cuts = np.searchsorted(starts, np.arange(block_rows, n, block_rows))
    bounds = np.unique(np.concatenate([[0], cuts, [big]]))
    del lo
    parts: list[Summary] = []
    # every block's summary counts over all the window's edge directions: added up as the
    # blocks come and dropped from them (held per block: ~10 GB at 100,000 NICs x 32 peers)
    n_clean = np.zeros(2 * len(edges), np.int64)
    n_all = np.zeros(2 * len(edges), np.int64)
    none = np.zeros(0, np.int64)
    for a, b in itertools.pairwise(bounds):
        r = order[starts[a] : starts[b]]
        if not len(r):
            continue
        smp = orient_samples(
            w.src[r], w.dst[r], w.pair[r], w.t1[r], w.t2[r], w.t3[r], w.t4[r],
            np.zeros(len(r), bool), t_ref, coded_tol_ns=coded_tol_ns, min_coded=0,
        )  # fmt: skip
        local = smp.edges[:, 0] * big + smp.edges[:, 1]
        part = reduce_chunk(smp, np.searchsorted(keys, local), edges, cap)
        n_clean += part.n_clean
        n_all += part.n_all
        parts.append(dataclasses.replace(part, n_clean=none, n_all=none))
        del smp, r, part
    return _laid_end_to_end(parts, n_clean, n_all)


_POINT_FIELDS = (
    "clean_g", "clean_t", "clean_d", "all_g", "all_t", "all_d", "x_edge", "x_rtt", "x_off", "x_mid",
)  # fmt: skip


def _laid_end_to_end(parts: list[Summary], n_clean: I64, n_all: I64) -> Summary:
    """The summary of disjoint blocks of edges, each block's edges after the previous', with
    the window's counts ``n_clean``/``n_all`` (the blocks' summed).

    Empties ``parts`` and joins one field at a time, letting go of each field's pieces once
    joined, so the join holds the blocks plus one joined field, never the blocks twice."""
    edges, cap = parts[0].edges, parts[0].cap
    pieces = {f: [getattr(p, f) for p in parts] for f in _POINT_FIELDS}
    parts.clear()
    joined = {f: np.concatenate(pieces.pop(f)) for f in _POINT_FIELDS}
    return Summary(edges, cap, n_clean=n_clean, n_all=n_all, **joined)


def solve_window(
    w: SampleWindow, n_nics: int, config: ClockSyncConfig, t_ref: int, leaf: I64 | None = None
) -> tuple[WindowSync, int]:
    """The estimator on one window at ``t_ref`` (module docstring: hw summary driver unless a
    row is software-stamped); returns (result, summary points read, 0 for the sw driver).
    ``leaf``: per NIC its leaf's index, for the summary driver's leaf split of the queueing
    (`sync.excess.split_excess`); None: the receive part alone."""
    if w.sw.any():
        samples = orient_samples(
            w.src, w.dst, w.pair, w.t1, w.t2, w.t3, w.t4, np.zeros(len(w), bool), t_ref,
            coded_tol_ns=config.coded_tol_ns, min_coded=config.min_coded,
        )  # fmt: skip
        ws = sync_window(
            n_nics, samples, min_samples=config.min_samples, refine=config.refine
        )  # fmt: skip
        return ws, 0
    s = window_summary(w, t_ref, config.coded_tol_hw_ns)
    return solve_summary(s, n_nics, config, leaf), s.n_points


def solve_summary(
    s: Summary, n_nics: int, config: ClockSyncConfig, leaf: I64 | None = None
) -> WindowSync:
    """The hardware-stamp estimator on a window's summary (`sync.summarysolve.sync_summary`
    with the config's quantization and thresholds); ``leaf`` as in `solve_window`. A fleet
    whose edge owners summarize their edges solves the summary they lay end to end here."""
    return sync_summary(
        n_nics, s, quant_ns=config.quant_hw_ns, min_samples=config.min_samples,
        min_coded=config.min_coded, leaf=leaf,
    )  # fmt: skip


def fit_params(config: ClockSyncConfig) -> FitParams:
    """The pair fits' parameters of the hardware-stamp estimator (`solve_summary`)."""
    return FitParams(config.quant_hw_ns, config.min_samples, config.min_coded)


def solve_edge_ranges(
    ranges: Sequence[RangeStages], n_nics: int, leaf: I64 | None = None
) -> WindowSync:
    """`solve_summary` of the window whose edges are the ``ranges``' laid end to end (each a
    `sync.edgestage.EdgeRange` made with `fit_params`, which carries the config's part, or a
    stand-in for one an edge owner holds): `sync.summarysolve.solve_ranges`, the same to the
    bit. Raises ValueError as `solve_ranges`."""
    return solve_ranges(n_nics, ranges, leaf=leaf)


def compute_state(
    w: SampleWindow, n_nics: int, config: ClockSyncConfig, now_ns: int, leaf: I64 | None = None
) -> ClockState | None:
    """Pure solve of one window (`solve_window`, ``leaf`` as there) -> per-NIC `ClockModels`
    at the middle of the window. With the rows' remembered floors (``w.floor``) each NIC's
    offset uncertainty includes the bound its paths' raised floors put on it
    (`controller.clockfloors.node_bounds`): a NIC whose every path queues is no longer
    certain. NICs whose clocks stepped inside the window come back unknown (``stepped``).
    With software stamps, how far each model sits from the window's newest rows
    (`recent_errors` over `recent_span`: ``recent_ns``, ``recent_at_ns``). Returns None when
    no pair could be fitted. Safe to run in a worker thread."""
    if len(w) < 2:
        return None
    t_lo, t_hi = int(w.t1.min()), int(w.t1.max())
    t_ref = t_lo + (t_hi - t_lo) // 2
    ws, points = solve_window(w, n_nics, config, t_ref, leaf)
    state = state_of(
        ws, t_ref, now_ns, n_samples=len(w), span=(t_lo, t_hi), points=points, window=w
    )  # fmt: skip
    if state is None or not bool(w.sw.any()):
        return state
    since = t_hi - recent_span(config, t_hi - t_lo)
    return dataclasses.replace(
        state, recent_ns=recent_errors(state.models, w, since, floor=w.floor),
        recent_at_ns=since + (t_hi - since) // 2,
    )  # fmt: skip


def recent_span(config: ClockSyncConfig, span_ns: int) -> int:
    """How far back from its latest row a window's newest rows go (`recent_errors`): a bin
    (``window_ns / bins``, one kept coded pair per directed pair) once the window spans one,
    a quarter of the window before (the first bin's sub-bins)."""
    return config.bin_ns if span_ns >= config.bin_ns else span_ns // 4


RECENT_MIN_ROWS = 6  # a NIC with fewer newest rows is not read by `recent_errors`
_NO_FLOOR = 1e18  # the excess of a row whose pair has no remembered floor (finite: a sort key)


def recent_errors(
    models: ClockModels, w: SampleRows, since_ns: int, min_rows: int = RECENT_MIN_ROWS,
    floor: F64 | None = None,
) -> F64:  # fmt: skip
    """Per NIC how far its model sits from the rows of ``w`` sent from ``since_ns`` on (its
    newest, initiator clocks): for each row half the difference of its two one-way delays
    under ``models``, which is its initiator's model error less its responder's, give or
    take half the row's queueing asymmetry. A clock error shows in every row of the NIC
    alike, a queue only in the rows that met it: with ``floor`` (per row its directed pair's
    remembered round-trip floor, `SampleWindow.floor`) only the NIC's rows whose round trip
    sits least above its floor are read, the lower half (a leaf whose uplinks queue for
    milliseconds leaves its peers' clean rows). Per NIC the median of those (negated where
    it responded), the common shift (the median over NICs) removed, as a magnitude (ns).
    NaN for a NIC with fewer than ``min_rows`` newest rows or not in ``models``."""
    n = len(models)
    rows = np.flatnonzero(w.t1 >= since_ns)
    if not len(rows):
        return np.full(n, np.nan)
    src, dst = w.src[rows].astype(np.int64), w.dst[rows].astype(np.int64)
    out_f = models.true_rel_ns(w.t2[rows], dst) - models.true_rel_ns(w.t1[rows], src)
    back = models.true_rel_ns(w.t4[rows], src) - models.true_rel_ns(w.t3[rows], dst)
    half = 0.5 * (back - out_f)  # + : the initiator ahead of its model (or the responder behind)
    ok = np.isfinite(half)
    node = np.concatenate([src[ok], dst[ok]])
    val = np.concatenate([half[ok], -half[ok]])
    enough = np.bincount(node, minlength=n) >= min_rows
    if floor is not None:
        rtt = ((w.t4[rows] - w.t1[rows]) - (w.t3[rows] - w.t2[rows])).astype(np.float64)
        ex = rtt - np.asarray(floor, np.float64)[rows]
        ex = np.where(np.isfinite(ex), ex, _NO_FLOOR)[ok]  # no floor: read last
        ex = np.concatenate([ex, ex])
        mid, _ = cell_medians(node, ex, n)
        low = ex <= np.take(mid, node)
        node, val = node[low], val[low]
    med, _ = cell_medians(node, val, n)
    med[~enough] = np.nan
    k = np.isfinite(med)
    if not k.any():
        return med
    out: F64 = np.abs(med - np.median(med[k]))
    return out


def floor_bounds(w: SampleWindow, n_nics: int) -> tuple[F64 | None, F64 | None]:
    """Per NIC the bound its paths' raised floors put on its offset error and its share of
    the raises (`controller.clockfloors.node_bounds`, `split_raise`), from the window's rows
    and their remembered floors (``w.floor``); (None, None) without floors or raises."""
    if w.floor is None:
        return None, None
    rtt = ((w.t4 - w.t1) - (w.t3 - w.t2)).astype(np.float64)
    e, raised = edge_raises(
        n_nics, w.src.astype(np.int64), w.dst.astype(np.int64), rtt, w.floor, w.t1
    )
    if not len(e):
        return None, None
    return node_bounds(n_nics, e, 0.5 * raised), split_raise(n_nics, e, raised)


def state_of(
    ws: WindowSync,
    t_ref: int,
    now_ns: int,
    *,
    n_samples: int,
    span: tuple[int, int],
    points: int = 0,
    window: SampleWindow | None = None,
    bounds: tuple[F64 | None, F64 | None] | None = None,
) -> ClockState | None:
    """The `ClockState` of a window's estimate ``ws`` at reference instant ``t_ref`` (its
    samples: ``n_samples`` rows sent between ``span`` = (first, last) initiator stamps, a
    summary of ``points``); None when no pair could be fitted. ``window``: the rows solved,
    whose remembered floors bound the NICs behind raised ones (`floor_bounds`: the bound
    joins each NIC's offset uncertainty) and whose ``moved_since`` the state keeps. Without
    the rows (a fleet's edge owners summarized them: `controller.fleet.edges`): ``bounds``,
    the (bound, queued) `floor_bounds` gives."""
    n_nics = len(ws.known)
    t_lo, t_hi = span
    fits = ws.fits
    good = fits.ok & np.isfinite(fits.drift_std)
    if not ws.known.any() or not good.any():
        return None
    drift_std = drift_std_per_node(ws, n_nics)
    known = ws.known & np.isfinite(ws.offset_ns) & np.isfinite(ws.drift)
    nan = np.full(n_nics, np.nan)
    bound_ns, queued_ns = (None, None) if window is None else floor_bounds(window, n_nics)
    if bounds is not None:
        bound_ns, queued_ns = bounds
    std = np.maximum(ws.offset_std_ns, 0.0)
    if bound_ns is not None:  # the queueing the paths carry now, against their floors
        std = np.hypot(std, np.nan_to_num(bound_ns, nan=0.0))
    models = ClockModels.build(
        t_ref,
        np.where(known, ws.offset_ns, nan),
        np.where(known, ws.drift, nan),
        np.where(known, std, nan),
        np.where(known, drift_std, nan),
    )
    return ClockState(
        models=models,
        center_ns=0.0,
        solved_at_ns=now_ns,
        n_pairs=int(fits.ok.sum()),
        n_samples=n_samples,
        estimator=ws.estimator,
        span_ns=t_hi - t_lo,
        end_ns=t_hi,
        summary_points=points,
        stepped=ws.stepped,
        step_at_ns=np.rint(ws.step_at_ns).astype(np.int64) + t_ref,
        bound_ns=bound_ns,
        queued_ns=queued_ns,
        moved_since=None if window is None else window.moved_since,
    )


def timed_solve(job: Callable[[], ClockState | None]) -> tuple[ClockState | None, float]:
    """Run a clock solve; return its result and the CPU time (s) of the thread that ran it,
    which is what the solve cost of a core, however busy the machine. Raises what ``job``
    raises."""
    t0 = time.thread_time()
    state = job()
    return state, time.thread_time() - t0
