"""Ethernet counters by name (``ETHTOOL_GSTRINGS`` + ``ETHTOOL_GSTATS``), link and MTU.

Two layers:

- `ethtool_values(stats)` (pure): maps a driver's counter names (what ``ethtool -S`` prints)
  to catalogue signals. Names vary by driver; `NAME_MAP` lists the ones known here, each with
  the driver that uses it (from the drivers' sources: mlx5 ``en_stats.c``, bnxt_en
  ``bnxt_ethtool.c``, ice ``ice_ethtool.c``, i40e ``i40e_ethtool.c``). A signal the driver
  does not count is left out (not available); nothing is guessed from another name.
- `EthtoolReader` (I/O): the ``SIOCETHTOOL`` ioctls on one datagram socket, in the namespace
  the socket was made in. Counter names are read once per device (``ETHTOOL_GSSET_INFO`` +
  ``ETHTOOL_GSTRINGS``) and kept; each read is then one ``ETHTOOL_GSTATS``. Also
  ``ETHTOOL_GLINK`` (link detected) and ``SIOCGIFMTU``. A device without ethtool statistics
  (EOPNOTSUPP) reads as no counters, a missing device raises `EthtoolError`.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import re
import socket
import struct
from collections.abc import Mapping

SIOCETHTOOL = 0x8946
SIOCGIFMTU = 0x8921
ETHTOOL_GLINK = 0x0000000A
ETHTOOL_GSTRINGS = 0x0000001B
ETHTOOL_GSTATS = 0x0000001D
ETHTOOL_GSSET_INFO = 0x00000037
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16

# (regular expression on the driver's name, catalogue name; "{0}" = the first group)
NAME_MAP: tuple[tuple[str, str], ...] = (
    # mlx5
    (r"rx_pause_ctrl_phy", "pause_rx"),
    (r"tx_pause_ctrl_phy", "pause_tx"),
    (r"rx_prio([0-7])_pause", "pfc_rx_p{0}"),
    (r"tx_prio([0-7])_pause", "pfc_tx_p{0}"),
    (r"tx_pause_storm_warning_events", "pause_storm_warnings"),
    (r"tx_pause_storm_error_events", "pause_storm_errors"),
    (r"rx_discards_phy", "rx_discards_phy"),
    (r"tx_discards_phy", "tx_discards_phy"),
    (r"rx_out_of_buffer", "rx_out_of_buffer"),
    (r"rx_corrected_bits_phy", "fec_corrected_bits"),
    (r"rx_symbol_err_phy", "symbol_errors"),
    (r"rx_pcs_symbol_err_phy", "pcs_symbol_errors"),
    (r"rx_crc_errors_phy", "crc_errors_phy"),
    (r"link_down_events_phy", "link_down_events"),
    (r"rx_pci_signal_integrity", "pcie_si_rx"),
    (r"tx_pci_signal_integrity", "pcie_si_tx"),
    # bnxt_en (Broadcom)
    (r"rx_pause_frames", "pause_rx"),
    (r"tx_pause_frames", "pause_tx"),
    (r"rx_pfc_ena_frames_pri([0-7])", "pfc_rx_p{0}"),
    (r"tx_pfc_ena_frames_pri([0-7])", "pfc_tx_p{0}"),
    (r"rx_corrected_bits", "fec_corrected_bits"),
    (r"rx_fec_corrected_blocks", "fec_corrected_blocks"),
    (r"rx_fec_uncorrectable_blocks", "fec_uncorrectable_blocks"),
    (r"rx_pcs_symbol_err", "pcs_symbol_errors"),
    # ice (Intel E800): ".nic" since 2021, without it before
    (r"link_xoff_rx(?:\.nic)?", "pause_rx"),
    (r"link_xoff_tx(?:\.nic)?", "pause_tx"),
    (r"rx_priority_([0-7])_xoff\.nic", "pfc_rx_p{0}"),
    (r"tx_priority_([0-7])_xoff\.nic", "pfc_tx_p{0}"),
    (r"rx_dropped\.nic", "rx_discards_phy"),
    # i40e (Intel 700): "port." prefix; the "_rx"/"_tx" suffix on the PFC names since 2018
    (r"port\.link_xoff_rx", "pause_rx"),
    (r"port\.link_xoff_tx", "pause_tx"),
    (r"port\.rx_priority_([0-7])_xoff(?:_rx)?", "pfc_rx_p{0}"),
    (r"port\.tx_priority_([0-7])_xoff(?:_tx)?", "pfc_tx_p{0}"),
)
_COMPILED = tuple((re.compile(rx + r"\Z"), name) for rx, name in NAME_MAP)


class EthtoolError(OSError):
    """The device does not exist (or the ioctl failed for another reason than "not
    supported")."""


def catalogue_name(driver_name: str) -> str | None:
    """Return the catalogue signal a driver counter name maps to, or None."""
    for rx, name in _COMPILED:
        m = rx.match(driver_name)
        if m:
            return name.format(*m.groups())
    return None


def ethtool_values(stats: Mapping[str, int]) -> dict[str, float]:
    """Return catalogue signal -> raw counter value from a driver's named counters (the first
    driver name that maps to a signal wins; unknown names are ignored)."""
    out: dict[str, float] = {}
    for raw, value in stats.items():
        name = catalogue_name(raw)
        if name is not None and name not in out:
            out[name] = float(value)
    return out


def parse_gstrings(data: bytes, count: int) -> tuple[str, ...]:
    """Return the ``count`` names packed in ``data`` (32 bytes each, NUL-padded)."""
    names = []
    for i in range(count):
        chunk = data[i * ETH_GSTRING_LEN : (i + 1) * ETH_GSTRING_LEN]
        names.append(chunk.split(b"\0", 1)[0].decode("ascii", "replace"))
    return tuple(names)


class EthtoolReader:
    """The ethtool ioctls of one socket's namespace; names cached per device."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self._sock = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._names: dict[str, tuple[str, ...]] = {}

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()

    def _ioctl(self, dev: str, buf: ctypes.Array[ctypes.c_char]) -> None:
        ifr = struct.pack(f"{IFNAMSIZ}sP", dev.encode()[: IFNAMSIZ - 1], ctypes.addressof(buf))
        try:
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifr)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            raise EthtoolError(exc.errno or 0, f"ethtool on {dev!r}: {exc.strerror}") from None

    def names(self, dev: str) -> tuple[str, ...]:
        """Return the device's counter names (empty without ethtool statistics)."""
        if dev in self._names:
            return self._names[dev]
        info = ctypes.create_string_buffer(struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0,
                                                       1 << ETH_SS_STATS, 0))  # fmt: skip
        try:
            self._ioctl(dev, info)
            count = struct.unpack_from("I", info.raw, 16)[0]
            buf = ctypes.create_string_buffer(
                struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
                + bytes(count * ETH_GSTRING_LEN)
            )
            self._ioctl(dev, buf)
            names = parse_gstrings(buf.raw[12:], count)
        except OSError as exc:
            if isinstance(exc, EthtoolError):
                raise
            names = ()
        self._names[dev] = names
        return names

    def stats(self, dev: str) -> dict[str, int]:
        """Return the device's named counters now (empty without ethtool statistics)."""
        names = self.names(dev)
        if not names:
            return {}
        n = len(names)
        buf = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_GSTATS, n) + bytes(8 * n))
        try:
            self._ioctl(dev, buf)
        except OSError as exc:
            if isinstance(exc, EthtoolError):
                raise
            return {}
        got = struct.unpack_from("I", buf.raw, 4)[0]
        values = struct.unpack_from(f"{min(got, n)}Q", buf.raw, 8)
        return dict(zip(names, values, strict=False))

    def link(self, dev: str) -> bool | None:
        """Return whether the link is detected (None: the driver does not say)."""
        buf = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_GLINK, 0))
        try:
            self._ioctl(dev, buf)
        except EthtoolError:
            raise
        except OSError:
            return None
        return bool(struct.unpack_from("I", buf.raw, 4)[0])

    def mtu(self, dev: str) -> int | None:
        """Return the device's MTU (None when the ioctl fails)."""
        ifr = struct.pack(f"{IFNAMSIZ}si", dev.encode()[: IFNAMSIZ - 1], 0) + bytes(20)
        try:
            res = fcntl.ioctl(self._sock.fileno(), SIOCGIFMTU, ifr)
        except OSError:
            return None
        return int(struct.unpack_from("i", res, IFNAMSIZ)[0])
