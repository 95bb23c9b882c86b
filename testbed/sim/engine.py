"""Vectorized probe simulator with known truth (clocks, delays, losses, faults).

`Simulator` generates what probers would report on a fabric — coded probe pairs between chosen
NIC pairs over swept UDP source ports, four NIC-clock timestamps each — together with the ground
truth: true send times, true one-way delays, the directed hops each probe crossed, and the clock
offsets of every NIC. Everything is numpy over all probes of a time step, so 10,000 NICs fit.

Model:

- clocks: ``local_i(t) = epoch + t + offset_i + drift_i * t + wander_i(t)`` with offsets up to
  ``max_offset_ns``, drifts up to ``max_drift`` and a slow wander (a few sinusoids of periods
  30-300 s, ``wander_ns`` amplitude);
- per hop: propagation (a few ns of cable-length spread per link) + serialization of the probe
  + forwarding latency of the switch it leaves (0.3-1 µs, one switch model per tier with a few
  ns of spread per switch, so forward and reverse floors nearly match), plus queueing: with utilisation ``rho`` a probe waits with
  probability ``rho`` an exponential time of mean ``S / (1 - rho)`` (``S`` = one MTU at link
  rate), and rarely a heavy-tailed (Pareto) burst;
- stamps: ``hw`` quantizes to 6.4 ns with rare transmit-stamp outliers of 10-300 ns; ``cqe``
  (qpmesh's RDMA path) is ``hw`` with send stamps taken at the TX completion, before the NIC's
  own egress queue and a per-NIC lead before the wire, plus jitter (`stamp_model`); ``sw`` adds
  µs-scale kernel jitter (exponential delays after the event, larger on receive);
- faults (`testbed.scenario.Fault`): flap / link_down / nic_down drop every probe crossing the
  down link while it is down; loss drops with a probability per traversal; congest adds
  utilisation (magnitude <= 1) or a persistent queue of ``magnitude`` µs mean; gray drops a
  share of the link's 5-tuples and optic loses in bursts (`fault_model`); prober_down drops
  the host's own probes and every probe to it; gpu_fault only shows in `SimStep.gpu_faults`.

That is the *ideal* model (``SimConfig(model=ModelKnobs.ideal_model())``, ``--ideal`` on the
CLI). The default adds the realistic effects of `testbed.sim.model.ModelKnobs` (one generator
module each; docs/simulator.md): utilisation per directed hop and over time with hot spots,
incasts, overflow loss and load moving off down links (`load_model`); cable lengths, per-port
switch latency and NIC TX/RX delays (`asymmetry`); frequency wander and temperature steps
(`clock_model`); clock steps and servo steering (`clock_events`), gross bad hw stamps
(`stamp_model`); per-host software-stamp bias and outliers (`stamp_model`); the two probes of a
coded pair sharing queues; background loss and loss bursts (`loss_model`); ECMP hashing the
controller does not know, with the controller's view of each path in `SimStep.seen_fwd`
(`ecmp_model`). Effects draw from their own seeded generators, so the ideal model's random
stream is the original one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from contract.records import MISSING, ProbeBatch
from mesh.fabric import Fabric, NodeKind, hop_id
from mesh.fabric.model import hop_links
from testbed.scenario import Fault, FaultKind, validate_targets
from testbed.sim.asymmetry import hop_base_ns, nic_txrx_ns, pair_asymmetry_ns
from testbed.sim.clock_events import ClockEvents
from testbed.sim.clock_model import ClockWander
from testbed.sim.congestion_truth import QueueTruth
from testbed.sim.fault_model import gray_drops, optic_drops
from testbed.sim.load_model import UtilisationModel, redistribution
from testbed.sim.loss_model import LossModel
from testbed.sim.model import ModelKnobs
from testbed.sim.moving_paths import MovingPaths
from testbed.sim.stamp_model import StampModel, bad_stamps_ns, cqe_jitter_ns, cqe_lead_ns

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
EPOCH_NS = 1_700_000_000_000_000_000
HW_TICK_NS = 6.4
SPORT_LO, SPORT_HI = 49152, 65536
_ROWS = 1 << 17  # events per block where a per-event computation is done in blocks


# hw: NIC stamps at the wire (UDP with hardware stamps, or RDMA with port timestamps); cqe: NIC
# stamps with sends stamped at the TX completion (qpmesh's RDMA path); sw: kernel stamps
STAMPS = ("hw", "cqe", "sw")


class SimError(ValueError):
    """Bad simulator configuration."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Simulation knobs; see the module docstring for the model."""

    load: float = 0.4
    timestamps: str = "hw"
    rate_hz: float = 10.0  # coded probe pairs per second per probed peer
    peers: int = 16  # random peers in other groups per NIC
    mesh_in_group: bool = True  # also probe every NIC of the own group
    ports_per_pair: int = 8  # UDP source ports swept per peer
    coded_spacing_ns: int = 20_000
    seed: int = 1
    max_offset_ns: float = 1e6
    max_drift: float = 30e-6
    wander_ns: float = 3.0
    switch_latency_ns: tuple[float, float] = (300.0, 1000.0)  # per switch tier (one model a tier)
    switch_spread_ns: float = 4.0  # per-switch deviation from its tier's latency
    cable_spread_ns: float = 5.0  # per-link deviation of propagation delay (cable lengths)
    mtu_bytes: int = 4096
    probe_bytes: int = 64
    burst_prob: float = 2e-4  # per hop per probe, scaled by load
    turnaround_ns: tuple[float, float] = (1000.0, 4000.0)
    model: ModelKnobs = field(default_factory=ModelKnobs)  # realistic effects (default on)

    def __post_init__(self) -> None:
        if not 0 <= self.load <= 0.95:
            raise SimError(f"load must be in [0, 0.95], got {self.load}")
        if self.timestamps not in STAMPS:
            raise SimError(f"timestamps must be one of {STAMPS}, got {self.timestamps!r}")
        if self.rate_hz <= 0 or self.ports_per_pair < 1 or self.peers < 0:
            raise SimError("rate_hz must be > 0, ports_per_pair >= 1, peers >= 0")


@dataclass(frozen=True, eq=False)
class SimStep:
    """Probes initiated in [t0_s, t1_s) with their ground truth (arrays align with ``batch``)."""

    t0_s: float
    t1_s: float
    batch: ProbeBatch
    true_t_ns: F64  # true send time, ns since sim start
    true_fwd_ns: F64  # true one-way delays, NaN if lost
    true_rev_ns: F64
    hops_fwd: I32
    hops_rev: I32
    pair_index: I64  # index into Simulator.pairs_src/pairs_dst
    alive_hosts: frozenset[str]
    gpu_faults: frozenset[str]
    active_faults: tuple[Fault, ...] = field(default=())
    seen_fwd: I32 | None = None  # the controller's view of each probe's path (None: = hops)
    seen_rev: I32 | None = None
    hop_queue_ns: F64 | None = None  # per directed hop: median queueing (congestion truth)
    # what path discovery found in this step: (src, dst, sport, forward hops, reply hops)
    discovered: tuple[I64, I64, I64, I32, I32] | None = None


def _probe_pairs(fabric: Fabric, cfg: SimConfig, rng: np.random.Generator) -> tuple[I64, I64]:
    """Return directed (src, dst) NIC index arrays of the probe graph."""
    n = len(fabric.nics)
    group = fabric.nic_group_index
    src_l: list[I64] = []
    dst_l: list[I64] = []
    if cfg.mesh_in_group:
        for members in fabric.groups.values():
            m = np.asarray(members, dtype=np.int64)
            a, b = np.meshgrid(m, m, indexing="ij")
            keep = a != b
            src_l.append(a[keep])
            dst_l.append(b[keep])
    if cfg.peers:
        k = cfg.peers
        src = np.repeat(np.arange(n, dtype=np.int64), k)
        dst = rng.integers(0, n, size=n * k)
        # redraw peers in the own group or duplicates a few times, then drop leftovers
        for _ in range(8):
            bad = group[dst] == group[src]
            srt = src * n + dst
            _, first = np.unique(srt, return_index=True)
            dup = np.ones(len(srt), dtype=bool)
            dup[first] = False
            bad |= dup
            if not bad.any():
                break
            dst[bad] = rng.integers(0, n, size=int(bad.sum()))
        ok = group[dst] != group[src]
        srt = src * n + dst
        _, first = np.unique(srt, return_index=True)
        uniq = np.zeros(len(srt), dtype=bool)
        uniq[first] = True
        ok &= uniq
        src_l.append(src[ok])
        dst_l.append(dst[ok])
    if not src_l:
        raise SimError("empty probe graph: enable mesh_in_group or set peers > 0")
    src_all, dst_all = np.concatenate(src_l), np.concatenate(dst_l)
    if len(src_all) == 0:
        raise SimError("empty probe graph: the fabric is too small for this peer setting")
    return src_all, dst_all


class Simulator:
    """Generates probe batches with ground truth; faults can be added and cleared at run time."""

    def __init__(
        self, fabric: Fabric, config: SimConfig | None = None, faults: Sequence[Fault] = ()
    ) -> None:
        self.fabric = fabric
        self.config = cfg = config or SimConfig()
        self.rng = np.random.default_rng(cfg.seed)
        n = len(fabric.nics)
        self.offset_ns = self.rng.uniform(-cfg.max_offset_ns, cfg.max_offset_ns, n)
        self.drift = self.rng.uniform(-cfg.max_drift, cfg.max_drift, n)
        self._w_amp = self.rng.uniform(0, cfg.wander_ns, (n, 3))
        self._w_per = self.rng.uniform(30.0, 300.0, (n, 3))
        self._w_phase = self.rng.uniform(0, 2 * np.pi, (n, 3))
        self.pairs_src, self.pairs_dst = _probe_pairs(fabric, cfg, self.rng)
        n_pairs = len(self.pairs_src)
        self.ports = self.rng.integers(SPORT_LO, SPORT_HI, size=(n_pairs, cfg.ports_per_pair))
        self.phase_s = self.rng.uniform(0, 1.0 / cfg.rate_hz, n_pairs)
        self.faults: list[Fault] = []
        knobs = cfg.model
        self.real = not knobs.ideal
        self._fx = np.random.default_rng([cfg.seed, 900])
        self._fifo_rng = np.random.default_rng([cfg.seed, 901])  # coded pairs' FIFO (own stream)
        self._util = UtilisationModel(fabric, cfg.load, knobs, cfg.seed)
        self._wander = ClockWander(n, knobs, cfg.seed) if self.real else None
        self._stamps = StampModel(len(fabric.hosts), knobs, cfg.seed)
        self._loss = LossModel(len(fabric.links), knobs, cfg.seed)
        self.nic_tx_ns, self.nic_rx_ns = (
            nic_txrx_ns(n, knobs, cfg.seed) if self.real else (np.zeros(n), np.zeros(n))
        )
        egress = np.zeros(fabric.n_hops, dtype=bool)
        egress[[hop_id(int(li), False) for li in fabric.nic_link]] = True
        self._queue_truth = QueueTruth(
            knobs, cfg.seed, egress, self.real and cfg.timestamps == "hw" and knobs.hw_stamp_at_wire
        )
        # NIC clocks as they are: steps, servo steering, bad stamps, CQE send stamps (the lead
        # of a NIC's CQE stamps before the wire is a constant of its TX path)
        self._events = ClockEvents(n, knobs, cfg.seed)
        self._clk_rng = np.random.default_rng([cfg.seed, 902])
        if cfg.timestamps == "cqe":
            self.nic_tx_ns = self.nic_tx_ns + cqe_lead_ns(n, knobs, cfg.seed)
        for f in faults:
            self.add_fault(f)
        self._moving = MovingPaths(
            fabric, knobs, cfg.seed, self.pairs_src, self.pairs_dst, self.ports
        )
        self._seq = 0
        self._pair_id = 0
        self._batch_seq = 0

    # ---- faults --------------------------------------------------------------------------
    def add_fault(self, fault: Fault) -> None:
        """Add a fault (its times are simulated seconds); raise `ScenarioError` on a bad target."""
        validate_targets(self.fabric, [fault])
        self.faults.append(fault)

    def clear_faults(self, until_s: float | None = None) -> None:
        """Remove all faults (or, with ``until_s``, end every fault at that time)."""
        if until_s is None:
            self.faults.clear()
            return
        kept = []
        for f in self.faults:
            if f.start_s < until_s:
                kept.append(
                    Fault(
                        f.kind,
                        f.target,
                        f.start_s,
                        max(until_s - f.start_s, 1e-9),
                        f.magnitude,
                        f.down_s,
                        f.up_s,
                    )
                )
        self.faults = kept

    # ---- truth ---------------------------------------------------------------------------
    def redraw_luck(self, draw: int) -> None:
        """Re-seed the per-probe random streams (queueing waits and bursts, incast hits, the
        coded pairs' FIFO gaps, loss and turnaround draws, stamp jitter) as draw ``draw`` of
        this seed: the same fabric, clocks, probe pairs, paths, load and hot spots, other luck.
        Call before the first step. For truth that needs the luck averaged out
        (`sim sync --luck-draws`); draw 0 is not the simulator's own stream. Raises ValueError
        for a negative ``draw``."""
        if draw < 0:
            raise ValueError(f"draw must be >= 0, got {draw}")
        seed = self.config.seed
        self.rng = np.random.default_rng([seed, 910, draw])
        self._fx = np.random.default_rng([seed, 911, draw])
        self._fifo_rng = np.random.default_rng([seed, 912, draw])
        self._clk_rng = np.random.default_rng([seed, 913, draw])

    def step_clock(self, nic: int, at_s: float, step_ns: float) -> None:
        """Step NIC ``nic``'s clock by ``step_ns`` at true time ``at_s`` (a host reboot,
        ptp4l / phc2sys stepping the NIC clock). Raises ValueError on a bad NIC or time."""
        self._events.add_step(nic, at_s, step_ns)

    def clock_steps(self, until_s: float) -> list[tuple[int, float, float]]:
        """Every clock step up to true time ``until_s`` (random and scheduled): (NIC index,
        time s, size ns), by time."""
        return self._events.steps(until_s)

    def true_offset_ns(self, t_ns: float | F64, nic: npt.ArrayLike | None = None) -> F64:
        """Return the clock offsets (local - true, without the epoch) at true time ``t_ns``.

        Scalar ``t_ns`` gives one value per NIC (or per ``nic`` index); an array ``t_ns`` must
        align with ``nic``.
        """
        idx = np.arange(len(self.fabric.nics)) if nic is None else np.asarray(nic)
        t = np.asarray(t_ns, dtype=np.float64)
        if t.ndim == 1 and idx.shape == t.shape and len(t) > _ROWS:
            # row by row the same values; in blocks, so the (events, 3) wander temporaries of
            # a step's stamps stay a few MB
            out = np.empty(len(t))
            for a in range(0, len(t), _ROWS):
                out[a : a + _ROWS] = self.true_offset_ns(t[a : a + _ROWS], idx[a : a + _ROWS])
            return out
        t_s = t / 1e9
        wander = (
            self._w_amp[idx]
            * np.sin(2 * np.pi * t_s[..., None] / self._w_per[idx] + self._w_phase[idx])
        ).sum(axis=-1)
        if self._wander is not None:
            wander = wander + self._wander.offset_ns(t, idx)
        if self._events.active:
            wander = wander + self._events.offset_ns(t, idx)
        return np.asarray(self.offset_ns[idx] + self.drift[idx] * t + wander, dtype=np.float64)

    @cached_property
    def _hop_base_ns(self) -> F64:
        """Fixed delay of each directed hop: propagation + serialization + switch forwarding."""
        f, cfg = self.fabric, self.config
        if self.real:
            return hop_base_ns(f, cfg.model, cfg.seed, cfg.switch_latency_ns, cfg.probe_bytes)
        rng = np.random.default_rng(cfg.seed + 7)
        tier_lat = {kind: float(rng.uniform(*cfg.switch_latency_ns)) for kind in NodeKind}
        sw_lat = {
            n.id: tier_lat[n.kind] + float(rng.uniform(-1, 1)) * cfg.switch_spread_ns
            for n in f.nodes
            if n.kind != NodeKind.HOST
        }
        base = np.empty(f.n_hops)
        for lk in f.links:
            ser = cfg.probe_bytes * 8 / lk.capacity_bps * 1e9
            prop = lk.prop_delay_ns + float(rng.uniform(-1, 1)) * cfg.cable_spread_ns
            base[hop_id(lk.index, False)] = prop + ser + sw_lat.get(lk.lower, 0.0)
            base[hop_id(lk.index, True)] = prop + ser + sw_lat.get(lk.upper, 0.0)
        return base

    @cached_property
    def _probe_ser_ns(self) -> F64:
        """Per directed hop: time to send one probe at link rate."""
        cap = np.repeat([lk.capacity_bps for lk in self.fabric.links], 2)
        return np.asarray(self.config.probe_bytes * 8 / cap * 1e9, dtype=np.float64)

    @cached_property
    def _service_ns(self) -> F64:
        """Per directed hop: time to send one MTU at link rate (the queueing unit)."""
        cap = np.repeat([lk.capacity_bps for lk in self.fabric.links], 2)
        return np.asarray(self.config.mtu_bytes * 8 / cap * 1e9, dtype=np.float64)

    def probed_paths(self) -> I32:
        """Return the true hops of every probed flow's probes and of its replies, one row
        each: ``(2 x pairs x ports, H)``, -1 padding (what end-to-end measurements cover)."""
        fwd, rev = self._moving.truth
        return np.concatenate([fwd.reshape(-1, fwd.shape[-1]), rev.reshape(-1, rev.shape[-1])])

    def loss_bursts(self, t0_s: float, t1_s: float) -> list[tuple[int, float, float]]:
        """Return the background loss bursts (link index, start s, end s) in [t0_s, t1_s)
        (none in the ideal model)."""
        return self._loss.bursts(t0_s, t1_s) if self.real else []

    def discovered_paths(self) -> tuple[I64, I64, I64, I32, I32]:
        """Return what the probers' path discovery tells the controller, one row per probed
        flow: (src, dst, sport, forward hops, reply hops) as the controller sees them (the
        model's hash where discovery missed a flow the real hash routes elsewhere)."""
        n_pairs, k = self.ports.shape
        sf, sr = self._moving.seen
        return (
            np.repeat(self.pairs_src, k),
            np.repeat(self.pairs_dst, k),
            self.ports.ravel().astype(np.int64),
            sf.reshape(n_pairs * k, -1),
            sr.reshape(n_pairs * k, -1),
        )

    def pair_asymmetry_ns(self) -> F64:
        """Return per probed pair half its constant forward-minus-reverse delay (ns), averaged
        over the pair's swept paths (with software stamps, the hosts' stamp biases included):
        the bias a two-way estimator cannot observe."""
        fwd, rev = self._moving.truth
        tx, rx = self.nic_tx_ns, self.nic_rx_ns
        if self.real and self.config.timestamps == "sw":  # host stamp bias acts the same way
            host = self.fabric.nic_host_index
            tx = tx + self._stamps.bias_tx[host]
            rx = rx + self._stamps.bias_rx[host]
        return pair_asymmetry_ns(
            fwd, rev, self._hop_base_ns, tx, rx, self.pairs_src, self.pairs_dst
        )

    def fixed_delay_ns(self, hops: I32, src: I64, dst: I64) -> F64:
        """Return each probe's fixed one-way delay along ``hops`` (n, H; -1 pads) from NIC
        ``src`` to NIC ``dst``: the hops' propagation, serialization and forwarding, plus in the
        realistic model (and with CQE stamps) the sender's NIC TX delay (with CQE stamps its
        lead) and the receiver's NIC RX delay. A probe's true one-way delay minus this is the
        queueing it met."""
        valid = hops >= 0
        base = np.where(valid, self._hop_base_ns[np.where(valid, hops, 0)], 0.0).sum(axis=1)
        if self.real or self.config.timestamps == "cqe":
            base = base + self.nic_tx_ns[src] + self.nic_rx_ns[dst]
        return np.asarray(base, dtype=np.float64)

    # ---- generation ----------------------------------------------------------------------
    def step(self, t0_s: float, dt_s: float) -> SimStep:
        """Return every probe initiated in [t0_s, t0_s + dt_s) with its truth."""
        if dt_s <= 0:
            raise SimError("dt_s must be > 0")
        cfg, rng, f = self.config, self.rng, self.fabric
        t1_s = t0_s + dt_s
        rate = cfg.rate_hz
        k0 = np.ceil((t0_s - self.phase_s) * rate).astype(np.int64)
        k1 = np.ceil((t1_s - self.phase_s) * rate).astype(np.int64)
        counts = np.maximum(k1 - k0, 0)
        pidx = np.repeat(np.arange(len(self.phase_s)), counts)
        # k index of each coded pair
        offs = np.arange(len(pidx)) - np.repeat(np.cumsum(counts) - counts, counts)
        kk = np.repeat(k0, counts) + offs
        t_pair_s = self.phase_s[pidx] + kk / rate
        # two probes per coded pair
        pidx2 = np.repeat(pidx, 2)
        kk2 = np.repeat(kk, 2)
        pos = np.tile(np.array([0, 1], dtype=np.uint8), len(pidx))
        t_ns = np.repeat(t_pair_s * 1e9, 2) + pos * float(cfg.coded_spacing_ns)
        slot = kk2 % cfg.ports_per_pair
        del offs, kk, t_pair_s, kk2  # (per-probe temporaries are freed as soon as used)
        src = self.pairs_src[pidx2]
        dst = self.pairs_dst[pidx2]
        sport = self.ports[pidx2, slot]
        fwd_paths, rev_paths = self._moving.truth
        hops_f = fwd_paths[pidx2, slot]
        hops_r = rev_paths[pidx2, slot]
        seen_f = seen_r = None
        found = self._moving.discover(t0_s, t1_s, self.faults) if self.real else None
        if self.real:  # the controller's view: discovered at the start or traced since
            seen_f, seen_r = self._moving.known(pidx2, slot)
        # faults active in this step; flows of a down switch link re-hash (reroute_model)
        active = [ft for ft in self.faults if ft.start_s < t1_s and ft.end_s > t0_s]
        t_s = t_ns / 1e9
        hops_f, hops_r, lost = self._moving.route(active, t_s, pidx2, slot, hops_f, hops_r)
        del slot

        n = len(t_ns)
        util_extra = np.zeros(f.n_hops)
        queue_extra_us = np.zeros(f.n_hops)
        host_of = f.nic_host_index
        hosts = f.hosts
        dead_hosts: set[str] = set()
        gpu_bad: set[str] = set()
        down_links: list[int] = []
        for ft in active:
            on = _active_mask(ft, t_s)
            if ft.kind == FaultKind.PROBER_DOWN:
                dead_hosts.add(ft.target)
                continue
            if ft.kind == FaultKind.GPU_FAULT:
                gpu_bad.add(ft.target)
                continue
            if ft.kind == FaultKind.NIC_DOWN:
                li = int(f.nic_link[f.nic_index[ft.target]])
            else:
                li = f.link_index[ft.target]
            hop_ids = (hop_id(li, False), hop_id(li, True))
            crosses = np.isin(hops_f, hop_ids).any(axis=1) | np.isin(hops_r, hop_ids).any(axis=1)
            if ft.kind in (FaultKind.FLAP, FaultKind.LINK_DOWN, FaultKind.NIC_DOWN):
                if not self._moving.reroutes(li):  # else handled by `route` above
                    lost |= crosses & on
                if on.mean() >= 0.5:
                    down_links.append(li)
            elif ft.kind == FaultKind.LOSS:
                p = ft.magnitude / 100.0
                nf = np.isin(hops_f, hop_ids).sum(axis=1) + np.isin(hops_r, hop_ids).sum(axis=1)
                drop = rng.random(n) < 1 - (1 - p) ** nf
                lost |= drop & on
            elif ft.kind == FaultKind.GRAY:
                lost |= gray_drops(f, ft, src, dst, sport, hops_f, hops_r) & on
            elif ft.kind == FaultKind.OPTIC:
                m = cfg.model
                burst = optic_drops(
                    ft, li, t_s, hops_f, hops_r, m.optic_duty, m.optic_burst_ms, self._fx
                )
                lost |= burst & on
            elif ft.kind == FaultKind.CONGEST:
                # applied below per probe only while on; most steps are fully inside a fault
                if ft.magnitude <= 1:
                    util_extra[list(hop_ids)] += ft.magnitude
                else:
                    queue_extra_us[list(hop_ids)] += ft.magnitude
        keep: npt.NDArray[np.bool_] | slice = slice(None)  # all: the columns, not copies
        if dead_hosts:
            dead_idx = np.array([i for i, h in enumerate(hosts) if h.id in dead_hosts])
            from_dead = np.isin(host_of[src], dead_idx)
            to_dead = np.isin(host_of[dst], dead_idx)
            lost |= to_dead
            keep = ~from_dead

        if self.real:
            rho = self._util.utilisation(t0_s)
            if cfg.model.redistribute and down_links:
                rho = rho + redistribution(f, down_links, rho)
            rho = np.minimum(rho + util_extra, 0.98)
            lost |= self._real_loss(hops_f, hops_r, rho, t_s)
            incast = self._util.incast(t0_s)
        else:
            rho = np.minimum(cfg.load + util_extra, 0.98)
            incast = None
        del t_s
        hop_q = self._queue_truth.hop_queue_ns(rho, self._service_ns, incast)
        owd_f, nic_wait_f = self._delays(hops_f, rho, queue_extra_us, incast)
        owd_r, nic_wait_r = self._delays(hops_r, rho, queue_extra_us, incast)
        if self.real or cfg.timestamps == "cqe":
            owd_f += self.nic_tx_ns[src] + self.nic_rx_ns[dst]
            owd_r += self.nic_tx_ns[dst] + self.nic_rx_ns[src]
        if cfg.timestamps == "cqe":  # each send stamp a little earlier still than its lead
            owd_f += cqe_jitter_ns(n, cfg.model, self._clk_rng)
            owd_r += cqe_jitter_ns(n, cfg.model, self._clk_rng)
        if self.real and cfg.timestamps == "hw" and cfg.model.hw_stamp_at_wire:
            # a NIC stamps a probe as it goes on the wire, after its own egress queue: that
            # wait is before the send stamp, not part of the measured (or true) one-way delay
            owd_f -= nic_wait_f
            owd_r -= nic_wait_r
        else:
            nic_wait_f = nic_wait_r = np.zeros(n)
        turn = rng.uniform(*cfg.turnaround_ns, n)
        T1 = t_ns + nic_wait_f  # send stamp instant (handed to the NIC at t_ns)
        del t_ns, nic_wait_f
        T2 = T1 + owd_f
        T3 = T2 + turn + nic_wait_r
        del turn, nic_wait_r
        T4 = T3 + owd_r
        s1 = self._stamp(T1, src, tx=True)
        s2 = self._stamp(T2, dst, tx=False)
        del T2
        s3 = self._stamp(T3, dst, tx=True)
        del T3
        s4 = self._stamp(T4, src, tx=False)
        del T4
        for s in (s2, s3, s4):
            s[lost] = MISSING
        true_f = np.where(lost, np.nan, owd_f)
        true_r = np.where(lost, np.nan, owd_r)

        n_keep = n if isinstance(keep, slice) else int(keep.sum())
        seq = (self._seq + np.arange(n_keep)) % (1 << 32)
        self._seq += n_keep
        pair_ids = ((self._pair_id + np.repeat(np.arange(len(pidx)), 2)) % (1 << 31))[keep]
        self._pair_id += len(pidx)
        self._batch_seq += 1
        batch = ProbeBatch.from_columns(
            "sim",
            "sw" if cfg.timestamps == "sw" else "hw",
            self._nic_ids,
            {
                "seq": seq,
                "src": src[keep],
                "dst": dst[keep],
                "sport": sport[keep],
                "pair": pair_ids,
                "pos": pos[keep],
                "t1": s1[keep],
                "t2": s2[keep],
                "t3": s3[keep],
                "t4": s4[keep],
                "lost": lost[keep],
            },
            batch_seq=self._batch_seq,
        )
        return SimStep(
            t0_s,
            t1_s,
            batch,
            T1[keep],
            true_f[keep],
            true_r[keep],
            hops_f[keep],
            hops_r[keep],
            pidx2[keep],
            frozenset(h.id for h in hosts) - dead_hosts,
            frozenset(gpu_bad),
            tuple(active),
            seen_f[keep] if seen_f is not None else None,
            seen_r[keep] if seen_r is not None else None,
            hop_q,
            found,
        )

    def run(
        self, duration_s: float, step_s: float = 0.1, start_s: float = 0.0
    ) -> Iterator[SimStep]:
        """Yield consecutive steps of ``step_s`` from ``start_s`` to ``start_s + duration_s``."""
        if duration_s <= 0 or step_s <= 0:
            raise SimError("duration_s and step_s must be > 0")
        n = int(np.ceil(duration_s / step_s - 1e-9))
        for i in range(n):
            t0 = start_s + i * step_s
            yield self.step(t0, min(step_s, start_s + duration_s - t0))

    @cached_property
    def _nic_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.fabric.nics)

    def _delays(
        self, hops: I32, rho_hop: F64, queue_extra_us: F64, incast: npt.NDArray[np.bool_] | None
    ) -> tuple[F64, F64]:
        """Return the one-way delay of each probe along ``hops`` (n, H) with queueing, and the
        wait at its first hop (the source NIC's own egress queue).

        ``rho_hop``: utilisation per directed hop; ``incast``: hops with an incast burst in
        this step (realistic model). Rows 2j and 2j+1 are the two probes of a coded pair; in
        the realistic model (``coded_fifo``) the second goes through each hop's FIFO behind the
        first (`_coded_fifo`).
        """
        cfg, rng = self.config, self.rng
        valid = hops >= 0
        h = np.where(valid, hops, 0)  # column 0: the source NIC's own egress (NIC -> leaf)
        rho = rho_hop[h]
        svc = self._service_ns[h]
        # in place, in the order the draws are made: a step's (probes, hops) float temporaries
        # are tens of MB each at 10,000 NICs; the values are those of the expressions noted
        scratch = rng.random(hops.shape)
        waits = scratch < rho
        q = rng.exponential(1.0, hops.shape)  # q = where(waits, Exp(1) * svc / (1 - rho), 0)
        q *= svc
        np.subtract(1.0, rho, out=scratch)
        q /= scratch
        q[~waits] = 0.0
        del waits
        burst = rng.random(hops.shape, out=scratch) < cfg.burst_prob * rho
        if burst.any():
            nb = int(burst.sum())
            q[burst] += np.minimum((rng.pareto(1.5, nb) + 1.0) * 1000.0, 200_000.0)
        del burst, scratch
        if queue_extra_us.any():
            extra = queue_extra_us[h]
            if extra.any():
                on = extra > 0
                q[on] += rng.exponential(1.0, int(on.sum())) * extra[on] * 1000.0
            del extra
        if self.real:
            fx, m = self._fx, cfg.model
            if incast is not None and incast.any():
                hit = incast[h] & valid & (fx.random(hops.shape) < m.incast_hit)
                q[hit] += fx.exponential(m.incast_queue_us * 1000.0, int(hit.sum()))
                del hit
            if m.coded_fifo and len(q) >= 2:
                self._coded_fifo(q, h, valid, rho, svc)
        del rho, svc
        first = np.asarray(np.where(valid[:, 0], q[:, 0], 0.0), dtype=np.float64)
        q += self._hop_base_ns[h]  # owd = where(valid, base + q, 0).sum(axis=1)
        q[~valid] = 0.0
        return np.asarray(q.sum(axis=1), dtype=np.float64), first

    def _coded_fifo(self, q: F64, h: I32, valid: npt.NDArray[np.bool_], rho: F64, svc: F64) -> None:
        """Replace, in place, the second probe's wait at every hop by what a FIFO gives it.

        Per hop in path order, with ``s`` the pair's spacing on arrival at the hop, ``W1`` the
        first probe's wait and ``tau`` a probe's serialization time: if the first is still
        queued or being sent when the second arrives (``W1 + tau > s``), the second waits
        behind it, ``W2 = W1 + tau - s + C`` with ``C`` the cross traffic that arrived in the
        gap (Poisson MTU packets at utilisation rho, exponential service): the pair is
        *compressed* towards ``tau + C``. Otherwise the queue drained between the two and the
        second's own draw stands. The spacing leaving the hop is ``s + W2 - W1``, so a pair
        keeps its sent spacing only when neither probe waited anywhere (a pure pair) or by
        coincidence. Packet-pair dispersion through FIFO queues: Dovrolis, Ramanathan, Moore,
        *What do packet dispersion techniques measure?*, INFOCOM 2001; Huygens (Geng et al.,
        NSDI 2018, section 3) filters on exactly this.
        """
        n2 = len(q) // 2
        q1, q2 = q[0 : 2 * n2 : 2], q[1 : 2 * n2 : 2]
        spacing = np.full(n2, float(self.config.coded_spacing_ns))
        tau = self._probe_ser_ns
        for c in range(q.shape[1]):
            ok = valid[0 : 2 * n2 : 2, c]
            if not ok.any():
                break
            hop = h[0 : 2 * n2 : 2, c]
            w1 = q1[:, c]
            busy = ok & (w1 + tau[hop] > spacing)
            if busy.any():
                sv, r = svc[0 : 2 * n2 : 2, c][busy], rho[0 : 2 * n2 : 2, c][busy]
                gap = spacing[busy]
                arrivals = self._fifo_rng.poisson(r * gap / sv)
                cross = sv * self._fifo_rng.gamma(np.maximum(arrivals, 1), 1.0) * (arrivals > 0)
                q2[busy, c] = w1[busy] + tau[hop[busy]] - gap + cross
            spacing = np.where(ok, spacing + q2[:, c] - w1, spacing)

    def _real_loss(self, hops_f: I32, hops_r: I32, rho: F64, t_s: F64) -> npt.NDArray[np.bool_]:
        """Return which probes the realistic model drops: background loss, buffer overflow at
        high utilisation and loss bursts (per directed hop traversal, both directions)."""
        m, fx = self.config.model, self._fx
        # probability of passing each directed hop, multiplied along the path column by column
        # in path order (forward hops, then reverse): the product numpy's row-wise prod takes,
        # without a (probes, 2 x hops) float temporary
        p_hop = (1.0 - m.background_loss) * (1.0 - self._util.overflow_loss(rho))
        keep = np.ones(len(hops_f))
        for hops in (hops_f, hops_r):
            for c in range(hops.shape[1]):
                col = hops[:, c]
                keep *= np.where(col >= 0, p_hop[np.maximum(col, 0)], 1.0)
        bursts = self._loss.bursts(float(t_s.min(initial=0.0)), float(t_s.max(initial=0.0)) + 1e-3)
        if bursts:
            both = np.concatenate([hops_f, hops_r], axis=1)
            valid = both >= 0
            links = hop_links(np.where(valid, both, 0))
            del both
            for li, b0, b1 in bursts:
                inb = (t_s >= b0) & (t_s < b1)
                n_cross = ((links == li) & valid).sum(axis=1)
                keep = keep * np.where(inb, (1.0 - m.burst_loss) ** n_cross, 1.0)
        return np.asarray(fx.random(len(keep)) >= keep)

    def _stamp(self, true_ns: F64, nic: I64, *, tx: bool) -> I64:
        """Return the int64 NIC-clock stamps of events at ``true_ns`` on ``nic``."""
        cfg, rng = self.config, self.rng
        local = true_ns + self.true_offset_ns(true_ns, nic)
        n = len(true_ns)
        if cfg.timestamps != "sw":
            if tx:
                out = rng.random(n) < 1e-3
                local = local + np.where(out, rng.uniform(10.0, 300.0, n), 0.0)
            bad = bad_stamps_ns(n, cfg.model, self._clk_rng)
            if bad is not None:
                local = local + bad
            local = np.floor(local / HW_TICK_NS) * HW_TICK_NS
        else:
            mean = 500.0 if tx else 2000.0
            local = local + rng.exponential(mean, n) + np.abs(rng.normal(0, 200.0, n))
            if self.real:
                host = np.asarray(self.fabric.nic_host_index[nic], dtype=np.int64)
                extra: F64 = self._stamps.extra_ns(host, tx=tx, rng=self._fx)
                local = np.asarray(local + extra, dtype=np.float64)
        return np.asarray(np.round(local), dtype=np.int64) + EPOCH_NS


def _active_mask(fault: Fault, t_s: F64) -> npt.NDArray[np.bool_]:
    """Vectorized `Fault.active`: True where the fault is in effect at each time."""
    inside = (t_s >= fault.start_s) & (t_s < fault.end_s)
    if fault.kind != FaultKind.FLAP:
        return inside
    period = fault.down_s + fault.up_s
    return inside & (np.mod(t_s - fault.start_s, period) < fault.down_s)
