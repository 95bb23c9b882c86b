"""What a signal says about a cause: one table, read by the root-cause walk.

Each scored signal of the catalogue has a *role*:

- ``root``: the entity carrying it is where the cause is, of the given class (PCIe replays on
  a NIC, a GPU's thermal slowdown, a host's softirq load, a NIC that sends pauses);
- ``victim_pfc``: the NIC *receives* pauses: the cause is whoever its leaf is pausing for (a
  NIC under the same leaf sending pauses, or a congested port);
- ``congestion_rx`` / ``congestion_tx``: ECN marks / CNPs at a receiver, CNPs acted on at a
  sender: congestion on the way (a contended link, or a leaf marking too early);
- ``loss``: transport retransmissions and sequence errors: a lossy path or link;
- ``symptom``: less throughput or GPU work: the job is slow, not why.

A root class's target is the entity itself, except ``link_degraded`` and ``link_flap``
(the NIC's link) and the host-wide classes (``ecn_config``, ``mtu_config``: the NIC's host).
`PRECEDENCE` orders root classes on one entity: a NIC with PCIe replays that also sends
pauses is a PCIe problem (a slow slot backs the NIC up), not a pause storm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from contract.signals import CATALOGUE

ROLES = ("root", "victim_pfc", "congestion_rx", "congestion_tx", "loss", "symptom")

# root classes, strongest explanation first
PRECEDENCE = (
    "link_flap",
    "pcie",
    "link_degraded",
    "ecn_config",
    "mtu_config",
    "pfc_storm",
    "gpu_config",
    "gpu_pcie",
    "gpu_memory",
    "gpu_throttle",
    "host_starved",
    "host_memory",
    "host_io",
)
# classes the walk can name besides the root classes of signals
WALK_CLASSES = ("cnp_storm", "link_contention", "link_loss", "link_down", "unknown")


def _table() -> dict[str, tuple[str, str]]:
    t: dict[str, tuple[str, str]] = {}

    def put(cls: str, role: str, *names: str) -> None:
        for n in names:
            t[n] = (role, cls)

    put("pfc_storm", "root", "pause_tx", "pause_storm_warnings", "pause_storm_errors",
        *(f"pfc_tx_p{p}" for p in range(8)))  # fmt: skip
    put("", "victim_pfc", "pause_rx", "rdma_xmit_wait", *(f"pfc_rx_p{p}" for p in range(8)))
    put("pcie", "root", "pcie_si_rx", "pcie_si_tx", "pcie_replay_rollover",
        "pcie_replay_timeout", "pcie_bad_tlp", "pcie_bad_dllp", "pcie_rx_err")  # fmt: skip
    put("pfc_storm", "root", "rx_out_of_buffer", "rdma_out_of_buffer", "rx_discards_phy")
    put("link_degraded", "root", "fec_corrected_bits", "fec_corrected_blocks",
        "fec_uncorrectable_blocks", "symbol_errors", "pcs_symbol_errors", "crc_errors_phy",
        "rdma_symbol_errors", "rdma_rcv_errors", "rx_errors")  # fmt: skip
    put("link_flap", "root", "link_down_events", "rdma_link_downed", "rdma_link_recovery",
        "link_up")  # fmt: skip
    put("ecn_config", "root", "cnp_ignored")
    put("mtu_config", "root", "mtu")
    put("", "congestion_rx", "ecn_marked", "cnp_sent")
    put("", "congestion_tx", "cnp_handled")
    put("", "loss", "out_of_sequence", "packet_seq_err", "local_ack_timeout",
        "implied_nak_seq_err", "duplicate_request", "rdma_retry_exceeded", "rnr_nak_retry",
        "rdma_xmit_discards")  # fmt: skip
    put("", "symptom", "rx_bytes", "tx_bytes", "rdma_rx_bytes", "rdma_tx_bytes", "rx_dropped",
        "tx_dropped", "tx_errors", "tx_discards_phy", "gpu_util", "tx_qdisc_drops",
        "tx_qdisc_backlog")  # fmt: skip
    put("gpu_throttle", "root", "temperature_c", "throttle_thermal", "throttle_hw",
        "sm_clock_mhz", "mem_clock_mhz", "throttle_power", "power_w")  # fmt: skip
    put("gpu_config", "root", "power_limit_w")
    put("gpu_pcie", "root", "gpu_pcie_replay")
    put("gpu_memory", "root", "ecc_corrected")
    put("host_starved", "root", "cpu_softirq", "cpu_irq", "cpu_steal", "runq_per_cpu",
        "psi_cpu_some", "softnet_dropped", "softnet_squeezed")  # fmt: skip
    put("host_memory", "root", "psi_mem_some", "psi_mem_full", "mem_available")
    put("host_io", "root", "psi_io_some", "psi_io_full", "cpu_iowait", "procs_blocked")
    return t


SIGNAL_ROLE: Mapping[str, tuple[str, str]] = MappingProxyType(_table())


def role_of(signal: str) -> tuple[str, str]:
    """Return (role, root class or "") of ``signal``; unknown signals are symptoms."""
    return SIGNAL_ROLE.get(signal, ("symptom", ""))


def root_class(signals: Iterable[str]) -> str | None:
    """Return the strongest root class among ``signals`` (`PRECEDENCE`), or None."""
    found = {role_of(s)[1] for s in signals if role_of(s)[0] == "root"}
    return next((c for c in PRECEDENCE if c in found), None)


def roles(signals: Iterable[str]) -> set[str]:
    """Return the roles present among ``signals``."""
    return {role_of(s)[0] for s in signals}


# scored catalogue signals the table forgot (a test keeps this empty)
UNMAPPED: tuple[str, ...] = tuple(
    s.name for s in CATALOGUE if s.bad != "none" and s.name not in SIGNAL_ROLE
)
