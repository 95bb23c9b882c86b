"""One host's signal collector: raw readings from every source, and windows of rates.

- `Reading`: what the host's sources said at one instant, raw (counters cumulative), per
  entity kind and entity id: ``{"nic": {"nic3": {"rx_bytes": 1.2e12, ...}}, "gpu": {...},
  "host": {...}}``. A signal a source could not read is absent.
- `window(prev, cur, host)` (pure): the `contract.signals.SignalsDoc` of the window between
  two readings: counters as per-second rates (`prober.telemetry.rates`: wraps, saturation,
  resets), gauges as read at ``cur``, both to 5 significant digits. A signal no entity
  of a kind has is left out of that kind's names (not available, as null is); an entity
  that lacks one its peers have gets null.
- `Collector` (I/O): reads the sources of one host per `CollectorConfig`: ``/proc/net/dev``
  and the root qdiscs (rtnetlink), both of the calling thread's namespace, the ethtool ioctls
  (of the namespace the collector was made in), RDMA sysfs, PCIe AER, procfs and NVML. A
  source that fails leaves its signals out of that reading; nothing is zero-filled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.signals import BY_NAME, Entity, Kind, SignalGroup, SignalsDoc, gpu_id, names_of
from prober.telemetry.ethtool import EthtoolError, EthtoolReader, ethtool_values
from prober.telemetry.gpuperf import NvmlPerf, gpu_perf_values
from prober.telemetry.host import host_values, read_host_texts
from prober.telemetry.netdev import THREAD_NET_DEV, read_proc_net_dev
from prober.telemetry.pcie import aer_values, read_aer
from prober.telemetry.qdisc import qdisc_values, read_qdiscs
from prober.telemetry.rates import counter_rate
from prober.telemetry.rdma import SYSFS_IB, rdma_values, read_rdma_port

RawValues = dict[str, dict[str, dict[str, float]]]  # kind -> entity -> signal -> raw value


@dataclass(frozen=True, slots=True)
class Reading:
    """Raw values of one host at ``t_ns`` (see the module docstring)."""

    t_ns: int
    values: Mapping[str, Mapping[str, Mapping[str, float]]]


def window(prev: Reading, cur: Reading, host: str) -> SignalsDoc:
    """Return the signals of the window from ``prev`` to ``cur`` (the module's rules);
    ``t_ns`` is ``cur``'s, ``interval_s`` the time between the readings. Raises ValueError
    if ``cur`` is not after ``prev``."""
    dt = (cur.t_ns - prev.t_ns) / 1e9
    if dt <= 0:
        raise ValueError("a window needs its second reading after its first")
    groups: dict[str, SignalGroup] = {}
    for kind in Entity:
        ents = cur.values.get(kind, {})
        if not ents:
            continue
        before = prev.values.get(kind, {})
        rows: dict[str, dict[str, float | None]] = {}
        for ent, vals in ents.items():
            old = before.get(ent, {})
            row: dict[str, float | None] = {}
            for name, v in vals.items():
                sig = BY_NAME.get(name)
                if sig is None or sig.entity != kind:
                    continue
                if sig.kind == Kind.GAUGE:
                    row[name] = _round(v)
                else:
                    row[name] = _round(counter_rate(old.get(name), v, dt, sig.width, sig.saturates))
            rows[ent] = row
        present = {n for r in rows.values() for n in r}
        names = tuple(n for n in names_of(kind) if n in present)
        groups[kind] = SignalGroup(
            names, {e: tuple(r.get(n) for n in names) for e, r in rows.items()}
        )
    return SignalsDoc(host=host, t_ns=cur.t_ns, interval_s=dt, groups=groups)


def _round(v: float | None) -> float | None:
    """Return ``v`` to 5 significant digits (finer than any signal's noise; shorter JSON)."""
    return None if v is None else float(f"{v:.5g}")


@dataclass(frozen=True, slots=True)
class NicSource:
    """Where one NIC's signals come from: its fabric id, its network device, and its RDMA
    device and port (None: no RDMA device, e.g. a plain Ethernet NIC or a veth)."""

    nic: str
    netdev: str
    rdma: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """What one host's collector reads: ``nics``, GPUs (NVML) and host signals (procfs)."""

    host: str
    nics: tuple[NicSource, ...] = ()
    gpus: bool = True
    host_signals: bool = True
    proc_root: Path = Path("/proc")
    net_dev: Path = THREAD_NET_DEV
    sysfs_net: Path = Path("/sys/class/net")
    sysfs_ib: Path = SYSFS_IB


@dataclass
class Collector:
    """Reads one host's sources (thin shell; see the module docstring). Not thread-safe:
    the ethtool socket belongs to the namespace it was made in."""

    config: CollectorConfig
    ethtool: EthtoolReader = field(default_factory=EthtoolReader)
    nvml: NvmlPerf | None = None
    gpu_reason: str = ""
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, config: CollectorConfig, nvml: Any = None) -> Collector:
        """Return a collector with NVML opened when ``config.gpus`` (its absence is noted in
        ``gpu_reason``, not raised)."""
        perf: NvmlPerf | None = None
        reason = ""
        if config.gpus:
            got = NvmlPerf.open(nvml)
            perf, reason = (got, "") if isinstance(got, NvmlPerf) else (None, got)
        return cls(config, nvml=perf, gpu_reason=reason)

    def close(self) -> None:
        """Release the socket and NVML."""
        self.ethtool.close()
        if self.nvml is not None:
            self.nvml.close()

    def read(self, t_ns: int, cpu_s: dict[str, float] | None = None) -> Reading:
        """Return every source's raw values now (``t_ns``: the caller's clock); with
        ``cpu_s``, add this thread's CPU seconds per entity kind to it (the benchmark)."""
        cfg = self.config
        self.errors = {}
        out: RawValues = {}
        c0 = time.thread_time()
        if cfg.nics:
            out[Entity.NIC] = self._nics()
        c1 = time.thread_time()
        if self.nvml is not None:
            out[Entity.GPU] = {gpu_id(cfg.host, int(raw["index"])): gpu_perf_values(raw)
                               for raw in self.nvml.read()}  # fmt: skip
        c2 = time.thread_time()
        if cfg.host_signals:
            texts = read_host_texts(cfg.proc_root)
            out[Entity.HOST] = {cfg.host: host_values(texts, float(os.sysconf("SC_CLK_TCK")))}
        if cpu_s is not None:
            for key, dt in (("nic", c1 - c0), ("gpu", c2 - c1), ("host", time.thread_time() - c2)):
                cpu_s[key] = cpu_s.get(key, 0.0) + dt
        return Reading(t_ns, out)

    def _nics(self) -> dict[str, dict[str, float]]:
        cfg = self.config
        try:
            netdev = read_proc_net_dev(cfg.net_dev)
        except OSError as exc:
            netdev = {}
            self.errors["netdev"] = str(exc)
        try:
            qdiscs = read_qdiscs()
        except OSError as exc:
            qdiscs = {}
            self.errors["qdisc"] = str(exc)
        out: dict[str, dict[str, float]] = {}
        for src in cfg.nics:
            vals: dict[str, float] = {k: float(v) for k, v in netdev.get(src.netdev, {}).items()}
            if src.netdev in qdiscs:
                vals.update(qdisc_values(qdiscs[src.netdev]))
            try:
                vals.update(ethtool_values(self.ethtool.stats(src.netdev)))
                up = self.ethtool.link(src.netdev)
                if up is not None:
                    vals["link_up"] = float(up)
                mtu = self.ethtool.mtu(src.netdev)
                if mtu is not None:
                    vals["mtu"] = float(mtu)
            except EthtoolError as exc:
                self.errors[f"ethtool:{src.netdev}"] = str(exc)
            aer = read_aer(src.netdev, cfg.sysfs_net)
            if aer is not None:
                vals.update(aer_values(aer))
            if src.rdma is not None:
                try:
                    vals.update(rdma_values(*read_rdma_port(*src.rdma, root=cfg.sysfs_ib)))
                except OSError as exc:
                    self.errors[f"rdma:{src.rdma[0]}"] = str(exc)
            out[src.nic] = vals
        return out
