"""The solver's core: the partials of every worker in, one judged window out.

`FleetSolver(fabric, config)` is what the controller runs at the centre of a fleet (and what
`controller.live.LiveController` runs beside its one worker): `add` takes a worker's
`Partial`; `complete(window, expected_workers)` says whether every expected worker's partial
of a window is in; `solve(window, now_ns)` merges the window's partials and judges it, in
window order, and returns a `SolveResult`: the findings, the state the workers need next
(`SolveResult.clock`, bytes for `controller.fleet.worker.FleetWorker.install_clock`) and what
the snapshot, the API and the time series read.

Merging is exact. The clock selections of a window are folded into the solver's
`controller.clocksync.ClockSync` in one call, in an order that does not depend on which
worker sent what (per directed pair and clock bin the coded pair of lowest round trip
survives, as if one process had seen every record); the clock is solved when due
(`ClockSync.maybe_solve`), on the whole fleet's selection. The detection parts are absorbed
into one window of the brain's numbering (`controller.brain.Brain.judge`: counts add, minima
take the minimum, lost and slow sets concatenate) and judged. A pair's two directions (the
probes i -> j in host(i)'s batches, j -> i in host(j)'s) meet here, in the selection the
solve reads: docs/architecture.md ("The fleet") says why the pair work is not split further
and what it costs at 100,000 NICs.

With ``FleetConfig.edge_owners`` (k >= 1) the solver neither folds the clock parts nor
summarizes: k edge owners (`controller.fleet.edges.EdgeStage`) do, and at each solve window
(`controller.fleet.edges.solve_due`) the solver solves the window in rounds with them
(`solve_blocks`): the owners run the per-edge stages on their blocks
(`controller.fleet.edges.EdgeStage.stages`), the solver the network stages on what they
return; no block is joined. ``local_edges``: the owners run inside the solver, fed the
window's partials split by owner (one process); otherwise the shell runs them and hands
their blocks to `add_block` (`needs_blocks` says for which windows), and the blocks' stages
run here until the shell carries the rounds (docs/scale.md, "Edge owners"); a solve window
whose blocks are not all in is judged without a clock solve (counted in
``missing_blocks``). The solve cadence is
then the grid's, and clock solves always run inline.

Host facts (`presence`, `gpu`, `nic_links`) are the solver's: its brain judges them, and
the hosts whose prober is down, with since when each prober is alive, travel to the workers
in the state. Pure: time is passed in.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.brain import Brain
from controller.brainlike import BrainLike
from controller.clockfloors import WINNER_RANK
from controller.clocksync import ClockState, ClockSync, compute_state
from controller.fleet.config import FleetConfig
from controller.fleet.edges import (
    EdgeStage,
    SummaryBlock,
    first_send,
    fold_order,
    owner_bounds,
    solve_blocks,
    solve_cut,
    solve_due,
    split_partial,
)
from controller.fleet.partial import (
    LearnedPaths,
    NicDelays,
    Partial,
    PartialError,
    RecordCounts,
    fabric_id,
)
from controller.fleet.stagewire import StageError
from controller.fleet.state import NONE, FleetState, encode_state
from controller.refabric import host_times
from mesh.fabric import Fabric
from mesh.fabric.ecmp import routing_tables
from sync.edgestage import RangeStages

I32 = npt.NDArray[np.int32]
RemoteStages = Callable[[int, Sequence[SummaryBlock]], tuple[Sequence[RangeStages | None], int]]
"""``(window, blocks) -> (ranges, points)``: the rounds of a solve window's blocks run by
their owners apart (`controller.fleet.stagelink.StageLink.ranges`); raises `StageError`."""
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class Added(enum.Enum):
    """What `FleetSolver.add` made of a partial."""

    TAKEN = "taken"
    DUPLICATE = "duplicate"  # the same worker's partial of that window came before
    LATE = "late"  # its window was solved already
    OVERLAP = "overlap"  # another worker's partial of the window covers one of its batches
    STALE = "stale"  # of another fabric (a learned fabric changed since: its indices differ)


@dataclass(frozen=True, eq=False)
class SolveResult:
    """One judged window: ``events`` (pending host facts first, then the window's
    findings, each stamped with the window's end), ``state`` (what workers install next;
    `clock` is it as bytes), ``solved`` (a new clock state came of it), the workers whose
    partials it merged, their summed ``counts``, per NIC the worst fine delay out and in
    (``nic_owd``), and the clock offsets and their uncertainty at the window's end (NaN:
    unknown)."""

    window: int
    end_ns: int
    events: tuple[EventDoc, ...]
    state: FleetState
    solved: bool
    workers: tuple[str, ...]
    counts: RecordCounts
    nic_owd: NicDelays
    offsets_ns: F64
    uncertainty_ns: F64

    @functools.cached_property
    def clock(self) -> bytes:
        """Return `state` encoded for the workers (`FleetWorker.install_clock`)."""
        return encode_state(self.state)


class FleetSolver:
    """The centre of the fleet (see the module docstring). Not thread-safe: one owner (the
    clock solve may run elsewhere: `start_solve` / `install_clock`)."""

    def __init__(
        self,
        fabric: Fabric,
        config: FleetConfig | None = None,
        *,
        brain: BrainLike | None = None,
        solve_inline: bool = True,
        local_edges: bool = True,
    ) -> None:
        self.fabric = fabric
        self.config = config or FleetConfig()
        self.solve_inline = solve_inline
        n = len(fabric.nics)
        # its floors come from the workers' selections: each a bin's lowest round trip
        self.clock = ClockSync(
            n, self.config.sync, leaf=fabric.nic_group_index, floor_rank=WINNER_RANK
        )
        self.brain: BrainLike = brain if brain is not None else Brain(fabric, self.config.detection)
        self._fabric_id = fabric_id(fabric)
        self._width = routing_tables(fabric).max_hops
        self._parts: dict[int, dict[str, Partial]] = {}
        self._next: int | None = None  # the next window to judge
        self._alive_since = np.zeros(len(fabric.hosts), np.int64)
        self._alive: dict[str, bool] = {}
        self._alive_at: dict[str, int] = {}  # since when each prober is alive, by host id
        self._last: FleetState | None = None
        self._learned: dict[tuple[int, int, int], tuple[I32, I32]] = {}
        self._learned_here: list[LearnedPaths] = []  # `learn`ed, for the next state
        self.late_partials = 0
        self.stale_partials = 0
        self._owners = self.config.edge_owners
        self._bounds = owner_bounds(n, self._owners) if self._owners else None
        self.edges: list[EdgeStage] | None = None
        if self._owners and local_edges:
            self.edges = [EdgeStage(n, self.config.sync, k) for k in range(self._owners)]
        self._blocks: dict[int, dict[int, SummaryBlock]] = {}
        self._first_stamp: int | None = None  # with edge owners: the fleet's first coded send
        self._first_window: int | None = None  # and the window it came in
        self.missing_blocks = 0
        self.remote: RemoteStages | None = None  # the owners apart run the rounds (the shell)

    # ---- partials ------------------------------------------------------------------------
    def add(self, partial: Partial) -> Added:
        """Take a worker's partial of a window not judged yet. Returns `Added`: a second
        partial of the same worker and window is a duplicate (a redelivery: dropped), one of a
        judged window is late (dropped, counted in ``late_partials``), one that covers a batch
        another worker's partial of the window covers overlaps (dropped: counting it would
        count that batch twice), one of another fabric is stale (dropped, counted in
        ``stale_partials``: a learned fabric changed and its worker had not followed yet;
        one process drops its open windows at a change too, `FleetWorker.refabric`). Raises
        `PartialError` on a partial of another grid, or whose indices do not fit this
        fabric."""
        if partial.grid_ns != self.config.grid.width_ns:
            raise PartialError(
                f"partial on a grid of {partial.grid_ns} ns, not {self.config.grid.width_ns}"
            )
        if partial.fabric != self._fabric_id:
            self.stale_partials += 1
            return Added.STALE
        _check_fits(partial, self.fabric)
        if self._next is not None and partial.window < self._next:
            self.late_partials += 1
            return Added.LATE
        have = self._parts.setdefault(partial.window, {})
        if partial.worker in have:
            return Added.DUPLICATE
        if len(partial.covers) and any(p.covers.overlaps(partial.covers) for p in have.values()):
            return Added.OVERLAP
        have[partial.worker] = partial
        return Added.TAKEN

    def add_block(self, block: SummaryBlock) -> Added:
        """Take an edge owner's summary block of a window not judged yet: `Added` as for
        partials (a second block of the same owner and window is a duplicate). Raises
        ValueError when this solver has no edge owners or ``block.owner`` is not one."""
        if not 0 <= block.owner < self._owners:
            raise ValueError(f"block of owner {block.owner}, not one of {self._owners}")
        if self._next is not None and block.window < self._next:
            return Added.LATE
        have = self._blocks.setdefault(block.window, {})
        if block.owner in have:
            return Added.DUPLICATE
        have[block.owner] = block
        return Added.TAKEN

    def blocks_in(self, window: int) -> int:
        """Return how many edge owners' blocks of ``window`` are in (`add_block`)."""
        return len(self._blocks.get(window, {}))

    def needs_blocks(self, window: int) -> bool:
        """Return True when ``window`` ends with a clock solve whose blocks come from edge
        owners outside this solver (known once the partials of the windows up to it are
        in: the first window with clock rows starts the cadence)."""
        if not self._owners or self.edges is not None:
            return False
        first = self._first_window
        if first is None:
            have = [k for k in sorted(self._parts) if k <= window and any(
                first_send(p.clock) is not None for p in self._parts[k].values())]  # fmt: skip
            if not have:
                return False
            first = have[0]
        return solve_due(window, first, self.config.grid, self.config.sync)

    def complete(self, window: int, expected_workers: Collection[str] | int) -> bool:
        """Return True when the partials of ``window`` from every worker named in
        ``expected_workers`` (or from that many workers) are in."""
        have = self._parts.get(window, {})
        if isinstance(expected_workers, int):
            return len(have) >= expected_workers
        return set(expected_workers) <= set(have)

    def pending_windows(self) -> list[int]:
        """Return the windows with partials not yet judged, oldest first."""
        return sorted(self._parts)

    @property
    def next_window(self) -> int | None:
        """Return the next window `solve` judges (None: none judged yet)."""
        return self._next

    # ---- host facts ----------------------------------------------------------------------
    def presence(self, host: str, alive: bool, now_ns: int, *, since_ns: int | None = None) -> None:
        """Record a prober's liveness (see `controller.live.LiveController.presence`); since
        when it is alive is kept by host id, also for a host the fabric lacks yet (a learned
        fabric places it later: `take_hosts`)."""
        if alive and not self._alive.get(host, False):
            at = now_ns if not since_ns or since_ns > now_ns else since_ns
            self._alive_at[host] = at
            i = self.fabric.host_index.get(host)
            if i is not None:
                self._alive_since[i] = at
        self._alive[host] = alive
        self.brain.presence(host, alive, now_ns)

    def take_hosts(self, old: FleetSolver, now_ns: int) -> None:
        """Take the prober facts of ``old``, the solver of the fabric this one's replaces
        (`controller.live.LiveController.replace_fabric`), by host id: whether each prober is
        alive (told to this solver's brain at ``now_ns``) and since when it has been."""
        self._alive, self._alive_at = dict(old._alive), dict(old._alive_at)
        self._alive_since = host_times(self.fabric, self._alive_at)
        for host, alive in sorted(self._alive.items()):
            self.brain.presence(host, alive, now_ns)

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None:
        """Record the GPU health of ``host``."""
        self.brain.gpu(host, ok, detail, now_ns)

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        """Record the link state of ``host``'s NICs as its prober read them."""
        self.brain.nic_links(host, up, now_ns)

    def pending(self) -> list[EventDoc]:
        """Return (and forget) the findings of host facts not yet handed out."""
        return self.brain.take_pending()

    # ---- judging -------------------------------------------------------------------------
    def solve(self, window: int, now_ns: int) -> SolveResult:
        """Judge ``window`` (and, first, every window before it not judged yet, each as its
        partials stand: a window with none is judged empty) and return its result, the
        events of the windows judged on the way included. ``now_ns``: the time of the call
        (when a clock solve is due). Raises ValueError for a window already judged."""
        if self._next is not None and window < self._next:
            raise ValueError(f"window {window} was judged already (next: {self._next})")
        start = window if self._next is None else self._next
        if self._next is None and self._parts:
            start = min(start, *self._parts)
        events = self.pending()
        solved = False
        last: tuple[list[Partial], int] = ([], window)
        ks: Iterable[int] = range(start, window + 1)
        if window - start >= self.config.max_gap:  # a long silence: its windows with partials
            near = range(window - self.config.max_gap + 1, window + 1)
            ks = sorted({k for k in self._parts if start <= k <= window} | set(near))
        for k in ks:
            parts = [p for _, p in sorted(self._parts.pop(k, {}).items())]
            for p in parts:  # clocks found moved: unknown and withheld everywhere from now on
                self.clock.note_moves(p.moved.nic, p.moved.since)
            if self._owners:
                solved |= self._edge_window(k, parts, now_ns)
            else:
                self._fold_clock(parts)
                if self.solve_inline:
                    solved |= self.clock.maybe_solve(now_ns)
            events += self.brain.judge(self.config.grid.end(k), [p.detection for p in parts])
            self._last = self._state_after(k, parts)
            last = (parts, k)
        self._next = window + 1
        parts = last[0]
        end = self.config.grid.end(window)
        off, unc = self.clock.offsets(end)
        assert self._last is not None
        counts = RecordCounts()
        for p in parts:
            counts = counts + p.counts
        return SolveResult(
            window, end, tuple(events), self._last, solved, tuple(p.worker for p in parts),
            counts, _merge_nic(parts, len(self.fabric.nics)), off, unc,
        )  # fmt: skip

    def _fold_clock(self, parts: list[Partial]) -> None:
        """Fold the window's clock selections into the clock, in one order whatever the split
        (`controller.fleet.edges.fold_order`)."""
        rows = fold_order([p.clock for p in parts])
        if rows is not None:
            self.clock.add_pairs(rows)

    def _edge_window(self, k: int, parts: list[Partial], now_ns: int) -> bool:
        """Window ``k``'s clock work with edge owners: the parts to the owners in this
        process, and at a solve window the owners' blocks joined and solved; return True on
        a new clock state."""
        firsts = [f for p in parts if (f := first_send(p.clock)) is not None]
        if self._first_stamp is None and firsts:
            self._first_stamp, self._first_window = min(firsts), k
        if self.edges is not None:
            assert self._bounds is not None
            inputs = [split_partial(p, self._bounds) for p in parts]
            for o, stage in enumerate(self.edges):
                stage.add([i[o] for i in inputs])
        blocks = self._blocks.pop(k, {})
        first, t0, grid = self._first_window, self._first_stamp, self.config.grid
        if first is None or t0 is None or not solve_due(k, first, grid, self.config.sync):
            return False
        since, t_ref = solve_cut(k, t0, grid, self.config.sync)
        ranges: list[RangeStages | None] | None = None  # blocks with summaries: run here
        if self.edges is not None:
            got = [stage.block(k, since, t_ref) for stage in self.edges]
            ranges = [stage.stages(b) for stage, b in zip(self.edges, got, strict=True)]
        else:
            got = [blocks[o] for o in sorted(blocks)]
        if len(got) < self._owners:
            self.missing_blocks += 1
            return False
        points = None
        try:  # a round an owner does not answer: no clock solve, never one from some rounds
            if self.edges is None and self.remote is not None:
                remote, points = self.remote(k, got)
                ranges = list(remote)
            state = solve_blocks(got, self.clock.n_nics, self.config.sync, t_ref, now_ns,
                                 leaf=self.clock.leaf, moved_since=self.clock.stepped_at.copy(),
                                 ranges=ranges)  # fmt: skip
        except StageError:
            self.missing_blocks += 1
            return False
        if state is not None and points is not None:  # the summaries stayed with the owners
            state = dataclasses.replace(state, summary_points=points)
        new = self.clock.install(state)
        for stage in self.edges or ():
            stage.install(state)
        return new

    def _state_after(self, k: int, parts: list[Partial]) -> FleetState:
        """The state after judging window ``k``: its baseline and learned-path changes."""
        sig = [p.detection.path_sig[np.isfinite(p.detection.wmin)] for p in parts]
        hop = [p.detection.path_hops[np.isfinite(p.detection.wmin)] for p in parts]
        if sig and sum(len(s) for s in sig):
            if len(sig) == 1:  # one part: its paths are distinct already
                b_sig, b_hops = sig[0], hop[0]
            else:
                all_sig = np.concatenate(sig)
                u, first = np.unique(all_sig, return_index=True)
                b_sig, b_hops = u, np.concatenate(hop)[first]
            b_ns = self.brain.path_baselines(b_sig)
        else:
            b_sig, b_hops, b_ns = (
                np.zeros(0, np.int64),
                np.zeros((0, self._width), np.int32),
                np.zeros(0),
            )
        learned = LearnedPaths.join(
            [*(p.learned for p in parts if len(p.learned)), *self._learned_here], self._width
        )
        self._learned_here = []
        for i in range(len(learned)):
            key = (int(learned.src[i]), int(learned.dst[i]), int(learned.sport[i]))
            self._learned[key] = (learned.hops[i], learned.reply[i])
        since = self._last.window if self._last is not None else NONE
        return self._state(k, since, False, b_sig, b_hops, b_ns, learned)

    def learn(self, paths: LearnedPaths) -> None:
        """Take paths learned where the solver runs (the probers' traced paths, which the
        controller service reads from MQTT): they go to every worker with the next judged
        window's state, as paths in a worker's partial do. Raises ValueError on rows of
        another width than this fabric's."""
        if len(paths) and paths.hops.shape[1] != self._width:
            raise ValueError(f"learned paths of width {paths.hops.shape[1]}, not {self._width}")
        if len(paths):
            self._learned_here.append(paths)

    def _state(
        self, k: int, since: int, full: bool, sig: I64, hops: I32, base: F64, learned: LearnedPaths
    ) -> FleetState:
        st = self.clock.state
        return FleetState(
            k, since, full, st, self.clock.trust(),
            self._first_stamp if self._owners else self.clock.first_stamp,
            tuple(sorted(self.brain.hosts_down())), self._alive_since.copy(), sig, hops,
            np.asarray(base, np.float64), learned,
        )  # fmt: skip

    def state(self, *, full: bool = False) -> FleetState:
        """Return the state to hand workers now: the clock, trust and host facts as they
        are, and the baselines and learned paths changed in the last judged window, or with
        ``full`` every baseline and learned path (for a worker that missed a state or just
        started). Before any window was judged: no changes."""
        k = self._last.window if self._last is not None else NONE
        if full:
            sig, hops, base = self.brain.baselines()
            return self._state(k, NONE, True, sig, hops, base, self._all_learned())
        if self._last is None:
            e = LearnedPaths.empty(self._width)
            return self._state(
                k,
                k,
                False,
                np.zeros(0, np.int64),
                np.zeros((0, self._width), np.int32),
                np.zeros(0),
                e,
            )
        last = self._last
        return self._state(
            k, last.since, False, last.base_sig, last.base_hops, last.base_ns, last.learned
        )

    def host_state(self) -> FleetState:
        """Return the state with no baseline or path changes (clock and host facts only):
        what an in-process worker takes after a presence or an installed clock."""
        k = self._last.window if self._last is not None else NONE
        e = LearnedPaths.empty(self._width)
        return self._state(
            k, k, False, np.zeros(0, np.int64), np.zeros((0, self._width), np.int32), np.zeros(0), e
        )

    def _all_learned(self) -> LearnedPaths:
        if not self._learned:
            return LearnedPaths.empty(self._width)
        keys = np.array(list(self._learned), np.int64).reshape(-1, 3)
        hops = np.stack([h for h, _ in self._learned.values()])
        reply = np.stack([r for _, r in self._learned.values()])
        return LearnedPaths(keys[:, 0].copy(), keys[:, 1].copy(), keys[:, 2].copy(), hops, reply)

    # ---- clock solves elsewhere (a thread) -----------------------------------------------
    def start_solve(self, now_ns: int) -> Callable[[], ClockState | None] | None:
        """If a clock solve is due: mark it started and return the solve to run (pure, may
        run in a worker thread; hand its result to `install_clock`); else None."""
        window = self.clock.start_solve(now_ns)
        if window is None:
            return None
        n, cfg, leaf = self.clock.n_nics, self.clock.config, self.clock.leaf
        return lambda: compute_state(window, n, cfg, now_ns, leaf)

    def install_clock(self, state: ClockState | None, cost_ns: int | None = None) -> bool:
        """Install a clock state solved elsewhere; return True if it was new."""
        return self.clock.install(state, cost_ns)


def _merge_nic(parts: list[Partial], n: int) -> NicDelays:
    """Per NIC the worst of the parts' worst delays."""
    if not any(len(p.nic_owd.nic) for p in parts):
        return NicDelays.empty()
    out = np.full(n, -np.inf, np.float32)
    inn = np.full(n, -np.inf, np.float32)
    for p in parts:
        d = p.nic_owd
        np.fmax.at(out, d.nic, np.nan_to_num(d.worst_out, nan=-np.inf))
        np.fmax.at(inn, d.nic, np.nan_to_num(d.worst_in, nan=-np.inf))
    nic = np.flatnonzero(np.isfinite(out) | np.isfinite(inn)).astype(np.int32)

    def fix(a: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return np.where(np.isfinite(a[nic]), a[nic], np.nan).astype(np.float32)

    return NicDelays(nic, fix(out), fix(inn))


def _check_fits(p: Partial, fabric: Fabric) -> None:
    """Raise `PartialError` when an index of ``p`` lies outside ``fabric``."""
    n_nics, n_links, n_hops = len(fabric.nics), len(fabric.links), fabric.n_hops
    checks: list[tuple[str, npt.NDArray[np.integer], int]] = [
        ("clock src", p.clock.src, n_nics), ("clock dst", p.clock.dst, n_nics),
        ("NIC", p.detection.nic, n_nics), ("lost link", p.detection.lost, n_links),
        ("path hop", p.detection.path_hops, n_hops), ("slow hop", p.detection.slow_hops, n_hops),
        ("fine delay NIC", p.detection.fine_flows[:, :2], n_nics),
        ("flow NIC", p.detection.flow[:, :2], n_nics), ("NIC delay", p.nic_owd.nic, n_nics),
        ("learned hop", p.learned.hops, n_hops), ("learned reply hop", p.learned.reply, n_hops),
        ("moved clock", p.moved.nic, n_nics),
    ]  # fmt: skip
    for what, a, top in checks:
        if a.size and (int(a.max()) >= top or int(a.min()) < -1):
            raise PartialError(f"{what} index outside the fabric")
    for what, a in (
        ("clock src", p.clock.src),
        ("clock dst", p.clock.dst),
        ("NIC", p.detection.nic),
        ("fine delay NIC", p.detection.fine_flows[:, :2]),
        ("flow NIC", p.detection.flow[:, :2]),
        ("moved clock", p.moved.nic),
    ):
        if a.size and int(a.min()) < 0:
            raise PartialError(f"{what} index outside the fabric")
