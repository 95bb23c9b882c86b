"""Shared fixtures.

``mosquitto``: a real MQTT broker (/usr/sbin/mosquitto) on a free loopback port with a temp
config, yields ``(host, port)``; stopped by its PID when the test ends (also on failure).
Tests that use it are skipped when the binary is missing.

``_rxe_vm_early`` (session, automatic): starts the Soft-RoCE VM of ``tests/test_rxe.py`` at
the session's start when an ``rxe`` test was collected (`tests.rxe_early`), so its minutes of
emulation overlap the rest of the suite; killed by its PID at the session's end if unused.

``_teardown_on_sigterm`` (session, automatic): a SIGTERM (a CI timeout, ``kill``) ends the
session the way Ctrl-C does, so every fixture's teardown runs (VMs, brokers, namespaces are
stopped by their PIDs) instead of the process dying with them still running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.rxevm.vm import VmError, vm_unavailable
from tests.rxe_early import EARLY, start_scenario
from tests.servers import free_port, stop_process

MOSQUITTO = "/usr/sbin/mosquitto"


def _interrupt(signum: int, _frame: object) -> None:
    """Raise KeyboardInterrupt: pytest then stops and tears every fixture down."""
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session", autouse=True)
def _teardown_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into an interrupt for the session (see the module docstring)."""
    before = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.fixture(scope="session", autouse=True)
def _rxe_vm_early(
    _teardown_on_sigterm: None,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Start `tests.rxe_early`'s VM when an rxe test was collected and a VM can run here;
    kill it at the session's end (a no-op once it has finished)."""
    if not any(item.get_closest_marker("rxe") for item in request.session.items):
        yield
        return
    if vm_unavailable() is not None:  # test_rxe skips with the reason
        yield
        return
    out = tmp_path_factory.mktemp("rxe")
    try:
        vm = start_scenario(out)
    except VmError:
        yield
        return
    request.config.stash[EARLY] = (vm, out)
    try:
        yield
    finally:
        vm.kill()


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"mosquitto did not listen on port {port} within {timeout_s}s")


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """Run a private mosquitto broker on 127.0.0.1:<free port>; yield (host, port)."""
    binary = MOSQUITTO if os.path.exists(MOSQUITTO) else shutil.which("mosquitto")
    if binary is None:
        pytest.skip("mosquitto binary not installed")
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "log_dest stderr\nlog_type error\nlog_type warning\n"
    )
    log = (tmp_path / "mosquitto.log").open("wb")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc, timeout_s=10.0)
        yield ("127.0.0.1", port)
    finally:
        stop_process(proc)
        log.close()
