"""The ingest worker's core: probe batches in, one `Partial` per window of the fleet grid out.

`FleetWorker(fabric, config)` is what an ingest worker process runs (and what
`controller.live.LiveController` runs for its one process): `admit` judges a batch
(`controller.admission`: decode, origin, replay, duplicate) and ingests it at once (or queued,
`flush`); `learn_paths` takes discovered paths; `install_clock` (bytes) / `install`
(`controller.fleet.state.FleetState`) takes what the solver decided after a window; `close`
hands every window that is over as a `Partial`, oldest first.

Ingesting a batch: map it onto the fabric (`controller.ingest`), one-way delays with the
installed clock models (`controller.clocksync.ClockSync.delays`), `Observations`; each record
goes to the window of its send time on the controller's timebase, kept between the oldest
window still open and the window it arrived in (a record older than every open window goes
into the oldest; one stamped after its arrival into the arrival's). Per window the worker
keeps the clock selection (a `controller.clocksync.ClockSync` used for its selection only:
per directed pair and clock bin the coded pair of lowest round trip), the brain's
accumulators (`controller.detect.window.DetectionWindow`, delays judged against the
baselines the solver folded), the batches covered, the paths learned, the worst delay per
NIC and the counts. Nothing is judged here that needs another worker's records: that is the
solver's. Pure: time is passed in, nothing reads a clock, a file or the network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.records import ProbeBatch
from controller.admission import Admission, Outcome, Verdict
from controller.clocksync import (
    ClockSync,
    ClockTrust,
    Delays,
    PairSlots,
    SampleRows,
    coded_partners,
)
from controller.coalesce import ProbeQueue
from controller.detect.causes import excluded_nics
from controller.detect.paths import PathIndex
from controller.detect.window import DetectionWindow, WindowPart
from controller.fleet.config import FleetConfig
from controller.fleet.partial import (
    Covers,
    LearnedPaths,
    MovedClocks,
    NicDelays,
    Partial,
    RecordCounts,
    fabric_id,
)
from controller.fleet.state import FleetState, decode_state
from controller.fleet.watermark import Watermarks
from controller.ingest import Ingested, Ingestor, IngestStats, PathTable
from controller.observations import Observations
from controller.windows import FlowStore
from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT, routing_tables
from mesh.fabric.model import SWITCH_TIER, NodeKind, hop_id

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
EARLY_NS = 10_000_000_000
"""How long before a prober's start a probe sent to its host is taken for a loss of that start
(no responder yet) and not judged. Start-up races are a second or less; a probe stamped further
back is judged as before: stamps on another time base than the controller's clock (a
free-running NIC clock) must not blind the controller to a host."""


@dataclass(eq=False)
class _Open:
    """What a worker keeps of one open window."""

    detect: DetectionWindow
    select: ClockSync
    covers: set[tuple[str, int]] = field(default_factory=set)
    worst_out: npt.NDArray[np.float32] | None = None
    worst_in: npt.NDArray[np.float32] | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, n: int) -> None:
        if n:
            self.counts[key] = self.counts.get(key, 0) + n


class FleetWorker:
    """One ingest worker (see the module docstring). Not thread-safe: one owner.

    ``name``: how its partials name it; ``paths``: a path table to share (default: its own);
    ``observers``: called with every `Observations` the worker makes (the time-series
    recorder, a benchmark's tap); ``on_stage``: called with the name of each ingest stage as
    it ends (``ingest``, ``sync_add``, ``delays``, ``detect``), for profiling; ``owners``: NIC
    id -> host for the origin checks of probe batches, read as it changes (a learned fabric's
    claimed NICs, `contract.origin.claimed_nics`); None: the fabric's."""

    def __init__(
        self,
        fabric: Fabric,
        config: FleetConfig | None = None,
        *,
        name: str = "worker",
        paths: PathTable | None = None,
        observers: Sequence[Callable[[Observations], object]] = (),
        on_stage: Callable[[str], object] | None = None,
        owners: Mapping[str, str] | None = None,
    ) -> None:
        self.fabric = fabric
        self.config = config or FleetConfig()
        self.name = name
        self.observers = list(observers)
        self._on_stage = on_stage
        n = len(fabric.nics)
        self._admission = Admission(fabric, owners=owners)
        self._ingestor = Ingestor(fabric, paths)
        self._width = routing_tables(fabric).max_hops
        self._clock = ClockSync(n, self.config.sync, whole=False)  # delays: the solver's state
        self._paths = PathIndex(self._width)  # path numbering and the solver's baselines
        self._pairs = PathIndex(2 * self._width)
        self._excluded = np.zeros(n, bool)
        self._alive_since = np.zeros(len(fabric.hosts), np.int64)
        self._first_stamp: int | None = None
        self._slots = PairSlots(n)  # directed pairs, numbered once for every window's selection
        self._floor: int | None = None  # oldest window still open (None: nothing yet)
        self._marks = Watermarks(len(fabric.hosts))  # per host, the newest send time ingested
        self._open: dict[int, _Open] = {}
        self._skip: dict[int, set[tuple[str, int]]] = {}
        self._state_window: int | None = None
        self._gap = False
        self._learned: list[LearnedPaths] = []  # learned since the last partial
        self._verdicts: dict[str, int] = {}  # admission verdicts since the last partial
        self._pending: list[tuple[str, int, int]] = []  # queued: (origin, batch_seq, records)
        self.flows = FlowStore(n, self.config.baseline_bucket_ns)
        self._hop_spine = _hop_spine_table(fabric)
        self.records = 0
        self.delay_trust = np.zeros(3, np.int64)  # arrived delays: fine, coarse, withheld
        self.now_ns = 0
        self._fabric_id = fabric_id(fabric)

    def refabric(self, fabric: Fabric, config: FleetConfig | None = None) -> FleetWorker:
        """Return a worker of ``fabric`` (a fabric replaced under a running controller,
        `controller.live.LiveController.replace_fabric`; ``config``: None, this one's) that
        keeps what does not depend on the fabric's numbering: the admission's replay and
        duplicate memory and verdict counts (origins judged by ``fabric`` from now on unless
        owners were given: `Admission.fabric_changed`), the ingest counters, the records and
        delay trust counted, whether model paths are used, its name, observers and stage
        hook. What is indexed by the old fabric starts again: open windows, clock models,
        paths, baselines and flows; this worker is not to be used any more."""
        new = FleetWorker(fabric, config or self.config, name=self.name,
                          observers=self.observers, on_stage=self._on_stage)  # fmt: skip
        self._admission.fabric_changed(fabric)
        new._admission = self._admission
        new._ingestor.stats = self._ingestor.stats
        new._ingestor.use_model_paths = self._ingestor.use_model_paths
        new.records, new.delay_trust, new.now_ns = self.records, self.delay_trust, self.now_ns
        return new

    # ---- inputs --------------------------------------------------------------------------
    def admit(
        self,
        host: str | None,
        payload: bytes | ProbeBatch,
        now_ns: int,
        *,
        queue: ProbeQueue | None = None,
    ) -> Verdict:
        """Judge one probe batch (`controller.admission.Admission.judge`: a payload decoded,
        checked against ``host``, the host of the topic it came on; None: a source the caller
        trusts) and take it when accepted: ingested now, or with ``queue`` queued to be
        ingested merged by `flush`. ``now_ns``: its arrival. Returns the frozen verdict (its
        records: those taken). Bad input is a verdict, never an exception."""
        verdict, taken = self._admission.judge(payload, host, now_ns)
        self.now_ns = max(self.now_ns, now_ns)
        v = verdict.outcome.value
        self._verdicts[v] = self._verdicts.get(v, 0) + 1
        if taken is None:
            return verdict
        if queue is not None:
            queue.add(taken, now_ns)
            self._pending.append((taken.origin, taken.batch_seq, len(taken)))
            return verdict
        return Verdict(
            Outcome.ACCEPTED,
            records=self._ingest(taken, now_ns, [(taken.origin, taken.batch_seq, len(taken))]),
        )

    def flush(self, queue: ProbeQueue, now_ns: int) -> int:
        """Ingest everything ``queue`` holds (queued by `admit`), merged
        (`controller.coalesce`); return the records taken."""
        groups = queue.take()
        pending, self._pending = self._pending, []
        if self._on_stage is not None:
            self._on_stage("merge")
        got, i = 0, 0
        for m in groups:
            parts = pending[i : i + len(m.parts)]
            i += len(m.parts)
            got += self._ingest(m.batch, now_ns, parts)
        return got

    def learn_paths(
        self,
        src: I64,
        dst: I64,
        sport: I64,
        hops: I32,
        reply_hops: I32 | None = None,
    ) -> None:
        """Learn the forward hop ids of flows (src, dst, sport) (rows of ``hops``, -1 padded
        to `max_hops`) and those of their replies (``reply_hops``, same shape; None: the
        reverse hops back, as a symmetric L4 hash routes them); they also travel in the next
        partial `close` hands out to the solver, which hands them to every worker. Raises
        `controller.ingest.IngestError` on rows of the wrong shape."""
        learned = _learned(src, dst, sport, hops, reply_hops, self.max_hops)
        self._apply_learned(learned)
        if len(learned):
            self._learned.append(learned)

    def know_paths(self, src: I64, dst: I64, sport: I64, hops: I32) -> None:
        """Learn flows' forward hops (as `learn_paths`, replies mirrored) that every worker
        knows already (a learned fabric's traced paths, published with it): they are not
        sent to the solver again. Raises `controller.ingest.IngestError` on bad rows."""
        self._apply_learned(_learned(src, dst, sport, hops, None, self.max_hops))

    def take_learned(self) -> LearnedPaths:
        """Return the paths learned since the last partial and forget them (they will not
        travel in one): for a solver process, whose own worker makes no partials, to hand
        them to its solver (`controller.fleet.solver.FleetSolver.learn`)."""
        learned = LearnedPaths.join(self._learned, self.max_hops)
        self._learned = []
        return learned

    def _apply_learned(self, lp: LearnedPaths) -> None:
        if len(lp):
            self._ingestor.paths.update(lp.src, lp.dst, lp.sport, lp.hops)
            self._ingestor.reply_paths.update(lp.src, lp.dst, lp.sport, lp.reply)

    def install_clock(self, models: bytes) -> None:
        """Take the solver's latest state (`controller.fleet.solver.SolveResult.clock`: clock
        models and their trust, baselines, hosts down, learned paths). Raises
        `controller.fleet.state.StateError` on a payload that is not a state of this fabric."""
        self.install(decode_state(models, len(self.fabric.nics), len(self.fabric.hosts)))

    def install(self, state: FleetState) -> None:
        """Take a solver state (see `install_clock`). A state whose changes start after the
        last one taken (a state missed) is taken all the same; `needs_full` then says so."""
        self._clock.adopt(state.clock, state.trust)
        if state.first_stamp is not None:
            mine = self._first_stamp
            self._first_stamp = state.first_stamp if mine is None else min(mine, state.first_stamp)
        self._excluded = excluded_nics(self.fabric, state.hosts_down)
        self._alive_since = np.asarray(state.alive_since, np.int64).copy()
        if len(state.base_sig):
            self._paths.install(state.base_sig, _fit(state.base_hops, self._width), state.base_ns)
        self._apply_learned(state.learned)
        last = self._state_window
        if state.full:
            self._gap = False
        elif last is not None and state.since > last:
            self._gap = True
        self._state_window = state.window if last is None else max(last, state.window)

    @property
    def needs_full(self) -> bool:
        """True when a state taken started after the one before it ended (baselines or
        learned paths were missed) until a full state (`FleetSolver.state(full=True)`) mends
        it. A worker's first state need not be full: it had nothing to miss."""
        return self._gap

    def exclude(self, window: int, covers: Covers) -> None:
        """Records of the batches ``covers`` names that fall into ``window`` are dropped
        (counted ``covered``): another worker's partial of that window already holds them (a
        partition taken over mid-window, its batches delivered again)."""
        self._skip.setdefault(window, set()).update(covers.batches())

    # ---- ingest --------------------------------------------------------------------------
    def _window_at(self, t_ns: int) -> int:
        """The open window a record sent at ``t_ns`` (or an event then) goes into."""
        self._open_floor(t_ns)
        assert self._floor is not None
        return max(self._floor, self.config.grid.index(t_ns))

    def _open_floor(self, now_ns: int) -> None:
        if self._floor is None:  # the first input: open one window more than lateness allows
            self._floor = self.config.grid.index(now_ns) - 1 - self.config.late_windows

    def _window(self, k: int) -> _Open:
        w = self._open.get(k)
        if w is None:
            f = self.fabric
            w = _Open(
                DetectionWindow.empty(len(f.links), f.n_hops, len(f.nics), self._pairs),
                ClockSync(
                    len(f.nics),
                    self.config.sync,
                    first_stamp=self._first_stamp,
                    slots=self._slots,
                    remember=False,  # one window's selection: the floors are the solver's
                ),
            )
            self._open[k] = w
        return w

    def _ingest(self, batch: ProbeBatch, now_ns: int, parts: list[tuple[str, int, int]]) -> int:
        """Ingest an admitted batch (merged from ``parts``: origin, batch_seq, records);
        return the records taken."""
        self.now_ns = max(self.now_ns, now_ns)
        stage = self._on_stage
        st0 = dataclasses.replace(self._ingestor.stats)
        ing = self._ingestor.ingest(batch, [(o, n) for o, _, n in parts])
        arrival = self._window(self._window_at(now_ns))
        arrival.add(
            "unknown_nic", self._ingestor.stats.unknown_nic_records - st0.unknown_nic_records
        )
        arrival.add("unstamped", self._ingestor.stats.unstamped_records - st0.unstamped_records)
        if stage is not None:
            stage("ingest")
        if not len(ing):
            return 0
        if self._first_stamp is None:
            self._first_stamp = int(ing.t1.min())
        self._clock.remember(ing, now_ns)  # floors for the delays' bad-stamp and move checks
        d = self._clock.delays(ing)
        if stage is not None:
            stage("sync_add")
        obs = self._observations(ing, d, now_ns)
        self._marks.note(self.fabric.nic_host_index[obs.src], obs.t_ns)
        if stage is not None:
            stage("delays")
        assert self._floor is not None
        top = self.config.grid.index(now_ns)
        k = np.clip(self.config.grid.indices(obs.t_ns), self._floor, max(top, self._floor))
        first, second = coded_partners(ing.pair, ing.t1)
        if len(first):
            k[second] = k[first]  # a coded pair stays in one window: its first probe's
        batch_of = ing.part if ing.part is not None else np.zeros(len(ing), np.int32)
        keep = np.ones(len(ing), bool)
        if self._skip:
            for kk, skip in self._skip.items():
                if skip:
                    hit = (k == kk) & np.isin(
                        batch_of, [i for i, p in enumerate(parts) if (p[0], p[1]) in skip]
                    )
                    keep &= ~hit
        if self._alive_since.any():  # sent to a host before its prober was alive: no evidence
            ahead = self._alive_since[self.fabric.nic_host_index[ing.dst]] - d.t_ns
            early = (ahead > 0) & (ahead <= EARLY_NS)
        else:
            early = None
        k_lo, k_hi = int(k.min()), int(k.max())
        for kk in range(k_lo, k_hi + 1):
            in_k = k == kk if k_lo != k_hi else np.ones(len(k), bool)
            rows = keep & in_k
            n_rows = int(rows.sum())
            if n_rows < int(in_k.sum()):
                self._window(kk).add("covered", int(in_k.sum()) - n_rows)
            if not n_rows:
                continue
            w = self._window(kk)
            sub_ing = ing if n_rows == len(ing) else _select_ing(ing, rows)
            sub_obs = obs if n_rows == len(ing) else obs.select(rows)
            sub_d_lost = sub_ing.lost
            fine, coarse, withheld = _trust(sub_d_lost, sub_obs)
            w.add("fine", fine)
            w.add("coarse", coarse)
            w.add("withheld", withheld)
            self.delay_trust += np.array([fine, coarse, withheld], np.int64)
            w.select.add(sub_ing)
            if early is not None:
                e = early[rows] if n_rows != len(ing) else early
                if e.any():
                    w.add("early", int(e.sum()))
                    sub_obs = sub_obs.select(~e)
            w.detect.fold(sub_obs, self._paths, self._excluded, self.config.detection.delay)
            _worst(w, sub_obs, len(self.fabric.nics))
            w.add("records", len(sub_obs))
            if len(parts) == 1:
                w.covers.add((parts[0][0], parts[0][1]))
            else:  # which parts put rows here (a count, not np.unique: no sort, no hash)
                for i in np.flatnonzero(np.bincount(batch_of[rows], minlength=len(parts))):
                    w.covers.add((parts[int(i)][0], parts[int(i)][1]))
        if self.observers:
            seen = keep if early is None else keep & ~early
            shown = obs if seen.all() else obs.select(seen)
            for observe in self.observers:
                observe(shown)
        n = int(keep.sum())
        self.records += n
        if stage is not None:
            stage("detect")
        return n

    def _observations(self, ing: Ingested, d: Delays, now_ns: int) -> Observations:
        """The batch as `Observations`; its forward delays recorded per flow (`flows`)."""
        slots = ing.flow
        new = self.flows.unregistered(slots)
        if new.any():
            s, hops = slots[new], ing.hops_fwd[new]
            spine = _path_spine(self._hop_spine, hops)
            self.flows.register(s, ing.src[new], ing.dst[new], ing.sport[new], spine)
        self.flows.update(slots, d.t_ns, d.fine()[0], now_ns)  # what the API shows: fine
        return Observations(
            d.t_ns, ing.src, ing.dst, ing.sport, ing.hops_fwd, ing.hops_rev, ing.lost,
            d.owd_fwd_ns, d.owd_rev_ns, d.rtt_ns, d.coarse, np.full(len(ing), ing.stamp == "sw"),
        )  # fmt: skip

    # ---- outputs -------------------------------------------------------------------------
    def close(self, upto_ns: int) -> list[Partial]:
        """Return a `Partial` for every window whose end + ``lateness_ns`` <= ``upto_ns``,
        that is whole (every live prober's batches cover it, or a bound passed:
        `controller.fleet.watermark`; a short one says how short in its counts) and that was
        not handed out before, oldest first (an empty one for a window without records: the
        solver knows the worker had nothing); records that arrive later go into the oldest
        window still open."""
        grid, cfg = self.config.grid, self.config
        self.now_ns = max(self.now_ns, upto_ns)
        top = grid.closed_before(upto_ns, cfg.lateness_ns)
        live = self._live_hosts()
        until = self._marks.close_until(live, upto_ns, cfg.wait_ns) if cfg.wait_ns else None
        if until is not None:  # a window waits for every live prober's batches (bounded)
            top = min(top, grid.closed_before(until))
        if self._floor is None:
            self._floor = top
            return []
        if top - self._floor <= self.config.max_gap:
            ks: Sequence[int] = range(self._floor, top)
        else:  # a long silence (or a clock jump): its windows with records, then the last
            ks = sorted({k for k in self._open if self._floor <= k < top} | {top - 1})
        out = [self._partial(k, live) for k in ks]
        for k in sorted(k for k in self._open if k < top):  # nothing left behind the floor
            out.append(self._partial(k, live))
        if out and (self._learned or self._verdicts):
            p = out[0]
            v = RecordCounts(verdicts=tuple(sorted(self._verdicts.items())))
            learned = LearnedPaths.join([p.learned, *self._learned], self.max_hops)
            out[0] = dataclasses.replace(p, learned=learned, counts=p.counts + v)
            self._learned, self._verdicts = [], {}
        if out:  # clocks found moved, for the solver to mark everywhere
            out[0] = dataclasses.replace(out[0], moved=MovedClocks(*self._clock.take_moves()))
        self._floor = max(self._floor, top)
        for k in [k for k in self._skip if k < self._floor]:
            del self._skip[k]
        return out

    def _live_hosts(self) -> npt.NDArray[np.bool_]:
        """Per host: its prober is not down (some NIC of it not excluded)."""
        hosts = self.fabric.nic_host_index
        n = len(self.fabric.hosts)
        down = np.bincount(hosts[self._excluded], minlength=n)
        return np.asarray(down < np.bincount(hosts, minlength=n))

    def _partial(self, k: int, live: npt.NDArray[np.bool_]) -> Partial:
        # short of late probers: only where windows wait for them (wait 0: on the grid)
        short = self._marks.short(live, self.config.grid.end(k)) if self.config.wait_ns else 0
        w = self._open.pop(k, None)
        if w is None:
            return Partial(
                k, self.name, self.config.grid.width_ns, self._fabric_id, self._first_stamp,
                Covers.of([]), SampleRows.empty(), WindowPart.empty(self._width),
                LearnedPaths.empty(self.max_hops), NicDelays.empty(), RecordCounts(short=short),
            )  # fmt: skip
        sel = w.select.window()
        clock = SampleRows.empty() if sel is None else sel.rows()
        counts = RecordCounts(batches=len(w.covers), short=short)
        counts = dataclasses.replace(counts, **w.counts)  # type: ignore[arg-type]
        return Partial(
            k, self.name, self.config.grid.width_ns, self._fabric_id, self._first_stamp,
            Covers.of(w.covers), clock, w.detect.export(self._paths),
            LearnedPaths.empty(self.max_hops), _nic_delays(w), counts,
        )  # fmt: skip

    # ---- what the one-process controller reads ------------------------------------------
    @property
    def newest_send_ns(self) -> int:
        """Return the newest send time ingested from any host (-1: none)."""
        return self._marks.newest()

    @property
    def max_hops(self) -> int:
        """Return the most hops a learnt path may have."""
        return self._ingestor.max_hops

    def use_model_paths(self, enabled: bool) -> None:
        """Trust the fabric model's ECMP hash for flows without a learnt path (or not)."""
        self._ingestor.use_model_paths = enabled

    def paths(
        self, src: I64, dst: I64, sport: I64, dport: int = ROCEV2_PORT
    ) -> tuple[I32, I32, npt.NDArray[np.bool_]]:
        """Return (forward hops, reply hops, known mask) probes of flows would be given now."""
        return self._ingestor.lookup(src, dst, sport, dport)

    def verdicts(self) -> dict[Outcome, int]:
        """Return how many batches `admit` gave each outcome."""
        return dict(self._admission.counts)

    def ingest_stats(self) -> IngestStats:
        """Return a copy of the ingest counters."""
        st = self._ingestor.stats
        return dataclasses.replace(st, origins=dict(st.origins))

    def clock_trust(self) -> ClockTrust:
        """Return the clock trust in use (the solver's)."""
        return self._clock.trust()


def _learned(
    src: Any, dst: Any, sport: Any, hops: Any, reply_hops: Any, width: int
) -> LearnedPaths:
    from controller.ingest import IngestError

    h = np.asarray(hops, np.int32)
    if h.ndim != 2 or h.shape[0] != len(src) or h.shape[1] > width:
        raise IngestError(f"hops must have shape ({len(src)}, <= {width})")
    if reply_hops is None:
        reply = np.full_like(h, -1)
        for i in range(len(h)):
            ids = h[i][h[i] >= 0]
            reply[i, : len(ids)] = ids[::-1] ^ 1  # reverse_hop, vectorized
    else:
        reply = np.asarray(reply_hops, np.int32)
        if reply.shape != h.shape:
            raise IngestError(f"reply hops must have shape {h.shape}")
    return LearnedPaths(
        np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(sport, np.int64),
        _fit(h, width), _fit(reply, width),
    )  # fmt: skip


def _fit(rows: I32, width: int) -> I32:
    """Rows padded (-1) or cut to ``width`` columns."""
    if rows.shape[1] == width:
        return rows
    out = np.full((len(rows), width), -1, np.int32)
    w = min(width, rows.shape[1])
    out[:, :w] = rows[:, :w]
    return out


def _select_ing(ing: Ingested, rows: npt.NDArray[np.bool_]) -> Ingested:
    """The rows ``rows`` of an ingested batch."""
    kw = {f.name: getattr(ing, f.name) for f in dataclasses.fields(ing)}
    for k, v in kw.items():
        if isinstance(v, np.ndarray):
            kw[k] = v[rows]
    return Ingested(**kw)


def _trust(lost: npt.NDArray[np.bool_], obs: Observations) -> tuple[int, int, int]:
    """(fine, coarse, withheld) counts of the arrived probes' delays."""
    ok = ~lost
    known = ok & np.isfinite(obs.owd_fwd_ns)
    coarse = int((known & obs.coarse).sum())
    n_known = int(known.sum())
    return n_known - coarse, coarse, int(ok.sum()) - n_known


def _worst(w: _Open, obs: Observations, n: int) -> None:
    """Fold the worst fine forward delay per source and destination NIC."""
    fine = np.isfinite(obs.owd_fwd_ns) & ~obs.coarse
    if not fine.any():
        return
    if w.worst_out is None or w.worst_in is None:
        w.worst_out = np.full(n, -np.inf, np.float32)
        w.worst_in = np.full(n, -np.inf, np.float32)
    v = obs.owd_fwd_ns[fine].astype(np.float32)
    np.maximum.at(w.worst_out, obs.src[fine], v)
    np.maximum.at(w.worst_in, obs.dst[fine], v)


def _nic_delays(w: _Open) -> NicDelays:
    if w.worst_out is None or w.worst_in is None:
        return NicDelays.empty()
    nic = np.flatnonzero(np.isfinite(w.worst_out) | np.isfinite(w.worst_in)).astype(np.int32)
    out, inn = w.worst_out[nic], w.worst_in[nic]
    return NicDelays(nic, np.where(np.isfinite(out), out, np.nan).astype(np.float32),
                     np.where(np.isfinite(inn), inn, np.nan).astype(np.float32))  # fmt: skip


def _hop_spine_table(fabric: Fabric) -> I64:
    """Per directed hop: (tier << 32 | switch index) of the link's upper switch."""
    sidx = {s.id: i for i, s in enumerate(fabric.switches)}
    out = np.full(fabric.n_hops + 1, -1, np.int64)  # last entry: padding hop -1
    for lk in fabric.links:
        node = fabric.node_by_id.get(lk.upper)
        if node is not None and node.kind != NodeKind.HOST:
            v = (SWITCH_TIER[node.kind] << 32) | sidx[lk.upper]
            out[hop_id(lk.index, down=False)] = out[hop_id(lk.index, down=True)] = v
    return out


def _path_spine(table: I64, hops: I32) -> I32:
    """Switch index of the highest-tier switch each path crosses (-1 if none known)."""
    if hops.shape[1] == 0:
        return np.full(hops.shape[0], -1, np.int32)
    best = table[hops].max(axis=1)  # hop -1 indexes the padding entry (-1)
    return np.where(best >= 0, best & 0xFFFFFFFF, -1).astype(np.int32)
