"""Linux SO_TIMESTAMPING and IP_RECVERR: constants, socket setup, control-message parsing.

Kernel interface (Documentation/networking/timestamping.rst):

- ``setsockopt(SOL_SOCKET, SO_TIMESTAMPING, flags)`` turns stamps on. RX stamps arrive as an
  ``SCM_TIMESTAMPING`` control message with each received datagram; TX stamps are queued on the
  socket's error queue and read with ``recvmsg(..., MSG_ERRQUEUE)``: an ``IP_RECVERR`` control
  message (``struct sock_extended_err`` with ``ee_origin == SO_EE_ORIGIN_TIMESTAMPING`` and, with
  ``OPT_ID``, ``ee_data`` = the per-socket send counter) plus the ``SCM_TIMESTAMPING`` message.
  ``OPT_TSONLY`` keeps the kernel from echoing the payload back.
- ``SCM_TIMESTAMPING`` carries three ``struct timespec``: [0] software, [1] legacy (zero),
  [2] raw hardware. We take hardware when non-zero, else software.
- Hardware stamps also need the NIC told to stamp (``SIOCSHWTSTAMP`` ioctl on the device, needs
  CAP_NET_ADMIN and driver support): `enable_timestamping` tries it and falls back to software.
  The setting is per device, shared with e.g. ptp4l; we ask for TX on + RX filter ALL, a
  superset of what PTP daemons set, so they keep working.
- ``IP_RECVERR`` also queues ICMP errors (``ee_origin == SO_EE_ORIGIN_ICMP``) with the offending
  router's address after the struct: path discovery (`prober.pathdisc`) reads those.

Only parsing and setup here; the event loop lives in `prober.udp`.
"""

from __future__ import annotations

import ctypes
import enum
import fcntl
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

SO_TIMESTAMPING = 37
SCM_TIMESTAMPING = SO_TIMESTAMPING
SOF_TIMESTAMPING_TX_HARDWARE = 1 << 0
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_HARDWARE = 1 << 2
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_SYS_HARDWARE = 1 << 5
SOF_TIMESTAMPING_RAW_HARDWARE = 1 << 6
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
SW_FLAGS = (
    SOF_TIMESTAMPING_TX_SOFTWARE
    | SOF_TIMESTAMPING_RX_SOFTWARE
    | SOF_TIMESTAMPING_SOFTWARE
    | SOF_TIMESTAMPING_OPT_ID
    | SOF_TIMESTAMPING_OPT_TSONLY
)
HW_FLAGS = (
    SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE
)

SOL_IP = 0
IP_RECVERR = 11
IP_TTL = 2
SO_EE_ORIGIN_ICMP = 2
SO_EE_ORIGIN_TIMESTAMPING = 4
ICMP_DEST_UNREACH = 3
ICMP_PORT_UNREACH = 3
ICMP_TIME_EXCEEDED = 11
SIOCSHWTSTAMP = 0x89B0
HWTSTAMP_TX_ON = 1
HWTSTAMP_FILTER_ALL = 1
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)

_TIMESPEC3 = struct.Struct("=qqqqqq")
_EXT_ERR = struct.Struct("=IBBBBII")  # errno, origin, type, code, pad, info, data
_SOCKADDR_IN = struct.Struct("=H2s4s")  # family (host order), port (network), address

ANC_BUFSIZE = 512


class StampSource(enum.StrEnum):
    """Where a timestamp came from."""

    HW = "hw"  # NIC hardware clock
    SW = "sw"  # kernel software stamp (CLOCK_REALTIME)
    USER = "user"  # user-space clock read around the syscall (no kernel stamp)


@dataclass(frozen=True, slots=True)
class ExtendedErr:
    """A decoded ``sock_extended_err`` (+ offender address for ICMP errors)."""

    errno: int
    origin: int
    icmp_type: int
    icmp_code: int
    info: int
    data: int
    offender: str | None


def set_hw_timestamping(sock: socket.socket, device: str) -> bool:
    """Ask ``device`` to stamp all packets in hardware (SIOCSHWTSTAMP); return True on success.

    Returns False (never raises) when the driver, the device or our privileges say no.
    """
    config = ctypes.create_string_buffer(
        struct.pack("=iii", 0, HWTSTAMP_TX_ON, HWTSTAMP_FILTER_ALL)
    )
    name = device.encode()[:15]
    ifreq = struct.pack("@16sP", name, ctypes.addressof(config)).ljust(40, b"\0")
    try:
        fcntl.ioctl(sock.fileno(), SIOCSHWTSTAMP, ifreq)
    except OSError:
        return False
    return True


def enable_timestamping(
    sock: socket.socket, device: str | None = None, want_hw: bool = True
) -> StampSource:
    """Turn on TX+RX kernel stamps (OPT_ID, OPT_TSONLY) and IP_RECVERR on ``sock``.

    Tries hardware stamps when ``want_hw`` and ``device`` are given (falls back to software).
    Returns the source configured; raises `OSError` only if even software stamping fails.
    """
    sock.setsockopt(SOL_IP, IP_RECVERR, 1)
    if want_hw and device and set_hw_timestamping(sock, device):
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, SW_FLAGS | HW_FLAGS)
            return StampSource.HW
        except OSError:
            pass
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, SW_FLAGS)
    return StampSource.SW


def parse_stamp(ancdata: Iterable[tuple[int, int, bytes]]) -> tuple[int, StampSource] | None:
    """Return (ns, source) from an SCM_TIMESTAMPING control message, or None if absent/zero.

    Hardware (timespec [2]) wins when non-zero; otherwise software (timespec [0]).
    """
    for level, ctype, data in ancdata:
        if level == socket.SOL_SOCKET and ctype == SCM_TIMESTAMPING and len(data) >= 48:
            s0, n0, _, _, s2, n2 = _TIMESPEC3.unpack_from(data)
            if s2 or n2:
                return s2 * 1_000_000_000 + n2, StampSource.HW
            if s0 or n0:
                return s0 * 1_000_000_000 + n0, StampSource.SW
    return None


def parse_extended_err(ancdata: Iterable[tuple[int, int, bytes]]) -> ExtendedErr | None:
    """Return the `ExtendedErr` in an IP_RECVERR control message, or None if there is none."""
    for level, ctype, data in ancdata:
        if level == SOL_IP and ctype == IP_RECVERR and len(data) >= _EXT_ERR.size:
            err, origin, etype, code, _, info, edata = _EXT_ERR.unpack_from(data)
            offender = None
            rest = data[_EXT_ERR.size :]
            if origin == SO_EE_ORIGIN_ICMP and len(rest) >= _SOCKADDR_IN.size:
                family, _, addr = _SOCKADDR_IN.unpack_from(rest)
                if family == socket.AF_INET:
                    offender = socket.inet_ntoa(addr)
            return ExtendedErr(err, origin, etype, code, info, edata, offender)
    return None
