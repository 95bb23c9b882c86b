"""Local servers for tests (one helper for every test module): free loopback ports to start
them on, and stopping one by its process id."""

from __future__ import annotations

import socket
import subprocess


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


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float = 5.0) -> None:
    """Stop ``proc`` by its id if it still runs: SIGTERM, then SIGKILL after ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)
