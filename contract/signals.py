"""The declared catalogue of hardware signals, and the document a host publishes them in.

The catalogue is part of the contract: probers collect these names, the controller's anomaly
detector scores them, the simulator emits them and dashboards query them, so all four share
one spelling, unit and meaning. A `Signal` says:

- ``name`` (the wire name), ``entity`` (``host``, ``nic`` or ``gpu``: what it describes),
  ``kind`` (``counter``: cumulative, published as a per-second rate over the window;
  ``gauge``: a level, published as read), ``unit`` (of the published value), ``source``
  (where a prober reads it: ``netdev``, ``ethtool``, ``qdisc``, ``rdma``, ``aer``, ``nvml``,
  ``procfs``);
- ``width`` (bits of a counter as the device keeps it: 32-bit counters wrap, or saturate when
  ``saturates``: the InfiniBand PMA counters stop at their maximum);
- what the detector does with it: ``bad`` (the direction that means trouble: ``up``, ``down``,
  ``both``; ``none``: context only, never scored), ``scale`` (the resolution under which
  differences are noise, in the published unit), ``log`` (compare on log2(1 + value/scale):
  rates that span decades across healthy devices) and ``config`` (a setting that should be the
  same on every peer: compared with the peers only, never with its own history).

A signal a host cannot read is *not available* (null on the wire, NaN in arrays), never zero.

`SignalsDoc` on ``<prefix>/signals/<host>``: one window of one host, grouped by entity kind so
the names travel once per document::

    {"host": "host3", "t_ns": ..., "interval_s": 3.0,
     "groups": {"nic": {"signals": ["rx_bytes", ...], "values": {"nic12": [1.2e9, null, ...]}},
                "gpu": {"signals": [...], "values": {"host3.gpu0": [...]}},
                "host": {"signals": [...], "values": {"host3": [...]}}}}

Entity ids: a NIC's fabric id, the host's id, and ``<host>.gpu<k>`` for GPU ``k`` of the host
(`gpu_id`). Decoding drops signal names this catalogue does not know (a newer prober may send
more); `DocumentError` for anything malformed.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from contract.jsondoc import DocumentError, check, decode_object, encode_json
from contract.jsondoc import field as read


class Entity(enum.StrEnum):
    """What a signal describes."""

    HOST = "host"
    NIC = "nic"
    GPU = "gpu"


class Kind(enum.StrEnum):
    """Counter (cumulative, published as a rate) or gauge (a level)."""

    COUNTER = "counter"
    GAUGE = "gauge"


BADS = ("up", "down", "both", "none")


@dataclass(frozen=True, slots=True)
class Signal:
    """One catalogue entry (see the module docstring for the fields)."""

    name: str
    entity: Entity
    kind: Kind
    unit: str
    source: str
    help: str
    bad: str = "up"
    scale: float = 1.0
    log: bool = True
    config: bool = False
    width: int = 64
    saturates: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", self.name):
            raise ValueError(f"signal {self.name!r}: bad name")
        if self.bad not in BADS or not self.scale > 0 or self.width not in (32, 64):
            raise ValueError(f"signal {self.name}: bad direction, scale or width")


def _c(name: str, ent: Entity, unit: str, source: str, help: str, **kw: Any) -> Signal:
    return Signal(name, ent, Kind.COUNTER, unit, source, help, **kw)


def _g(name: str, ent: Entity, unit: str, source: str, help: str, **kw: Any) -> Signal:
    return Signal(name, ent, Kind.GAUGE, unit, source, help, **{"log": False, **kw})


H, N, G = Entity.HOST, Entity.NIC, Entity.GPU
_PRIOS = range(8)

CATALOGUE: tuple[Signal, ...] = (
    # ---- NIC: kernel netdev statistics (/proc/net/dev), any driver --------------------------
    _c("rx_bytes", N, "B/s", "netdev", "bytes received", bad="down", scale=1e8),
    _c("tx_bytes", N, "B/s", "netdev", "bytes sent", bad="down", scale=1e8),
    _c("rx_packets", N, "packets/s", "netdev", "packets received", bad="none", scale=1e4),
    _c("tx_packets", N, "packets/s", "netdev", "packets sent", bad="none", scale=1e4),
    _c("rx_dropped", N, "packets/s", "netdev", "received packets the stack dropped"),
    _c("tx_dropped", N, "packets/s", "netdev", "packets dropped on send"),
    _c("rx_errors", N, "packets/s", "netdev", "receive errors (all kinds)"),
    _c("tx_errors", N, "packets/s", "netdev", "transmit errors (all kinds)"),
    _g("mtu", N, "bytes", "netdev", "interface MTU", bad="both", config=True),
    _g("link_up", N, "0/1", "ethtool", "link detected (ETHTOOL_GLINK)", bad="down", scale=0.5),
    # ---- NIC: the root qdisc (rtnetlink): the kernel's egress queue (not RDMA's) ------------
    _c("tx_qdisc_drops", N, "packets/s", "qdisc", "packets the egress qdisc dropped"),
    _c("tx_qdisc_overlimits", N, "events/s", "qdisc", "egress over its rate", bad="none"),
    _g("tx_qdisc_backlog", N, "bytes", "qdisc", "bytes queued for egress", scale=1e5, log=True),
    # ---- NIC: Ethernet counters by name (ETHTOOL_GSTRINGS / GSTATS; names vary by driver) ---
    _c("pause_rx", N, "frames/s", "ethtool", "link-level pause frames received", scale=100.0),
    _c("pause_tx", N, "frames/s", "ethtool", "link-level pause frames sent", scale=100.0),
    *(
        _c(
            f"pfc_rx_p{p}",
            N,
            "frames/s",
            "ethtool",
            f"PFC pause frames received, priority {p}",
            scale=100.0,
        )
        for p in _PRIOS
    ),
    *(
        _c(
            f"pfc_tx_p{p}",
            N,
            "frames/s",
            "ethtool",
            f"PFC pause frames sent, priority {p}",
            scale=100.0,
        )
        for p in _PRIOS
    ),
    _c(
        "pause_storm_warnings",
        N,
        "events/s",
        "ethtool",
        "pause storm watchdog warnings",
        scale=0.01,
    ),
    _c("pause_storm_errors", N, "events/s", "ethtool", "pause storm watchdog trips", scale=0.01),
    _c("rx_discards_phy", N, "packets/s", "ethtool", "packets the port discarded (no buffer)"),
    _c("tx_discards_phy", N, "packets/s", "ethtool", "packets the port discarded on send"),
    _c("rx_out_of_buffer", N, "packets/s", "ethtool", "packets dropped: no receive descriptor"),
    _c("fec_corrected_bits", N, "bits/s", "ethtool", "bit errors the FEC corrected", scale=1e3),
    _c("fec_corrected_blocks", N, "blocks/s", "ethtool", "FEC codewords corrected", scale=1e2),
    _c(
        "fec_uncorrectable_blocks",
        N,
        "blocks/s",
        "ethtool",
        "FEC codewords not correctable",
        scale=0.1,
    ),
    _c("symbol_errors", N, "errors/s", "ethtool", "packets with physical symbol errors", scale=0.1),
    _c("pcs_symbol_errors", N, "errors/s", "ethtool", "PCS-layer symbol errors", scale=0.1),
    _c("crc_errors_phy", N, "packets/s", "ethtool", "frames with a bad FCS at the port", scale=0.1),
    _c("link_down_events", N, "events/s", "ethtool", "physical link down events", scale=0.01),
    _c(
        "pcie_si_rx",
        N,
        "events/s",
        "ethtool",
        "PCIe signal-integrity recoveries (NIC side)",
        scale=0.1,
    ),
    _c("pcie_si_tx", N, "events/s", "ethtool", "PCIe recoveries the far end started", scale=0.1),
    # ---- NIC: PCIe AER correctable errors of the NIC's function (sysfs aer_dev_correctable) --
    _c("pcie_replay_rollover", N, "events/s", "aer", "REPLAY_NUM rollovers", scale=0.1),
    _c("pcie_replay_timeout", N, "events/s", "aer", "replay timer timeouts", scale=0.1),
    _c("pcie_bad_tlp", N, "events/s", "aer", "bad TLPs (each one is replayed)", scale=0.1),
    _c("pcie_bad_dllp", N, "events/s", "aer", "bad DLLPs", scale=0.1),
    _c("pcie_rx_err", N, "events/s", "aer", "receiver errors", scale=0.1),
    # ---- NIC: RDMA port and hardware counters (/sys/class/infiniband/<dev>/ports/<p>/) ------
    _c(
        "rdma_rx_bytes",
        N,
        "B/s",
        "rdma",
        "port_rcv_data x 4 (the PMA counts 4-byte words)",
        bad="down",
        scale=1e8,
    ),
    _c("rdma_tx_bytes", N, "B/s", "rdma", "port_xmit_data x 4", bad="down", scale=1e8),
    _c("rdma_rx_packets", N, "packets/s", "rdma", "port_rcv_packets", bad="none", scale=1e4),
    _c("rdma_tx_packets", N, "packets/s", "rdma", "port_xmit_packets", bad="none", scale=1e4),
    _c(
        "rdma_xmit_discards", N, "packets/s", "rdma", "port_xmit_discards", width=32, saturates=True
    ),
    _c("rdma_rcv_errors", N, "packets/s", "rdma", "port_rcv_errors", width=32, saturates=True),
    _c(
        "rdma_symbol_errors",
        N,
        "errors/s",
        "rdma",
        "symbol_error",
        scale=0.1,
        width=32,
        saturates=True,
    ),
    _c(
        "rdma_link_downed",
        N,
        "events/s",
        "rdma",
        "link_downed",
        scale=0.01,
        width=32,
        saturates=True,
    ),
    _c(
        "rdma_link_recovery",
        N,
        "events/s",
        "rdma",
        "link_error_recovery",
        scale=0.01,
        width=32,
        saturates=True,
    ),
    _c(
        "rdma_xmit_wait",
        N,
        "ticks/s",
        "rdma",
        "port_xmit_wait: ticks with data but no credit",
        scale=1e4,
        width=32,
        saturates=True,
    ),
    _c(
        "cnp_sent",
        N,
        "packets/s",
        "rdma",
        "CNPs sent as notification point (np_cnp_sent)",
        scale=100.0,
    ),
    _c("cnp_handled", N, "packets/s", "rdma", "CNPs the reaction point acted on", scale=100.0),
    _c("cnp_ignored", N, "packets/s", "rdma", "CNPs the reaction point ignored", scale=10.0),
    _c("ecn_marked", N, "packets/s", "rdma", "ECN-marked RoCE packets received", scale=100.0),
    _c("out_of_sequence", N, "packets/s", "rdma", "out-of-sequence packets received"),
    _c("packet_seq_err", N, "events/s", "rdma", "NAKs for sequence errors received"),
    _c("local_ack_timeout", N, "events/s", "rdma", "ACK timeouts (the QP retransmitted)"),
    _c("rnr_nak_retry", N, "events/s", "rdma", "RNR NAK retries exhausted"),
    _c("implied_nak_seq_err", N, "events/s", "rdma", "implied NAK sequence errors"),
    _c("duplicate_request", N, "packets/s", "rdma", "duplicate requests received"),
    _c("rdma_retry_exceeded", N, "events/s", "rdma", "transport retries exhausted"),
    _c("rdma_out_of_buffer", N, "packets/s", "rdma", "drops: no receive WQE (out_of_buffer)"),
    # ---- GPU: NVML performance signals --------------------------------------------------------
    _g("gpu_util", G, "%", "nvml", "GPU busy time share", bad="none", scale=5.0),
    _g("mem_util", G, "%", "nvml", "memory controller busy share", bad="none", scale=5.0),
    _g("sm_clock_mhz", G, "MHz", "nvml", "SM clock", bad="down", scale=30.0),
    _g("mem_clock_mhz", G, "MHz", "nvml", "memory clock", bad="down", scale=30.0),
    _g("power_w", G, "W", "nvml", "board power draw", bad="none", scale=20.0),
    _g("power_limit_w", G, "W", "nvml", "enforced power limit", bad="both", scale=5.0, config=True),
    _g("temperature_c", G, "degC", "nvml", "GPU core temperature", scale=2.0),
    _g("throttle_thermal", G, "0/1", "nvml", "SW or HW thermal slowdown active", scale=0.2),
    _g("throttle_power", G, "0/1", "nvml", "SW power cap or HW power brake active", scale=0.2),
    _g("throttle_hw", G, "0/1", "nvml", "HW slowdown active", scale=0.2),
    _g("pcie_tx_bytes", G, "B/s", "nvml", "PCIe transmit throughput", bad="none", scale=1e8),
    _g("pcie_rx_bytes", G, "B/s", "nvml", "PCIe receive throughput", bad="none", scale=1e8),
    _c("gpu_pcie_replay", G, "events/s", "nvml", "PCIe replays", scale=0.1, width=32),
    _c("ecc_corrected", G, "errors/s", "nvml", "corrected ECC errors (volatile)", scale=0.1),
    # ---- host: procfs ------------------------------------------------------------------------
    _c(
        "cpu_user",
        H,
        "fraction",
        "procfs",
        "CPU share in user mode",
        bad="none",
        scale=0.05,
        log=False,
    ),
    _c(
        "cpu_system",
        H,
        "fraction",
        "procfs",
        "CPU share in the kernel",
        bad="none",
        scale=0.05,
        log=False,
    ),
    _c(
        "cpu_iowait",
        H,
        "fraction",
        "procfs",
        "CPU share idle waiting for I/O",
        scale=0.05,
        log=False,
    ),
    _c("cpu_irq", H, "fraction", "procfs", "CPU share in hard interrupts", scale=0.05, log=False),
    _c(
        "cpu_softirq",
        H,
        "fraction",
        "procfs",
        "CPU share in soft interrupts",
        scale=0.05,
        log=False,
    ),
    _c(
        "cpu_steal",
        H,
        "fraction",
        "procfs",
        "CPU share stolen by the hypervisor",
        scale=0.05,
        log=False,
    ),
    _g(
        "runq_per_cpu",
        H,
        "tasks/CPU",
        "procfs",
        "runnable tasks per CPU (procs_running)",
        scale=0.5,
    ),
    _g("procs_blocked", H, "tasks", "procfs", "tasks blocked on I/O", scale=2.0),
    _g("load1", H, "tasks", "procfs", "1-minute load average", bad="none", scale=1.0),
    _c("ctxt", H, "switches/s", "procfs", "context switches", bad="none", scale=1e4),
    _c(
        "psi_cpu_some",
        H,
        "fraction",
        "procfs",
        "time some task waited for a CPU",
        scale=0.05,
        log=False,
    ),
    _c(
        "psi_mem_some",
        H,
        "fraction",
        "procfs",
        "time some task stalled on memory",
        scale=0.05,
        log=False,
    ),
    _c(
        "psi_mem_full",
        H,
        "fraction",
        "procfs",
        "time all tasks stalled on memory",
        scale=0.05,
        log=False,
    ),
    _c(
        "psi_io_some",
        H,
        "fraction",
        "procfs",
        "time some task stalled on I/O",
        scale=0.05,
        log=False,
    ),
    _c(
        "psi_io_full",
        H,
        "fraction",
        "procfs",
        "time all tasks stalled on I/O",
        scale=0.05,
        log=False,
    ),
    _c("softnet_dropped", H, "packets/s", "procfs", "packets dropped: backlog full"),
    _c("softnet_squeezed", H, "events/s", "procfs", "NET_RX ran out of budget or time", scale=50.0),
    _g("mem_available", H, "fraction", "procfs", "MemAvailable / MemTotal", bad="down", scale=0.05),
)

BY_NAME: Mapping[str, Signal] = MappingProxyType({s.name: s for s in CATALOGUE})
if len(BY_NAME) != len(CATALOGUE):  # pragma: no cover - a typo in the table above
    raise RuntimeError("duplicate signal name in the catalogue")


def signals_of(entity: Entity | str) -> tuple[Signal, ...]:
    """Return the catalogue's signals of ``entity`` (``host``, ``nic`` or ``gpu``), in order."""
    ent = Entity(entity)
    return tuple(s for s in CATALOGUE if s.entity == ent)


def names_of(entity: Entity | str) -> tuple[str, ...]:
    """Return the names of `signals_of` ``entity``."""
    return tuple(s.name for s in signals_of(entity))


def gpu_id(host: str, index: int) -> str:
    """Return the entity id of GPU ``index`` of ``host`` (``host3.gpu0``)."""
    return f"{host}.gpu{index}"


# ---- the document ---------------------------------------------------------------------------

MAX_ENTITIES = 1024  # per document: a host with 16 NICs and 16 GPUs needs 33
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
Values = tuple[float | None, ...]


def _value(v: object) -> bool:
    if v is None:
        return True
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, slots=True)
class SignalGroup:
    """The values of one entity kind: ``signals`` (catalogue names) and per entity id the
    values in that order (None = not available)."""

    signals: tuple[str, ...]
    values: Mapping[str, Values] = field(default_factory=dict)

    def get(self, entity: str, name: str) -> float | None:
        """Return ``name`` of ``entity`` (None when absent or not available)."""
        row = self.values.get(entity)
        if row is None or name not in self.signals:
            return None
        return row[self.signals.index(name)]


@dataclass(frozen=True, slots=True)
class SignalsDoc:
    """One window of one host's signals (see the module docstring)."""

    host: str
    t_ns: int
    interval_s: float
    groups: Mapping[str, SignalGroup] = field(default_factory=dict)

    def __post_init__(self) -> None:
        w = "signals"
        check(isinstance(self.host, str) and bool(_ID.match(self.host)), w, "host", "a host id",
              self.host)  # fmt: skip
        check(isinstance(self.t_ns, int) and not isinstance(self.t_ns, bool), w, "t_ns",
              "an integer", self.t_ns)  # fmt: skip
        ok = _value(self.interval_s) and self.interval_s is not None and self.interval_s > 0
        check(ok, w, "interval_s", "a positive number", self.interval_s)
        groups: dict[str, SignalGroup] = {}
        n = 0
        for kind, g in self.groups.items():
            check(kind in Entity.__members__.values(), w, "groups", "host, nic or gpu", kind)
            known = set(names_of(kind))
            unknown = [s for s in g.signals if s not in known]
            check(not unknown, w, f"groups.{kind}.signals", "catalogue names", unknown[:3])
            check(len(set(g.signals)) == len(g.signals), w, f"groups.{kind}.signals",
                  "distinct names", g.signals)  # fmt: skip
            rows: dict[str, Values] = {}
            for ent, row in g.values.items():
                where = f"groups.{kind}.values.{ent}"
                check(isinstance(ent, str) and bool(_ID.match(ent)), w, where, "an entity id", ent)
                ok = isinstance(row, tuple | list) and len(row) == len(g.signals)
                check(ok and all(_value(v) for v in row), w, where,
                      f"{len(g.signals)} finite numbers or null", row)  # fmt: skip
                rows[ent] = tuple(None if v is None else float(v) for v in row)
                n += 1
            groups[kind] = SignalGroup(tuple(g.signals), MappingProxyType(rows))
        check(n <= MAX_ENTITIES, w, "groups", f"at most {MAX_ENTITIES} entities", n)
        object.__setattr__(self, "groups", MappingProxyType(groups))

    def entities(self, kind: Entity | str) -> tuple[str, ...]:
        """Return the entity ids of ``kind`` in this document."""
        g = self.groups.get(Entity(kind))
        return tuple(g.values) if g is not None else ()

    def get(self, kind: Entity | str, entity: str, name: str) -> float | None:
        """Return one value (None when absent or not available)."""
        g = self.groups.get(Entity(kind))
        return None if g is None else g.get(entity, name)

    def encode(self) -> bytes:
        """Return the JSON bytes of this document."""
        return encode_json(
            {
                "host": self.host,
                "t_ns": self.t_ns,
                "interval_s": self.interval_s,
                "groups": {
                    k: {
                        "signals": list(g.signals),
                        "values": {e: list(r) for e, r in g.values.items()},
                    }
                    for k, g in self.groups.items()
                },
            }
        )

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> SignalsDoc:
        """Return the document in ``payload``, without signal names this catalogue does not
        know; raise `DocumentError`."""
        doc = decode_object(payload, "signals")
        w = "signals"
        raw = read(doc, "groups", dict, w, {})
        groups: dict[str, SignalGroup] = {}
        for kind, g in raw.items():
            if kind not in Entity.__members__.values():
                continue  # an entity kind a newer prober knows
            if not isinstance(g, dict):
                raise DocumentError(f"signals: groups.{kind}: must be an object")
            names = read(g, "signals", list, f"signals: groups.{kind}")
            values = read(g, "values", dict, f"signals: groups.{kind}", {})
            known = set(names_of(kind))
            keep = [i for i, s in enumerate(names) if isinstance(s, str) and s in known]
            rows: dict[str, Values] = {}
            for ent, row in values.items():
                if not isinstance(row, list) or len(row) != len(names):
                    raise DocumentError(f"signals: groups.{kind}.values.{ent}: must be a list "
                                        f"of {len(names)} values")  # fmt: skip
                rows[ent] = tuple(row[i] for i in keep)
            groups[kind] = SignalGroup(tuple(names[i] for i in keep), rows)
        return cls(
            host=read(doc, "host", str, w),
            t_ns=read(doc, "t_ns", int, w),
            interval_s=read(doc, "interval_s", float, w),
            groups=groups,
        )
