"""The controller's brain: observations in, health and events out (pure; time passed in).

`Brain.observe` assigns each observation to the detection window of its probe's *send* time
(``Observations.t_ns``, controller timebase) with array code only (bincounts over link / hop
ids, baseline lookups); `Brain.tick(now_ns)` marks a window boundary at ``now_ns`` and closes
every open window whose end is at least ``BrainConfig.lateness_ns`` old (a lost probe is
reported one loss timeout after the successes sent after it): for each it localizes loss and
queueing delay (`controller.localize`), separates causes (`controller.detect.causes`), steps
every entity through the health table (`controller.health`) and returns the new `EventDoc`
findings stamped with the window's end. `presence`, `gpu` and `nic_links` (the NIC link
states a host's prober read from its own NICs) feed host facts. Nothing here reads a clock, a
file or the network.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.detect.causes import excluded_nics, host_quiet, silent_hosts
from controller.detect.congestion import CongestionParams, link_queue_ns, own_loss_rates
from controller.detect.delay import DelayParams
from controller.detect.flowloss import FlowLoss, FlowLossParams, Spread, poisson_tail
from controller.detect.loss import LossParams, LossVerdict
from controller.detect.loss_horizon import HorizonParams, LossHorizon, mispath_leaks, resid_rate
from controller.detect.paths import PathIndex, alias_groups
from controller.detect.pooled import PooledContention, PooledParams
from controller.detect.queues import (
    QueueEstimate,
    QueueParams,
    class_table,
    estimate_queues,
    hop_classes,
    hop_ends,
)
from controller.detect.significance import ProbedPairs, loss_excess
from controller.detect.window import DetectionWindow, WindowPart
from controller.health import EntityState, Finding, HealthParams, Signal, step
from controller.localize import Cover
from controller.observations import Observations
from mesh.fabric import Fabric
from mesh.fabric.ecmp import routing_tables
from mesh.fabric.model import hop_id, hop_link, hop_links, reverse_hop
from mesh.snapshot import Health


@dataclass(frozen=True, slots=True)
class BrainConfig:
    """Detection knobs (see docs/detection.md). ``silent_ns``: a host whose NICs initiated no
    probe for this long is reported ``prober_down``; 0 disables silence detection.
    ``lateness_ns``: a window (probes sent between two ticks) is judged only once a tick is
    this much past its end, so late reports (lost probes, delayed batches) land in the window
    they were sent in; 0 = judge at the next tick (callers that deliver each step complete).
    ``horizon``: loss over the last few windows, for losses too small or short for one
    (`controller.detect.loss_horizon`). ``queues``: the per-hop queue estimate
    (`controller.detect.queues`); ``pooled``: its estimates pooled over windows for a queue near
    the threshold (`controller.detect.pooled`); ``congestion``: which losses are overflow on a congested link
    (`controller.detect.congestion`); ``flow_loss``: a link's loss spread over its flows or
    concentrated on a few (`controller.detect.flowloss`: gray failures, wrong paths).
    ``moved_ns``, ``heavy_loss``: a link that lost at least
    ``heavy_loss`` of its probes in a window (or was dead) within ``moved_ns`` is not blamed
    for queueing: ECMP re-hashed its flows onto its siblings, so the delays of the paths the
    controller believes cross it are those of the links the flows moved to, until path
    discovery re-learns them (a sweep of the probers' traces takes tens of seconds)."""

    loss: LossParams = field(default_factory=LossParams)
    delay: DelayParams = field(default_factory=DelayParams)
    queues: QueueParams = field(default_factory=QueueParams)
    pooled: PooledParams = field(default_factory=PooledParams)
    congestion: CongestionParams = field(default_factory=CongestionParams)
    flow_loss: FlowLossParams = field(default_factory=FlowLossParams)
    health: HealthParams = field(default_factory=HealthParams)
    horizon: HorizonParams = field(default_factory=HorizonParams)
    silent_ns: int = 2_000_000_000
    lateness_ns: int = 0
    moved_ns: int = 30_000_000_000
    heavy_loss: float = 0.3

    def __post_init__(self) -> None:
        if self.silent_ns < 0:
            raise ValueError("silent_ns must be >= 0")
        if self.lateness_ns < 0:
            raise ValueError("lateness_ns must be >= 0")
        if self.moved_ns < 0 or not 0 < self.heavy_loss <= 1:
            raise ValueError("moved_ns must be >= 0 and heavy_loss in (0, 1]")


class Brain:
    """Detection and localization state for one fabric. Not thread-safe; one owner."""

    def __init__(self, fabric: Fabric, config: BrainConfig | None = None) -> None:
        self.fabric = fabric
        self.config = config or BrainConfig()
        n_links, n_nics = len(fabric.links), len(fabric.nics)
        width = routing_tables(fabric).max_hops
        self._paths = PathIndex(width)
        self._pairs = PathIndex(2 * width)
        self._alias_at = -1  # path count the alias groups are of (-1: never computed)
        self._alias_of: dict[int, tuple[str, ...]] | None = None  # None: not yet, `_aliases`
        self._hop_aliases: list[tuple[int, ...]] = []  # directed hops no delay tells apart
        self._open: list[DetectionWindow] = [self._new_window()]
        self._states = [EntityState() for _ in range(n_links)]
        self._stirred: set[int] = set()  # links not UP at rest (streak 0): stepped each window
        self._raised: dict[int, str] = {}
        self._nic_of_link = {int(lk): i for i, lk in enumerate(fabric.nic_link)}
        self._last_src = np.full(n_nics, -1, dtype=np.int64)
        self._presence_down: set[str] = set()
        self._silent: set[str] = set()
        self._back_at: dict[str, int] = {}  # host -> when its presence last said alive
        self._excluded = np.zeros(n_nics, dtype=bool)
        self._reported_down: set[int] = set()
        self._host_nics: dict[str, list[int]] | None = None  # `_all_reported_down`
        self._gpu_bad: dict[str, str] = {}
        self._pending: list[EventDoc] = []
        self._last_tick: int | None = None
        self._horizon = LossHorizon(n_links, self.config.horizon)
        self._probed = ProbedPairs(self.config.horizon.span_ns)  # the horizon's every probe
        self._last_dead = np.full(n_links, np.iinfo(np.int64).min // 2, dtype=np.int64)  # ns
        self._last_heavy = self._last_dead.copy()  # last window it lost >= heavy_loss (ns)
        self._flows = FlowLoss(n_nics, self.config.flow_loss)
        self._links_of: npt.NDArray[np.int32] | None = None  # `_path_links`
        self._loss_since: dict[int, int] = {}  # link -> since when a cover blames it (ns)
        # this window's `FlowLoss.spread` by (link, links whose flows are left out)
        self._spread: dict[tuple[int, tuple[int, ...]], Spread | None] = {}
        nodes: dict[str, int] = {}
        self._link_nodes = np.array(
            [
                [nodes.setdefault(lk.lower, len(nodes)), nodes.setdefault(lk.upper, len(nodes))]
                for lk in fabric.links
            ],
            dtype=np.int64,
        ).reshape(-1, 2)
        self._switch_link = np.array([lk.lower not in fabric.nic_index for lk in fabric.links])
        self._hop_class = hop_classes(fabric)
        self._hop_ends = hop_ends(fabric)  # the lift between the estimate's sweeps
        self._queues: QueueEstimate | None = None  # the last window's per-hop queue estimate
        self._pooled = PooledContention(self.config.pooled)  # contention over windows
        self._turns: dict[int, int] = {}  # contended link -> windows its queue is reversed
        self._fine: deque[
            tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]
        ] = deque()
        self._class_of = np.zeros((0, 0), np.int32)  # per known path: its hop per class
        # per-link queue (both directions) of the windows in the loss horizon: (end, values)
        self._link_q: deque[tuple[int, npt.NDArray[np.float64]]] = deque()
        self._overflow: dict[int, float] = {}  # link -> own loss read as overflow, this window
        self._measured_at: int | None = None  # the first window with a queue measured
        self._held: dict[int, int] = {}  # link -> since when its small loss is held (ns)
        self.last_blamed: frozenset[str] = frozenset()

    # ---- inputs --------------------------------------------------------------------------
    def observe(self, obs: Observations) -> None:
        """Fold ``obs`` into the open windows of their send times (vectorized per window).

        A record sent before the oldest open window (later than ``lateness_ns``) goes into
        the oldest open window; one sent after the last tick into the current window.
        """
        if not len(obs):
            return
        np.maximum.at(self._last_src, obs.src, obs.t_ns)
        ends = np.array([w.end_ns for w in self._open[:-1]], dtype=np.int64)
        if not len(ends):
            self._fold(self._open[0], obs)
            return
        widx = np.searchsorted(ends, obs.t_ns, side="left")
        lo, hi = int(widx.min()), int(widx.max())
        if lo == hi:
            self._fold(self._open[lo], obs)
            return
        for w in np.unique(widx):
            self._fold(self._open[int(w)], obs.select(widx == w))

    def _new_window(self) -> DetectionWindow:
        f = self.fabric
        return DetectionWindow.empty(len(f.links), f.n_hops, len(f.nics), self._pairs)

    def _fold(self, win: DetectionWindow, obs: Observations) -> None:
        win.fold(obs, self._paths, self._excluded, self.config.delay)

    def tap(self, obs: Observations) -> None:
        """Nothing: a brain's windows are filled by `observe` or, in the fleet, by `judge`;
        what listens beside detection to the observations a worker made is a tap around the
        brain (`controller.brainlike.TeeBrain`)."""
        del obs

    def presence(self, host: str, alive: bool, now_ns: int) -> None:
        """Record the prober presence of ``host`` (MQTT last-will / hello). A presence that
        says alive at ``now_ns`` is newer news than the silence of any window that ended before
        it: `_host_silence` does not raise a restarted prober's gap once its hello is in."""
        if alive:
            self._back_at[host] = max(now_ns, self._back_at.get(host, now_ns))
            if host in self._presence_down:
                self._presence_down.discard(host)
                if host not in self._silent:
                    self._pending.append(EventDoc(now_ns, "clear", host, "prober back", "info"))
        elif host not in self._presence_down:
            self._presence_down.add(host)
            if host not in self._silent:
                self._pending.append(
                    EventDoc(now_ns, "prober_down", host, "presence lost", "warning")
                )
        self._excluded = excluded_nics(self.fabric, self._presence_down | self._silent)

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None:
        """Record the GPU health of ``host``; a change raises gpu_fault / clear at next tick."""
        if not ok and host not in self._gpu_bad:
            self._gpu_bad[host] = detail
            self._pending.append(EventDoc(now_ns, "gpu_fault", host, detail, "critical"))
        elif ok and host in self._gpu_bad:
            del self._gpu_bad[host]
            self._pending.append(EventDoc(now_ns, "clear", host, "GPU healthy", "info"))

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        """Record the link state (carrier) of ``host``'s NICs as its own prober read them.

        A NIC its host reports down is judged down from the next window on (``nic_down``),
        also when the host, having no other NIC, initiates nothing: a quiet host whose NICs
        are all reported down is not a silent prober. NICs of other hosts are ignored.
        """
        del now_ns  # the report is a state, applied to the windows closed from now on
        for nic_id, is_up in up.items():
            i = self.fabric.nic_index.get(nic_id)
            if i is None or self.fabric.nics[i].host != host:
                continue
            if is_up:
                self._reported_down.discard(i)
            else:
                self._reported_down.add(i)

    def _all_reported_down(self, host: str) -> bool:
        if not self._reported_down:
            return False
        if self._host_nics is None:  # once: a host's NICs, not a scan of the fabric per host
            self._host_nics = {}
            for n in self.fabric.nics:
                self._host_nics.setdefault(n.host, []).append(n.index)
        idx = self._host_nics.get(host, [])
        return bool(idx) and all(i in self._reported_down for i in idx)

    # ---- the window ----------------------------------------------------------------------
    def tick(self, now_ns: int) -> list[EventDoc]:
        """Mark a window boundary at ``now_ns`` and close the windows that ended at least
        ``lateness_ns`` before it; return new findings (incl. clears), each window's stamped
        with its end time."""
        events, self._pending = self._pending, []
        events += self._host_silence(now_ns)
        cur = self._open[-1]
        prev = self._open[-2].end_ns if len(self._open) > 1 else self._last_tick
        if prev is None or now_ns > prev:
            cur.end_ns = now_ns
            self._open.append(self._new_window())
        limit = now_ns - self.config.lateness_ns
        while len(self._open) > 1:
            end = self._open[0].end_ns
            if end is None or end > limit:
                break
            events += self._close(self._open.pop(0), end)
        return events

    def judge(self, end_ns: int, parts: Sequence[WindowPart]) -> list[EventDoc]:
        """Judge one window of the fleet grid that ended at ``end_ns``, made of ``parts``
        (every worker's evidence of it, `controller.detect.window.WindowPart`, merged here
        exactly): the silence of hosts at ``end_ns``, then the window as `tick` closes one;
        return its findings stamped ``end_ns``. Windows are judged in order, one call each
        (an empty one too: no evidence is a state). The brain's own windows (`observe`,
        `tick`) are not touched: an owner uses one way or the other."""
        win = self._new_window()
        for part in parts:
            win.absorb(part, self._paths)
        np.maximum(self._last_src, win.last_src, out=self._last_src)
        return self._host_silence(end_ns) + self._close(win, end_ns)

    def take_pending(self) -> list[EventDoc]:
        """Return (and forget) the findings of host facts given since the last call or tick:
        prober presence lost or back (`presence`), GPU faults (`gpu`)."""
        events, self._pending = self._pending, []
        return events

    def _close(self, win: DetectionWindow, now_ns: int) -> list[EventDoc]:
        """Judge one window ending at ``now_ns``; return its findings."""
        f, cfg = self.fabric, self.config
        dt_s = 0.0 if self._last_tick is None else (now_ns - self._last_tick) / 1e9
        self._last_tick = now_ns
        quiet_hosts = host_quiet(f, win.src_count)
        nic_quiet = quiet_hosts[f.nic_host_index] | self._excluded
        reported = np.zeros(len(f.nics), dtype=bool)
        reported[list(self._reported_down)] = True
        nic_quiet &= ~reported  # its host says the link is down: that is evidence, not quiet

        est = self._estimate_queues(win)
        standing = self._standing(est, now_ns)
        self._overflow = {}
        self._flows.add_counts(win.flows.counts())
        self._flows.decay(dt_s)
        self._spread = {}
        loss = win.loss.verdict(cfg.loss)
        self._horizon.push(now_ns, loss.cover.total, win.loss.lost_sets())
        pair_ids, pair_probes, _, _ = win.loss.pairs_seen()
        self._probed.push(now_ns, pair_ids, pair_probes)
        signals, slow_hop, two_way, flows_of = self._delay_signals(win, est, now_ns)
        rates = self._loss_signals(
            win, loss, signals, standing, now_ns, round(dt_s * 1e9), (pair_ids, pair_probes)
        )
        blamed = set()
        for lk in signals:
            nic = self._nic_of_link.get(lk)
            if nic is not None and nic_quiet[nic]:
                signals[lk] = Signal.NODATA
            else:
                blamed.add(f.links[lk].id)
        self.last_blamed = frozenset(blamed)

        events: list[EventDoc] = []
        enough = loss.cover.total >= cfg.loss.min_probes
        # a link with no signal that is UP at rest stays so: only the others are stepped, in
        # link order (not a pass over every link of the fabric each window)
        for lk in sorted(self._stirred.union(map(int, signals))):
            st = self._states[lk]
            sig = signals.get(lk)
            if sig is None:
                nic = self._nic_of_link.get(lk)
                quiet = nic is not None and nic_quiet[nic]
                sig = Signal.CLEAN if enough[lk] and not quiet else Signal.NODATA
            new, finding = step(st, sig, now_ns, cfg.health)
            self._states[lk] = new
            if new.state == Health.UP and new.streak == 0:
                self._stirred.discard(lk)
            else:
                self._stirred.add(lk)
            if finding is None and new.state == Health.CONTENDED:
                finding = self._turned(lk, sig, slow_hop, two_way)
                if finding is not None:
                    events.append(
                        EventDoc(now_ns, "clear", self._raised.pop(lk), "recovered", "info")
                    )
            if finding is not None:
                ev = self._event(
                    lk, finding, new, now_ns, rates.get(lk), slow_hop, flows_of, lk in two_way
                )
                if ev is not None:
                    events.append(ev)

        win.delay.fold_baselines(self._paths, dt_s, cfg.delay)
        return events

    def _delay_signals(
        self, win: DetectionWindow, est: QueueEstimate, now_ns: int
    ) -> tuple[
        dict[int, Signal], dict[int, int], set[int], Callable[[int], list[tuple[int, int, int]]]
    ]:
        """Return the window's SLOW links (the slow tier's cover, then the hops the queue
        estimate finds contended past its warm-up, in this window or pooled over the last
        few: `controller.detect.pooled`), per link the hop blamed, the links blamed
        in both directions, and a function: a blamed hop -> its affected flows (computed only
        for an event raised)."""
        cfg = self.config
        # a hop is blamed by neither tier for a queue the round trips of the delays not judged
        # finely clear it of (`controller.detect.roundtrips`): the slow tier's claim is the
        # slow delays' typical queue across it, the queue estimate's its estimate; a NIC
        # whose clock is withheld still shows which hops did not hold them (a window of
        # trusted clocks keeps no round trips: nothing to test)
        tested = win.delay.has_round_trips()
        slow_clear = (
            win.delay.cleared(self._paths, win.delay.slow_claims(), cfg.delay) if tested else None
        )
        slow_cover, slow_flows = win.delay.verdict(self._paths, cfg.delay, slow_clear)
        signals: dict[int, Signal] = {}
        slow_hop: dict[int, int] = {}
        two_way: set[int] = set()  # links blamed in both directions
        for hop, nbad in zip(slow_cover.picked, slow_cover.picked_bad, strict=True):
            lk = hop_link(int(hop))
            signals[lk] = Signal.SLOW
            if lk in slow_hop and slow_hop[lk] != int(hop):
                two_way.add(lk)
            if lk not in slow_hop or nbad > slow_cover.bad[slow_hop[lk]]:
                slow_hop[lk] = int(hop)
        warming = self._warming(now_ns)
        queued = np.zeros(0, np.int64) if warming else self._pooled.contended(est, len(self._fine))
        if len(queued) and tested:
            claims = np.full(len(est.queue_ns), np.nan)
            claims[queued] = est.queue_ns[queued]  # only the hops it would blame are tested
            queue_clear = win.delay.cleared(self._paths, claims, cfg.delay)
            queued = queued[~queue_clear[queued]]
        margin = est.queue_ns - est.threshold_ns
        for hop in queued[np.argsort(-margin[queued], kind="stable")]:  # the larger first
            lk = hop_link(int(hop))
            signals[lk] = Signal.SLOW
            if lk in slow_hop and slow_hop[lk] != int(hop):
                two_way.add(lk)
            slow_hop.setdefault(lk, int(hop))
        cut = np.nan_to_num(est.threshold_ns, nan=np.inf)

        def flows_of(hop: int) -> list[tuple[int, int, int]]:  # only for an event raised
            if hop not in slow_flows:
                hops = np.array([hop], dtype=np.int64)
                slow_flows.update(win.delay.flows_over(self._paths, cut, hops, cfg.delay.max_flows))
            return slow_flows[hop]

        return signals, slow_hop, two_way, flows_of

    def _turned(
        self, lk: int, sig: Signal, slow_hop: dict[int, int], two_way: set[int]
    ) -> Finding | None:
        """Return CONTENTION when contended link ``lk``'s queue has moved to the direction its
        standing alert does not name for ``raise_windows`` windows running (the hop blamed
        this window, not both), else None. Health is per link, so a queue that turns while the
        link stays contended would otherwise be reported on the old direction until it clears
        (a queue pooled over windows, `controller.detect.pooled`, holds a link long enough
        for that)."""
        raised = self._raised.get(lk)
        hop = slow_hop.get(lk)
        if sig != Signal.SLOW or hop is None or lk in two_way or raised is None:
            self._turns.pop(lk, None)
            return None
        if raised == self.fabric.hop_name(hop) or raised != self.fabric.hop_name(reverse_hop(hop)):
            self._turns.pop(lk, None)
            return None
        self._turns[lk] = self._turns.get(lk, 0) + 1
        if self._turns[lk] < self.config.health.raise_windows:
            return None
        del self._turns[lk]
        return Finding.CONTENTION

    def _loss_signals(
        self,
        win: DetectionWindow,
        loss: LossVerdict,
        signals: dict[int, Signal],
        standing: npt.NDArray[np.float64],
        now_ns: int,
        dt_ns: int,
        probed: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    ) -> dict[int, float]:
        """Mark in ``signals`` the links the window's loss (``loss``) and the loss horizon
        blame (DEAD, LOSSY), less overflow on congested links, chance clusters, leaks of
        wrong paths and losses held undecided; drop the SLOW of links that lost heavily
        within ``moved_ns`` (their flows moved); return the loss rate of every link blamed
        for loss. ``probed``: the window's path pairs and probes on each."""
        cfg = self.config
        hz = self._horizon.verdict()
        blamed_loss = self._not_congestion(
            loss.blamed, loss.cover.total, win.loss.lost_sets(), probed, cfg.loss.min_rate,
            standing, now_ns,
        )  # fmt: skip
        leaks = mispath_leaks(
            loss.cover, self._link_nodes, self._switch_link, cfg.horizon.sibling_leak,
            lambda m, others: m in blamed_loss and self._concentrated(m, others),
        )  # fmt: skip
        heavy = [lk for lk, r in loss.blamed.items() if r >= cfg.heavy_loss and lk not in leaks]
        self._last_heavy[heavy] = now_ns
        for lk in [k for k, sig in signals.items() if sig == Signal.SLOW]:
            if now_ns - self._last_heavy[lk] < cfg.moved_ns:  # its flows moved: stale paths
                del signals[lk]
        for lk, rate in blamed_loss.items():
            if rate >= cfg.loss.dead_rate:
                signals[lk] = Signal.DEAD
            elif lk not in leaks and not self._undecided_leak(
                lk, hz if lk in hz.picked else loss.cover, now_ns
            ):
                signals[lk] = Signal.LOSSY
        for down_nic in self._reported_down:
            signals[int(self.fabric.nic_link[down_nic])] = Signal.DEAD
        rates = self._horizon_signals(signals, hz, now_ns, dt_ns, standing)
        rates.update(blamed_loss)
        lossy = set(loss.blamed) | set(rates)
        self._loss_since = {lk: self._loss_since.get(lk, now_ns) for lk in lossy}
        return rates

    def _horizon_signals(
        self,
        signals: dict[int, Signal],
        hz: Cover,
        now_ns: int,
        dt_ns: int,
        standing: npt.NDArray[np.float64],
    ) -> dict[int, float]:
        """Mark LOSSY in ``signals`` the links the loss horizon's cover ``hz`` (this window
        folded in) blames that the window did not, except leaks, links whose own loss is under
        the horizon's floor or is overflow (`_not_congestion`) and links dead within the
        horizon or in the window before it (a partly dead window: that down, already
        reported); return the horizon's loss rates of the links it blamed."""
        dead = [lk for lk, s in signals.items() if s == Signal.DEAD]
        self._last_dead[dead] = now_ns
        if not len(hz.picked):
            return {}
        hp = self.config.horizon
        held = now_ns - hp.span_ns - dt_ns  # dead after this: in or next to the horizon
        picked = resid_rate(hz)
        for lk in [k for k in self._held if k not in picked and k not in signals]:
            del self._held[lk]  # no longer blamed: a later loss is held afresh
        out = self._not_congestion(
            picked, self._horizon.totals, self._horizon.lost_sets(), self._probed.pairs(),
            hp.min_rate, standing, now_ns,
        )  # fmt: skip
        leaks = mispath_leaks(
            hz, self._link_nodes, self._switch_link, hp.sibling_leak,
            lambda m, others: m in out and self._concentrated(m, others),
        )  # fmt: skip
        fresh: npt.NDArray[np.bool_] | None = None  # read once, if a link not raised needs it
        for lk in out:
            if lk in signals or lk in leaks or self._last_dead[lk] >= held:
                continue
            if self._undecided_leak(lk, hz, now_ns):
                continue
            if self._states[lk].state != Health.DEGRADED:
                fresh = self._fresh_loss(now_ns) if fresh is None else fresh
                if not fresh[lk]:
                    continue  # a loss that ended: not raised now, stale (HorizonParams.fresh_ns)
            signals[lk] = Signal.LOSSY
        return out

    def _fresh_loss(self, now_ns: int) -> npt.NDArray[np.bool_]:
        """Return per link whether its loss goes on: the windows that ended within the last
        ``HorizonParams.fresh_ns`` lost probes across it, at least ``min_rate`` of its probes
        there (all True when ``fresh_ns`` is 0)."""
        hp = self.config.horizon
        if not hp.fresh_ns:
            return np.ones(self._horizon.n_links, dtype=np.bool_)
        total, lost = self._horizon.recent(now_ns - hp.fresh_ns)
        return (lost > 0) & (lost >= hp.min_rate * total)

    def _undecided_leak(self, m: int, hz: Cover, now_ns: int) -> bool:
        """Return True while link ``m``'s loss could still be the leak of a larger loss on a
        switch link L it can be an ECMP alternative of (`mispath_leaks`): over the loss
        horizon ``hz`` its unexplained rate is at most ``HorizonParams.leak_hold`` of L's (a
        leak is the share of its flows whose real path is L's: with 25 % wrong paths over
        3 alternatives, ~8 %), and the flows it would take are too few, for the probes they
        have had since L began losing, for the per-flow test (`controller.detect.flowloss`)
        to have shown them. Held so for up to ``CongestionParams.hold_ns`` (`_held`), then
        reported."""
        rate, resid = hz.rate, resid_rate(hz)
        if m not in resid or self._states[m].state == Health.DEGRADED:
            return False  # nothing to hold, or already reported
        bound = self.config.horizon.leak_hold
        alts = [
            int(lk)
            for lk in hz.picked
            if self._switch_link[int(lk)]
            and int(lk) != m
            and self._link_nodes[int(lk), 1] != self._link_nodes[m, 1]
            and resid[m] <= bound * rate[int(lk)]
        ]
        if not alts:
            return False
        src = max(alts, key=lambda lk: float(rate[lk]))
        sp = self._flow_spread(m, tuple(int(e) for e in hz.picked if int(e) != m))
        if sp is not None:
            # were m's loss src's leak, this many of m's flows would lose at src's rate
            n_leak = sp.rate / max(float(rate[src]), 1e-9) * sp.flows
            dt = (now_ns - self._loss_since.get(src, now_ns)) / 1e9
            grown = 1.0 - np.exp(-max(dt, 0.1) / self.config.flow_loss.span_s)
            mu = float(rate[src]) * self._flows.typical_probes(m, self._path_links()) * grown
            seen = n_leak * float(poisson_tail(np.array([mu]), sp.k)[0])
            if seen >= sp.expected + self.config.flow_loss.z * np.sqrt(sp.expected) + 1:
                return False  # the test could tell, and found the loss spread: not a leak
        since = self._held.setdefault(m, now_ns)
        return now_ns - since < self.config.congestion.hold_ns

    def _flow_spread(self, lk: int, explained: tuple[int, ...] = ()) -> Spread | None:
        """Return how the loss of link ``lk``'s flows that cross none of the ``explained``
        links, nor a link dead within the loss horizon, lies over them (`FlowLoss.spread`),
        once a window."""
        recent = self._last_tick or 0
        dead = np.flatnonzero(self._last_dead > recent - self.config.horizon.span_ns)
        explained = tuple(sorted({*explained, *(int(d) for d in dead if int(d) != lk)}))
        key = (lk, explained)
        if key not in self._spread:
            self._spread[key] = self._flows.spread(lk, self._path_links(), explained)
        return self._spread[key]

    def _path_links(self) -> npt.NDArray[np.int32]:
        """Return each known path's links (-1 padded), computed once a window."""
        if self._links_of is None or len(self._links_of) != self._paths.size:
            self._links_of = hop_links(self._paths.hops).astype(np.int32)
        return self._links_of

    def _concentrated(self, lk: int, explained: tuple[int, ...] = ()) -> bool:
        """Return True if link ``lk``'s loss (on its flows that cross none of the
        ``explained`` links) is concentrated on a few of its flows."""
        sp = self._flow_spread(lk, explained)
        return sp is not None and sp.concentrated

    def _estimate_queues(self, win: DetectionWindow) -> QueueEstimate:
        """Return the per-hop queue estimate (`controller.detect.queues`) over this window's
        fine delays and those of the windows before it (`QueueParams.windows`, ``enough``),
        with their stamp kinds, started from the last window's estimate."""
        p = self.config.queues
        self._fine.append(win.delay.fine())
        while len(self._fine) > p.windows or (
            len(self._fine) > 1 and sum(len(e) for _, e, _ in list(self._fine)[1:]) >= p.enough
        ):
            self._fine.popleft()
        paths = np.concatenate([x for x, _, _ in self._fine])
        excess = np.concatenate([e for _, e, _ in self._fine])
        sw = np.concatenate([k for _, _, k in self._fine])
        warm = None if self._queues is None else self._queues.queue_ns
        self._refresh_aliases()
        if len(self._class_of) < self._paths.size:  # new paths: their hop per class
            fresh = class_table(self._paths.hops[len(self._class_of) :], self._hop_class)
            self._class_of = (
                np.concatenate([self._class_of, fresh]) if len(self._class_of) else fresh
            )
        est = estimate_queues(
            paths,
            excess,
            self._class_of,
            self._hop_class,
            p,
            warm,
            self._hop_aliases,
            sw,
            hop_ends=self._hop_ends,
        )
        self._queues = est
        return est

    def _standing(self, est: QueueEstimate, now_ns: int) -> npt.NDArray[np.float64]:
        """Return per link its queue (both directions' typical waits added) averaged over the
        windows of the loss horizon that measured it, this one included (NaN: none did)."""
        span = self.config.horizon.span_ns
        self._link_q.append((now_ns, link_queue_ns(est.queue_ns)))
        while self._link_q[0][0] <= now_ns - span:
            self._link_q.popleft()
        held = np.array([q for _, q in self._link_q])
        seen = np.isfinite(held).any(axis=0)
        if self._measured_at is None and seen.any():
            self._measured_at = now_ns
        if self._warming(now_ns):
            return np.full(len(seen), np.nan)  # the first seconds of queues: not yet known
        mean = np.nansum(held, axis=0) / np.maximum(np.isfinite(held).sum(axis=0), 1)
        return np.asarray(np.where(seen, mean, np.nan), dtype=np.float64)

    def _warming(self, now_ns: int) -> bool:
        """Return True until queues have been measured for ``QueueParams.warmup_ns``: the
        paths' baselines (the least delay seen) are then learnt from a few samples each, on
        a busy fabric a few hundred ns over the floor, and the estimate reads queues low."""
        start = self._measured_at
        return start is None or now_ns - start < self.config.queues.warmup_ns

    def _not_congestion(
        self,
        blamed: Mapping[int, float],
        totals: npt.NDArray[np.int64],
        lost_sets: npt.NDArray[np.int32],
        probed: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
        floor: float,
        standing: npt.NDArray[np.float64],
        now_ns: int,
    ) -> dict[int, float]:
        """Return the links of ``blamed`` (link -> loss rate) whose loss is a finding: dead
        ones, and those whose own loss (`own_loss_rates`) is over ``floor``, significantly
        (`loss_excess` over the ``probed`` path pairs and probes on each: more lost probes
        than the other links and the floor explain, by ``CongestionParams.z`` Poisson
        deviations; the probes that crossed a link dead now, within the loss horizon, or of
        a NIC reported down, are left out of the test), and is not
        overflow on a congested link: own loss not significantly over
        ``CongestionParams.max_loss`` (3 binomial standard deviations) with a standing queue
        (remembered in ``_overflow`` for the link's contention finding). Such a small loss on
        a link whose queue is not known (`_standing` NaN: no judged delay crossed it, as in
        the controller's first seconds or while its NICs' clocks are not trusted) is held
        for up to ``CongestionParams.hold_ns``, then reported."""
        if not blamed:
            return {}
        cp, dead = self.config.congestion, self.config.loss.dead_rate
        own = own_loss_rates(totals, lost_sets, cp.iterations)
        gone = (own >= dead) | (self._last_dead > now_ns - self.config.horizon.span_ns)
        gone[self.fabric.nic_link[list(self._reported_down)]] = True
        pair_links: npt.NDArray[np.int32] | None = None  # gathered once, if a link needs it
        out = {}
        for lk, rate in blamed.items():
            n = int(totals[lk])
            small = own[lk] * n <= n * cp.max_loss + 3.0 * np.sqrt(n * cp.max_loss)
            if rate >= dead:
                out[lk] = rate
                continue
            if own[lk] < floor:
                continue  # the loss of its probes elsewhere
            if pair_links is None:
                pair_links = self._pairs.hops[probed[0]]
            test = loss_excess(lk, pair_links, probed[1], lost_sets, own, gone, floor=floor, z=cp.z)
            if not test.significant:
                continue  # a chance cluster of the losses its probes meet elsewhere
            if small and standing[lk] >= cp.standing_ns:
                self._overflow[lk] = max(self._overflow.get(lk, 0.0), float(own[lk]))
            elif small and np.isnan(standing[lk]) and self._states[lk].state != Health.DEGRADED:
                since = self._held.setdefault(lk, now_ns)
                if now_ns - since >= cp.hold_ns:
                    out[lk] = rate
            else:
                out[lk] = rate
        return out

    def _host_silence(self, now_ns: int) -> list[EventDoc]:
        out: list[EventDoc] = []
        if not self.config.silent_ns:
            return out
        silent = silent_hosts(self.fabric, self._last_src, now_ns, self.config.silent_ns)
        silent = {h for h in silent if not self._all_reported_down(h)}  # it cannot send
        # a window judged after the prober said hello again is older than that hello: its gap
        # is the restart's, already raised and cleared by presence (one prober_down, not two)
        silent = {
            h for h in silent if self._back_at.get(h, now_ns - 1) < now_ns or h in self._silent
        }
        for host in sorted(silent - self._silent):
            if host not in self._presence_down:
                out.append(EventDoc(now_ns, "prober_down", host, "prober silent", "warning"))
        for host in sorted(self._silent - silent):
            if host not in self._presence_down:
                out.append(EventDoc(now_ns, "clear", host, "prober reporting again", "info"))
        if silent != self._silent:
            self._silent = silent
            self._excluded = excluded_nics(self.fabric, self._presence_down | self._silent)
        return out

    def _event(
        self,
        lk: int,
        finding: Finding,
        st: EntityState,
        now_ns: int,
        rate: float | None,
        slow_hop: dict[int, int],
        flows_of: Callable[[int], list[tuple[int, int, int]]],
        two_way: bool = False,
    ) -> EventDoc | None:
        f = self.fabric
        link = f.links[lk].id
        nic = self._nic_of_link.get(lk)
        if finding == Finding.CLEAR:
            target = self._raised.pop(lk, None)
            return (
                None if target is None else EventDoc(now_ns, "clear", target, "recovered", "info")
            )
        if finding == Finding.DOWN:
            kind, target = ("nic_down", f.nics[nic].id) if nic is not None else ("link_down", link)
            loss_txt = f"{rate:.0%}" if rate is not None else "all"
            detail = f"{loss_txt} of probes across {link} lost"
            if nic is not None and nic in self._reported_down:
                detail = f"{f.nics[nic].host} reports the link of {target} down (no carrier)"
            ev = EventDoc(now_ns, kind, target, detail, "critical")
        elif finding == Finding.FLAP:
            n = st.flap_count(now_ns, self.config.health.flap_window_ns)
            win = self.config.health.flap_window_ns / 1e9
            first = st.first_down_ns if st.first_down_ns is not None else now_ns
            detail = f"link flapped {n} times in {win:g} s (first down {(now_ns - first) / 1e9:.1f} s ago)"
            ev = EventDoc(now_ns, "link_flap", link, detail, "critical")
        elif finding == Finding.LOSS:
            detail = f"{rate or 0:.1%} of probes across it lost"
            if self._concentrated(lk):
                sp = self._flow_spread(lk)
                assert sp is not None
                detail += (
                    f", concentrated on {sp.heavy} of its {sp.flows} flows, which lose "
                    f"{sp.heavy_rate:.0%}: a gray failure of some 5-tuples"
                )
            ev = EventDoc(now_ns, "loss", link, detail)
        else:
            hop = slow_hop.get(lk, hop_id(lk, down=False))
            names = f.nics
            flows = tuple((names[a].id, names[b].id, c) for a, b, c in flows_of(hop))
            both = f" and {f.hop_name(reverse_hop(hop))}" if two_way else ""
            moved = self._down_sibling(lk, now_ns)
            why = "" if moved is None else f" (flows re-hashed here from {moved}, which went down)"
            wait = self._wait_text(hop)
            over = self._overflow.get(lk)
            lost = "" if over is None else f"; {over:.1%} of its probes lost to overflow"
            ev = EventDoc(
                now_ns,
                "contention",
                f.hop_name(hop),
                f"queueing delay on {f.hop_name(hop)}{both}{wait}{why}{lost}",
                flows=flows,
                related=moved or "",
            )
        alias = self._aliases(lk) if nic is None else ()
        if alias:
            also = ", ".join(alias)
            why = f"; or {also}: every known path that crosses one crosses the other"
            ev = replace(ev, detail=ev.detail + why)
        self._raised[lk] = ev.target
        return ev

    def _wait_text(self, hop: int) -> str:
        """Return " (typical wait X µs)" from the last queue estimate of ``hop``, or ""."""
        q = None if self._queues is None else float(self._queues.queue_ns[hop])
        return "" if q is None or not np.isfinite(q) else f" (typical wait {q / 1e3:.1f} µs)"

    def _aliases(self, lk: int) -> tuple[str, ...]:
        """Return the ids of the links no known path tells apart from link ``lk``
        (`controller.detect.paths.alias_groups` over every path seen so far,
        `_refresh_aliases`)."""
        self._refresh_aliases()
        if self._alias_of is None:  # the links' groups of the paths `_refresh_aliases` took
            self._alias_of = {}
            hops = self._paths.hops[: self._alias_at]  # paths are only appended: those paths
            for g in alias_groups(len(self.fabric.links), hops):
                for li in g:
                    self._alias_of[li] = tuple(self.fabric.links[o].id for o in g if o != li)
        return self._alias_of.get(lk, ())

    def _refresh_aliases(self) -> None:
        """Recompute the alias groups of directed hops once the known paths have grown by 1 %
        (new paths only split groups, so between two computations a group may name a hop
        that the newest paths already tell apart); those of links, which only an event's
        text reads, are computed over the same paths when `_aliases` first needs them."""
        n = self._paths.size
        if self._alias_at >= 0 and n <= 1.01 * self._alias_at:  # 2 s at 2.5 M paths
            return
        self._alias_at = n
        self._alias_of = None
        self._hop_aliases = alias_groups(self.fabric.n_hops, self._paths.hops, directed=True)

    def _down_sibling(self, lk: int, now_ns: int) -> str | None:
        """Return the id of a sibling of link ``lk`` (`Fabric.sibling_links`) that is down or
        flapping now, or lost at least ``heavy_loss`` of its probes within ``moved_ns`` (a
        switch link that goes down loses its probes only until ECMP re-hashes its flows),
        the first by index, or None: ECMP moved that link's flows onto ``lk``'s group, so
        queueing on ``lk`` may follow from it."""
        for s in self.fabric.sibling_links[lk]:
            recent = now_ns - self._last_heavy[s] < self.config.moved_ns
            if recent or self._states[s].state in (Health.DOWN, Health.FLAPPING):
                return self.fabric.links[s].id
        return None

    # ---- outputs -------------------------------------------------------------------------
    def link_health(self) -> dict[str, Health]:
        """Return the health of every link by link id."""
        return {self.fabric.links[i].id: st.state for i, st in enumerate(self._states)}

    def nic_health(self) -> list[Health]:
        """Return per NIC index its health (its NIC link's; UNKNOWN while its prober is down)."""
        out = []
        for i, lk in enumerate(self.fabric.nic_link):
            out.append(Health.UNKNOWN if self._excluded[i] else self._states[int(lk)].state)
        return out

    def flap_counts(self) -> dict[str, int]:
        """Return per link id the downs in the flap window (links that went down only)."""
        now = self._last_tick or 0
        w = self.config.health.flap_window_ns
        return {
            self.fabric.links[i].id: c
            for i, st in enumerate(self._states)
            if st.downs and (c := st.flap_count(now, w))  # most links never went down
        }

    def path_baselines(self, sig: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Return the propagation baseline of each path signature
        (`controller.detect.paths.path_signature`), NaN if unseen or never measured."""
        idx = self._paths.lookup(np.asarray(sig, np.int64))
        out = np.where(idx >= 0, self._paths.base[np.maximum(idx, 0)], np.nan)
        return np.where(np.isfinite(out), out, np.nan)

    def baselines(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.float64]]:
        """Return every path with a propagation baseline: (signatures, hop rows, baselines)."""
        p = self._paths
        has = np.flatnonzero(np.isfinite(p.base))
        return p.sigs[has], p.hops[has], p.base[has]

    def path_width(self) -> int:
        """Return the width of the hop rows paths are keyed by (the fabric's longest path)."""
        return self._paths.width

    def baseline_ns(self, hops: npt.NDArray[np.int32]) -> npt.NDArray[np.float64]:
        """Return the propagation baseline of each path (rows of directed hops), NaN if unseen."""
        idx = self._paths.paths(np.atleast_2d(hops).astype(np.int32))
        out = self._paths.base[idx]
        return np.where(np.isfinite(out), out, np.nan)

    def hosts_down(self) -> frozenset[str]:
        """Return hosts whose prober is down (presence lost or silent)."""
        return frozenset(self._presence_down | self._silent)
