"""Built-in UDP traffic generator for congestion faults: ``python -m testbed.netns.blast``.

Run inside a namespace (``ip netns exec``); sends fixed-size datagrams from ``--src`` to
``--dst`` (port 9, discarded by the receiver) at ``--rate-mbit`` for ``--seconds``, paced in
1 ms ticks by `packets_due` (pure), so it fills the link's shaped queue like background traffic.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import time


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
