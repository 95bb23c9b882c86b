"""Egress queueing of every network device: the root qdisc's statistics, over rtnetlink.

A host's traffic through the kernel (TCP to storage, NCCL's socket transport, the prober's
own probes) queues in the root qdisc of each device: its drops and backlog are the host's
view of an egress link that cannot keep up. RDMA traffic bypasses the qdisc.

- `dump_request(seq)` / `parse_qdiscs(data)` (pure): one ``RTM_GETQDISC`` dump request, and
  the `QdiscStats` of the root qdiscs in the kernel's answer (``TCA_STATS2``:
  ``gnet_stats_basic`` bytes and packets, ``gnet_stats_queue`` qlen, backlog, drops,
  requeues, overlimits; ``TCA_STATS`` when there is no ``TCA_STATS2``).
- `read_qdiscs()` (I/O): the dump over a ``NETLINK_ROUTE`` socket made in the calling
  thread's network namespace; ifindex -> device name there too.
- `qdisc_values(stats)`: catalogue signals of one device.
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass

RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_STATS, TCA_STATS2 = 1, 3, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
_HDR = struct.Struct("=IHHII")  # nlmsghdr
_TC = struct.Struct("=BBHiIII")  # tcmsg


class NetlinkError(OSError):
    """The kernel refused the dump or sent something that does not parse."""


@dataclass(frozen=True, slots=True)
class QdiscStats:
    """One qdisc: device index, kind (``tbf``, ``fq_codel``, ...), and its counters."""

    ifindex: int
    kind: str
    parent: int
    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    requeues: int = 0
    backlog: int = 0
    qlen: int = 0


def dump_request(seq: int) -> bytes:
    """Return the netlink message asking for every qdisc."""
    body = _TC.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0)
    return _HDR.pack(_HDR.size + len(body), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    i = 0
    while i + 4 <= len(data):
        ln, typ = struct.unpack_from("=HH", data, i)
        if ln < 4 or i + ln > len(data):
            raise NetlinkError(0, f"bad netlink attribute length {ln}")
        out[typ & 0x3FFF] = data[i + 4 : i + ln]
        i += (ln + 3) & ~3
    return out


def parse_qdiscs(data: bytes, root_only: bool = True) -> tuple[list[QdiscStats], bool]:
    """Return the qdiscs in ``data`` (one or more netlink messages) and whether the dump is
    done. Raises `NetlinkError` on a netlink error message or a malformed one."""
    out: list[QdiscStats] = []
    done = False
    i = 0
    while i + _HDR.size <= len(data):
        ln, typ, _flags, _seq, _pid = _HDR.unpack_from(data, i)
        if ln < _HDR.size or i + ln > len(data):
            raise NetlinkError(0, f"bad netlink message length {ln}")
        body = data[i + _HDR.size : i + ln]
        i += (ln + 3) & ~3
        if typ == NLMSG_DONE:
            done = True
            break
        if typ == NLMSG_ERROR:
            err = -struct.unpack_from("=i", body, 0)[0] if len(body) >= 4 else 0
            if err:
                raise NetlinkError(err, f"RTM_GETQDISC: {errno.errorcode.get(err, err)}")
            continue
        if typ != RTM_NEWQDISC or len(body) < _TC.size:
            continue
        _fam, _p1, _p2, ifindex, _handle, parent, _info = _TC.unpack_from(body, 0)
        if root_only and parent != TC_H_ROOT:
            continue
        a = _attrs(body[_TC.size :])
        kind = a.get(TCA_KIND, b"").split(b"\0", 1)[0].decode("ascii", "replace")
        vals: dict[str, int] = {}
        if TCA_STATS2 in a:
            nested = _attrs(a[TCA_STATS2])
            basic = nested.get(TCA_STATS_BASIC, b"")
            if len(basic) >= 12:
                vals["bytes"], vals["packets"] = struct.unpack_from("=QI", basic, 0)
            queue = nested.get(TCA_STATS_QUEUE, b"")
            if len(queue) >= 20:
                q = struct.unpack_from("=5I", queue, 0)
                vals.update(qlen=q[0], backlog=q[1], drops=q[2], requeues=q[3], overlimits=q[4])
        elif len(a.get(TCA_STATS, b"")) >= 36:
            st = struct.unpack_from("=QIIIIIII", a[TCA_STATS], 0)
            vals.update(bytes=st[0], packets=st[1], drops=st[2], overlimits=st[3], qlen=st[6],
                        backlog=st[7])  # fmt: skip
        out.append(QdiscStats(ifindex, kind, parent, **vals))
    return out, done


def read_qdiscs(timeout_s: float = 1.0) -> dict[str, QdiscStats]:
    """Return device name -> its root qdisc's statistics, in this thread's namespace.
    Raises OSError (`NetlinkError`) when the dump fails."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.settimeout(timeout_s)
        s.send(dump_request(1))
        got: list[QdiscStats] = []
        done = False
        while not done:
            part, done = parse_qdiscs(s.recv(65536))
            got += part
        out: dict[str, QdiscStats] = {}
        for q in got:
            try:
                out[socket.if_indextoname(q.ifindex)] = q
            except OSError:
                continue  # the device went away during the dump
        return out


def qdisc_values(q: QdiscStats) -> dict[str, float]:
    """Return the catalogue signals of one device's root qdisc (counters raw)."""
    return {"tx_qdisc_drops": float(q.drops), "tx_qdisc_overlimits": float(q.overlimits),
            "tx_qdisc_backlog": float(q.backlog)}  # fmt: skip
