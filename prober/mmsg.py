"""Batched UDP socket calls: ``recvmmsg(2)`` / ``sendmmsg(2)`` through ctypes (Linux, x86-64/arm64).

Python's `socket` has ``recvmsg``/``sendmsg`` but no ``recvmmsg``/``sendmmsg``: one system call
(and one Python call, and one exception at EAGAIN) per datagram. These rings keep their headers,
control buffers and payload slots preallocated in one ctypes buffer each and hand the kernel
up to ``size`` datagrams per call; EAGAIN is a return value (0), not an exception.

Layout (LP64): ``struct mmsghdr`` = ``struct msghdr`` (56 bytes: name ptr, namelen, iov ptr,
iovlen, control ptr, controllen, flags) + ``msg_len`` (4) + padding = 64 bytes; ``struct iovec``
= 16 bytes; ``struct cmsghdr`` = len (8), level (4), type (4), data aligned to 8. Fields are read
and written with `struct` on a memoryview of the buffers (ctypes attribute access is slower).

`RecvRing.recv` returns how many datagrams arrived; ``payload(i)`` (a view valid until the next
call), ``source(i)``, ``cmsgs(i)`` and ``stamp(i)`` read them. `SendRing.send` sends a list of
(payload, destination) from one socket and returns how many the kernel took. OS errors other
than EAGAIN raise `OSError` with the errno (after the datagrams already taken were counted).
Only parsing and buffers here; `prober.fastudp` drives them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from collections.abc import Callable, Sequence

from prober.timestamping import SCM_TIMESTAMPING, StampSource

_HDR = 64  # sizeof(struct mmsghdr)
_IOV = 16  # sizeof(struct iovec)
_NAME = 16  # sizeof(struct sockaddr_in)
_OFF_NAMELEN = 8
_OFF_CONTROLLEN = 40
_OFF_MSGLEN = 56
_MSG_DONTWAIT = 0x40
_MSG_ERRQUEUE = 0x2000
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_CMSG = struct.Struct("=QiI")  # cmsg_len, cmsg_level, cmsg_type
_TS = struct.Struct("=qqqqqq")  # three timespecs (SCM_TIMESTAMPING)
_SIN = struct.Struct("=H2s4s8x")  # family (host order), port (network), address
_SIN_PORT = struct.Struct("!H")
_SOL_SOCKET = socket.SOL_SOCKET
_SOL_IP = 0
_IP_RECVERR = 11
_EXT_ERR = struct.Struct("=IBBBBII")  # errno, origin, type, code, pad, info, data

_libc = ctypes.CDLL(None, use_errno=True)
_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int
_sendmmsg = _libc.sendmmsg
_sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
_sendmmsg.restype = ctypes.c_int


def _headers(
    size: int, slot: int, control: int, named: bool
) -> tuple[ctypes.Array[ctypes.c_char], ...]:
    """Return (headers, iovecs, payload, control, names) buffers wired together."""
    hdrs = ctypes.create_string_buffer(size * _HDR)
    iovs = ctypes.create_string_buffer(size * _IOV)
    data = ctypes.create_string_buffer(max(1, size * slot))
    ctl = ctypes.create_string_buffer(max(1, size * control))
    names = ctypes.create_string_buffer(size * _NAME)
    d, c, n, v = (ctypes.addressof(b) for b in (data, ctl, names, iovs))
    for i in range(size):
        struct.pack_into("=QQ", iovs, i * _IOV, d + i * slot, slot)
        struct.pack_into(
            "=QI4xQQQQi4x",
            hdrs,
            i * _HDR,
            n + i * _NAME if named else 0,
            _NAME if named else 0,
            v + i * _IOV,
            1,
            c + i * control if control else 0,
            control,
            0,
        )
    return hdrs, iovs, data, ctl, names


class RecvRing:
    """Preallocated ``recvmmsg`` state for up to ``size`` datagrams of ``slot`` bytes each.

    ``errqueue``: read the socket error queue (TX stamps, ICMP errors) instead of data.
    """

    __slots__ = (
        "_addr_cache",
        "_bufs",
        "_ctl",
        "_data",
        "_hdr_ptr",
        "_hdrs",
        "_names",
        "_template",
        "control",
        "flags",
        "size",
        "slot",
    )  # fmt: skip

    def __init__(self, size: int = 64, slot: int = 2048, control: int = 256,
                 errqueue: bool = False) -> None:  # fmt: skip
        if size <= 0 or slot <= 0 or control < 0:
            raise ValueError("size and slot must be positive, control >= 0")
        self.size, self.slot, self.control = size, slot, control
        self._bufs = _headers(size, slot, control, named=not errqueue)
        hdrs, _, data, ctl, names = self._bufs
        self._hdr_ptr = ctypes.addressof(hdrs)
        self._template = bytes(hdrs)
        self._hdrs = memoryview(hdrs).cast("B")
        self._data = memoryview(data).cast("B")
        self._ctl = memoryview(ctl).cast("B")
        self._names = memoryview(names).cast("B")
        self._addr_cache: dict[bytes, str] = {}
        self.flags = _MSG_DONTWAIT | (_MSG_ERRQUEUE if errqueue else 0)

    def recv(self, fd: int) -> int:
        """Receive up to ``size`` datagrams from ``fd`` without blocking; return how many.

        Returns 0 when nothing is waiting (EAGAIN); raises `OSError` for any other error
        (e.g. a pending ICMP error surfaced by IP_RECVERR on a data read).
        """
        self._hdrs[:] = self._template  # restore namelen / controllen the last call shrank
        n: int = _recvmmsg(fd, self._hdr_ptr, self.size, self.flags, None)
        if n >= 0:
            return n
        err = ctypes.get_errno()
        if err in (errno.EAGAIN, errno.EINTR):
            return 0
        raise OSError(err, os.strerror(err))

    def length(self, i: int) -> int:
        """Return the payload length of datagram ``i``."""
        return int(_U32.unpack_from(self._hdrs, i * _HDR + _OFF_MSGLEN)[0])

    def payload(self, i: int) -> memoryview:
        """Return datagram ``i``'s payload (a view into the ring: valid until the next `recv`)."""
        start = i * self.slot
        return self._data[start : start + self.length(i)]

    def source(self, i: int) -> tuple[str, int]:
        """Return datagram ``i``'s source (IPv4 address, port)."""
        off = i * _NAME
        raw = bytes(self._names[off + 4 : off + 8])
        ip = self._addr_cache.get(raw)
        if ip is None:
            ip = self._addr_cache[raw] = socket.inet_ntoa(raw)
        return ip, int(_SIN_PORT.unpack_from(self._names, off + 2)[0])

    def cmsgs(self, i: int) -> list[tuple[int, int, bytes]]:
        """Return datagram ``i``'s control messages as ``socket.recvmsg`` does."""
        out: list[tuple[int, int, bytes]] = []
        base = i * self.control
        end = base + int(_U64.unpack_from(self._hdrs, i * _HDR + _OFF_CONTROLLEN)[0])
        off = base
        while off + 16 <= end:
            clen, level, ctype = _CMSG.unpack_from(self._ctl, off)
            if clen < 16 or off + clen > end:
                break
            out.append((level, ctype, bytes(self._ctl[off + 16 : off + clen])))
            off += (clen + 7) & ~7
        return out

    def stamp(self, i: int) -> tuple[int, StampSource] | None:
        """Return (ns, source) of datagram ``i``'s SCM_TIMESTAMPING stamp, or None.

        Same rule as `prober.timestamping.parse_stamp`: hardware when non-zero, else software.
        """
        base = i * self.control
        end = base + int(_U64.unpack_from(self._hdrs, i * _HDR + _OFF_CONTROLLEN)[0])
        off = base
        while off + 16 <= end:
            clen, level, ctype = _CMSG.unpack_from(self._ctl, off)
            if clen < 16 or off + clen > end:
                return None
            if level == _SOL_SOCKET and ctype == SCM_TIMESTAMPING and clen >= 64:
                s0, n0, _, _, s2, n2 = _TS.unpack_from(self._ctl, off + 16)
                if s2 or n2:
                    return s2 * 1_000_000_000 + n2, StampSource.HW
                if s0 or n0:
                    return s0 * 1_000_000_000 + n0, StampSource.SW
                return None
            off += (clen + 7) & ~7
        return None

    def received(
        self, n: int, clock: Callable[[int], int], now_ns: int, stamped: bool
    ) -> tuple[list[tuple[memoryview, tuple[str, int], int]], list[StampSource]]:
        """Return ([(payload, source, rx_ns)], [stamp source]) for datagrams 0..n-1.

        ``rx_ns`` is ``clock(kernel stamp)`` (see `stamp`), or ``now_ns`` with source USER when
        the datagram has no stamp or ``stamped`` is False. Payloads are views into the ring.
        """
        out: list[tuple[memoryview, tuple[str, int], int]] = []
        sources: list[StampSource] = []
        hdrs, data, slot, names, cache = (
            self._hdrs,
            self._data,
            self.slot,
            self._names,
            self._addr_cache,
        )
        for i in range(n):
            length = _U32.unpack_from(hdrs, i * _HDR + _OFF_MSGLEN)[0]
            off = i * _NAME
            raw = bytes(names[off + 4 : off + 8])
            ip = cache.get(raw)
            if ip is None:
                ip = cache[raw] = socket.inet_ntoa(raw)
            src = (ip, _SIN_PORT.unpack_from(names, off + 2)[0])
            stamp = self.stamp(i) if stamped else None
            if stamp is None:
                rx, source = now_ns, StampSource.USER
            else:
                rx, source = clock(stamp[0]), stamp[1]
            sources.append(source)
            out.append((data[i * slot : i * slot + length], src, rx))
        return out, sources

    def tx_stamp(self, i: int) -> tuple[int, int, int, StampSource | None]:
        """Return (origin, ee_data, ns, source) of error-queue entry ``i`` without copying.

        ``origin`` is the ``sock_extended_err`` origin (-1 if there is none; then use `cmsgs`
        with `prober.timestamping.parse_extended_err`); ``ns``/``source`` are its stamp
        (0/None when absent), with the rule of `stamp`.
        """
        base = i * self.control
        end = base + int(_U64.unpack_from(self._hdrs, i * _HDR + _OFF_CONTROLLEN)[0])
        off, ctl = base, self._ctl
        origin, data, ns, source = -1, 0, 0, None
        while off + 16 <= end:
            clen, level, ctype = _CMSG.unpack_from(ctl, off)
            if clen < 16 or off + clen > end:
                break
            if level == _SOL_SOCKET and ctype == SCM_TIMESTAMPING and clen >= 64:
                s0, n0, _, _, s2, n2 = _TS.unpack_from(ctl, off + 16)
                if s2 or n2:
                    ns, source = s2 * 1_000_000_000 + n2, StampSource.HW
                elif s0 or n0:
                    ns, source = s0 * 1_000_000_000 + n0, StampSource.SW
            elif level == _SOL_IP and ctype == _IP_RECVERR and clen >= 16 + _EXT_ERR.size:
                _, origin, _, _, _, _, data = _EXT_ERR.unpack_from(ctl, off + 16)
            off += (clen + 7) & ~7
        return origin, data, ns, source


class SendRing:
    """Preallocated ``sendmmsg`` state for up to ``size`` datagrams of at most ``slot`` bytes."""

    __slots__ = ("_bufs", "_data", "_hdr_ptr", "_iovs", "_names", "_sin_cache", "size", "slot")

    def __init__(self, size: int = 64, slot: int = 2048) -> None:
        if size <= 0 or slot <= 0:
            raise ValueError("size and slot must be positive")
        self.size, self.slot = size, slot
        self._bufs = _headers(size, slot, 0, named=True)
        hdrs, iovs, data, _, names = self._bufs
        self._hdr_ptr = ctypes.addressof(hdrs)
        self._iovs = memoryview(iovs).cast("B")
        self._data = memoryview(data).cast("B")
        self._names = memoryview(names).cast("B")
        self._sin_cache: dict[tuple[str, int], bytes] = {}

    def _sockaddr(self, dest: tuple[str, int]) -> bytes:
        sin = self._sin_cache.get(dest)
        if sin is None:
            if len(self._sin_cache) > 65536:
                self._sin_cache.clear()
            sin = _SIN.pack(socket.AF_INET, _SIN_PORT.pack(dest[1]), socket.inet_aton(dest[0]))
            self._sin_cache[dest] = sin
        return sin

    def send(self, fd: int, items: Sequence[tuple[bytes, tuple[str, int]]]) -> int:
        """Send ``items`` (payload, (IPv4, port)) from ``fd`` in order; return how many left.

        At most ``size`` per call (the caller sends the rest in a further call). Returns 0 on
        EAGAIN; raises `OSError` when the kernel refused the first datagram for another reason
        (a later failure shows as a short count, and the next call reports it).
        Raises `ValueError` for a payload longer than ``slot``.
        """
        k = min(len(items), self.size)
        slot, data, names, iovs = self.slot, self._data, self._names, self._iovs
        for i in range(k):
            payload, dest = items[i]
            n = len(payload)
            if n > slot:
                raise ValueError(f"datagram of {n} bytes > slot {slot}")
            off = i * slot
            data[off : off + n] = payload
            _U64.pack_into(iovs, i * _IOV + 8, n)
            names[i * _NAME : (i + 1) * _NAME] = self._sockaddr(dest)
        sent: int = _sendmmsg(fd, self._hdr_ptr, k, 0)
        if sent >= 0:
            return sent
        err = ctypes.get_errno()
        if err in (errno.EAGAIN, errno.EINTR):
            return 0
        raise OSError(err, os.strerror(err))
