"""Injected causes for ``qpmesh sim rootcause``: what each does to the signals, to the jobs'
step times and to what the mesh reports, and the truth to score against.

Kinds (`KINDS`) and what they do (magnitudes are drawn per cause; sources in
docs/crosslayer.md, "The simulator"):

- ``pfc_storm``: a NIC's receive path stalls and it sends pauses (tens to hundreds of
  thousands a second); its leaf, its buffer full, pauses every other port under it.
- ``cnp_storm``: a leaf marks ECN far too early: its NICs see marks and send CNPs, the
  senders of their jobs act on them.
- ``fec_degrading``: a NIC's optic degrades: FEC-corrected errors rise ten-thousandfold over
  40-80 min, uncorrectable ones and retransmissions at the end, then the link flaps.
- ``gpu_thermal``: a GPU's cooling fails: hot, thermal slowdown, lower clocks and power.
- ``pcie_replay``: a NIC's slot degrades: PCIe replays (AER; mlx5 signal integrity), the NIC
  cannot drain, runs out of buffers and pauses its leaf.
- ``starved_host``: softirq / interrupt load starves a host (and its prober).
- ``mtu_config``: a host comes back with MTU 1500 on its NICs (RoCE MTU 1024).
- ``ecn_config``: a host's NICs ignore CNPs (DCQCN off): its traffic fills the leaf, which
  marks and pauses its neighbours.
- ``link_contention``: another tenant's traffic contends a leaf uplink the job's ring uses.
- ``link_flap``: a leaf uplink flaps.
- ``unobservable``: a job slows for a reason no signal shows (a software straggler).

A cause's truth: the entities whose counters record it (``affected``: a flag on any other
entity is false), the classes and targets that name it correctly, and per window the jobs it
slows and by how much.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from contract.signals import Entity
from testbed.sim.signals_model import COL, Fleet, NormalModel, Rates, SimJob

KINDS = ("pfc_storm", "cnp_storm", "fec_degrading", "gpu_thermal", "pcie_replay",
         "starved_host", "mtu_config", "ecn_config", "link_contention", "link_flap",
         "unobservable")  # fmt: skip
# classes that name each kind correctly (controller.rootcause.classes)
ACCEPT: dict[str, frozenset[str]] = {
    "pfc_storm": frozenset({"pfc_storm"}),
    "cnp_storm": frozenset({"cnp_storm"}),
    "fec_degrading": frozenset({"link_degraded", "link_flap", "link_loss", "link_down"}),
    "gpu_thermal": frozenset({"gpu_throttle"}),
    "pcie_replay": frozenset({"pcie"}),
    "starved_host": frozenset({"host_starved"}),
    "mtu_config": frozenset({"mtu_config"}),
    "ecn_config": frozenset({"ecn_config"}),
    "link_contention": frozenset({"link_contention"}),
    "link_flap": frozenset({"link_flap", "link_down"}),
    "unobservable": frozenset({"unknown"}),
}


@dataclass
class Cause:
    """One injected cause: kind, where (an entity, link, leaf or job id), windows [start,
    end), a magnitude in [0, 1), the targets that name it, and per-kind parameters."""

    kind: str
    target: str
    start: int
    end: int
    magnitude: float
    targets: frozenset[str]
    params: dict[str, float] = field(default_factory=dict)

    def active(self, w: int) -> bool:
        """Return True while the cause acts."""
        return self.start <= w < self.end


@dataclass
class Effect:
    """What a cause did in one window: entities touched, job index -> slowdown, findings."""

    affected: set[str] = field(default_factory=set)
    slow: dict[int, float] = field(default_factory=dict)
    findings: list[EventDoc] = field(default_factory=list)


@dataclass
class World:
    """The lookups the effects need."""

    fleet: Fleet
    jobs: list[SimJob]
    model: NormalModel
    window_s: float
    rng: np.random.Generator

    def __post_init__(self) -> None:
        f = self.fleet
        self.nic_i = {n: i for i, n in enumerate(f.nics)}
        self.host_i = {h: i for i, h in enumerate(f.hosts)}
        self.leaf_i = {lf: i for i, lf in enumerate(f.leaves)}
        self.nic_link = {
            n.id: f.fabric.links[int(f.fabric.nic_link[n.index])].id for n in f.fabric.nics
        }

    def t_ns(self, w: int) -> int:
        return int(w * self.window_s * 1e9)

    def under(self, leaf: int) -> npt.NDArray[np.intp]:
        return np.flatnonzero(self.fleet.nic_leaf == leaf)

    def host_nics(self, h: int) -> npt.NDArray[np.intp]:
        return np.flatnonzero(self.fleet.nic_host == h)

    def jobs_of(self, rates: Rates, nics: npt.NDArray[np.intp]) -> set[int]:
        j = rates.host_job[self.fleet.nic_host[nics]]
        return {int(x) for x in j[j >= 0]}

    def job_nics(self, k: int) -> npt.NDArray[np.intp]:
        return np.flatnonzero(np.isin(self.fleet.nic_host, self.jobs[k].hosts))

    def spanning(self, rates: Rates, leaf: int) -> set[int]:
        """Jobs with NICs under ``leaf`` and elsewhere (their rings cross its uplinks)."""
        out = set()
        for k in self.jobs_of(rates, self.under(leaf)):
            if len(set(self.fleet.nic_leaf[self.job_nics(k)].tolist())) > 1:
                out.add(k)
        return out

    def ring_flows(self, k: int, leaf: int) -> tuple[tuple[str, str, int], ...]:
        """Return up to 3 ring queue pairs of job ``k`` leaving ``leaf``."""
        nics = self.job_nics(k)
        f = self.fleet
        out = []
        for a, b in zip(nics, np.roll(nics, -1), strict=True):
            if f.nic_leaf[a] == leaf and f.nic_leaf[b] != leaf:
                out.append((f.nics[a], f.nics[b], 49152 + int(a) % 1000))
        return tuple(out[:3])


def _scale(rates: Rates, kind: Entity, rows: npt.NDArray[np.intp] | int, name: str,
           factor: float | npt.NDArray[np.float64] = 1.0, add: float = 0.0) -> None:  # fmt: skip
    m = rates.of(kind)
    j = COL[kind][name]
    m[rows, j] = m[rows, j] * factor + add


def _nic_ids(w_: World, idx: npt.NDArray[np.intp]) -> set[str]:
    return {w_.fleet.nics[int(i)] for i in idx}


def _pause_victims(
    w_: World, rates: Rates, src: int, rate: float, eff: Effect, slow: float
) -> None:
    leaf = int(w_.fleet.nic_leaf[src])
    vic = np.array([i for i in w_.under(leaf) if i != src], np.intp)
    share = w_.rng.uniform(0.3, 1.0, len(vic))
    m, c = rates.nic, COL[Entity.NIC]
    m[vic, c["pfc_rx_p3"]] += rate * share
    m[vic, c["pause_rx"]] += rate * share
    m[vic, c["rdma_xmit_wait"]] += 500.0 * rate * share
    m[vic, c["rdma_tx_bytes"]] *= 1 - 0.5 * share
    eff.affected |= _nic_ids(w_, vic)
    for k in w_.jobs_of(rates, vic):
        eff.slow[k] = max(eff.slow.get(k, 1.0), slow)


def _pfc_storm(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    src = w_.nic_i[c.target]
    rate = 2e4 * 10 ** (c.magnitude)  # 20 k .. 200 k pauses/s
    _scale(rates, Entity.NIC, src, "pfc_tx_p3", add=rate)
    _scale(rates, Entity.NIC, src, "pause_tx", add=rate)
    _scale(rates, Entity.NIC, src, "pause_storm_warnings", add=0.05)
    _scale(rates, Entity.NIC, src, "rx_out_of_buffer", add=1e3)
    _scale(rates, Entity.NIC, src, "rx_discards_phy", add=1e3)
    _scale(rates, Entity.NIC, src, "rdma_rx_bytes", factor=0.1)
    eff.affected.add(c.target)
    slow = 1.5 + 1.5 * c.magnitude
    for k in w_.jobs_of(rates, np.array([src])):
        eff.slow[k] = slow
    _pause_victims(w_, rates, src, rate * 0.3, eff, slow)
    leaf = int(w_.fleet.nic_leaf[src])
    under = [i for i in w_.under(leaf) if i != src and rates.host_job[w_.fleet.nic_host[i]] >= 0]
    if under and w_.rng.random() < 0.6:  # the victims' egress queues: contention on their link
        v = w_.fleet.nics[int(w_.rng.choice(under))]
        eff.findings.append(EventDoc(w_.t_ns(w), "contention", f"{v}->{w_.fleet.leaves[leaf]}"))
    if w_.rng.random() < 0.3:
        eff.findings.append(EventDoc(w_.t_ns(w), "loss", w_.nic_link[c.target]))
    return eff


def _cnp_storm(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    leaf = w_.leaf_i[c.target]
    under = w_.under(leaf)
    m, col = rates.nic, COL[Entity.NIC]
    # marks x100 .. x3000, at most every packet; CNPs at most one per 50 us per queue pair
    # (DCQCN, Zhu et al. 2015), ~8 queue pairs a NIC
    packets = m[under, col["rdma_rx_packets"]]
    marks = np.minimum(packets, m[under, col["ecn_marked"]] * 10 ** (2 + 1.5 * c.magnitude))
    m[under, col["ecn_marked"]] = marks
    m[under, col["cnp_sent"]] = np.minimum(marks, 8 * 2e4) * 0.5
    eff.affected |= _nic_ids(w_, under)
    slow = 1.2 + 0.4 * c.magnitude
    for k in w_.jobs_of(rates, under):
        jn = w_.job_nics(k)
        m[jn, col["cnp_handled"]] += float(np.mean(m[under, col["cnp_sent"]]))
        m[jn, col["rdma_tx_bytes"]] *= 1 / slow
        eff.affected |= _nic_ids(w_, jn)
        eff.slow[k] = slow
    return eff


def _fec(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    i = w_.nic_i[c.target]
    flap_at = c.end - int(c.params["flap_windows"])
    p = min(1.0, (w - c.start) / max(1, flap_at - c.start))
    m, col = rates.nic, COL[Entity.NIC]
    m[i, col["fec_corrected_bits"]] *= 10 ** (4 * p)
    m[i, col["fec_corrected_blocks"]] *= 10 ** (4 * p)
    eff.affected.add(c.target)
    link = w_.nic_link[c.target]
    late = max(0.0, (p - 0.8) / 0.2)
    slow = 1.0
    if late > 0 or w >= flap_at:
        for name, r in (("fec_uncorrectable_blocks", 10.0), ("symbol_errors", 5.0),
                        ("crc_errors_phy", 5.0), ("pcs_symbol_errors", 20.0)):  # fmt: skip
            m[i, col[name]] += r * 10 ** (2 * late)
        slow = 1.0 + 0.25 * late
        for k in w_.jobs_of(rates, np.array([i])):
            jn = w_.job_nics(k)
            m[jn, col["local_ack_timeout"]] += 2.0 * late
            m[jn, col["packet_seq_err"]] += 20.0 * late
            m[i, col["out_of_sequence"]] += 200.0 * late
            eff.affected |= _nic_ids(w_, jn)
        if w_.rng.random() < 0.5 * late:
            eff.findings.append(EventDoc(w_.t_ns(w), "loss", link))
    if w >= flap_at:
        m[i, col["link_down_events"]] += 0.03
        m[i, col["rdma_link_downed"]] += 0.03
        m[i, col["link_up"]] = 0.0 if w_.rng.random() < 0.3 else 1.0
        m[i, col["rdma_tx_bytes"]] *= 0.3
        slow = 2.0 + 2.0 * c.magnitude
        if w_.rng.random() < 0.9:
            eff.findings.append(EventDoc(w_.t_ns(w), "link_flap", link))
    for k in w_.jobs_of(rates, np.array([i])):
        eff.slow[k] = slow
    return eff


def _gpu_thermal(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    i = w_.fleet.gpus.index(c.target)
    ramp = min(1.0, (w - c.start + 1) / 3)
    m, col = rates.gpu, COL[Entity.GPU]
    m[i, col["temperature_c"]] = m[i, col["temperature_c"]] * (1 - ramp) + ramp * (
        88 + 6 * c.magnitude
    )
    m[i, col["throttle_thermal"]] = 1.0 if w_.rng.random() < 0.9 * ramp else 0.0
    m[i, col["sm_clock_mhz"]] *= 1 - ramp * (0.2 + 0.15 * c.magnitude)
    m[i, col["power_w"]] *= 1 - 0.2 * ramp
    eff.affected.add(c.target)
    for k in w_.jobs_of(rates, np.array([i])):
        eff.slow[k] = 1 + ramp * (0.25 + 0.35 * c.magnitude)
    return eff


def _pcie(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    i = w_.nic_i[c.target]
    r = 10 * 50**c.magnitude  # 10 .. 500 replays/s
    m, col = rates.nic, COL[Entity.NIC]
    for name, share in (("pcie_replay_rollover", 0.2), ("pcie_replay_timeout", 0.3),
                        ("pcie_bad_tlp", 0.3), ("pcie_bad_dllp", 0.2), ("pcie_si_rx", 0.05),
                        ("pcie_si_tx", 0.05)):  # fmt: skip
        m[i, col[name]] += r * share
    m[i, col["rx_out_of_buffer"]] += 50 * r
    pauses = 1e3 + 60 * r
    m[i, col["pfc_tx_p3"]] += pauses
    m[i, col["pause_tx"]] += pauses
    m[i, col["rdma_rx_bytes"]] *= 0.5
    eff.affected.add(c.target)
    slow = 1.3 + 0.7 * c.magnitude
    _pause_victims(w_, rates, i, pauses * 0.3, eff, 1.0 + 0.2 * c.magnitude)
    for k in w_.jobs_of(rates, np.array([i])):
        eff.slow[k] = slow
    if w_.rng.random() < 0.5:
        leaf = w_.fleet.leaves[int(w_.fleet.nic_leaf[i])]
        eff.findings.append(EventDoc(w_.t_ns(w), "contention", f"{leaf}->{c.target}"))
    return eff


def _starved(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    h = w_.host_i[c.target]
    m, col = rates.host, COL[Entity.HOST]
    load = 0.3 + 0.3 * c.magnitude
    m[h, col["cpu_softirq"]] += load
    m[h, col["psi_cpu_some"]] += load
    m[h, col["runq_per_cpu"]] *= 3
    m[h, col["softnet_squeezed"]] *= 50
    m[h, col["softnet_dropped"]] += 100
    eff.affected.add(c.target)
    job = int(rates.host_job[h])
    if job >= 0:
        eff.slow[job] = 1.2 + 0.6 * c.magnitude
    if w_.rng.random() < 0.3:
        eff.findings.append(EventDoc(w_.t_ns(w), "prober_down", c.target))
    if w_.rng.random() < 0.3:
        nic = w_.fleet.nics[int(w_.host_nics(h)[0])]
        leaf = w_.fleet.leaves[int(w_.fleet.host_leaf[h])]
        eff.findings.append(EventDoc(w_.t_ns(w), "contention", f"{nic}->{leaf}"))
    return eff


def _mtu(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    nics = w_.host_nics(w_.host_i[c.target])
    m, col = rates.nic, COL[Entity.NIC]
    m[nics, col["mtu"]] = 1500.0
    m[nics, col["rdma_tx_bytes"]] *= 0.85
    m[nics, col["rdma_tx_packets"]] *= 4 * 0.85
    m[nics, col["rdma_rx_packets"]] *= 4
    eff.affected |= _nic_ids(w_, nics)
    job = int(rates.host_job[w_.host_i[c.target]])
    if job >= 0:
        eff.slow[job] = 1.1 + 0.25 * c.magnitude
    return eff


def _ecn(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    h = w_.host_i[c.target]
    nics = w_.host_nics(h)
    m, col = rates.nic, COL[Entity.NIC]
    ign = 1e3 * 10**c.magnitude
    m[nics, col["cnp_ignored"]] += ign
    m[nics, col["cnp_handled"]] *= 0.01
    eff.affected |= _nic_ids(w_, nics)
    leaf = int(w_.fleet.host_leaf[h])
    others = np.array([i for i in w_.under(leaf) if i not in set(nics.tolist())], np.intp)
    if len(others):
        m[others, col["ecn_marked"]] = m[others, col["ecn_marked"]] * 5 + 2e3
        m[others, col["cnp_sent"]] = m[others, col["cnp_sent"]] * 5 + 1e3
        _pause_victims(w_, rates, int(nics[0]), 3e3, eff, 1.15 + 0.35 * c.magnitude)
        if w_.rng.random() < 0.4:
            v = w_.fleet.nics[int(w_.rng.choice(others))]
            eff.findings.append(EventDoc(w_.t_ns(w), "contention", f"{w_.fleet.leaves[leaf]}->{v}"))
    eff.slow.pop(int(rates.host_job[h]), None)  # its own job runs as fast as ever
    return eff


def _contention(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    lk = w_.fleet.fabric.link(c.target)
    leaf = w_.leaf_i[lk.lower]
    m, col = rates.nic, COL[Entity.NIC]
    slow = 1.3 + 0.7 * c.magnitude
    for k in w_.spanning(rates, leaf):
        jn = w_.job_nics(k)
        mine = jn[w_.fleet.nic_leaf[jn] == leaf]
        m[mine, col["ecn_marked"]] = m[mine, col["ecn_marked"]] * 5 + 1e3
        m[mine, col["cnp_sent"]] = m[mine, col["cnp_sent"]] * 5 + 500
        m[mine, col["pfc_rx_p3"]] *= 3
        m[mine, col["pause_rx"]] *= 3
        eff.affected |= _nic_ids(w_, mine)
        eff.slow[k] = slow
        if w_.rng.random() < 0.95:
            eff.findings.append(EventDoc(w_.t_ns(w), "contention", f"{lk.lower}->{lk.upper}",
                                         flows=w_.ring_flows(k, leaf)))  # fmt: skip
    return eff


def _flap(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    eff = Effect()
    lk = w_.fleet.fabric.link(c.target)
    leaf = w_.leaf_i[lk.lower]
    m, col = rates.nic, COL[Entity.NIC]
    slow = 1.5 + 1.5 * c.magnitude
    for k in w_.spanning(rates, leaf):
        jn = w_.job_nics(k)
        m[jn, col["local_ack_timeout"]] += 1.0
        m[jn, col["packet_seq_err"]] += 10.0
        eff.affected |= _nic_ids(w_, jn)
        eff.slow[k] = slow
    if w_.rng.random() < 0.95:
        eff.findings.append(EventDoc(w_.t_ns(w), "link_flap", c.target))
    return eff


def _unobservable(w_: World, c: Cause, w: int, rates: Rates) -> Effect:
    job = next(i for i, j in enumerate(w_.jobs) if j.id == c.target)
    return Effect(slow={job: 1.2 + 0.8 * c.magnitude})


EFFECTS: dict[str, Callable[[World, Cause, int, Rates], Effect]] = {
    "pfc_storm": _pfc_storm, "cnp_storm": _cnp_storm, "fec_degrading": _fec,
    "gpu_thermal": _gpu_thermal, "pcie_replay": _pcie, "starved_host": _starved,
    "mtu_config": _mtu, "ecn_config": _ecn, "link_contention": _contention, "link_flap": _flap,
    "unobservable": _unobservable,
}  # fmt: skip


def background_findings(w_: World, w: int) -> list[EventDoc]:
    """Return the mesh's findings of normal operation this window: short contention on a
    random uplink (other tenants' bursts), 0.3 % of windows."""
    if w_.rng.random() >= 0.003:
        return []
    up = [lk for lk in w_.fleet.fabric.links if lk.lower.startswith("leaf")]
    lk = up[int(w_.rng.integers(len(up)))]
    return [EventDoc(w_.t_ns(w), "contention", f"{lk.lower}->{lk.upper}")]


def draw_causes(
    w_: World, n: int, start: int, windows: int, kinds: Sequence[str] = KINDS
) -> list[Cause]:
    """Return ``n`` causes, kinds in turn from ``kinds`` (a random order), starting after
    window ``start``. A cause on a busy host strikes a job that has run for at least 10
    minutes and runs past the cause's end; no two causes overlap in time on hosts of one job
    (each slowed job has one true cause at a time)."""
    rng = w_.rng
    order = [kinds[i % len(kinds)] for i in rng.permutation(max(n, len(kinds)))][:n]
    out: list[Cause] = []
    busy: list[tuple[int, int, set[int]]] = []
    dt = w_.window_s
    for kind in order:
        for _ in range(100):
            dur = int(rng.uniform(600, 1800) / dt)
            params: dict[str, float] = {}
            if kind == "fec_degrading":
                params["flap_windows"] = int(rng.uniform(180, 480) / dt)
                dur = int(rng.uniform(2400, 4800) / dt) + int(params["flap_windows"])
            a = int(rng.integers(start, max(start + 1, windows - dur)))
            b = min(windows, a + dur)
            target, targets, hosts = _target(w_, kind, a, b, rng)
            if target is None:
                continue
            if any(x < b and a < y and hosts & hs for x, y, hs in busy):
                continue
            busy.append((a - 6, b + 6, hosts))
            out.append(Cause(kind, target, a, b, float(rng.random()), targets, params))
            break
    return out


def _job_hosts(w_: World, hosts: set[int]) -> set[int]:
    """Return ``hosts`` and every host of a job (at any time) that runs on one of them."""
    out = set(hosts)
    for j in w_.jobs:
        if out.intersection(j.hosts):
            out |= set(j.hosts)
    return out


def _target(
    w_: World, kind: str, a: int, b: int, rng: np.random.Generator
) -> tuple[str | None, frozenset[str], set[int]]:
    """Return a target for ``kind`` over windows [a, b) (on a host of a settled job 80 % of
    the time, else any host), the ids that name it, and the hosts whose jobs it can slow."""
    f = w_.fleet
    settled = [h for h in range(len(f.hosts))
               if any(j.start <= a - 60 and j.end >= b and h in j.hosts for j in w_.jobs)]  # fmt: skip
    pool = settled if settled and rng.random() < 0.8 else list(range(len(f.hosts)))
    h = int(rng.choice(pool))
    nic = int(rng.choice(w_.host_nics(h)))
    leaf = int(f.nic_leaf[nic])
    leaf_hosts = _job_hosts(w_, {int(x) for x in f.nic_host[w_.under(leaf)]})
    own = _job_hosts(w_, {h})
    host, nic_id = f.hosts[h], f.nics[nic]
    host_nics = frozenset(f.nics[int(i)] for i in w_.host_nics(h))
    if kind in ("pfc_storm", "pcie_replay"):
        return nic_id, frozenset({nic_id, host}), leaf_hosts
    if kind == "fec_degrading":
        return nic_id, frozenset({nic_id, w_.nic_link[nic_id]}), own
    if kind == "gpu_thermal":
        return f.gpus[nic], frozenset({f.gpus[nic]}), own
    if kind in ("starved_host", "mtu_config"):
        return host, frozenset({host, *host_nics}), own
    if kind == "ecn_config":
        return host, frozenset({host, *host_nics}), leaf_hosts
    if kind == "cnp_storm":
        return f.leaves[leaf], frozenset({f.leaves[leaf]}), leaf_hosts
    if kind in ("link_contention", "link_flap"):
        up = str(rng.choice([lk.id for lk in f.fabric.links if lk.lower == f.leaves[leaf]]))
        return up, frozenset({up}), leaf_hosts
    job = next((j for j in w_.jobs if j.start <= a - 60 and j.end >= b and h in j.hosts), None)
    if job is None:
        return None, frozenset(), set()
    return job.id, frozenset({""}), own
