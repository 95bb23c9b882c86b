"""RDMA port counters and hardware counters from sysfs, by name.

``/sys/class/infiniband/<dev>/ports/<port>/counters/`` holds the InfiniBand PMA port counters
(any RDMA device with a MAD interface: mlx5, not rxe); ``hw_counters/`` holds the driver's own
(mlx5: congestion control and transport errors; rxe: its software counters). One file per
counter, a decimal number each.

- `rdma_values(counters, hw_counters)` (pure): the catalogue signals from the two name ->
  value maps, through `PORT_MAP` and `HW_MAP` (names from the kernel's ``sysfs.c`` for the
  PMA, mlx5 ``counters.c``, bnxt_re ``hw_counters.c`` and rxe ``rxe_hw_counters.c``; a name known to neither is ignored,
  a signal the device does not count is not available). ``port_rcv_data`` and
  ``port_xmit_data`` count 4-byte words: the signals are bytes.
- `read_rdma_port(dev, port, root)` (I/O): the two directories' files as name -> integer.
- `rdma_netdev(dev, port, root)`: the network device a RoCE port runs on (``gid_attrs``), to
  tie an RDMA device to a NIC id.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

SYSFS_IB = Path("/sys/class/infiniband")

# PMA name -> (catalogue name, factor)
PORT_MAP: Mapping[str, tuple[str, float]] = {
    "port_rcv_data": ("rdma_rx_bytes", 4.0),
    "port_xmit_data": ("rdma_tx_bytes", 4.0),
    "port_rcv_packets": ("rdma_rx_packets", 1.0),
    "port_xmit_packets": ("rdma_tx_packets", 1.0),
    "port_xmit_discards": ("rdma_xmit_discards", 1.0),
    "port_rcv_errors": ("rdma_rcv_errors", 1.0),
    "symbol_error": ("rdma_symbol_errors", 1.0),
    "link_downed": ("rdma_link_downed", 1.0),
    "link_error_recovery": ("rdma_link_recovery", 1.0),
    "port_xmit_wait": ("rdma_xmit_wait", 1.0),
}
# hw_counters name -> catalogue name (mlx5, then rxe; the same meaning under two spellings)
HW_MAP: Mapping[str, str] = {
    # mlx5
    "np_cnp_sent": "cnp_sent",
    "rp_cnp_handled": "cnp_handled",
    "rp_cnp_ignored": "cnp_ignored",
    "np_ecn_marked_roce_packets": "ecn_marked",
    "out_of_sequence": "out_of_sequence",
    "packet_seq_err": "packet_seq_err",
    "local_ack_timeout_err": "local_ack_timeout",
    "rnr_nak_retry_err": "rnr_nak_retry",
    "implied_nak_seq_err": "implied_nak_seq_err",
    "duplicate_request": "duplicate_request",
    "out_of_buffer": "rdma_out_of_buffer",
    # bnxt_re (Broadcom; its hw_counters.c): CNPs received, not split into handled/ignored
    "tx_cnp_pkts": "cnp_sent",
    "rx_cnp_pkts": "cnp_handled",
    "rx_ecn_marked_pkts": "ecn_marked",
    "to_retransmits": "local_ack_timeout",
    "seq_err_naks_rcvd": "packet_seq_err",
    "max_retry_exceeded": "rdma_retry_exceeded",
    "dup_reqs": "duplicate_request",
    "rx_roce_only_bytes": "rdma_rx_bytes",
    "tx_roce_only_bytes": "rdma_tx_bytes",
    "rx_roce_only_pkts": "rdma_rx_packets",
    "tx_roce_only_pkts": "rdma_tx_packets",
    # rxe (Soft-RoCE)
    "sent_pkts": "rdma_tx_packets",
    "rcvd_pkts": "rdma_rx_packets",
    "out_of_seq_request": "out_of_sequence",
    "rcvd_seq_err": "packet_seq_err",
    "completer_retry_err": "local_ack_timeout",
    "retry_exceeded_err": "rdma_retry_exceeded",
    "retry_rnr_exceeded_err": "rnr_nak_retry",
    "link_downed": "rdma_link_downed",
}


def rdma_values(
    counters: Mapping[str, int], hw_counters: Mapping[str, int] | None = None
) -> dict[str, float]:
    """Return catalogue signal -> raw counter value (bytes for the data counters) from the
    ``counters/`` and ``hw_counters/`` maps of one port (PMA names win over hw names)."""
    out: dict[str, float] = {}
    for raw, (name, factor) in PORT_MAP.items():
        if raw in counters:
            out[name] = float(counters[raw]) * factor
    for raw, value in (hw_counters or {}).items():
        hw_name = HW_MAP.get(raw)
        if hw_name is not None and hw_name not in out:
            out[hw_name] = float(value)
    return out


def parse_counter_dir(texts: Mapping[str, str]) -> dict[str, int]:
    """Return name -> integer from the texts of a counter directory's files (files that are
    not one integer are left out)."""
    out: dict[str, int] = {}
    for name, text in texts.items():
        try:
            out[name] = int(text.strip())
        except ValueError:
            continue
    return out


def _read_dir(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        entries = sorted(path.iterdir())
    except OSError:
        return out
    for f in entries:
        try:
            out[f.name] = f.read_text()
        except OSError:  # some counters refuse reads on some devices
            continue
    return out


def read_rdma_port(
    dev: str, port: int = 1, root: Path = SYSFS_IB
) -> tuple[dict[str, int], dict[str, int]]:
    """Return the (``counters``, ``hw_counters``) maps of ``dev`` port ``port``; a directory
    the device lacks is an empty map. Raises FileNotFoundError if the port does not exist."""
    base = root / dev / "ports" / str(port)
    if not base.is_dir():
        raise FileNotFoundError(f"no RDMA port {dev}/{port} under {root}")
    return (parse_counter_dir(_read_dir(base / "counters")),
            parse_counter_dir(_read_dir(base / "hw_counters")))  # fmt: skip


def rdma_netdev(dev: str, port: int = 1, root: Path = SYSFS_IB) -> str | None:
    """Return the network device of RoCE port ``dev``/``port`` (GID 0's), or None."""
    try:
        name = (root / dev / "ports" / str(port) / "gid_attrs" / "ndevs" / "0").read_text()
    except OSError:
        return None
    return name.strip() or None
