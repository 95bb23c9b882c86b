"""What timestamping an interface can do: the ``ETHTOOL_GET_TS_INFO`` ioctl (``ethtool -T``).

The kernel fills ``struct ethtool_ts_info`` (include/uapi/linux/ethtool.h)::

    u32 cmd; u32 so_timestamping; s32 phc_index; u32 tx_types; u32 tx_reserved[3];
    u32 rx_filters; u32 rx_reserved[3];

``so_timestamping`` holds the ``SOF_TIMESTAMPING_*`` capability bits (`prober.timestamping`),
``phc_index`` the PTP hardware clock (``/dev/ptp<N>``, -1 when none), ``tx_types`` and
``rx_filters`` bit sets of ``HWTSTAMP_TX_*`` / ``HWTSTAMP_FILTER_*``. `decode_ts_info` (pure)
reads the bytes; `read_ts_info` (thin) asks the kernel through a UDP socket (no privilege
needed to ask; *setting* hardware stamping needs CAP_NET_ADMIN: `prober.timestamping`).
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct
from dataclasses import dataclass

from prober.timestamping import (
    HWTSTAMP_FILTER_ALL,
    HWTSTAMP_TX_ON,
    SOF_TIMESTAMPING_RAW_HARDWARE,
    SOF_TIMESTAMPING_RX_HARDWARE,
    SOF_TIMESTAMPING_RX_SOFTWARE,
    SOF_TIMESTAMPING_SOFTWARE,
    SOF_TIMESTAMPING_TX_HARDWARE,
    SOF_TIMESTAMPING_TX_SOFTWARE,
)

SIOCETHTOOL = 0x8946
ETHTOOL_GET_TS_INFO = 0x41
_TS_INFO = struct.Struct("=IIiI3II3I")  # 44 bytes
HW_NEEDED = (
    SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE
)
SW_NEEDED = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE


@dataclass(frozen=True, slots=True)
class TsInfo:
    """An interface's timestamping capabilities (see the module doc for the fields)."""

    so_timestamping: int
    phc_index: int = -1
    tx_types: int = 0
    rx_filters: int = 0

    @property
    def hardware(self) -> bool:
        """True when the NIC stamps sent and received packets with its own clock, and can be
        told to stamp every packet (TX on, RX filter ALL: what `prober.timestamping` asks)."""
        return (
            self.so_timestamping & HW_NEEDED == HW_NEEDED
            and self.phc_index >= 0
            and bool(self.tx_types & (1 << HWTSTAMP_TX_ON))
            and bool(self.rx_filters & (1 << HWTSTAMP_FILTER_ALL))
        )

    @property
    def software(self) -> bool:
        """True when the kernel stamps this interface's packets in software (TX and RX)."""
        return self.so_timestamping & SW_NEEDED == SW_NEEDED

    @property
    def mode(self) -> str:
        """``"hardware"``, ``"software"`` or ``"none"``: the best stamps the prober gets."""
        return "hardware" if self.hardware else "software" if self.software else "none"


def decode_ts_info(data: bytes) -> TsInfo:
    """Return the `TsInfo` in a filled ``struct ethtool_ts_info``; ValueError if too short."""
    if len(data) < _TS_INFO.size:
        raise ValueError(f"ethtool_ts_info needs {_TS_INFO.size} bytes, got {len(data)}")
    f = _TS_INFO.unpack_from(data)
    return TsInfo(so_timestamping=f[1], phc_index=f[2], tx_types=f[3], rx_filters=f[7])


def read_ts_info(ifname: str) -> TsInfo:
    """Ask the kernel for ``ifname``'s timestamping capabilities (in the caller's namespace).

    Raises OSError (ENODEV: no such interface; EOPNOTSUPP: the driver does not say).
    """
    buf = ctypes.create_string_buffer(_TS_INFO.pack(ETHTOOL_GET_TS_INFO, 0, -1, 0, 0, 0, 0, 0,
                                                    0, 0, 0))  # fmt: skip
    ifreq = struct.pack("@16sP", ifname.encode()[:15], ctypes.addressof(buf)).ljust(40, b"\0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
    return decode_ts_info(buf.raw)
