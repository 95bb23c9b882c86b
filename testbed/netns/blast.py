"""Built-in UDP traffic generator for congestion faults: ``python -m testbed.netns.blast``.

Run inside a namespace (``ip netns exec``); sends fixed-size datagrams from ``--src`` to
``--dst`` (port 9, discarded by the receiver) at ``--rate-mbit`` for ``--seconds``, paced in
1 ms ticks by `packets_due` (pure), so it fills the link's shaped queue like background traffic.

It raises its own scheduling priority (`BLAST_NICE`, when allowed): it stands for traffic of
other machines, and each datagram's trip through the emulated fabric (veth, forwarding, the
shaper) is computed in its system calls, so on a busy host an ordinary-priority generator fell
short of its rate, built no queue and the fault it injects silently did not happen (seen at
load 9 on two cores). Paced in 1 ms ticks, it never takes more CPU than its rate needs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import time

BLAST_NICE = -10


def packets_due(rate_bps: float, pkt_bytes: int, elapsed_s: float, sent: int) -> int:
    """Return how many packets to send now to keep ``rate_bps`` after ``elapsed_s``."""
    return max(0, int(rate_bps * elapsed_s / (8 * pkt_bytes)) - sent)


def main(argv: list[str] | None = None) -> int:
    """Run the generator; return 0."""
    p = argparse.ArgumentParser(prog="blast")
    p.add_argument("--src", required=True)
    p.add_argument("--dst", required=True)
    p.add_argument("--rate-mbit", type=float, required=True)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--size", type=int, default=1200)
    a = p.parse_args(argv)
    with contextlib.suppress(OSError):  # not root: keep the priority it has
        os.setpriority(os.PRIO_PROCESS, 0, BLAST_NICE)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a.src, 0))
    payload = b"\0" * a.size
    t0, sent = time.monotonic(), 0
    while (el := time.monotonic() - t0) < a.seconds:
        for _ in range(min(packets_due(a.rate_mbit * 1e6, a.size + 28, el, sent), 2000)):
            with contextlib.suppress(OSError):
                s.sendto(payload, (a.dst, 9))
            sent += 1
        time.sleep(0.001)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
