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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.detect.causes import excluded_nics, host_quiet, silent_hosts
from controller.detect.delay import DelayParams
from controller.detect.loss import LossParams
from controller.detect.loss_horizon import HorizonParams, LossHorizon, mispath_leaks, resid_rate
from controller.detect.paths import PathIndex, alias_groups
from controller.detect.window import DetectionWindow, WindowPart
from controller.health import EntityState, Finding, HealthParams, Signal, step
from controller.observations import Observations
from mesh.fabric import Fabric
from mesh.fabric.ecmp import routing_tables
from mesh.fabric.model import hop_id, hop_link, reverse_hop
from mesh.snapshot import Health


@dataclass(frozen=True, slots=True)
class BrainConfig:
    """Detection knobs (see docs/detection.md). ``silent_ns``: a host whose NICs initiated no
    probe for this long is reported ``prober_down``; 0 disables silence detection.
    ``lateness_ns``: a window (probes sent between two ticks) is judged only once a tick is
    this much past its end, so late reports (lost probes, delayed batches) land in the window
    they were sent in; 0 = judge at the next tick (callers that deliver each step complete).
    ``horizon``: loss over the last few windows, for losses too small or short for one
    (`controller.detect.loss_horizon`)."""

    loss: LossParams = field(default_factory=LossParams)
    delay: DelayParams = field(default_factory=DelayParams)
    health: HealthParams = field(default_factory=HealthParams)
    horizon: HorizonParams = field(default_factory=HorizonParams)
    silent_ns: int = 2_000_000_000
    lateness_ns: int = 0

    def __post_init__(self) -> None:
        if self.silent_ns < 0:
            raise ValueError("silent_ns must be >= 0")
        if self.lateness_ns < 0:
            raise ValueError("lateness_ns must be >= 0")


class Brain:
    """Detection and localization state for one fabric. Not thread-safe; one owner."""

    def __init__(self, fabric: Fabric, config: BrainConfig | None = None) -> None:
        self.fabric = fabric
        self.config = config or BrainConfig()
        n_links, n_nics = len(fabric.links), len(fabric.nics)
        width = routing_tables(fabric).max_hops
        self._paths = PathIndex(width)
        self._pairs = PathIndex(2 * width)
        self._alias_at = -1  # path count `_alias_of` was computed at (-1: never)
        self._alias_of: dict[int, tuple[str, ...]] = {}
        self._open: list[DetectionWindow] = [self._new_window()]
        self._states = [EntityState() for _ in range(n_links)]
        self._raised: dict[int, str] = {}
        self._nic_of_link = {int(lk): i for i, lk in enumerate(fabric.nic_link)}
        self._last_src = np.full(n_nics, -1, dtype=np.int64)
        self._presence_down: set[str] = set()
        self._silent: set[str] = set()
        self._excluded = np.zeros(n_nics, dtype=bool)
        self._reported_down: set[int] = set()
        self._gpu_bad: dict[str, str] = {}
        self._pending: list[EventDoc] = []
        self._last_tick: int | None = None
        self._horizon = LossHorizon(n_links, self.config.horizon)
        self._last_dead = np.full(n_links, np.iinfo(np.int64).min // 2, dtype=np.int64)  # ns
        nodes: dict[str, int] = {}
        self._link_nodes = np.array(
            [
                [nodes.setdefault(lk.lower, len(nodes)), nodes.setdefault(lk.upper, len(nodes))]
                for lk in fabric.links
            ],
            dtype=np.int64,
        ).reshape(-1, 2)
        self._switch_link = np.array([lk.lower not in fabric.nic_index for lk in fabric.links])
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
        """Record the prober presence of ``host`` (MQTT last-will / hello)."""
        if alive:
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
        idx = [n.index for n in self.fabric.nics if n.host == host]
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
        events: list[EventDoc] = []
        quiet_hosts = host_quiet(f, win.src_count)
        nic_quiet = quiet_hosts[f.nic_host_index] | self._excluded
        reported = np.zeros(len(f.nics), dtype=bool)
        reported[list(self._reported_down)] = True
        nic_quiet &= ~reported  # its host says the link is down: that is evidence, not quiet

        loss = win.loss.verdict(cfg.loss)
        leak = cfg.horizon.sibling_leak
        leaks = mispath_leaks(loss.cover, self._link_nodes, self._switch_link, leak)
        slow_cover, slow_flows = win.delay.verdict(self._paths, cfg.delay)
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
        for lk, rate in loss.blamed.items():
            if lk not in leaks:
                signals[lk] = Signal.DEAD if rate >= cfg.loss.dead_rate else Signal.LOSSY
        for down_nic in self._reported_down:
            signals[int(f.nic_link[down_nic])] = Signal.DEAD
        rates = self._horizon_signals(
            signals, loss.cover.total, win.loss.lost_sets(), now_ns, round(dt_s * 1e9)
        )
        rates.update(loss.blamed)
        blamed = set()
        for lk in signals:
            nic = self._nic_of_link.get(lk)
            if nic is not None and nic_quiet[nic]:
                signals[lk] = Signal.NODATA
            else:
                blamed.add(f.links[lk].id)
        self.last_blamed = frozenset(blamed)

        enough = loss.cover.total >= cfg.loss.min_probes
        for lk, st in enumerate(self._states):
            sig = signals.get(lk)
            if sig is None:
                if st.state == Health.UP and st.streak == 0:
                    continue
                nic = self._nic_of_link.get(lk)
                quiet = nic is not None and nic_quiet[nic]
                sig = Signal.CLEAN if enough[lk] and not quiet else Signal.NODATA
            new, finding = step(st, sig, now_ns, cfg.health)
            self._states[lk] = new
            if finding is not None:
                ev = self._event(
                    lk, finding, new, now_ns, rates.get(lk), slow_hop, slow_flows, lk in two_way
                )
                if ev is not None:
                    events.append(ev)

        win.delay.fold_baselines(self._paths, dt_s, cfg.delay)
        return events

    def _horizon_signals(
        self,
        signals: dict[int, Signal],
        totals: npt.NDArray[np.int64],
        lost_sets: npt.NDArray[np.int32],
        now_ns: int,
        dt_ns: int,
    ) -> dict[int, float]:
        """Fold the window into the loss horizon; mark LOSSY in ``signals`` the links the
        horizon blames that the window did not, except leaks and links dead within the
        horizon or in the window before it (a partly dead window: that down, already
        reported); return the horizon's loss rates of the links it blamed."""
        dead = [lk for lk, s in signals.items() if s == Signal.DEAD]
        self._last_dead[dead] = now_ns
        self._horizon.push(now_ns, totals, lost_sets)
        hz = self._horizon.verdict()
        if not len(hz.picked):
            return {}
        hp = self.config.horizon
        leaks = mispath_leaks(hz, self._link_nodes, self._switch_link, hp.sibling_leak)
        held = now_ns - hp.span_ns - dt_ns  # dead after this: in or next to the horizon
        out = resid_rate(hz)
        for lk in out:
            if lk not in signals and lk not in leaks and self._last_dead[lk] < held:
                signals[lk] = Signal.LOSSY
        return out

    def _host_silence(self, now_ns: int) -> list[EventDoc]:
        out: list[EventDoc] = []
        if not self.config.silent_ns:
            return out
        silent = silent_hosts(self.fabric, self._last_src, now_ns, self.config.silent_ns)
        silent = {h for h in silent if not self._all_reported_down(h)}  # it cannot send
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
        slow_flows: dict[int, list[tuple[int, int, int]]],
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
            ev = EventDoc(now_ns, "loss", link, f"{rate or 0:.1%} of probes across it lost")
        else:
            hop = slow_hop.get(lk, hop_id(lk, down=False))
            names = f.nics
            flows = tuple((names[a].id, names[b].id, c) for a, b, c in slow_flows.get(hop, []))
            both = f" and {f.hop_name(reverse_hop(hop))}" if two_way else ""
            moved = self._down_sibling(lk)
            why = "" if moved is None else f" (flows re-hashed here from {moved}, which is down)"
            ev = EventDoc(
                now_ns,
                "contention",
                f.hop_name(hop),
                f"queueing delay on {f.hop_name(hop)}{both}{why}",
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

    def _aliases(self, lk: int) -> tuple[str, ...]:
        """Return the ids of the links no known path tells apart from link ``lk``
        (`alias_groups` over every path seen so far, recomputed once the known paths have grown
        by 1 %: new paths only split groups, so between two computations a group may name a
        link that the newest paths already tell apart)."""
        n = self._paths.size
        if self._alias_at < 0 or n > 1.01 * self._alias_at:  # 2 s at 2.5 M paths: not per event
            self._alias_at = n
            self._alias_of = {}
            for g in alias_groups(len(self.fabric.links), self._paths.hops):
                for li in g:
                    self._alias_of[li] = tuple(self.fabric.links[o].id for o in g if o != li)
        return self._alias_of.get(lk, ())

    def _down_sibling(self, lk: int) -> str | None:
        """Return the id of a sibling of link ``lk`` (`Fabric.sibling_links`) that is down or
        flapping now, the first by index, or None: ECMP moved that link's flows onto ``lk``'s
        group, so queueing on ``lk`` may follow from it."""
        for s in self.fabric.sibling_links[lk]:
            if self._states[s].state in (Health.DOWN, Health.FLAPPING):
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
