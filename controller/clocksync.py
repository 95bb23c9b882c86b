"""Continuous clock sync: the estimator `qpmesh sim sync` measures, run on a sliding window.

`ClockSync.add(ing)` keeps, per directed NIC pair and time bin (``window_ns / bins``, on the
fleet's fixed grid: aligned to UNIX time, `bin_keys`), the coded probe pair (both probes, both arrived) with the smallest round trip: raw probe columns
(src, dst, pair, t1..t4, and whether the batch was software-stamped) go into a bounded ring of
per-bin chunks. The round trip ``(t4 - t1) - (t3 - t2)`` needs no clock model (the offsets
cancel), so the selection is the same before and after the first solve, and a solve reads at
most pairs x bins x 2 rows, however high the probe rate. The bin's lowest-RTT pair is the one
least queued in both directions. Why a selection and not a summary per batch: reducing every
record into `sync.summary` costs ~2.7 us per record (orientation, hull sorts) against a budget
of ~1 us for the whole controller, and a bin's summary at live probe rates holds about as many
points as the bin has records (docs/controller.md, "Clock sync").

`ClockSync.maybe_solve(now_ns)` (every ``solve_every_ns``) runs `controller.clocksolve` on the
rows of the last ``window_ns``: hardware-stamped windows are streamed into a bounded
`sync.summary.Summary` and solved by `sync.summarysolve.sync_summary` (hull fits, drifts from
the envelopes and lowest-RTT lines, receive-side correction), software-stamped ones by
`sync.window.sync_window` (the two drivers of the benchmark), and per-NIC `sync.ClockModels`
are installed. `ClockSync.delays(ing)` maps each stamp to the reference timescale with those
models (extrapolated to "now"): one-way delays in real time; NaN before the first solve or for a
NIC outside the solved part of the probe graph, never a guess.

`compute_state` is the pure solve (safe in a worker thread): `start_solve` hands out the window,
`install` adopts the result. In the fleet (`controller.fleet`) the selection runs where the
batches are ingested and the solve where the selections meet: `add_pairs` folds kept pairs
selected elsewhere (the bins are the same in every process), and a worker that only computes
delays adopts the solver's state and trust with `adopt` (`trust` exports them).

Clocks that move between solves (`controller.clocksteps`) show in the probes each NIC sends,
all in its own host's batches: whichever fleet worker ingests them finds the move the same
way. A worker's sync (``whole=False``) withholds those probes' delays at once and hands the
move to its solver (`take_moves`, in its next partial; `note_moves` there), whose state then
carries it to every worker (`trust`, ``moved_at``), which withhold the NIC's delays both ways
from then on: the probes a worker withholds do not depend on how hosts are split among
workers, and one process (`controller.live.LiveController`, one worker) withholds the same.
A sync that computes every batch's delays and solves them itself (``whole=True``, the
default) marks its finds at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from controller.clockfloors import EPOCH_RANK, FloorMemory
from controller.clocksolve import (
    SAMPLE_COLUMNS,
    ClockState,
    ClockSyncConfig,
    SampleRows,
    SampleWindow,
    compute_state,
)
from controller.clocksteps import clock_errors, moved, off_probes, queue_floor
from controller.ingest import Ingested
from controller.windows import KeyIndex
from sync import ClockModels

__all__ = [
    "ClockState",
    "ClockSync",
    "ClockSyncConfig",
    "ClockTrust",
    "Delays",
    "PairSlots",
    "SampleRows",
    "SampleWindow",
    "bin_keys",
    "coded_partners",
    "compute_state",
    "recent_drift",
    "solve_miss",
    "trust_horizon",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
I32 = NDArray[np.int32]

_COLS = tuple(SAMPLE_COLUMNS)  # sw: a software-stamped row


@dataclass(frozen=True, eq=False)
class Delays:
    """One-way delays of an ingested batch (ns, NaN if lost or clocks unknown or less certain
    than ``coarse_unc_ns``); ``coarse``: True where certain only to ``coarse_unc_ns``, not to
    ``max_unc_ns`` (all False before the first solve)."""

    t_ns: I64  # send time on the controller timebase (initiator clock corrected)
    owd_fwd_ns: F64
    owd_rev_ns: F64
    rtt_ns: F64
    coarse: NDArray[np.bool_]

    def fine(self) -> tuple[F64, F64]:
        """Return (forward, reverse) delays with the coarse ones NaN."""
        return (np.where(self.coarse, np.nan, self.owd_fwd_ns),
                np.where(self.coarse, np.nan, self.owd_rev_ns))  # fmt: skip


class ClockSync:
    """Stateful wrapper that runs `sync.window` continuously; see the module docstring."""

    def __init__(
        self,
        n_nics: int,
        config: ClockSyncConfig | None = None,
        *,
        leaf: NDArray[np.integer[Any]] | None = None,
        first_stamp: int | None = None,
        slots: PairSlots | None = None,
        remember: bool = True,
        floor_rank: int = EPOCH_RANK,
        whole: bool = True,
    ) -> None:
        """``leaf``: per NIC index its leaf switch's index (the fabric's ECMP group), which
        lets the solve split the queueing left in the best samples by leaf uplink and NIC
        downlink (`sync.excess.split_excess`); None: receive side only. ``first_stamp``:
        where the warm-up bins are (`bin_keys`; None: at the first stamp added), e.g. a
        fleet worker's window selection binning as its solver does; ``slots``: a directed
        pair numbering to share (`PairSlots`: a worker's one selection per window);
        ``remember``: keep the directed pairs' round-trip floors across windows (`floors`;
        False for a selection that lives one window); ``floor_rank``: which of a window's
        lowest round trips is its floor (`FloorMemory`: ``WINNER_RANK`` where the pairs
        folded are other selections' winners, `add_pairs` in a fleet solver); ``whole``:
        this sync computes the delays of every batch (its clock moves found withhold both
        ends at once and reach its own solves); False: a fleet worker's, which sees its own
        hosts' batches only (module docstring). Raises ValueError when ``leaf`` does not have
        ``n_nics`` entries."""
        if leaf is not None and len(leaf) != n_nics:
            raise ValueError(f"leaf has {len(leaf)} entries for {n_nics} NICs")
        self.leaf = None if leaf is None else np.asarray(leaf, np.int64)
        self.n_nics = n_nics
        self.config = config or ClockSyncConfig()
        self._chunks: deque[tuple[int, dict[str, NDArray[Any]]]] = deque()
        self._rows = 0
        self._t_max: int | None = None
        self._t0: int | None = first_stamp  # first stamp seen (where the warm-up bins are)
        self._slots = slots or PairSlots(n_nics)  # directed (src, dst) -> dense slot
        self._open: dict[int, _OpenBin] = {}  # bin index -> best pair per directed pair
        self._latest_bin = -1
        self._scratch = np.zeros(0, np.int64)
        self.state: ClockState | None = None
        self._last_solve_ns: int | None = None
        self._span_solved = 0  # data span at the last solve (warm-up cadence)
        self.solve_cost_ns: int | None = None  # what the last solve cost, if its owner said
        self.solves = 0
        self.last_solve_samples = 0
        # per NIC: the last solve-to-solve disagreement (ns), the drift error it implies and
        # the distance from t_ref within which its clock error stays under max_unc (-1: never)
        self.miss_ns = np.full(n_nics, np.nan)
        self.drift_err = np.full(n_nics, np.inf)
        self.trust_ns = np.full(n_nics, -1.0)
        self.coarse_trust_ns = np.full(n_nics, -1.0)  # the same for coarse_unc
        # memory across windows: each directed pair's round-trip floor
        self.floors = FloorMemory(self.config.window_ns, self.config.floor_epochs, rank=floor_rank)
        self._remember = remember
        # per NIC since when its clock is not to be trusted (NIC clock ns; -1: trusted): it
        # moved against its model (`controller.clocksteps`, `note_moves`) or stepped inside
        # a solve's window; cleared by a solve of data after that instant only
        self.stepped_at = np.full(n_nics, _NO_STEP, np.int64)
        self.whole = whole
        # not whole: the moves `delays` found (from the NIC's own probes) that no state has
        # carried back yet, since when (-1: none), and those not taken by `take_moves` yet
        self.found_at = np.full(n_nics, _NO_STEP, np.int64)
        self._new_found: dict[int, int] = {}
        self.moves_seen = 0  # NICs found moved between solves
        self._last_err = np.full(n_nics, np.nan)  # per NIC its error in the last batch
        self._suspect = np.zeros(n_nics, bool)  # its error jumped in the last batch
        self._suspect_since = np.full(n_nics, _NO_STEP, np.int64)

    # ---- samples -------------------------------------------------------------------------
    def add(self, ing: Ingested) -> int:
        """Fold the batch's coded pairs into the per (directed pair, bin) lowest-RTT summary;
        return how many pairs became the best of their bin."""
        if not len(ing):
            return 0
        first, second = coded_partners(ing.pair, ing.t1)
        arrived = ~ing.lost
        both = np.take(arrived, first) & np.take(arrived, second)
        first, second = first[both], second[both]
        cols = {k: getattr(ing, k) for k in _COLS[:-1]}
        sw = ing.stamp == "sw"
        if self.config.use_uncoded:
            rows = np.flatnonzero((ing.pair < 0) & arrived)
            if len(rows):
                self._push(_rows_of(cols, sw, rows))
        if not len(first):
            return 0
        return self._fold_pairs(cols, sw, first, second, self._slots.of_rows(ing, first))

    def remember(self, ing: Ingested, now_ns: int | None = None) -> None:
        """Fold the round trips of a batch's arrived probes into the directed pairs' floors
        (`floors`), as `add` does for the coded pairs it selects: for a `ClockSync` that only
        computes delays with another's models (a fleet worker's, `adopt`), so that its
        `delays` see bad stamps and moved clocks against remembered floors. ``now_ns``: the
        time that places the batch in an epoch (a fleet worker's ingest time, so that how
        hosts are split among workers does not move an epoch's edge); default: each round
        trip's send stamp."""
        ok = np.flatnonzero(~ing.lost)
        if not len(ok) or not self._remember:
            return
        rtt = (np.take(ing.t4, ok) - np.take(ing.t1, ok)) - (
            np.take(ing.t3, ok) - np.take(ing.t2, ok)
        )
        at = np.take(ing.t1, ok) if now_ns is None else now_ns
        self.floors.observe(self._slots.of_rows(ing, ok), rtt, at)

    def add_pairs(self, rows: SampleRows) -> int:
        """Fold kept coded pairs into the per (directed pair, bin) lowest-RTT summary, as
        `add` folds a batch's: ``rows`` both probes of a pair on adjacent rows (the earlier
        send first), e.g. the winners of a fleet worker's window (`controller.fleet`); rows
        with ``pair`` -1 (uncoded probes, ``use_uncoded``) are kept as they are. Return how
        many pairs became the best of their bin. Raises ValueError on coded rows that do
        not come two by two."""
        cols = rows.cols()
        coded = cols["pair"] >= 0
        if not coded.all():
            loose = np.flatnonzero(~coded)
            self._push({k: v[loose] for k, v in cols.items()})
            cols = {k: v[coded] for k, v in cols.items()}
        n = len(cols["src"])
        if n % 2:
            raise ValueError("kept coded pairs come as two rows each")
        if not n:
            return 0
        first = np.arange(0, n, 2, dtype=np.int64)
        key = np.asarray(cols["src"][first], np.int64) * self.n_nics + cols["dst"][first]
        dp, _ = self._slots.index.insert(key)
        return self._fold_pairs(cols, cols["sw"], first, first + 1, dp)

    def _fold_pairs(
        self,
        cols: Mapping[str, NDArray[Any]],
        sw: NDArray[np.bool_] | bool,
        first: I64,
        second: I64,
        dp: I64,
    ) -> int:
        """Fold candidate coded pairs (rows ``first``/``second`` of ``cols``, directed-pair
        slots ``dp``) into their bins; return how many became the best of their bin."""
        t1, t2, t3, t4 = cols["t1"], cols["t2"], cols["t3"], cols["t4"]

        def rtt(r: I64) -> I64:
            out: I64 = (np.take(t4, r) - np.take(t1, r)) - (np.take(t3, r) - np.take(t2, r))
            return out

        t1f = np.take(t1, first)
        t_hi = int(t1f.max())
        # a pair with a round trip well under its directed pair's floor had a bad stamp: it
        # would win its bin (the lowest round trip) and lose the bin's genuine best
        r1, r2 = rtt(first), rtt(second)
        floor = self.floors.floor(dp, settled=True)
        with np.errstate(invalid="ignore"):
            sane = ~(np.minimum(r1, r2) < floor - BAD_RTT_NS)
        if self._remember:
            t1s = np.take(t1, second)
            self.floors.observe(np.concatenate([dp, dp]), np.concatenate([r1, r2]),
                                np.concatenate([t1f, t1s]))  # fmt: skip
        score = r1 + r2  # clock offsets cancel
        if not sane.all():
            first, second, score, dp, t1f = (a[sane] for a in (first, second, score, dp, t1f))
            if not len(first):
                return 0
        self._t_max = t_hi if self._t_max is None else max(self._t_max, t_hi)
        if self._t0 is None:
            self._t0 = int(t1f.min())
        b = self.bin_keys(t1f)
        b_lo, b_hi = int(b.min()), int(b.max())
        improved = 0
        if b_lo == b_hi:
            improved += self._fold(cols, sw, b_lo, dp, score, first, second)
        else:
            seen = np.bincount(b - b_lo) if b_hi - b_lo < 1 << 20 else None
            keys = np.flatnonzero(seen) + b_lo if seen is not None else np.unique(b)
            for bb in keys.tolist():
                sel = np.flatnonzero(b == bb)
                improved += self._fold(cols, sw, bb, dp[sel], score[sel], first[sel], second[sel])
        self._flush(self._grace_bin())
        self._expire()
        return improved

    def _grace_bin(self) -> int:
        """Return the key of the oldest bin still open: the bin before the latest one on the
        grid (`bin_keys`: a warm-up sub-bin's key is one more than the one before it, a whole
        bin's ``warmup_bins`` more). Older candidates are late (their own chunk); a bin is
        closed once two newer bins have begun. Stamps are on their NICs' own clocks, so the
        latest bin is any NIC's: a grace of one key (a key step of a warm-up sub-bin) closed
        every whole bin as soon as the next began, and whether a NIC's last candidates of a
        bin were folded or late then depended on which other hosts' batches the same
        process had seen first (a fleet worker's selection differed from one process's at
        every bin edge, and the solver's floors with it)."""
        k = self.config.warmup_bins
        step = k if self._latest_bin % k == k - 1 else 1
        return self._latest_bin - step

    def bin_keys(self, t1: I64) -> I64:
        """Return the bin of each send stamp (`bin_keys` with this sync's first stamp)."""
        assert self._t0 is not None
        return bin_keys(t1, self._t0, self.config)

    def _fold(
        self,
        cols: Mapping[str, NDArray[Any]],
        sw: NDArray[np.bool_] | bool,
        bb: int,
        dp: I64,
        score: I64,
        first: I64,
        second: I64,
    ) -> int:
        """Update open bin ``bb`` with candidate pairs; return how many became its best."""
        if bb < self._grace_bin():  # late data for a bin already flushed: its own chunk
            self._push(_rows_of(cols, sw, np.stack([first, second], axis=1).reshape(-1)))
            return len(first)
        self._latest_bin = max(self._latest_bin, bb)
        ob = self._open.get(bb)
        size = self._slots.index.size
        if ob is None or len(ob.score) < size:
            ob = _OpenBin.grown(ob, max(size, 1024))
            self._open[bb] = ob
        np.minimum.at(ob.score, dp, score)
        win = np.flatnonzero(np.take(ob.score, dp) == score)
        # ties within the batch: the first pair wins (reverse scatter: the last write wins)
        dw = dp[win]
        if len(self._scratch) < size:
            self._scratch = np.zeros(max(size, 2 * len(self._scratch)), np.int64)
        self._scratch[dw[::-1]] = win[::-1]
        win = win[np.take(self._scratch, dw) == win]
        dw = dp[win]
        f, s = first[win], second[win]
        for name in _COLS[:-1]:
            col = cols[name]
            ob.cols[name][dw, 0] = np.take(col, f)
            ob.cols[name][dw, 1] = np.take(col, s)
        if isinstance(sw, bool):
            ob.cols["sw"][dw] = sw
        else:
            ob.cols["sw"][dw, 0] = np.take(sw, f)
            ob.cols["sw"][dw, 1] = np.take(sw, s)
        return len(win)

    def _flush(self, upto: int) -> None:
        """Close the open bins before ``upto``: their winners become a chunk of the ring."""
        for bb in sorted(k for k in self._open if k < upto):
            chunk = self._open.pop(bb).winners()
            if len(chunk["src"]):
                self._push(chunk)

    def _push(self, chunk: dict[str, NDArray[Any]]) -> None:
        t_hi = int(chunk["t1"].max())
        self._t_max = t_hi if self._t_max is None else max(self._t_max, t_hi)
        self._chunks.append((t_hi, chunk))
        self._rows += len(chunk["src"])

    def _expire(self) -> None:
        """Drop chunks older than the window, and the oldest beyond ``capacity`` rows."""
        assert self._t_max is not None
        horizon = self._t_max - self.config.window_ns
        while self._chunks and (self._chunks[0][0] < horizon or self._rows > self.config.capacity):
            _, old = self._chunks.popleft()
            self._rows -= len(old["src"])

    # ---- solving -------------------------------------------------------------------------
    def due(self, now_ns: int) -> bool:
        """True when a solve is due at ``now_ns``."""
        last = self._last_solve_ns
        if last is None:
            return True
        if (
            self._span_solved < self.config.window_ns
            and 10 * self._span() >= 19 * self._span_solved
        ):
            # warm-up: re-solve each time the data span (nearly) doubles until it fills; data
            # comes a grid window at a time, so a span of k windows is k windows less a hair
            return True
        return now_ns - last >= self.solve_period_ns()

    def solve_period_ns(self) -> int:
        """Return the time between solves: ``solve_every_ns``, or with a reported solve cost
        the cost / ``solve_budget``, clamped to [``min_solve_every_ns``, ``solve_every_ns``]."""
        cfg = self.config
        if self.solve_cost_ns is None:
            return cfg.solve_every_ns
        by_cost = round(self.solve_cost_ns / cfg.solve_budget)
        return min(cfg.solve_every_ns, max(cfg.min_solve_every_ns, by_cost))

    def _span(self) -> int:
        """Time covered by the samples so far (ns, capped at the window)."""
        if self._t_max is None or self._t0 is None:
            return 0
        return min(self._t_max - self._t0, self.config.window_ns)

    def start_solve(self, now_ns: int) -> SampleWindow | None:
        """If a solve is due: mark it started and return the window to solve (else None)."""
        if not self.due(now_ns):
            return None
        window = self.window()
        if window is not None:  # nothing to solve yet: the first solve waits for samples
            self._last_solve_ns = now_ns
            self._span_solved = max(self._span(), 1)
        return window

    def maybe_solve(self, now_ns: int) -> bool:
        """Solve if due; return True if a new clock state was produced."""
        window = self.start_solve(now_ns)
        if window is None:
            return False
        return self.install(compute_state(window, self.n_nics, self.config, now_ns, self.leaf))

    def solve(self, now_ns: int) -> bool:
        """Run `sync_window` on the current window; return True on a new state."""
        window = self.window()
        if window is None:
            return False
        return self.install(compute_state(window, self.n_nics, self.config, now_ns, self.leaf))

    def window(self, since_ns: int | None = None) -> SampleWindow | None:
        """Return the rows of the current window (None if there are none): those sent in the
        last ``window_ns`` of the latest stamp, or from ``since_ns`` on (a fleet's edge
        owners cut the window where their solver does).

        With `compute_state` and `install` this lets a caller run the heavy solve elsewhere
        (a worker thread) while ingest goes on."""
        if self._t_max is None:
            return None
        horizon = self._t_max - self.config.window_ns if since_ns is None else since_ns
        chunks = [c for t_hi, c in self._chunks if t_hi >= horizon]
        chunks += [ob.winners() for _, ob in sorted(self._open.items())]
        chunks = [c for c in chunks if len(c["src"])]
        if not chunks:
            return None
        cols = {k: np.concatenate([c[k] for c in chunks]) for k in _COLS}
        keep = cols["t1"] >= horizon
        moved = np.flatnonzero(self.stepped_at != _NO_STEP)
        for k in moved:  # a moved clock: only what it stamped after the move, once that is
            # enough to fit a line (a NIC on less pulled its peers' drifts: a -100 us step
            # left a peer 3.5 us off 7 s after a solve that had 2.5 s of the NIC after it)
            mine = (cols["src"] == k) | (cols["dst"] == k)
            after = self._t_max - self.stepped_at[k] >= self._moved_span_ns()
            keep &= ~mine | ((cols["t1"] >= self.stepped_at[k]) & after)
        if not keep.all():
            cols = {k: v[keep] for k, v in cols.items()}
        if not len(cols["src"]):
            return None
        key = cols["src"].astype(np.int64) * self.n_nics + cols["dst"]
        floor = self.floors.floor(self._slots.index.lookup(key))
        rows = SampleRows.of(cols)
        return SampleWindow(**rows.cols(), floor=floor, moved_since=self.stepped_at.copy())

    def install(self, state: ClockState | None, cost_ns: int | None = None) -> bool:
        """Adopt a computed clock state (None = the solve found nothing; an older solve than
        the installed one is ignored); return True if adopted. ``cost_ns``: what the solve
        cost (CPU time of the thread that ran it), which sets the solve cadence
        (`solve_period_ns`).

        Each NIC's trust is set from how far the previous state, extrapolated, missed the new
        one (`solve_miss`): the solver's own uncertainty assumes its envelope is unqueued and
        its drift observable, neither of which holds on little data."""
        if cost_ns is not None:
            self.solve_cost_ns = max(0, cost_ns)
        if state is None:
            return False
        old = self.state
        if old is not None and state.solved_at_ns < old.solved_at_ns:
            return False
        if len(state.stepped):
            at = np.maximum(self.stepped_at[state.stepped], state.step_at_ns)
            self.stepped_at[state.stepped] = at
        self.stepped_at[self._resolved(state, self.stepped_at)] = _NO_STEP
        self._last_err = rebased_errors(self._last_err, old, state)
        self._suspect &= self.stepped_at == _NO_STEP  # a suspect the solve found stepped
        self.miss_ns, self.drift_err = solve_miss(old, state)
        # where the window's newest rows sit off the new models (software stamps), the
        # models' drift is off by at least that over their distance from t_ref
        self.drift_err = np.fmax(self.drift_err, recent_drift(state))
        if state.span_ns < self.min_span_of(state):
            self.drift_err = np.full(self.n_nics, np.inf)  # one instant: drift unobservable
        # two solves that disagree by more than a clock may err: one of them is wrong, and
        # which one is unknown: withhold the NIC (at that bound) until a later solve agrees
        self.trust_ns, self.coarse_trust_ns = (
            np.where(self.miss_ns <= unc / np.sqrt(2.0),
                     trust_horizon(state.models, self.drift_err, unc), -1.0)
            for unc in (self.config.max_unc_ns, self.config.coarse_unc_ns)
        )  # fmt: skip
        moved = self.stepped_at != _NO_STEP
        self.trust_ns[moved] = -1.0
        self.coarse_trust_ns[moved] = -1.0
        self.state = state
        self.solves += 1
        self.last_solve_samples = state.n_samples
        return True

    def min_span_of(self, state: ClockState) -> int:
        """The data span a state needs before it is trusted: ``min_span_ns``; for software
        stamps (a state that read its newest rows, ``recent_ns``) at least a bin
        (``window_ns / bins``): their drift over a second of µs-jittery stamps is the least
        certain of all, and the newest rows of a shorter window are ones its fit leaned on
        (`controller.clocksolve.recent_span`)."""
        if state.recent_ns is None:
            return self.config.min_span_ns
        return max(self.config.min_span_ns, self.config.bin_ns)

    def trust(self) -> ClockTrust:
        """Return the per-NIC trust the installed state earned (`install`) and the clocks
        moved since (`stepped_at`)."""
        return ClockTrust(self.miss_ns, self.drift_err, self.trust_ns, self.coarse_trust_ns,
                          self.stepped_at.copy())  # fmt: skip

    def adopt(self, state: ClockState | None, trust: ClockTrust) -> None:
        """Take a state and its trust as another `ClockSync` installed them (a fleet worker
        computing delays with its solver's models), with the clocks it holds moved
        (``trust.moved_at``: the steps its solves found and the moves its workers found,
        `note_moves`). A move this sync found (`found_at`) stays until a state carries it
        (or re-solves the NIC, for a find its solver never took). Raises ValueError on a
        trust or state of another size."""
        if (
            len(trust.trust_ns) != self.n_nics
            or len(trust.moved_at) != self.n_nics
            or (state is not None and len(state.models) != self.n_nics)
        ):
            raise ValueError(f"clock state and trust must cover {self.n_nics} NICs")
        old = self.state
        self.stepped_at = np.array(trust.moved_at, np.int64)
        found = self.found_at != _NO_STEP
        done = found & (self.stepped_at >= self.found_at)
        if state is not None and (old is None or state.solved_at_ns != old.solved_at_ns):
            # a new solve (a fleet worker is handed the same one, decoded anew, each window)
            done |= found & self._resolved(state, self.found_at)
            self._last_err = rebased_errors(self._last_err, old, state)
            self._suspect &= self.stepped_at == _NO_STEP  # a suspect its solver found moved
        self.found_at[done] = _NO_STEP
        self.state = state
        self.miss_ns, self.drift_err = trust.miss_ns, trust.drift_err
        self.trust_ns, self.coarse_trust_ns = trust.trust_ns, trust.coarse_trust_ns

    def note_moves(self, nics: I64, at_ns: I64) -> None:
        """Mark the clocks of ``nics`` moved since ``at_ns`` (each its own clock's ns), as
        found between solves from the NICs' own probes (`take_moves` of the fleet workers
        that computed their delays): unknown (`offsets`), untrusted and their delays
        withheld, and their rows from before then left out of the solve (`window`), until
        a solve of data after the move re-solves them (`install`). A NIC marked already
        keeps the later instant. Raises ValueError on arrays of unequal lengths or a NIC
        outside ``n_nics``."""
        nic, at = np.asarray(nics, np.int64), np.asarray(at_ns, np.int64)
        if nic.shape != at.shape or nic.ndim != 1:
            raise ValueError("moves need one instant per NIC")
        if not len(nic):
            return
        if int(nic.min()) < 0 or int(nic.max()) >= self.n_nics:
            raise ValueError(f"a moved NIC outside the {self.n_nics} NICs")
        np.maximum.at(self.stepped_at, nic, at)
        marked = np.zeros(self.n_nics, bool)
        marked[nic] = True
        # new arrays: an adopted trust may be its solver's own
        self.trust_ns = np.where(marked, -1.0, self.trust_ns)
        self.coarse_trust_ns = np.where(marked, -1.0, self.coarse_trust_ns)

    def take_moves(self) -> tuple[I64, I64]:
        """Return (and forget) the moves `delays` found since the last call (NICs in order,
        since when: their own clocks' ns), for the solver's `note_moves` (a fleet worker's
        next partial). Empty for a ``whole`` sync: its finds are marked at once."""
        found, self._new_found = self._new_found, {}
        nic = np.array(sorted(found), np.int64)
        return nic, np.array([found[k] for k in nic.tolist()], np.int64)

    @property
    def first_stamp(self) -> int | None:
        """Return the first send stamp seen (where the warm-up bins are), None before any."""
        return self._t0

    def _moved_span_ns(self) -> int:
        """How much data after its move a moved clock needs before a solve takes it: half
        a window, at least ``min_span_ns``."""
        return max(self.config.min_span_ns, self.config.window_ns // 2)

    def _resolved(self, state: ClockState, at: I64) -> NDArray[np.bool_]:
        """Per NIC: marked moved at ``at`` (-1: not) and solved by ``state`` from data after
        its move only (the window left out its rows from before the move, or began after
        it; and `_moved_span_ns` of data came after it), and not found stepped by it.
        Stamps of different NICs are compared as the window's horizon compares them."""
        marked = at != _NO_STEP
        after = state.end_ns - state.span_ns >= at  # the whole window after it
        if state.moved_since is not None:  # ... or the NIC's rows from its move on only
            since = state.moved_since
            after |= (since != _NO_STEP) & (since >= at)
        clear: NDArray[np.bool_] = marked & after & state.models.known
        clear &= state.end_ns - at >= self._moved_span_ns()
        clear[state.stepped] = False
        return clear

    # ---- models --------------------------------------------------------------------------
    def true_rel(self, nic: I32, t_ns: I64) -> F64:
        """Reference time minus the models' t_ref (ns) at which ``nic`` read ``t_ns``; NaN if
        unknown (`sync.ClockModels.true_rel_ns`)."""
        st = self.state
        if st is None:
            return np.full(len(nic), np.nan)
        return st.models.true_rel_ns(t_ns, nic)

    def offsets(self, t_ns: int) -> tuple[F64, F64]:
        """Return (clock offset, uncertainty) of every NIC at reference time ``t_ns`` (NaN
        where unknown, and for a NIC whose clock moved until a solve re-solves it; inf while
        no later solve has confirmed the NIC's drift)."""
        st = self.state
        if st is None:
            nan = np.full(self.n_nics, np.nan)
            return nan, nan.copy()
        m = st.models
        rel = float(t_ns - m.t_ref_ns)
        off = m.offset_ns + m.drift * rel
        ds = np.fmax(m.drift_std, self.drift_err)
        with np.errstate(invalid="ignore"):
            unc = np.sqrt(m.offset_std_ns**2 + (ds * abs(rel - st.center_ns)) ** 2)
        known = m.known & (self.stepped_at == _NO_STEP)  # a moved clock: unknown till re-solved
        return np.where(known, off, np.nan), np.where(known, unc, np.nan)

    def trusted(self, nic: I32, rel_ns: F64, *, coarse: bool = False) -> NDArray[np.bool_]:
        """True where NIC ``nic``'s clock at ``rel_ns`` from t_ref is within ``max_unc_ns``
        (``coarse``: within ``coarse_unc_ns``)."""
        return np.abs(rel_ns) <= np.take(self.coarse_trust_ns if coarse else self.trust_ns, nic)

    def _find_moves(
        self, ing: Ingested, owd_f: F64, owd_r: F64, rtt: F64, floor: F64, rel: F64
    ) -> None:
        """Find the NICs whose clocks the batch shows moved against their models
        (`controller.clocksteps`, on the probes near their pairs' remembered floors, beyond the
        clocks' uncertainty at the batch's time ``rel`` from t_ref): suspect at once (their
        delays withheld), moved from the first suspect batch's first stamp on once the next
        batch that measures them confirms it (errors and suspects are carried over a new
        solve, `rebased_errors`). Not while the models are from a warm-up solve (less than
        ``min_span_ns`` of data)."""
        st = self.state
        if not len(ing) or st is None or not np.isfinite(rel).any():
            return
        if not np.isfinite(floor).any():
            return
        if st.span_ns < self.config.min_span_ns:  # warm-up models: their errors say little
            return
        # per NIC from the probes it sent, at their latest time: what a fleet worker owning
        # the NIC's host sees alike, however the batches are split among workers
        src = ing.src.astype(np.int64)
        unc = self._unc_at(_per_nic(self.n_nics, src, rel, np.fmax))
        err, agree = clock_errors(self.n_nics, src, owd_f, owd_r, rtt, floor)
        jumped = moved(err, agree, self._last_err, unc)
        jumped &= (self.stepped_at == _NO_STEP) & (self.found_at == _NO_STEP)
        seen = np.isfinite(err)
        # a jump is suspect at once (its delays withheld) and a move once the next batch that
        # measures the NIC shows it again; a suspect the next batch does not confirm is clear
        confirm = jumped & self._suspect
        clear = self._suspect & seen & ~jumped
        new = jumped & ~self._suspect
        t0 = np.full(self.n_nics, _NONE, np.int64)  # per NIC the first probe it sent
        np.minimum.at(t0, src, ing.t1.astype(np.int64))
        self._suspect_since = np.where(new, t0, self._suspect_since)
        self._suspect = (self._suspect | new) & ~clear & ~confirm
        self._last_err = np.where(seen & ~jumped, err, self._last_err)
        nics = np.flatnonzero(confirm)
        if len(nics):
            self.moves_seen += len(nics)
            since = self._suspect_since[nics]
            if self.whole:
                self.note_moves(nics, since)
            else:  # the solver's to mark (`take_moves`); meanwhile the NIC's own probes
                self.found_at[nics] = since
                self._new_found.update(zip(nics.tolist(), since.tolist(), strict=True))

    def _unc_at(self, rel: F64) -> F64:
        """Per NIC its clock's uncertainty at ``rel`` (its own time from t_ref; NaN where
        unknown), as `offsets` gives it."""
        st = self.state
        assert st is not None
        m = st.models
        ds = np.fmax(m.drift_std, self.drift_err)
        with np.errstate(invalid="ignore"):
            unc = np.sqrt(m.offset_std_ns**2 + (ds * np.abs(rel - st.center_ns)) ** 2)
        return np.where(m.known & np.isfinite(rel), unc, np.nan)

    def delays(self, ing: Ingested) -> Delays:
        """Return one-way delays of the batch's probes and replies from the current models."""
        lost = ing.lost
        rtt = ((ing.t4 - ing.t1) - (ing.t3 - ing.t2)).astype(np.float64)
        rtt[lost] = np.nan
        st = self.state
        if st is None:
            nan = np.full(len(ing), np.nan)
            return Delays(ing.t1, nan, nan.copy(), rtt, np.zeros(len(ing), np.bool_))
        r1 = self.true_rel(ing.src, ing.t1)
        r2 = self.true_rel(ing.dst, ing.t2)
        owd_f = r2 - r1
        owd_r = self.true_rel(ing.src, ing.t4) - self.true_rel(ing.dst, ing.t3)
        slots = self._slots.of_rows(ing, np.arange(len(ing)))
        settled = self.floors.floor(slots, settled=True)
        # the clock-move checks read a probe's queueing from its round trip over the lowest
        # floor its pair has on a closed epoch's evidence (`controller.clocksteps.queue_floor`)
        floor = queue_floor(self.floors.floor(slots), settled)
        self._find_moves(ing, owd_f, owd_r, rtt, floor, r1)
        # a delay is only as good as both clocks: withhold it where either is too uncertain,
        # mark it coarse where either is certain only to coarse_unc
        fine = self.trusted(ing.src, r1) & self.trusted(ing.dst, r2)
        coarse = self.trusted(ing.src, r1, coarse=True) & self.trusted(ing.dst, r2, coarse=True)
        # a moved clock's delays are withheld until a solve re-solves it: marked moved both
        # ways; found moved here (suspect, or not yet marked by a state), the probes of the
        # NIC's own host, unless this sync sees every batch (`whole`): they are the same
        # probes in whichever fleet worker computes them (module docstring)
        marked = self.stepped_at != _NO_STEP
        seen_out = marked | self._suspect | (self.found_at != _NO_STEP)
        if seen_out.any():
            seen_in = seen_out if self.whole else marked
            gone = np.take(seen_out, ing.src) | np.take(seen_in, ing.dst)
            fine &= ~gone
            coarse &= ~gone
        # ... and a probe whose destination's clock it shows off its model (moved, not yet
        # marked: `controller.clocksteps.off_probes`), against its source's error
        err_src = np.take(self._last_err, ing.src)
        if np.isfinite(err_src).any():
            at = np.where(lost, np.nan, r2)  # a lost probe's receive stamp is none
            unc_dst = self._unc_at(_per_nic(self.n_nics, ing.dst.astype(np.int64), at, np.fmax))
            off = off_probes(err_src, owd_f, owd_r, rtt - floor, np.take(unc_dst, ing.dst))
            fine &= ~off
            coarse &= ~off
        # a round trip well under its pair's settled floor is no path: a bad stamp made it
        with np.errstate(invalid="ignore"):
            impossible = rtt < settled - BAD_RTT_NS
        bad = lost | impossible | ~(fine | coarse)
        owd_f[bad] = np.nan
        owd_r[bad] = np.nan
        t_ns = np.where(np.isfinite(r1), np.rint(np.nan_to_num(r1)).astype(np.int64) +
                        st.models.t_ref_ns, ing.t1)  # fmt: skip
        return Delays(t_ns, owd_f, owd_r, rtt, ~bad & ~fine)


class PairSlots:
    """Directed NIC pairs (src, dst) -> dense slots, cached by the ingestor's flow slot: one
    numbering that several selections can share (a fleet worker's, one per window)."""

    def __init__(self, n_nics: int) -> None:
        self.n_nics = n_nics
        self.index = KeyIndex()
        self._by_flow = np.zeros(0, np.int64)  # ingestor flow slot -> directed pair slot

    def of_rows(self, ing: Ingested, rows: I64) -> I64:
        """Return the slot of each row's directed pair (via its flow slot, cached)."""
        flow = np.take(ing.flow, rows)
        need = int(flow.max()) + 1
        if need > len(self._by_flow):
            grown = np.full(max(need, 2 * len(self._by_flow), 1024), -1, np.int64)
            grown[: len(self._by_flow)] = self._by_flow
            self._by_flow = grown
        dp = np.take(self._by_flow, flow)
        miss = dp < 0
        if miss.any():
            r = rows[miss]
            key = np.take(ing.src, r).astype(np.int64) * self.n_nics + np.take(ing.dst, r)
            slots, _ = self.index.insert(key)
            self._by_flow[flow[miss]] = slots
            dp[miss] = slots
        return dp


@dataclass(frozen=True, eq=False)
class ClockTrust:
    """Per NIC what `ClockSync.install` concluded of a state: the solve-to-solve miss (ns),
    the drift error it implies, the distances from t_ref within which the clock is trusted
    finely and coarsely (-1: never), and since when the clock moved (`ClockSync.stepped_at`,
    its clock's ns; -1: it did not)."""

    miss_ns: F64
    drift_err: F64
    trust_ns: F64
    coarse_trust_ns: F64
    moved_at: I64  # since when each NIC's clock moved, unknown till re-solved (-1: not)


def _per_nic(n_nics: int, nic: I64, val: F64, how: np.ufunc) -> F64:
    """Per NIC ``how`` (np.fmax / np.fmin) of its finite values, NaN where none."""
    out = np.full(n_nics, np.nan)
    ok = np.isfinite(val)
    how.at(out, nic[ok], val[ok])
    return out


_NONE = np.iinfo(np.int64).max
_NO_STEP = -1
BAD_RTT_NS = 5_000.0  # a round trip this far under its pair's floor had a bad stamp (a floor
# is an epoch's fourth lowest: at load 0.9 the lowest is up to a few µs under it)


@dataclass(eq=False)
class _OpenBin:
    """Best coded pair so far per directed-pair slot of one time bin: its RTT sum and both
    probes' columns (shape (slots, 2))."""

    score: I64
    cols: dict[str, NDArray[Any]]

    @classmethod
    def grown(cls, old: _OpenBin | None, size: int) -> _OpenBin:
        """A bin with room for ``size`` slots, keeping ``old``'s entries."""
        score = np.full(size, _NONE, np.int64)
        cols: dict[str, NDArray[Any]] = {
            k: np.zeros((size, 2), np.dtype(dt)) for k, dt in SAMPLE_COLUMNS.items()
        }
        if old is not None:
            n = len(old.score)
            score[:n] = old.score
            for k in _COLS:
                cols[k][:n] = old.cols[k]
        return cls(score, cols)

    def winners(self) -> dict[str, NDArray[Any]]:
        """Columns of the kept pairs, both probes of a pair on adjacent rows."""
        used = np.flatnonzero(self.score != _NONE)
        return {k: np.take(v, used, axis=0).reshape(-1) for k, v in self.cols.items()}


def _rows_of(
    cols: Mapping[str, NDArray[Any]], sw: NDArray[np.bool_] | bool, rows: I64
) -> dict[str, NDArray[Any]]:
    out = {k: np.take(cols[k], rows) for k in _COLS[:-1]}
    out["sw"] = np.full(len(rows), sw) if isinstance(sw, bool) else np.take(sw, rows)
    return out


def bin_keys(t1: I64, t0: int, config: ClockSyncConfig) -> I64:
    """Return the selection bin of each send stamp ``t1`` (ns, the initiator's clock) on the
    fixed grid: bins of ``window_ns / bins`` aligned to UNIX time 0, except that the first
    ``window_ns / bins`` after ``t0`` (the first stamp, rounded down to a sub-bin) is cut into
    ``warmup_bins`` sub-bins on the same grid (one pair per directed pair and bin is kept:
    from a single bin the solve cannot see drift). Keys grow with time and name a bin
    whatever process computes them: bin b of the grid is key ``b * warmup_bins +
    warmup_bins - 1``, its sub-bin j ``b * warmup_bins + j`` (the warm-up ends on a sub-bin
    boundary, so a bin's sub-bins come before the rest of it), and two processes whose first stamps fall in the same sub-bin
    bin the same stamps alike (`controller.fleet` merges their selections)."""
    k = config.warmup_bins
    w = config.bin_ns
    sub = max(1, w // k)
    t = np.asarray(t1, np.int64)
    lo = (t0 // sub) * sub
    b = t // w
    warm = (t >= lo) & (t < lo + w)
    return b * k + np.where(warm, np.minimum((t - b * w) // sub, k - 1), k - 1)


def coded_partners(pair: I64, send: I64) -> tuple[I64, I64]:
    """Return (first, second) row indices of every coded pair with exactly two probes.

    ``pair`` is -1 for uncoded probes; first/second are ordered by send stamp.
    """
    idx = np.flatnonzero(pair >= 0)
    if len(idx) >= 2 and len(idx) % 2 == 0:
        # fast path: partners on adjacent rows (how probers and the simulator emit them)
        fa, fb = idx[0::2], idx[1::2]
        pa = pair[fa]
        if (pa == pair[fb]).all() and (pa[1:] != pa[:-1]).all():
            swap = send[fb] < send[fa]
            return np.where(swap, fb, fa).astype(np.int64), np.where(swap, fa, fb).astype(np.int64)
    order = idx[np.argsort(pair[idx], kind="stable")]
    p = pair[order]
    if len(p) < 2:
        e = np.zeros(0, np.int64)
        return e, e.copy()
    same = p[1:] == p[:-1]
    # groups of exactly two: equal to the next, not equal to the previous or the one after next
    prev_diff = np.concatenate([[True], ~same[:-1]])
    next_diff = np.concatenate([~same[1:], [True]])
    start = np.flatnonzero(same & prev_diff & next_diff)
    a, b = order[start], order[start + 1]
    swap = send[b] < send[a]
    return np.where(swap, b, a).astype(np.int64), np.where(swap, a, b).astype(np.int64)


def solve_miss(old: ClockState | None, new: ClockState) -> tuple[F64, F64]:
    """Return per NIC (miss ns, drift error) of ``old``'s models extrapolated to ``new``'s
    latest samples: the reference time each assigns to the same reading of the NIC's clock,
    minus the median over NICs (the two solves' reference timescales differ by a common
    offset), and that miss divided by the extrapolation distance. (NaN, inf) where either
    state does not know the NIC or there is no old state."""
    n = len(new.models)
    nan, inf = np.full(n, np.nan), np.full(n, np.inf)
    if old is None or len(old.models) != n:
        return nan, inf
    nic = np.arange(n)
    at = np.full(n, new.end_ns, np.int64)
    x_old = old.models.true_rel_ns(at, nic) + float(old.models.t_ref_ns - new.models.t_ref_ns)
    d = x_old - new.models.true_rel_ns(at, nic)
    ok = np.isfinite(d)
    if not ok.any():
        return nan, inf
    miss = np.abs(d - np.median(d[ok]))
    dist = max(abs(float(new.end_ns - old.models.t_ref_ns)), 1.0)
    return miss, np.where(ok, miss / dist, np.inf)


def rebased_errors(err: F64, old: ClockState | None, new: ClockState) -> F64:
    """Return the per-NIC clock errors ``err`` (`controller.clocksteps.clock_errors`, + :
    ahead, measured against ``old``'s models) as ``new``'s models would have measured them:
    plus what ``old`` put each clock ahead of ``new`` at ``new``'s latest samples, less the
    median of that over NICs (the two solves' reference timescales differ by a common
    offset). NaN where either state does not know the NIC, or without an old state.

    A solve every 2 s (the service's on a small fabric, `ClockSync.solve_period_ns`) often
    comes between the batch that shows a step and the one that confirms it, or fits part
    of the step; errors dropped at each solve left nothing to compare the next batch with
    (a 5 us step at 20 s of a 32-NIC run went unseen and raised a ``contention`` on its NIC
    link). Carried over, the move shows against the last error the NIC had."""
    n = len(new.models)
    if old is None or len(old.models) != n or len(err) != n:
        return np.full(n, np.nan)
    at = float(new.end_ns)
    om, nm = old.models, new.models
    d = (om.offset_ns + om.drift * (at - om.t_ref_ns)) - (
        nm.offset_ns + nm.drift * (at - nm.t_ref_ns)
    )
    ok = np.isfinite(d)
    if not ok.any():
        return np.full(n, np.nan)
    out: F64 = err + (d - np.median(d[ok]))
    return out


def recent_drift(state: ClockState) -> F64:
    """Per NIC the drift error (ns per ns) that how far its model sits from the window's
    newest rows implies (``state.recent_ns`` over their distance from the models' t_ref,
    ``state.recent_at_ns``; at least a second): a model off where its data ends is off by
    more as it is extrapolated past it. 0 where not measured (hardware stamps, too few
    rows)."""
    n = len(state.models)
    if state.recent_ns is None:
        return np.zeros(n)
    dist = max(abs(float(state.recent_at_ns - state.models.t_ref_ns)), 1e9)
    return np.nan_to_num(state.recent_ns, nan=0.0) / dist


def trust_horizon(models: ClockModels, drift_err: F64, max_unc_ns: float) -> F64:
    """Return per NIC the distance |t - t_ref| (ns) within which its clock uncertainty
    ``sqrt(offset_std^2 + (max(drift_std, drift_err) * dt)^2)`` stays under ``max_unc_ns``
    per clock (``max_unc_ns / sqrt 2``: a delay has two); -1 where never (unknown NICs)."""
    lim2 = max_unc_ns**2 / 2.0
    os2 = np.where(np.isnan(models.offset_std_ns), np.inf, models.offset_std_ns) ** 2
    ds = np.fmax(np.where(np.isnan(models.drift_std), np.inf, models.drift_std), drift_err)
    room = lim2 - os2
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(ds > 0, np.sqrt(np.maximum(room, 0.0)) / ds, np.inf)
    return np.where(models.known & (room > 0) & np.isfinite(ds), h, -1.0)
