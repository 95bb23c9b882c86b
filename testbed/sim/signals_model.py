"""The simulator's hardware signals in normal operation: a fleet, its jobs, and per window
every host's, NIC's and GPU's signals as the prober would read them (seeded, vectorized).

`Fleet` (hosts of 8 NICs and 8 GPUs on a leaf-spine fabric, per host a NIC driver profile,
AER on or off, bare metal or VM), `schedule_jobs` (jobs packed on neighbouring hosts, three
model kinds, evaluation and checkpoint phases, some jobs ending and replaced mid-run) and
`NormalModel.window(w)` (the true rates and levels of window ``w``: `Rates`). `CounterLayer`
turns rates into what a reader sees (cumulative counters that wrap at 32 bits or saturate,
driver reloads that reset them, signals a driver or NVML does not give, reads that fail) and
back into rates with the prober's own rule (`prober.telemetry.rates.counter_rates`).

Every parameter is in `NORMAL` with where it comes from (docs/crosslayer.md, "The
simulator"); none is fitted to the detector. Where no public figure exists the value is a
stated assumption, and `docs/crosslayer.md` reports how the scores move when it is doubled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from contract.signals import BY_NAME, Entity, Kind, gpu_id, names_of
from mesh.fabric import Fabric, FabricShape, build_fabric
from prober.telemetry.rates import counter_rates

Array = npt.NDArray[np.float64]
COL = {k: {n: j for j, n in enumerate(names_of(k))} for k in Entity}

# Job models: RDMA bytes/s per NIC while training, pause frames/s received per NIC, ECN
# marks/s, out-of-sequence/s, GPU utilisation %, base step time s. Assumptions in the range
# public traces show (docs/crosslayer.md): MoE all-to-all incasts pause and mark ~10x more
# than dense all-reduce; vision jobs move less.
MODELS: Mapping[str, Mapping[str, float]] = {
    "dense": {"bw": 12e9, "pfc": 40.0, "ecn": 300.0, "oos": 1.0, "util": 92.0, "step": 4.0},
    "moe": {"bw": 18e9, "pfc": 400.0, "ecn": 3000.0, "oos": 40.0, "util": 72.0, "step": 6.0},
    "vision": {"bw": 4e9, "pfc": 5.0, "ecn": 50.0, "oos": 0.5, "util": 88.0, "step": 1.5},
}

NORMAL: Mapping[str, float] = {
    "fec_ber_log10_mean": -8.5,  # healthy 400G PAM4 links: pre-FEC BER 1e-10..1e-7
    "fec_ber_log10_sd": 0.7,
    "line_rate_bps": 425e9,  # 400GBASE, 8x53.125 Gb/s PAM4 lanes
    "noise_bytes": 0.08,  # lognormal sigma per window of throughput
    "noise_cong": 0.3,  # of pauses / marks / CNPs
    "offset_cong": 0.5,  # per NIC, lasting: position in the fabric
    "burst_start": 0.002,  # per entity-window: an incast / interrupt burst starts
    "burst_mean_windows": 1.5,
    "burst_factor_median": 3.0,
    "burst_factor_sigma": 0.6,
    "diurnal_amp": 0.4,  # shared-cloud background load on a leaf, +-40 % over a day
    "gpu_temp_rack_sd": 4.0,  # degC between racks (inlet temperature)
    "power_cap_flicker": 0.15,  # windows a loaded H100 reads a power-cap throttle
    "reset_per_window": 2e-5,  # a NIC's driver reloads: its counters restart at 0
    "read_fail": 0.001,  # a source's read fails for one window
    "mlx5_share": 0.7,  # hosts with mlx5 NICs; the others bnxt_en / bnxt_re
    "aer_share": 0.7,  # hosts whose BIOS leaves AER reporting on
    "vm_share": 0.2,  # hosts that are VMs (CPU steal exists)
}

# Signals a bnxt_en / bnxt_re host does not give the collector (names not in the maps, no PMA
# counters; bnxt_re counts CNPs received, not ignored, and no out-of-sequence packets).
BNXT_MISSING = frozenset({
    "pause_storm_warnings", "pause_storm_errors", "rx_discards_phy", "tx_discards_phy",
    "rx_out_of_buffer", "symbol_errors", "crc_errors_phy", "link_down_events", "pcie_si_rx",
    "pcie_si_tx", "rdma_xmit_discards", "rdma_rcv_errors", "rdma_symbol_errors",
    "rdma_link_downed", "rdma_link_recovery", "rdma_xmit_wait", "cnp_ignored",
    "out_of_sequence", "rnr_nak_retry", "implied_nak_seq_err", "rdma_out_of_buffer",
})  # fmt: skip
MLX5_MISSING = frozenset({"fec_corrected_blocks", "fec_uncorrectable_blocks"})
AER_SIGNALS = frozenset({"pcie_replay_rollover", "pcie_replay_timeout", "pcie_bad_tlp",
                         "pcie_bad_dllp", "pcie_rx_err"})  # fmt: skip


@dataclass(frozen=True, eq=False)
class Fleet:
    """Hosts, NICs (8 per host) and GPUs (one beside each NIC) on ``fabric``."""

    fabric: Fabric
    hosts: tuple[str, ...]
    nics: tuple[str, ...]
    gpus: tuple[str, ...]
    nic_host: npt.NDArray[np.int64]
    nic_leaf: npt.NDArray[np.int64]
    leaves: tuple[str, ...]
    mlx5: npt.NDArray[np.bool_]  # per host
    aer: npt.NDArray[np.bool_]
    vm: npt.NDArray[np.bool_]

    @property
    def host_leaf(self) -> npt.NDArray[np.int64]:
        """Return each host's leaf index (a host's NICs share one leaf here)."""
        out = np.zeros(len(self.hosts), np.int64)
        out[self.nic_host] = self.nic_leaf
        return out


def build_fleet(
    nics: int,
    rng: np.random.Generator,
    nics_per_host: int = 8,
    params: Mapping[str, float] = NORMAL,
) -> Fleet:
    """Return a fleet of at least ``nics`` NICs: hosts of ``nics_per_host`` NICs, 4 hosts
    per leaf, a spine per 4 leaves (at least 2)."""
    hosts = max(2, -(-nics // nics_per_host))
    per_leaf = 4 if hosts >= 8 else 1
    leaves = -(-hosts // per_leaf)
    fabric = build_fabric(FabricShape(leaves=leaves, hosts_per_leaf=per_leaf,
                                      nics_per_host=nics_per_host, spines=max(2, leaves // 4)))  # fmt: skip
    host_ids = tuple(h.id for h in fabric.hosts)
    hidx = {h: i for i, h in enumerate(host_ids)}
    leaf_ids = tuple(n.id for n in fabric.leaves)
    lidx = {lf: i for i, lf in enumerate(leaf_ids)}
    n_h = len(host_ids)
    return Fleet(
        fabric=fabric,
        hosts=host_ids,
        nics=tuple(n.id for n in fabric.nics),
        gpus=tuple(gpu_id(n.host, n.port) for n in fabric.nics),
        nic_host=np.array([hidx[n.host] for n in fabric.nics], np.int64),
        nic_leaf=np.array([lidx[n.leaf] for n in fabric.nics], np.int64),
        leaves=leaf_ids,
        mlx5=rng.random(n_h) < params["mlx5_share"],
        aer=rng.random(n_h) < params["aer_share"],
        vm=rng.random(n_h) < params["vm_share"],
    )


@dataclass(frozen=True)
class SimJob:
    """A job: id, model kind, its hosts (indices), the windows it runs [start, end), its
    phases per window (0 train, 1 evaluation, 2 checkpoint) and base step time."""

    id: str
    model: str
    hosts: tuple[int, ...]
    start: int
    end: int
    phase: npt.NDArray[np.int8]
    step_s: float


def _phases(n: int, rng: np.random.Generator, window_s: float) -> npt.NDArray[np.int8]:
    """Return train / eval / checkpoint per window: a checkpoint every 30-60 min for 1-3
    min, an evaluation every 20-40 min for 2-5 min (common training-loop settings)."""
    ph = np.zeros(n, np.int8)
    for kind, every, length in ((1, (1200, 2400), (120, 300)), (2, (1800, 3600), (60, 180))):
        t = rng.uniform(*every)
        while t < n * window_s:
            a = int(t / window_s)
            ph[a : a + max(1, int(rng.uniform(*length) / window_s))] = kind
            t += rng.uniform(*every)
    return ph


def schedule_jobs(
    fleet: Fleet, windows: int, window_s: float, rng: np.random.Generator
) -> list[SimJob]:
    """Return the run's jobs: contiguous blocks of 1-16 hosts (about 90 % of the hosts busy),
    each a model kind; about a quarter end mid-run and a new job takes their hosts."""
    n_h = len(fleet.hosts)
    jobs: list[SimJob] = []
    h = 0
    k = 0
    while h < n_h:
        size = int(rng.choice([1, 2, 4, 4, 8, 8, 16]))
        size = min(size, n_h - h)
        if rng.random() < 0.1:  # idle hosts
            h += size
            continue
        hosts = tuple(range(h, h + size))
        h += size
        cut = windows
        if rng.random() < 0.25:
            cut = int(rng.uniform(0.3, 0.8) * windows)
        for start, end in ((0, cut), (cut + int(rng.integers(3, 30)), windows)):
            if end - start < 10:
                continue
            model = str(rng.choice(list(MODELS)))
            jobs.append(SimJob(f"job{k}", model, hosts, start, end,
                               _phases(windows, rng, window_s),
                               MODELS[model]["step"] * float(rng.uniform(0.7, 1.4))))  # fmt: skip
            k += 1
    return jobs


def lognormal(rng: np.random.Generator, sigma: float, size: int | tuple[int, ...]) -> Array:
    """Return mean-one lognormal factors."""
    return np.exp(sigma * rng.standard_normal(size) - sigma * sigma / 2)


@dataclass
class Rates:
    """One window's true values per kind (rows: fleet order, columns: catalogue order) and
    each host's job (-1 idle) and phase."""

    nic: Array
    gpu: Array
    host: Array
    host_job: npt.NDArray[np.int64]
    host_phase: npt.NDArray[np.int8]

    def of(self, kind: Entity) -> Array:
        """Return the matrix of ``kind``."""
        return {Entity.NIC: self.nic, Entity.GPU: self.gpu, Entity.HOST: self.host}[kind]


@dataclass
class NormalModel:
    """Normal operation of ``fleet`` running ``jobs`` (see the module docstring)."""

    fleet: Fleet
    jobs: list[SimJob]
    window_s: float
    rng: np.random.Generator
    p: Mapping[str, float] = field(default_factory=lambda: NORMAL)
    _burst: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        f, rng = self.fleet, self.rng
        n_n, n_h = len(f.nics), len(f.hosts)
        self.off_bw = lognormal(rng, 0.1, n_n)
        self.off_cong = lognormal(rng, self.p["offset_cong"], n_n)
        ber = 10 ** rng.normal(self.p["fec_ber_log10_mean"], self.p["fec_ber_log10_sd"], n_n)
        self.fec_bits = ber * self.p["line_rate_bps"]
        self.gpu_temp_off = rng.normal(0, self.p["gpu_temp_rack_sd"], n_h)[f.nic_host] + rng.normal(
            0, 2, n_n
        )
        self.gpu_clock_off = rng.normal(0, 15, n_n)
        self.gpu_power_off = rng.normal(0, 20, n_n)
        self.gpu_replay = np.where(rng.random(n_n) < 0.03, 0.05, 0.0)  # a few GPUs replay a bit
        self.leaf_phase = rng.uniform(0, 2 * np.pi, len(f.leaves))
        self.host_jitter = rng.integers(-1, 2, n_h)  # ranks enter a phase a window apart
        self.mem_base = rng.uniform(0.4, 0.8, n_h)

    def _bursts(self, name: str, n: int) -> Array:
        """Return this window's burst factors of one channel (1 where none)."""
        left = self._burst.setdefault(name, np.zeros(n, np.int64))
        rng = self.rng
        start = (left == 0) & (rng.random(n) < self.p["burst_start"])
        length = rng.geometric(1.0 / self.p["burst_mean_windows"], n)
        left[:] = np.where(start, length, np.maximum(left - 1, 0))
        fac = self.p["burst_factor_median"] * np.exp(
            self.p["burst_factor_sigma"] * rng.standard_normal(n)
        )
        return np.where(left > 0, fac, 1.0)

    def host_state(self, w: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int8]]:
        """Return each host's job index (-1 idle) and phase in window ``w``."""
        n_h = len(self.fleet.hosts)
        job = np.full(n_h, -1, np.int64)
        phase = np.zeros(n_h, np.int8)
        for k, j in enumerate(self.jobs):
            if j.start <= w < j.end:
                hs = np.array(j.hosts)
                job[hs] = k
                idx = np.clip(w + self.host_jitter[hs], 0, len(j.phase) - 1)
                phase[hs] = j.phase[idx]
        return job, phase

    def window(self, w: int) -> Rates:
        """Return window ``w``'s true values (see `Rates`)."""
        f, rng = self.fleet, self.rng
        n_n, n_h = len(f.nics), len(f.hosts)
        host_job, host_phase = self.host_state(w)
        busy_h = host_job >= 0
        par = {k: np.zeros(n_h) for k in ("bw", "pfc", "ecn", "oos", "util")}
        for k, j in enumerate(self.jobs):
            sel = host_job == k
            if sel.any():
                for key, arr in par.items():
                    arr[sel] = MODELS[j.model][key]
        net_ph = np.choose(host_phase, [1.0, 0.05, 0.02])
        gpu_ph = np.choose(host_phase, [1.0, 0.5, 0.05])
        nh = f.nic_host
        t = w * self.window_s
        leaf_load = 1 + self.p["diurnal_amp"] * np.sin(2 * np.pi * t / 86400 + self.leaf_phase)
        nic = np.zeros((n_n, len(COL[Entity.NIC])))
        c = COL[Entity.NIC]
        bw = (par["bw"] * net_ph)[nh] * self.off_bw * lognormal(
            rng, self.p["noise_bytes"], n_n
        ) + 1e6
        nic[:, c["rdma_tx_bytes"]] = bw
        nic[:, c["rdma_rx_bytes"]] = bw * lognormal(rng, 0.03, n_n)
        nic[:, c["rdma_tx_packets"]] = bw / 4096
        nic[:, c["rdma_rx_packets"]] = nic[:, c["rdma_rx_bytes"]] / 4096
        tcp = (2e8 * busy_h * np.choose(host_phase, [1.0, 1.0, 5.0]))[nh] * lognormal(
            rng, 0.3, n_n
        ) + 1e5
        nic[:, c["tx_bytes"]] = tcp
        nic[:, c["rx_bytes"]] = tcp * lognormal(rng, 0.2, n_n)
        nic[:, c["tx_packets"]] = tcp / 1500
        nic[:, c["rx_packets"]] = nic[:, c["rx_bytes"]] / 1500
        burst = self._bursts("incast", n_n)
        cong = (
            leaf_load[f.nic_leaf]
            * self.off_cong
            * lognormal(rng, self.p["noise_cong"], n_n)
            * burst
        )
        pfc = (par["pfc"] * net_ph)[nh] * cong
        nic[:, c["pfc_rx_p3"]] = pfc
        nic[:, c["pause_rx"]] = pfc
        nic[:, c["pfc_tx_p3"]] = 0.1 * pfc * lognormal(rng, 0.3, n_n)
        nic[:, c["pause_tx"]] = nic[:, c["pfc_tx_p3"]]
        nic[:, c["rdma_xmit_wait"]] = 500.0 * pfc
        ecn = (par["ecn"] * net_ph)[nh] * cong
        nic[:, c["ecn_marked"]] = ecn
        nic[:, c["cnp_sent"]] = 0.5 * ecn
        job_n = host_job[nh]
        handled = 0.5 * ecn
        for k in np.unique(job_n[job_n >= 0]):  # the peers' CNPs come back to the senders
            sel = job_n == k
            handled[sel] = 0.5 * ecn[sel].mean()
        nic[:, c["cnp_handled"]] = handled * lognormal(rng, 0.2, n_n)
        oos = (par["oos"] * net_ph)[nh] * lognormal(rng, 0.5, n_n)
        nic[:, c["out_of_sequence"]] = oos
        nic[:, c["packet_seq_err"]] = 0.1 * oos
        nic[:, c["implied_nak_seq_err"]] = 0.01 * oos
        nic[:, c["duplicate_request"]] = 0.01 * oos
        nic[:, c["rx_discards_phy"]] = 1e-3 * pfc
        nic[:, c["rx_out_of_buffer"]] = 0.05 * (burst > 1)
        nic[:, c["fec_corrected_bits"]] = self.fec_bits * lognormal(rng, 0.2, n_n)
        nic[:, c["fec_corrected_blocks"]] = nic[:, c["fec_corrected_bits"]] / 1.2
        for name in ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "symbol_errors",
                     "pcs_symbol_errors", "crc_errors_phy", "fec_uncorrectable_blocks",
                     "local_ack_timeout", "pcie_bad_tlp", "pcie_rx_err"):  # fmt: skip
            nic[:, c[name]] = 2e-4  # rare single events (Poisson in the counter layer)
        nic[:, c["mtu"]] = 9000.0
        nic[:, c["link_up"]] = 1.0
        # GPUs (one beside each NIC)
        g = COL[Entity.GPU]
        gpu = np.zeros((n_n, len(g)))
        util = np.clip((par["util"] * gpu_ph)[nh] + rng.normal(0, 2, n_n), 0, 100)
        gpu[:, g["gpu_util"]] = util
        gpu[:, g["mem_util"]] = 0.45 * util
        cap = (rng.random(n_n) < self.p["power_cap_flicker"]) & (util > 80)
        gpu[:, g["throttle_power"]] = cap
        gpu[:, g["sm_clock_mhz"]] = (
            1980 - self.gpu_clock_off.clip(0) - cap * rng.uniform(60, 180, n_n)
        )
        gpu[:, g["mem_clock_mhz"]] = 2619.0
        gpu[:, g["power_w"]] = np.minimum(
            700, 120 + 5.6 * util + self.gpu_power_off + rng.normal(0, 10, n_n)
        )
        gpu[:, g["power_limit_w"]] = 700.0
        gpu[:, g["temperature_c"]] = (40 + 0.3 * util + self.gpu_temp_off
                                      + 1.5 * np.sin(2 * np.pi * t / 86400) + rng.normal(0, 0.7, n_n))  # fmt: skip
        gpu[:, g["pcie_tx_bytes"]] = util * 2e7 * lognormal(rng, 0.2, n_n)
        gpu[:, g["pcie_rx_bytes"]] = util * 3e7 * lognormal(rng, 0.2, n_n)
        gpu[:, g["gpu_pcie_replay"]] = self.gpu_replay
        # hosts
        h = COL[Entity.HOST]
        host = np.zeros((n_h, len(h)))
        cpu_b = self._bursts("cpu", n_h)
        io = host_phase == 2
        host[:, h["cpu_user"]] = 0.05 + 0.3 * busy_h * lognormal(rng, 0.1, n_h)
        host[:, h["cpu_system"]] = 0.03 + 0.04 * busy_h
        host[:, h["cpu_softirq"]] = (0.01 + 0.02 * busy_h) * lognormal(rng, 0.2, n_h) * cpu_b
        host[:, h["cpu_irq"]] = 0.003 * lognormal(rng, 0.2, n_h)
        host[:, h["cpu_steal"]] = f.vm * 0.005 * lognormal(rng, 0.5, n_h) * cpu_b
        host[:, h["cpu_iowait"]] = 0.01 + 0.12 * io
        host[:, h["runq_per_cpu"]] = (0.2 + 0.3 * busy_h) * lognormal(rng, 0.2, n_h) * cpu_b
        host[:, h["procs_blocked"]] = rng.poisson(0.5 + 6 * io).astype(np.float64)
        host[:, h["load1"]] = 20 + 40 * busy_h
        host[:, h["ctxt"]] = 5e4 * lognormal(rng, 0.2, n_h)
        host[:, h["psi_cpu_some"]] = 0.02 * lognormal(rng, 0.3, n_h) * cpu_b
        host[:, h["psi_io_some"]] = 0.01 + rng.uniform(0.15, 0.4, n_h) * io
        host[:, h["psi_io_full"]] = 0.3 * host[:, h["psi_io_some"]]
        host[:, h["softnet_squeezed"]] = 2.0 * lognormal(rng, 0.4, n_h) * cpu_b
        host[:, h["mem_available"]] = self.mem_base - 0.2 * io
        return Rates(nic, gpu, host, host_job, host_phase)


class CounterLayer:
    """What the prober reads of one kind: counters accumulate (Poisson counts, 32-bit wraps,
    saturation), driver reloads reset a NIC's counters, unavailable signals stay NaN, reads
    fail for a window; `read` returns the window's published values through the prober's
    own rate rule."""

    def __init__(
        self,
        kind: Entity,
        missing: npt.NDArray[np.bool_],
        rng: np.random.Generator,
        reset_p: float = 0.0,
        read_fail: float = NORMAL["read_fail"],
    ) -> None:
        sigs = [BY_NAME[n] for n in names_of(kind)]
        self.kind = kind
        self.counter = np.array([s.kind == Kind.COUNTER for s in sigs])
        self.events = self.counter & np.array([s.unit != "fraction" for s in sigs])
        self.widths = np.array([s.width for s in sigs], np.int64)
        self.sat = np.array([s.saturates for s in sigs])
        self.missing = missing
        self.rng = rng
        self.reset_p = reset_p
        self.read_fail = read_fail
        n = missing.shape[0]
        top = np.where(self.widths < 64, 2.0**31, 2.0**40)
        self.cum = np.floor(rng.random((n, len(sigs))) * top)
        self.prev = np.where(missing, np.nan, self.cum)

    def read(self, values: Array, dt: float) -> Array:
        """Return the published values of a window whose true values are ``values``."""
        rng = self.rng
        lam = np.where(self.counter, np.maximum(values, 0) * dt, 0.0)
        small = self.events & (lam < 1e6)  # event counts: Poisson; CPU and stall time: exact
        inc = np.where(self.events, np.round(lam), lam)
        inc[small] = rng.poisson(lam[small])
        cum = self.cum + inc
        top = np.ldexp(1.0, self.widths)
        cum = np.where(
            self.sat, np.minimum(cum, top - 1), np.where(self.widths < 64, cum % top, cum)
        )
        if self.reset_p:
            reset = rng.random(cum.shape[0]) < self.reset_p
            cum[reset] = inc[reset]
        self.cum = cum
        raw = np.where(self.missing, np.nan, np.where(self.counter, cum, values))
        fail = rng.random(raw.shape[0]) < self.read_fail
        raw[fail] = np.nan
        out = np.where(self.counter, counter_rates(self.prev, raw, dt, self.widths, self.sat), raw)
        self.prev = raw
        return np.asarray(out, np.float64)


def missing_masks(fleet: Fleet, rng: np.random.Generator) -> dict[Entity, npt.NDArray[np.bool_]]:
    """Return per kind the signals each entity's sources do not give (drivers, AER, NVML)."""
    n_n, n_h = len(fleet.nics), len(fleet.hosts)
    nic_cols = names_of(Entity.NIC)
    bnxt = ~fleet.mlx5[fleet.nic_host]
    aer = fleet.aer[fleet.nic_host]
    nic = np.zeros((n_n, len(nic_cols)), bool)
    for j, name in enumerate(nic_cols):
        if name in BNXT_MISSING:
            nic[:, j] |= bnxt
        if name in MLX5_MISSING:
            nic[:, j] |= ~bnxt
        if name in AER_SIGNALS:
            nic[:, j] |= ~aer
    gpu = np.zeros((n_n, len(COL[Entity.GPU])), bool)
    no_pcie = rng.random(n_n) < 0.05  # NVML: NotSupported on some boards
    for name in ("pcie_tx_bytes", "pcie_rx_bytes"):
        gpu[:, COL[Entity.GPU][name]] = no_pcie
    host = np.zeros((n_h, len(COL[Entity.HOST])), bool)
    return {Entity.NIC: nic, Entity.GPU: gpu, Entity.HOST: host}
