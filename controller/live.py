"""The live controller state: admission -> ingest -> clock sync -> detection, behind
`SnapshotSource`.

`LiveController(fabric, config)` is one fleet worker and the fleet's solver in one process
(`controller.fleet`): the worker (`FleetWorker`: admission, ingest, one-way delays with the
solver's clock models, the clock selection and the detection evidence per window of the
fleet grid, a `FlowStore` of the latest delay per flow) and the solver (`FleetSolver`: the
clock solve, the detection brain). Probe batches enter through one door, `admit` (a payload
and its topic's host, or a decoded batch; a frozen `controller.admission.Verdict` out), and
are ingested at once or queued to be ingested merged by `flush`; other inputs are
`presence`, `gpu`, `nic_links`, `nic_counters` and `learn_paths`; `replace_fabric` is the one
door that swaps the fabric under a running controller (`controller.refabric` says what
survives). Every brain is wrapped in `controller.measured.Measured`: what nobody measured
lately is unknown. Call `tick(now_ns)`
periodically (it closes the windows that are over, which solves clocks when due and runs
detection, records per-NIC history, returns new events); read `snapshot()` / `history()`.
Every time-dependent call takes ``now_ns`` (same epoch as the NIC clocks, UNIX ns in
production); nothing reads a clock.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from contract.records import ProbeBatch
from controller.admission import Outcome, Verdict
from controller.behind import BehindMeter, degrade, mark_degraded, short_window
from controller.brain import Brain, BrainConfig
from controller.brainlike import BrainLike
from controller.clocksync import ClockState, ClockSync, ClockSyncConfig
from controller.coalesce import ProbeQueue
from controller.control import Control
from controller.fleet.config import FleetConfig
from controller.fleet.grid import WindowGrid
from controller.fleet.solver import FleetSolver
from controller.fleet.watermark import WAIT_NS
from controller.fleet.worker import EARLY_NS, FleetWorker
from controller.ingest import IngestStats, PathTable
from controller.jobs import JobRegistry, screen_jobs
from controller.measured import Measured
from controller.observations import Observations
from controller.refabric import remap_columns, topology_event
from controller.throughput import NicRates
from controller.windows import FlowStore
from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT
from mesh.fabric.plancheck import fabric_changes
from mesh.snapshot import ControlUnavailable, GpuHealth, Health, MeshSnapshot, PairPaths

F64 = npt.NDArray[np.float64]
__all__ = ["EARLY_NS", "LiveConfig", "LiveController"]


def brain_config(options: Mapping[str, Any] | None = None) -> BrainConfig:
    """Return `controller.brain.BrainConfig` with ``options`` applied (nested tables such as
    ``loss = {...}`` update the nested parameter dataclasses). Raises ValueError naming the
    bad option."""
    base = BrainConfig()
    kw: dict[str, Any] = {}
    try:
        for key, value in dict(options or {}).items():
            if not hasattr(base, key):
                raise ValueError(f"unknown detection threshold {key!r}")
            cur = getattr(base, key)
            if isinstance(value, dict) and dataclasses.is_dataclass(cur):
                kw[key] = dataclasses.replace(cur, **value)  # type: ignore[type-var]
            else:
                kw[key] = value
        return BrainConfig(**kw)
    except TypeError as exc:
        raise ValueError(f"bad detection thresholds: {exc}") from None


def default_brain(fabric: Fabric, options: Mapping[str, Any] | None = None) -> BrainLike:
    """Return `controller.brain.Brain(fabric, brain_config(options))`; raises ValueError."""
    return Brain(fabric, brain_config(options))


@dataclass(frozen=True)
class LiveConfig:
    """Live-state knobs: clock sync, the fleet window grid (``window_ns``: the detection
    windows, `controller.fleet.grid.WindowGrid`; the service's tick), delay staleness,
    history and event bounds; ``wait_ns``: how long past its end a window some prober's batches
    cover waits for every live prober's (`controller.fleet.watermark`; 0: it does not)."""

    sync: ClockSyncConfig = field(default_factory=ClockSyncConfig)
    window_ns: int = 1_000_000_000
    stale_ns: int = 10_000_000_000  # flows not measured for this long leave the snapshot
    throughput_stale_ns: int = 60_000_000_000  # NIC rates older than this leave the average
    baseline_bucket_ns: int = 60_000_000_000
    history_len: int = 3600  # ticks kept per NIC
    max_events: int = 200
    solve_inline: bool = True  # False: the owner runs clock solves (e.g. in a worker thread)
    wait_ns: int = WAIT_NS  # a window waits for every live prober's batches this long at most

    def __post_init__(self) -> None:
        if self.stale_ns <= 0 or self.history_len < 1 or self.max_events < 1:
            raise ValueError("stale_ns, history_len and max_events must be positive")
        if self.window_ns <= 0:
            raise ValueError("window_ns must be positive")


STAGES = ("merge", "ingest", "sync_add", "sync_solve", "delays", "detect")
"""The stages of an ingest, in order, as `LiveController`'s ``on_stage`` names them: merging
queued batches (`flush` only), mapping onto the fabric (with the admission check when it ran
in the same call), adding to the clock windows, a clock solve (when due and inline), one-way
delays and observations, detection."""


class LiveController:
    """In-process controller state; implements `mesh.snapshot.SnapshotSource`.

    One worker and the solver of a fleet in one process (`controller.fleet`): batches go
    through `controller.fleet.worker.FleetWorker`, each tick closes the windows of the grid
    that are over into partials and `controller.fleet.solver.FleetSolver` judges them, and
    the worker takes the solver's state at once. The embedded demo, the service, the
    testbed and the simulator's benchmarks run the fleet's code this way.

    ``on_stage``: called with the name of each stage of an ingest (`STAGES`) as it ends, for
    profiling (`qpmesh sim ingest` times the stages with it); None in production.
    ``owners``: NIC id -> host for the origin checks of probe batches, read as it changes
    (a learned fabric's claimed NICs, `contract.origin.claimed_nics`); None: the fabric's."""

    def __init__(
        self,
        fabric: Fabric,
        config: LiveConfig | None = None,
        *,
        brain: BrainLike | None = None,
        paths: PathTable | None = None,
        on_stage: Callable[[str], object] | None = None,
        owners: Mapping[str, str] | None = None,
    ) -> None:
        self.fabric = fabric
        self.config = config or LiveConfig()
        n = len(fabric.nics)
        the_brain = self._measured(fabric, brain)
        self.fleet = self._fleet_config(the_brain)
        self.worker = FleetWorker(
            fabric, self.fleet, name="local", paths=paths, observers=[self._tap],
            on_stage=on_stage, owners=owners,
        )  # fmt: skip
        # each NIC's leaf: the hardware-stamp solve splits the queueing left in the best
        # samples into a part per NIC downlink and one per leaf uplink (`sync.excess`)
        self.solver = FleetSolver(
            fabric, self.fleet, brain=the_brain, solve_inline=self.config.solve_inline
        )
        self._fabric_since_ns = 0  # when the fabric was last replaced (older solves refused)
        self.events: deque[EventDoc] = deque(maxlen=self.config.max_events)
        self.gpu_state: dict[str, GpuHealth] = {}
        self.rates = NicRates()  # NIC byte counters from health documents -> throughput
        self.alive: dict[str, bool] = {}
        self.now_ns = 0
        self._hist_t = np.zeros(self.config.history_len, np.int64)
        # float32: ns delays need no more, and at 10,000 NICs x 3600 ticks float64 is 288 MB
        self._hist_v = np.full((self.config.history_len, n), np.nan, np.float32)
        self._hist_head = 0
        self._hist_count = 0
        self._control: Control | None = None
        self._jobs: JobRegistry | None = None
        self._actor = ""
        self.behind = BehindMeter()  # the controller's own lateness (issue 32)

    def _measured(self, fabric: Fabric, brain: BrainLike | None) -> BrainLike:
        """``brain`` (None: `default_brain`) under the unknown rule: no measurement within
        ``stale_ns``, unknown, whatever the brain's table says (issue 33)."""
        return Measured(
            brain if brain is not None else default_brain(fabric), fabric, self.config.stale_ns
        )

    def _fleet_config(self, brain: BrainLike) -> FleetConfig:
        """The fleet settings of this process's worker and solver: the grid of
        ``window_ns``, ``brain``'s lateness and thresholds, the clock sync's."""
        return FleetConfig(
            grid=WindowGrid(self.config.window_ns),
            lateness_ns=brain.config.lateness_ns,
            sync=self.config.sync,
            detection=brain.config,
            baseline_bucket_ns=self.config.baseline_bucket_ns,
            wait_ns=self.config.wait_ns,
        )

    @property
    def brain(self) -> BrainLike:
        """Return detection (the solver's brain)."""
        return self.solver.brain

    @brain.setter
    def brain(self, brain: BrainLike) -> None:
        """Put a brain (e.g. the same one tee'd to the time series) in the solver's hands."""
        self.solver.brain = brain

    def _tap(self, obs: Observations) -> None:
        self.solver.brain.tap(obs)

    @property
    def clock(self) -> ClockSync:
        """Return the clock sync that solves (the solver's: offsets, state, solves)."""
        return self.solver.clock

    @property
    def flows(self) -> FlowStore:
        """Return the latest delay, spine and baseline per flow (the worker's)."""
        return self.worker.flows

    @property
    def records(self) -> int:
        """Return the records ingested."""
        return self.worker.records

    @property
    def delay_trust(self) -> npt.NDArray[np.int64]:
        """Return the arrived probes' delays by clock trust: fine, coarse, withheld."""
        return self.worker.delay_trust

    def attach_remediation(self, control: Control, jobs: JobRegistry, actor: str) -> None:
        """Show ``control`` and ``jobs`` in every snapshot (instead of "unavailable") and let
        `set_control` switch ``control`` on behalf of ``actor`` (e.g. the demo's operator)."""
        self._control, self._jobs, self._actor = control, jobs, actor

    # ---- the service's narrow API ---------------------------------------------------------
    def use_model_paths(self, enabled: bool) -> None:
        """Trust the fabric model's ECMP hash for flows without a learnt path (or not: their
        hops are unknown). Set before any ingest."""
        self.worker.use_model_paths(enabled)

    @property
    def max_hops(self) -> int:
        """Return the most hops a learnt path may have."""
        return self.worker.max_hops

    def learn_paths(
        self,
        src: npt.NDArray[np.int64],
        dst: npt.NDArray[np.int64],
        sport: npt.NDArray[np.int64],
        hops: npt.NDArray[np.int32],
        reply_hops: npt.NDArray[np.int32] | None = None,
    ) -> None:
        """Learn the forward hop ids of flows (src, dst, sport) (rows of ``hops``, -1 padded to
        `max_hops`) and those of their replies (``reply_hops``, same shape; None: the reverse
        hops back, as a symmetric L4 hash routes them). Raises `controller.ingest.IngestError`
        on rows of the wrong shape."""
        self.worker.learn_paths(src, dst, sport, hops, reply_hops)

    def paths(
        self,
        src: npt.NDArray[np.int64],
        dst: npt.NDArray[np.int64],
        sport: npt.NDArray[np.int64],
        dport: int = ROCEV2_PORT,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.bool_]]:
        """Return (forward hops, reply hops, known mask) that probes of flows (src, dst,
        sport -> dport) would be given now: learnt, else the model's (`use_model_paths`),
        else unknown (all -1). Read-only."""
        return self.worker.paths(src, dst, sport, dport)

    def start_solve(self, now_ns: int) -> Callable[[], ClockState | None] | None:
        """If a clock solve is due: mark it started and return the solve to run (pure, may run
        in a worker thread; hand its result to `install_clock`); else None."""
        return self.solver.start_solve(now_ns)

    def install_clock(self, state: ClockState | None, cost_s: float | None = None) -> bool:
        """Install a solved clock state; return True if it was new. ``cost_s``: what the
        solve cost (CPU s, `controller.clocksolve.timed_solve`), which sets how often solves
        are due (`ClockSync.solve_period_ns`). The worker takes it at once. A state solved
        before the fabric was last replaced (`replace_fabric`) is refused: its NIC indices are
        the old fabric's."""
        if state is not None and (
            state.solved_at_ns < self._fabric_since_ns or len(state.models) != self.clock.n_nics
        ):
            return False
        new = self.solver.install_clock(state, None if cost_s is None else round(cost_s * 1e9))
        if new:
            self.worker.install(self.solver.host_state())
        return new

    # ---- inputs --------------------------------------------------------------------------
    def admit(
        self,
        batch: ProbeBatch | bytes,
        now_ns: int,
        *,
        host: str | None = None,
        queue: ProbeQueue | None = None,
    ) -> Verdict:
        """The door every probe batch enters by: judge it (`controller.admission`: decoded
        from a payload, checked against ``host``, the host of the topic it came on, when
        given; replays and duplicates refused) and take it when accepted: ingested now, or
        with ``queue`` queued to be ingested merged with others by `flush` (the checks stay
        per batch, in arrival order, so merging drops exactly what one by one would).

        ``now_ns``: when it arrived (the time of the ingest, or of its place in the queue).
        Returns the frozen verdict, with the records ingested (with ``queue``: queued). Bad
        input is a verdict, never an exception; an exception is a bug."""
        self.now_ns = max(self.now_ns, now_ns)
        verdict = self.worker.admit(host, batch, now_ns, queue=queue)
        if queue is None and verdict.records:
            self.behind.ingested(self.worker.newest_send_ns, now_ns)
        return verdict

    def flush(self, queue: ProbeQueue, now_ns: int) -> int:
        """Ingest everything ``queue`` holds (admitted by `admit`), merged
        (`controller.coalesce`); return the records taken."""
        self.now_ns = max(self.now_ns, now_ns)
        got = self.worker.flush(queue, now_ns)
        if got:
            self.behind.ingested(self.worker.newest_send_ns, now_ns)
        return got

    def presence(self, host: str, alive: bool, now_ns: int, *, since_ns: int | None = None) -> None:
        """Record a prober's liveness (a last-will arrives as alive=False). The first alive
        one, and the first after a last will, starts the host's probes counting as evidence:
        those sent to it before ``since_ns`` (the presence's own time, when the prober
        published it; ``now_ns`` if None, 0 or later than ``now_ns``) are not judged
        (`controller.fleet.worker.EARLY_NS`). Repeated alive presences (a retained one
        delivered again, a prober's reconnect) do not move it."""
        self.now_ns = max(self.now_ns, now_ns)
        self.alive[host] = alive
        self.solver.presence(host, alive, now_ns, since_ns=since_ns)
        self.worker.install(self.solver.host_state())

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int, *, present: bool = True) -> None:
        """Record the GPU health of ``host``."""
        self.now_ns = max(self.now_ns, now_ns)
        self.gpu_state[host] = GpuHealth(present=present, ok=ok, detail=detail)
        self.solver.gpu(host, ok, detail, now_ns)

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        """Record the link state of ``host``'s NICs as its prober read them (``{nic id: up}``)."""
        self.now_ns = max(self.now_ns, now_ns)
        self.solver.nic_links(host, up, now_ns)

    def nic_counters(self, counters: Mapping[str, tuple[int, int]], t_ns: int, now_ns: int) -> None:
        """Record NIC byte counters (``{nic id: (rx_bytes, tx_bytes)}``) read by a prober at
        ``t_ns`` (its clock) and received at ``now_ns``; NICs the fabric lacks are ignored."""
        self.now_ns = max(self.now_ns, now_ns)
        for nic, (rx, tx) in counters.items():
            if nic in self.fabric.nic_index:
                self.rates.update(nic, rx, tx, t_ns, now_ns)

    def _close_upto(self, now_ns: int) -> int:
        """Return the time windows close up to: ``now_ns``, or, while the controller itself
        is behind (batch age at ingest, loop lag, solve overrun: its own backlog, not a late
        prober's), no further than `BehindMeter.threshold_ns` past the newest send time it
        ingested: its windows wait for what waits in its own socket instead of closing short
        of every prober's batches (which the silence rule read as every prober down, issue 32)."""
        newest = self.worker.newest_send_ns
        if newest <= 0 or not self.behind.state(now_ns).behind:
            return now_ns
        return min(now_ns, newest + self.behind.threshold_ns)

    def tick(self, now_ns: int) -> list[EventDoc]:
        """Close the windows of the grid that are over (their end + lateness <= ``now_ns``;
        while the controller is behind, ``now_ns`` as far as its ingest got: `_close_upto`):
        the worker's partials to the solver, which judges each (solving clocks when due) and
        whose state the worker takes; record history; return the new events (host facts
        first, then each window's findings, stamped with its end)."""
        self.now_ns = max(self.now_ns, now_ns)
        new = self.solver.pending()
        closed = self.worker.close(self._close_upto(now_ns))
        for part in closed:
            self.solver.add(part)
        nxt = self.solver.next_window
        for k in sorted({p.window for p in closed}):  # whole, or short past a bound
            if nxt is not None and k < nxt:
                continue
            res = self.solver.solve(k, now_ns)
            new += degrade(list(res.events), short_window(res.counts.short))
            self.worker.install(res.state)
            nxt = k + 1
        new = mark_degraded(new, self.behind.state(now_ns))
        self.events.extend(new)
        _, worst_in, worst_out = self._worst(now_ns)
        i = self._hist_head
        self._hist_t[i] = now_ns
        self._hist_v[i] = np.fmax(worst_in, worst_out)
        self._hist_head = (i + 1) % self.config.history_len
        self._hist_count = min(self._hist_count + 1, self.config.history_len)
        return new

    def loop_lag(self, planned_ns: int, now_ns: int) -> None:
        """Note that the tick planned for ``planned_ns`` runs at ``now_ns`` (the service's
        loop lag: `controller.behind`)."""
        self.behind.ticked(planned_ns, now_ns)

    def tick_cost(self, cost_ns: int, now_ns: int) -> None:
        """Note what a tick (the windows judged) cost, against the window's width (a solve
        that overruns it cannot keep up)."""
        self.behind.solved(cost_ns, self.config.window_ns, now_ns)

    def prober_slip(self, host: str, slip_ns: int, now_ns: int) -> None:
        """Note a prober's report of its own lateness (its health's ``send_slip_ns``)."""
        self.behind.prober_slip(host, slip_ns, now_ns)

    def replace_fabric(
        self,
        fabric: Fabric,
        now_ns: int,
        *,
        brain: BrainLike | None = None,
        note: str = "",
    ) -> EventDoc:
        """The one door to change the fabric under a running controller (a learned fabric
        that changed: a new host, a recabled NIC, a spine gone); return the ``topology``
        event it records (what changed, `mesh.fabric.plancheck.fabric_changes`, then
        ``note``), also in `snapshot`'s events.

        The worker and the solver are made again for ``fabric``. Kept by id: presence and
        since when each prober is alive, GPU health, NIC rates, the events, the per-NIC
        history, the admission's replay and duplicate memory, the ingest counters and whether
        model paths are used (`controller.fleet.worker.FleetWorker.refabric`,
        `controller.fleet.solver.FleetSolver.take_hosts`). Restarted (indexed by the old
        fabric's NICs and links): the clock sync (a solve started earlier is refused by
        `install_clock`), the flows, the path tables (the caller refills them from the traced
        paths it keeps), the open windows of the grid and detection, as ``brain`` (None:
        `default_brain`, under the unknown rule as the first), told the known presence and
        GPU states again. See `controller.refabric`."""
        old = self.fabric
        event = topology_event(now_ns, fabric_changes(old, fabric), note, fabric,
                               first=not old.nics and not old.nodes)  # fmt: skip
        self.now_ns = max(self.now_ns, now_ns)
        self.fabric = fabric
        self._fabric_since_ns = now_ns
        the_brain = self._measured(fabric, brain)
        self.fleet = self._fleet_config(the_brain)
        self.worker = self.worker.refabric(fabric, self.fleet)
        solver = FleetSolver(
            fabric, self.fleet, brain=the_brain, solve_inline=self.config.solve_inline
        )
        solver.take_hosts(self.solver, now_ns)
        self.solver = solver
        for host, g in sorted(self.gpu_state.items()):
            solver.gpu(host, g.ok, g.detail, now_ns)
        self.worker.install(solver.host_state())
        self._hist_v = remap_columns(old, fabric, self._hist_v)
        self.events.append(event)
        return event

    def record_events(self, events: Iterable[EventDoc]) -> None:
        """Add findings made outside detection (e.g. remediation actions) to the events the
        snapshot shows."""
        self.events.extend(events)

    # ---- outputs -------------------------------------------------------------------------
    @property
    def solves(self) -> int:
        """Return how many clock solves were installed."""
        return self.solver.clock.solves

    def verdicts(self) -> dict[Outcome, int]:
        """Return how many batches `admit` gave each outcome."""
        return self.worker.verdicts()

    def ingest_stats(self) -> IngestStats:
        """Return a copy of the ingest counters (batches, records, per origin, dropped)."""
        return self.worker.ingest_stats()

    def _worst(self, now_ns: int) -> tuple[npt.NDArray[np.int64], F64, F64]:
        n = len(self.fabric.nics)
        live = self.flows.live(now_ns - self.config.stale_ns)
        owd = self.flows.last_owd[live]
        w_in = np.full(n, -np.inf)
        w_out = np.full(n, -np.inf)
        np.maximum.at(w_out, self.flows.src[live], owd)
        np.maximum.at(w_in, self.flows.dst[live], owd)
        w_in[~np.isfinite(w_in)] = np.nan
        w_out[~np.isfinite(w_out)] = np.nan
        return live, w_in, w_out

    def flow_delays(self, now_ns: int | None = None) -> dict[str, npt.NDArray[Any]]:
        """Return per live flow: src, dst, sport, spine (switch index), latest forward owd,
        its baseline (windowed minimum, ~propagation) and queueing = owd - baseline (ns)."""
        now = self.now_ns if now_ns is None else now_ns
        fl = self.flows
        live = fl.live(now - self.config.stale_ns)
        base = fl.baseline(live)
        owd = fl.last_owd[live]
        return {
            "src": fl.src[live],
            "dst": fl.dst[live],
            "sport": fl.sport[live],
            "spine": fl.spine[live],
            "owd_ns": owd,
            "baseline_ns": base,
            "queue_ns": owd - base,
        }

    def snapshot(self) -> MeshSnapshot:
        """Return the state at the latest time seen (never blocks)."""
        now = self.now_ns
        fab = self.fabric
        n = len(fab.nics)
        live = self.flows.live(now - self.config.stale_ns)
        src, dst = self.flows.src[live], self.flows.dst[live]
        owd = self.flows.last_owd[live]
        spine = self.flows.spine[live]
        pkey = src.astype(np.int64) * n + dst
        names = tuple(s.id for s in fab.switches)
        path_owd = PairPaths(n, pkey, spine.astype(np.int64), owd, names)
        uk, worst = path_owd.worst()
        dense = path_owd.dense()
        if dense is not None and len(owd):  # the per-NIC worst from the pair matrix
            w_out, w_in = dense.max(axis=1), dense.max(axis=0)
            w_in[~np.isfinite(w_in)] = np.nan
            w_out[~np.isfinite(w_out)] = np.nan
        else:
            _, w_in, w_out = self._worst(now)
        off, unc = self.clock.offsets(now)
        nic_health = list(self.brain.nic_health())
        lag = self.behind.state(now)
        if len(nic_health) != n:
            nic_health = [Health.UNKNOWN] * n
        return MeshSnapshot(
            t_ns=now,
            fabric=fab,
            nic_health=tuple(nic_health),
            worst_in_ns=w_in,
            worst_out_ns=w_out,
            owd_src=(uk // n).astype(np.int32),
            owd_dst=(uk % n).astype(np.int32),
            owd_ns=worst,
            clock_offset_ns=off,
            clock_uncertainty_ns=unc,
            link_health=dict(self.brain.link_health()),
            flap_counts=dict(self.brain.flap_counts()),
            path_owd=path_owd,
            events=tuple(self.events),
            gpu=dict(self.gpu_state),
            throughput_bps=self.rates.average_bps(now, self.config.throughput_stale_ns),
            control_enabled=None if self._control is None else self._control.enabled,
            jobs=None if self._jobs is None else screen_jobs(self._jobs.jobs()),
            behind_ns=lag.by_ns if lag.behind else 0,
            status=lag.controller_status(),
            late_probers=dict(lag.late_probers),
        )

    def history(self, nic: int, window_s: float) -> tuple[F64, F64]:
        """Return (times in s relative to now, worst in/out delay ns) of ``nic`` over the window.

        Raises IndexError for an unknown NIC index.
        """
        if not 0 <= nic < len(self.fabric.nics):
            raise IndexError(f"no NIC with index {nic}")
        c, cap = self._hist_count, self.config.history_len
        idx = (self._hist_head - c + np.arange(c)) % cap
        t = self._hist_t[idx]
        rel = (t - self.now_ns) / 1e9
        keep = rel >= -window_s
        return rel[keep].astype(np.float64), self._hist_v[idx, nic][keep].astype(np.float64)

    def set_control(self, enabled: bool) -> None:
        """Turn the attached Control on or off (audited, at the latest time seen); raises
        `ControlUnavailable` when none is attached (`attach_remediation`)."""
        if self._control is None:
            raise ControlUnavailable("automatic remediation is not available in this controller")
        self._control.set(enabled, self._actor, self.now_ns)
