"""Free loopback ports for tests that start servers (one helper for every test module)."""

from __future__ import annotations

import socket


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """Return a loopback port free for ``kind`` (TCP by default) at the time of asking."""
    return free_ports(1, kind)[0]


def free_ports(n: int, kind: socket.SocketKind = socket.SOCK_STREAM) -> list[int]:
    """Return ``n`` distinct free loopback ports (held open together while chosen)."""
    socks = [socket.socket(socket.AF_INET, kind) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
