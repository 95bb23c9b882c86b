"""The live controller state: admission -> ingest -> clock sync -> detection, behind
`SnapshotSource`.

`LiveController(fabric, config)` owns an `Admission` (which batches may enter), an `Ingestor`,
a `ClockSync`, a `FlowStore` (latest delay, spine and baseline per flow) and the detection
brain. Probe batches enter through one door, `admit` (a payload and its topic's host, or a
decoded batch; a frozen `controller.admission.Verdict` out), and are ingested at once or
queued to be ingested merged by `flush`; other inputs are `presence`, `gpu`, `nic_links`,
`nic_counters` and `learn_paths`; `replace_fabric` is the one door that swaps the fabric under
a running controller (`controller.refabric` says what survives). Call `tick(now_ns)`
periodically (it solves clocks when due, runs detection, records per-NIC history, returns new
events); read `snapshot()` / `history()`. Every time-dependent call takes ``now_ns`` (same
epoch as the NIC clocks, UNIX ns in production); nothing reads a clock.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from contract.records import ProbeBatch
from controller.admission import Admission, Outcome, Verdict
from controller.brain import Brain, BrainConfig
from controller.brainlike import BrainLike
from controller.clocksync import ClockState, ClockSync, ClockSyncConfig, Delays, compute_state
from controller.coalesce import ProbeQueue
from controller.control import Control
from controller.ingest import Ingested, Ingestor, IngestStats, PathTable
from controller.jobs import JobRegistry, screen_jobs
from controller.measured import Measured
from controller.observations import Observations
from controller.refabric import host_times, remap_columns, topology_event
from controller.throughput import NicRates
from controller.windows import FlowStore
from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT
from mesh.fabric.model import SWITCH_TIER, NodeKind, hop_id
from mesh.fabric.plancheck import fabric_changes
from mesh.snapshot import ControlUnavailable, GpuHealth, Health, MeshSnapshot, PairPaths

F64 = npt.NDArray[np.float64]
EARLY_NS = 10_000_000_000
"""How long before a prober's start a probe sent to its host is taken for a loss of that start
(no responder yet) and not judged. Start-up races are a second or less; a probe stamped further
back is judged as before: stamps on another time base than the controller's clock (a
free-running NIC clock) must not blind the controller to a host."""


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
    """Live-state knobs: clock sync, delay staleness, history and event bounds."""

    sync: ClockSyncConfig = field(default_factory=ClockSyncConfig)
    stale_ns: int = 10_000_000_000  # flows not measured for this long leave the snapshot
    throughput_stale_ns: int = 60_000_000_000  # NIC rates older than this leave the average
    baseline_bucket_ns: int = 60_000_000_000
    history_len: int = 3600  # ticks kept per NIC
    max_events: int = 200
    solve_inline: bool = True  # False: the owner runs clock solves (e.g. in a worker thread)

    def __post_init__(self) -> None:
        if self.stale_ns <= 0 or self.history_len < 1 or self.max_events < 1:
            raise ValueError("stale_ns, history_len and max_events must be positive")


STAGES = ("merge", "ingest", "sync_add", "sync_solve", "delays", "detect")
"""The stages of an ingest, in order, as `LiveController`'s ``on_stage`` names them: merging
queued batches (`flush` only), mapping onto the fabric (with the admission check when it ran
in the same call), adding to the clock windows, a clock solve (when due and inline), one-way
delays and observations, detection."""


class LiveController:
    """In-process controller state; implements `mesh.snapshot.SnapshotSource`.

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
        self._admission = Admission(fabric, owners=owners)
        self._ingestor = Ingestor(fabric, paths)
        self._on_stage = on_stage
        # each NIC's leaf: the hardware-stamp solve splits the queueing left in the best
        # samples into a part per NIC downlink and one per leaf uplink (`sync.excess`)
        self.clock = ClockSync(n, self.config.sync, leaf=fabric.nic_group_index)
        self.flows = FlowStore(n, self.config.baseline_bucket_ns)
        # no measurement within stale_ns: unknown, whatever the brain's table says (issue 33)
        self.brain: BrainLike = Measured(
            brain if brain is not None else default_brain(fabric), fabric, self.config.stale_ns
        )
        self.events: deque[EventDoc] = deque(maxlen=self.config.max_events)
        self.gpu_state: dict[str, GpuHealth] = {}
        self.rates = NicRates()  # NIC byte counters from health documents -> throughput
        self.alive: dict[str, bool] = {}
        # per host index: since when its prober has been alive (its last alive presence; 0:
        # never said); probes to it sent earlier are no evidence (`_ingest`)
        self._alive_since = np.zeros(len(fabric.hosts), np.int64)
        self._alive_at: dict[str, int] = {}  # the same by host id (kept across fabrics)
        self._fabric_since_ns = 0  # when the fabric was last replaced (older solves refused)
        self.now_ns = 0
        self.records = 0
        # delays of the arrived probes by clock trust: fine, coarse, withheld (unjudged)
        self.delay_trust = np.zeros(3, np.int64)
        self._hist_t = np.zeros(self.config.history_len, np.int64)
        # float32: ns delays need no more, and at 10,000 NICs x 3600 ticks float64 is 288 MB
        self._hist_v = np.full((self.config.history_len, n), np.nan, np.float32)
        self._hist_head = 0
        self._hist_count = 0
        self._hop_spine = _hop_spine_table(fabric)
        self._control: Control | None = None
        self._jobs: JobRegistry | None = None
        self._actor = ""

    def attach_remediation(self, control: Control, jobs: JobRegistry, actor: str) -> None:
        """Show ``control`` and ``jobs`` in every snapshot (instead of "unavailable") and let
        `set_control` switch ``control`` on behalf of ``actor`` (e.g. the demo's operator)."""
        self._control, self._jobs, self._actor = control, jobs, actor

    # ---- the service's narrow API ---------------------------------------------------------
    def use_model_paths(self, enabled: bool) -> None:
        """Trust the fabric model's ECMP hash for flows without a learnt path (or not: their
        hops are unknown). Set before any ingest."""
        self._ingestor.use_model_paths = enabled

    @property
    def max_hops(self) -> int:
        """Return the most hops a learnt path may have."""
        return self._ingestor.max_hops

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
        if reply_hops is None:
            reply_hops = np.full_like(hops, -1)
            for i in range(len(hops)):
                ids = hops[i][hops[i] >= 0]
                reply_hops[i, : len(ids)] = ids[::-1] ^ 1  # reverse_hop, vectorized
        self._ingestor.paths.update(src, dst, sport, hops)
        self._ingestor.reply_paths.update(src, dst, sport, reply_hops)

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
        return self._ingestor.lookup(src, dst, sport, dport)

    def start_solve(self, now_ns: int) -> Callable[[], ClockState | None] | None:
        """If a clock solve is due: mark it started and return the solve to run (pure, may run
        in a worker thread; hand its result to `install_clock`); else None."""
        window = self.clock.start_solve(now_ns)
        if window is None:
            return None
        n, cfg, leaf = self.clock.n_nics, self.clock.config, self.clock.leaf
        return lambda: compute_state(window, n, cfg, now_ns, leaf)

    def install_clock(self, state: ClockState | None, cost_s: float | None = None) -> bool:
        """Install a solved clock state; return True if it was new. ``cost_s``: what the
        solve cost (CPU s, `controller.clocksolve.timed_solve`), which sets how often solves
        are due (`ClockSync.solve_period_ns`). A state solved before the fabric was last
        replaced (`replace_fabric`) is refused: its NIC indices are the old fabric's."""
        if state is not None and (
            state.solved_at_ns < self._fabric_since_ns or len(state.models) != self.clock.n_nics
        ):
            return False
        return self.clock.install(state, None if cost_s is None else round(cost_s * 1e9))

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
        verdict, taken = self._admission.judge(batch, host)
        if taken is None:
            return verdict
        if queue is not None:
            queue.add(taken, now_ns)
            return verdict  # its records: the batch's, queued
        return Verdict(Outcome.ACCEPTED, records=self._ingest(taken, now_ns))

    def flush(self, queue: ProbeQueue, now_ns: int) -> int:
        """Ingest everything ``queue`` holds (admitted by `admit`), merged
        (`controller.coalesce`); return the records taken."""
        groups = queue.take()
        if self._on_stage is not None:
            self._on_stage("merge")
        return sum(self._ingest(m.batch, now_ns, m.parts) for m in groups)

    def _ingest(
        self, batch: ProbeBatch, now_ns: int, parts: Sequence[tuple[str, int]] | None = None
    ) -> int:
        """Ingest an admitted batch, possibly merged from several (``parts``:
        `Ingestor.ingest`); return the records taken."""
        self.now_ns = max(self.now_ns, now_ns)
        stage = self._on_stage
        ing = self._ingestor.ingest(batch, parts)
        if stage is not None:
            stage("ingest")
        if not len(ing):
            return 0
        self.clock.add(ing)
        if stage is not None:
            stage("sync_add")
        if self.config.solve_inline:
            self.clock.maybe_solve(now_ns)
            if stage is not None:
                stage("sync_solve")
        d = self.clock.delays(ing)
        self.delay_trust += trust_counts(ing.lost, d)
        obs = self.observations(ing, d, now_ns)
        if stage is not None:
            stage("delays")
        # a probe sent to a host before its prober announced itself alive met no responder:
        # its loss is the start (or restart) of that prober, not evidence about the fabric
        if self._alive_since.any():
            ahead = self._alive_since[self.fabric.nic_host_index[ing.dst]] - d.t_ns
            early = (ahead > 0) & (ahead <= EARLY_NS)
            if early.any():
                obs = obs.select(~early)
        self.brain.observe(obs)
        self.records += len(ing)
        if stage is not None:
            stage("detect")
        return len(ing)

    def observations(self, ing: Ingested, d: Delays, now_ns: int) -> Observations:
        """Return the batch as `Observations` and record its forward delays per flow."""
        slots = ing.flow
        new = self.flows.unregistered(slots)
        if new.any():
            s, hops = slots[new], ing.hops_fwd[new]
            spine = _path_spine(self._hop_spine, hops)
            self.flows.register(s, ing.src[new], ing.dst[new], ing.sport[new], spine)
        self.flows.update(slots, d.t_ns, d.fine()[0], now_ns)  # what the API shows: fine
        return Observations(
            d.t_ns,
            ing.src,
            ing.dst,
            ing.sport,
            ing.hops_fwd,
            ing.hops_rev,
            ing.lost,
            d.owd_fwd_ns,
            d.owd_rev_ns,
            d.rtt_ns,
            d.coarse,
        )

    def presence(self, host: str, alive: bool, now_ns: int, *, since_ns: int | None = None) -> None:
        """Record a prober's liveness (a last-will arrives as alive=False). The first alive
        one, and the first after a last will, starts the host's probes counting as evidence:
        those sent to it before ``since_ns`` (the presence's own time, when the prober
        published it; ``now_ns`` if None, 0 or later than ``now_ns``) are not judged
        (`admit`). Repeated alive presences (a retained one delivered again, a
        prober's reconnect) do not move it."""
        self.now_ns = max(self.now_ns, now_ns)
        i = self.fabric.host_index.get(host)
        if alive and not self.alive.get(host, False):
            self._alive_at[host] = now_ns if not since_ns or since_ns > now_ns else since_ns
            if i is not None:
                self._alive_since[i] = self._alive_at[host]
        self.alive[host] = alive
        self.brain.presence(host, alive, now_ns)

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int, *, present: bool = True) -> None:
        """Record the GPU health of ``host``."""
        self.now_ns = max(self.now_ns, now_ns)
        self.gpu_state[host] = GpuHealth(present=present, ok=ok, detail=detail)
        self.brain.gpu(host, ok, detail, now_ns)

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        """Record the link state of ``host``'s NICs as its prober read them (``{nic id: up}``)."""
        self.now_ns = max(self.now_ns, now_ns)
        self.brain.nic_links(host, up, now_ns)

    def nic_counters(self, counters: Mapping[str, tuple[int, int]], t_ns: int, now_ns: int) -> None:
        """Record NIC byte counters (``{nic id: (rx_bytes, tx_bytes)}``) read by a prober at
        ``t_ns`` (its clock) and received at ``now_ns``; NICs the fabric lacks are ignored."""
        self.now_ns = max(self.now_ns, now_ns)
        for nic, (rx, tx) in counters.items():
            if nic in self.fabric.nic_index:
                self.rates.update(nic, rx, tx, t_ns, now_ns)

    def tick(self, now_ns: int) -> list[EventDoc]:
        """Solve clocks if due, run detection, record history; return the new events."""
        self.now_ns = max(self.now_ns, now_ns)
        if self.config.solve_inline:
            self.clock.maybe_solve(now_ns)
        new = list(self.brain.tick(now_ns))
        self.events.extend(new)
        _, worst_in, worst_out = self._worst(now_ns)
        i = self._hist_head
        self._hist_t[i] = now_ns
        self._hist_v[i] = np.fmax(worst_in, worst_out)
        self._hist_head = (i + 1) % self.config.history_len
        self._hist_count = min(self._hist_count + 1, self.config.history_len)
        return new

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

        Kept by id: presence and since when each prober is alive, GPU health, NIC rates,
        the events, the per-NIC history, the admission's replay and duplicate memory, the
        ingest counters and whether model paths are used. Restarted (indexed by the old
        fabric's NICs and links): the clock sync (a solve started earlier is refused by
        `install_clock`), the flows, the path tables (the caller refills them from the traced
        paths it keeps) and detection, as ``brain`` (None: `default_brain`), told the known
        presence and GPU states again. See `controller.refabric`."""
        old, n = self.fabric, len(fabric.nics)
        event = topology_event(now_ns, fabric_changes(old, fabric), note, fabric,
                               first=not old.nics and not old.nodes)  # fmt: skip
        self.now_ns = max(self.now_ns, now_ns)
        self.fabric = fabric
        self._fabric_since_ns = now_ns
        self._admission.fabric_changed(fabric)
        ingestor = Ingestor(fabric, use_model_paths=self._ingestor.use_model_paths)
        ingestor.stats = self._ingestor.stats
        self._ingestor = ingestor
        self.clock = ClockSync(n, self.config.sync, leaf=fabric.nic_group_index)
        self.flows = FlowStore(n, self.config.baseline_bucket_ns)
        self.brain = Measured(  # the unknown rule holds on every fabric (issue 33)
            brain if brain is not None else default_brain(fabric), fabric, self.config.stale_ns
        )
        self._alive_since = host_times(fabric, self._alive_at)
        self._hist_v = remap_columns(old, fabric, self._hist_v)
        self._hop_spine = _hop_spine_table(fabric)
        for host, alive in sorted(self.alive.items()):
            self.brain.presence(host, alive, now_ns)
        for host, g in sorted(self.gpu_state.items()):
            self.brain.gpu(host, g.ok, g.detail, now_ns)
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
        return self.clock.solves

    def verdicts(self) -> dict[Outcome, int]:
        """Return how many batches `admit` gave each outcome."""
        return dict(self._admission.counts)

    def ingest_stats(self) -> IngestStats:
        """Return a copy of the ingest counters (batches, records, per origin, dropped)."""
        st = self._ingestor.stats
        return dataclasses.replace(st, origins=dict(st.origins))

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


def trust_counts(lost: npt.NDArray[np.bool_], d: Delays) -> npt.NDArray[np.int64]:
    """Return (fine, coarse, withheld) counts of the arrived probes' delays (`Delays.coarse`;
    withheld: NaN although the probe arrived, i.e. a clock not trusted or not yet solved)."""
    ok = ~lost
    known = ok & np.isfinite(d.owd_fwd_ns)
    coarse = int((known & d.coarse).sum())
    n_known = int(known.sum())
    return np.array([n_known - coarse, coarse, int(ok.sum()) - n_known], np.int64)


def _hop_spine_table(fabric: Fabric) -> npt.NDArray[np.int64]:
    """Per directed hop: (tier << 32 | switch index) of the link's upper switch."""
    sidx = {s.id: i for i, s in enumerate(fabric.switches)}
    out = np.full(fabric.n_hops + 1, -1, np.int64)  # last entry: padding hop -1
    for lk in fabric.links:
        node = fabric.node_by_id.get(lk.upper)
        if node is not None and node.kind != NodeKind.HOST:
            v = (SWITCH_TIER[node.kind] << 32) | sidx[lk.upper]
            out[hop_id(lk.index, down=False)] = out[hop_id(lk.index, down=True)] = v
    return out


def _path_spine(table: npt.NDArray[np.int64], hops: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """Switch index of the highest-tier switch each path crosses (-1 if none known)."""
    if hops.shape[1] == 0:
        return np.full(hops.shape[0], -1, np.int32)
    best = table[hops].max(axis=1)  # hop -1 indexes the padding entry (-1)
    return np.where(best >= 0, best & 0xFFFFFFFF, -1).astype(np.int32)
