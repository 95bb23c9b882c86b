"""A small real-UDP probe helper for the testbed's tests and benchmarks (not the prober agent).

`Endpoint` is a UDP socket created inside a namespace (`nsutil.netns`), bound to a NIC address
and port, with kernel software timestamps (SO_TIMESTAMPING: TX after the qdisc, RX at the
driver). `round_trip(a, b, ...)` runs one probe exchange a -> b -> a in this process and returns
the four kernel stamps (t1, t2, t3, t4) in CLOCK_REALTIME ns, or None if lost. The prober agent
has its own transport; this helper exists so the fabric can be tested without it.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass

from testbed.netns.nsutil import netns

SO_TIMESTAMPING = 37
SCM_TIMESTAMPING = SO_TIMESTAMPING
SOF_TX_SOFTWARE = 1 << 1
SOF_RX_SOFTWARE = 1 << 3
SOF_SOFTWARE = 1 << 4
SOF_OPT_TSONLY = 1 << 11
_FLAGS = SOF_TX_SOFTWARE | SOF_RX_SOFTWARE | SOF_SOFTWARE | SOF_OPT_TSONLY
_MSG_ERRQUEUE = 0x2000
_PROBE = struct.Struct("!4sQB")  # magic, seq, kind (0 probe, 1 reply)
MAGIC = b"QPTB"


def _stamp(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPING and len(data) >= 16:
            sec, nsec = struct.unpack_from("qq", data, 0)
            if sec or nsec:
                return int(sec) * 1_000_000_000 + int(nsec)
    return None


@dataclass
class Endpoint:
    """A timestamping UDP socket bound to ``(addr, port)`` inside namespace ``ns``."""

    ns: str
    addr: str
    port: int
    sock: socket.socket

    @classmethod
    def open(cls, ns: str, addr: str, port: int) -> Endpoint:
        """Create and bind the socket in ``ns``; raise OSError if it cannot."""
        with netns(ns):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _FLAGS)
            s.bind((addr, port))
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        return cls(ns, addr, port, s)

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def send(self, payload: bytes, dest: tuple[str, int], timeout_s: float = 0.05) -> int | None:
        """Send ``payload``; return its kernel TX stamp (ns) or None if none came in time."""
        self.sock.sendto(payload, dest)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                _, anc, _, _ = self.sock.recvmsg(0, 512, _MSG_ERRQUEUE)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                select.select([], [], [self.sock], min(left, 0.005))
                continue
            st = _stamp(anc)
            if st is not None:
                return st

    def recv(self, timeout_s: float) -> tuple[bytes, tuple[str, int], int] | None:
        """Return (payload, source, kernel RX stamp ns) of the next datagram, or None."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                data, anc, _, src = self.sock.recvmsg(2048, 512)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                select.select([self.sock], [], [], left)
                continue
            st = _stamp(anc)
            return data, src, st if st is not None else time.time_ns()


def _recv_seq(
    ep: Endpoint, seq: int, kind: int, timeout_s: float
) -> tuple[tuple[str, int], int] | None:
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        got = ep.recv(left)
        if got is None:
            return None
        data, src, st = got
        if len(data) >= _PROBE.size:
            magic, s, k = _PROBE.unpack_from(data)
            if magic == MAGIC and s == seq and k == kind:
                return src, st
    return None


def round_trip(
    a: Endpoint, b: Endpoint, seq: int, timeout_s: float = 0.2, pad: int = 64
) -> tuple[int, int, int, int] | None:
    """Probe ``a`` -> ``b`` -> ``a``; return kernel stamps (t1, t2, t3, t4) or None if lost."""
    body = b"\0" * max(0, pad - _PROBE.size)
    t1 = a.send(_PROBE.pack(MAGIC, seq, 0) + body, (b.addr, b.port))
    got = _recv_seq(b, seq, 0, timeout_s)
    if got is None or t1 is None:
        return None
    src, t2 = got
    t3 = b.send(_PROBE.pack(MAGIC, seq, 1) + body, src)
    back = _recv_seq(a, seq, 1, timeout_s)
    if back is None or t3 is None:
        return None
    return t1, t2, t3, back[1]


def coded_round_trips(
    a: Endpoint, b: Endpoint, seq: int, timeout_s: float = 0.2, pad: int = 64
) -> list[tuple[int, int, int, int] | None]:
    """Send a coded pair (two probes back to back) a -> b, answered back to back b -> a.

    Returns the stamps of both probes (None for a lost one); sequence numbers seq, seq + 1.
    """
    body = b"\0" * max(0, pad - _PROBE.size)
    t1 = [a.send(_PROBE.pack(MAGIC, seq + k, 0) + body, (b.addr, b.port)) for k in (0, 1)]
    fwd = [_recv_seq(b, seq + k, 0, timeout_s) for k in (0, 1)]
    t3: list[int | None] = []
    for k in (0, 1):
        f = fwd[k]
        t3.append(b.send(_PROBE.pack(MAGIC, seq + k, 1) + body, f[0]) if f else None)
    out: list[tuple[int, int, int, int] | None] = []
    for k in (0, 1):
        f, s1, s3 = fwd[k], t1[k], t3[k]
        back = _recv_seq(a, seq + k, 1, timeout_s) if f is not None else None
        if f is None or back is None or s1 is None or s3 is None:
            out.append(None)
        else:
            out.append((s1, f[1], s3, back[1]))
    return out
