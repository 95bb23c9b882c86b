"""A one-flow UDP traceroute from a testbed namespace (tests and checks, not the prober).

`trace(ns, src, dst, sport)` sends one datagram per TTL on the flow's 5-tuple (so ECMP picks
the same path every time) and reads the answers from the socket's error queue (IP_RECVERR):
ICMP time-exceeded names the router at that TTL, port-unreachable says the destination was
reached. It returns a `contract.documents.TracedPath`, the shape the prober's path discovery
publishes, so the fabric learner can be tested on real kernel routing without a prober.
`hops_from_answers` (pure) turns the answers into the hop list.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Mapping

from contract.documents import TracedPath
from prober.timestamping import (
    ICMP_DEST_UNREACH,
    ICMP_TIME_EXCEEDED,
    IP_RECVERR,
    IP_TTL,
    SO_EE_ORIGIN_ICMP,
    SOL_IP,
    parse_extended_err,
)
from testbed.netns.nsutil import netns

MSG_ERRQUEUE = 0x2000
TRACE_PORT = 33434  # nothing listens: the destination answers port-unreachable


def hops_from_answers(
    answers: Mapping[int, tuple[int, str | None]], max_ttl: int
) -> tuple[tuple[str | None, ...], bool]:
    """Return (hops, reached) from ``{ttl: (icmp type, offender)}``: routers at TTL 1..r-1
    where r is the lowest TTL that reached the destination (None where silent); without a
    reaching TTL, every TTL up to ``max_ttl`` and False."""
    reached = [t for t, (kind, _) in answers.items() if kind == ICMP_DEST_UNREACH]
    top = min(reached) if reached else max_ttl + 1
    hops = tuple(
        answers[t][1] if t in answers and answers[t][0] == ICMP_TIME_EXCEEDED else None
        for t in range(1, top)
    )
    return hops, bool(reached)


def trace(
    ns: str,
    src_nic: str,
    src: str,
    dst_nic: str,
    dst: str,
    sport: int,
    *,
    max_ttl: int = 4,
    timeout_s: float = 1.0,
) -> TracedPath:
    """Trace the flow ``src:sport -> dst:TRACE_PORT`` from namespace ``ns`` (see the module doc).

    Raises OSError when the socket cannot be made or bound.
    """
    with netns(ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    answers: dict[int, tuple[int, str | None]] = {}
    try:
        sock.setsockopt(SOL_IP, IP_RECVERR, 1)
        sock.bind((src, sport))
        for ttl in range(1, max_ttl + 1):
            sock.setsockopt(SOL_IP, IP_TTL, ttl)
            sock.sendto(bytes([ttl]) * 16, (dst, TRACE_PORT))
            got = _answer(sock, ttl, timeout_s)
            if got is not None:
                answers[ttl] = got
                if got[0] == ICMP_DEST_UNREACH:
                    break
    finally:
        sock.close()
    hops, reached = hops_from_answers(answers, max_ttl)
    return TracedPath(src_nic, dst_nic, sport, hops, reached)


def _answer(sock: socket.socket, ttl: int, timeout_s: float) -> tuple[int, str | None] | None:
    poller = select.poll()
    poller.register(sock, select.POLLERR)
    while poller.poll(int(timeout_s * 1000)):
        data, anc, _, _ = sock.recvmsg(64, 512, MSG_ERRQUEUE)
        err = parse_extended_err(anc)
        if err is None or err.origin != SO_EE_ORIGIN_ICMP or not data or data[0] != ttl:
            continue
        return err.icmp_type, err.offender
    return None
