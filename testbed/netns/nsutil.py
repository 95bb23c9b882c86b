"""Enter a named network namespace from Python (3.11 has no ``os.setns``): ctypes ``setns``.

`netns(name)` switches the *calling thread* into ``/run/netns/<name>`` for the duration of a
``with`` block and back afterwards. Sockets created inside keep their namespace after the block,
so one process can own sockets in many namespaces. Raises `NamespaceError` (an OSError).
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")


class NamespaceError(OSError):
    """A namespace cannot be entered, or the environment lacks namespace support."""


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NamespaceError(err, f"setns failed: {os.strerror(err)}")


@contextmanager
def netns(name: str) -> Iterator[None]:
    """Run the block in network namespace ``name``; restore the previous one on exit."""
    path = NETNS_DIR / name
    try:
        target = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise NamespaceError(exc.errno or 2, f"no network namespace {name!r}") from None
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def udp_socket_in(name: str) -> socket.socket:
    """Return a new UDP socket living in namespace ``name``."""
    with netns(name):
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def write_sysctls(name: str, settings: tuple[str, ...] | list[str]) -> None:
    """Set ``key=value`` net sysctls inside namespace ``name`` (via /proc/sys).

    A key starting with ``?`` is optional: skipped when this kernel does not have it.
    """
    with netns(name):
        for item in settings:
            key, _, value = item.partition("=")
            optional = key.startswith("?")
            path = Path("/proc/sys", *key.strip().lstrip("?").split("."))
            if optional and not path.exists():
                continue
            path.write_text(value.strip() + "\n")


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 5.0) -> None:
    """Terminate every process of ``procs`` (by its PID), wait up to ``timeout_s`` each, then
    kill what is still running. Processes already gone are fine."""
    procs = list(procs)
    for p in procs:
        with suppress(ProcessLookupError):
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()


def wait_port(addr: str, port: int, timeout_s: float) -> bool:
    """Return True once a TCP connection to ``addr:port`` succeeds, False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with suppress(OSError), socket.create_connection((addr, port), timeout=0.2):
            return True
        time.sleep(0.05)
    return False
