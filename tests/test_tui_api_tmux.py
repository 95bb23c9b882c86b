"""``qpmesh tui --api`` in a real terminal against a real controller process: tmux runs the
TUI attached to ``qpmesh demo --headless --serve`` (the simulator-fed live controller behind
the HTTP API); we read the pane, select a NIC, try Control, then kill the controller and start
it again on the same port while the TUI stays open: the pane says it is disconnected and
retrying, then shows live data again. Unique tmux session name, processes stopped by PID,
the session killed by its name, also on failure. Skipped without tmux."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import free_port

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
    pytest.mark.slow,
]
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "tmux-test-operator-token"


def _controller(port: int, log: Path) -> subprocess.Popen[bytes]:
    """The demo's live controller behind the API, in real time for 10 minutes at most."""
    cmd = [sys.executable, "-m", "qpmesh.cli", "demo", "--headless", "--duration", "600",
           "--serve", f"127.0.0.1:{port}", "--token", TOKEN]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"controller exited early: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("controller did not listen within 60 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def _wait_for(session: str, *needles: str, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = _capture(session)
        if all(n in screen for n in needles):
            return screen
        time.sleep(0.25)  # polling a real terminal: no simulated time to pass in here
    raise AssertionError(f"{needles!r} not on screen:\n{screen}")


def _keys(session: str, *keys: str) -> None:
    for k in keys:  # one key per write: a burst of characters in one write reads as a paste
        subprocess.run(["tmux", "send-keys", "-t", session, k], check=True)
        time.sleep(0.15)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for p in started:
            _stop(p)


def test_tui_follows_a_controller_through_a_restart(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    log = tmp_path / "controller.log"
    procs.append(_controller(port, log))
    session = f"qpmesh-tui-api-{uuid.uuid4().hex[:10]}"
    # Textual draws on stderr; if the TUI ends, its exit code and last words stay on the pane
    # (and without pytest's COLUMNS/LINES, which would fix its size)
    cmd = (f"env -u COLUMNS -u LINES {sys.executable} -m qpmesh.cli tui --api http://127.0.0.1:{port} --token {TOKEN} "
           "--interval 0.5; echo TUI-EXITED $?; sleep 120")  # fmt: skip
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "60", "-c", str(ROOT), cmd],
        check=True,
    )
    try:
        # a tmux server already running (other tests) may impose its size: set ours
        subprocess.run(["tmux", "resize-window", "-t", session, "-x", "150", "-y", "60"],
                       check=True)  # fmt: skip
        screen = _wait_for(session, "┌ ecmp3", "● live")
        assert "Healthy NICs" in screen and "Control Disabled" in screen
        assert "Running jobs 1" in screen  # the demo's simulated job, from /jobs
        # the scripted flap (4 s into the demo) reaches the events pane with its flap count
        screen = _wait_for(session, "link_flap leaf1-spine2", "flaps=")
        # select nic5: its detail, delay row/column and per-spine breakdown (from /delays)
        _keys(session, "Right", "Down", "Right", "Enter")
        screen = _wait_for(session, "nic5  host5", "out→", "in ←", "path        out")
        # Control: `c` asks, `y` switches the controller's Control on through the API
        _keys(session, "c", "y")
        _wait_for(session, "Control Enabled")
        # the controller goes away: the last picture stays, the pane says so
        _stop(procs.pop())
        screen = _wait_for(session, "DISCONNECTED, retrying")
        assert "┌ ecmp3" in screen
        # it comes back on the same port (a new process: time and events start over)
        procs.append(_controller(port, log))
        screen = _wait_for(session, "● live", timeout_s=90.0)
        assert "DISCONNECTED" not in screen
        _wait_for(session, "link_flap leaf1-spine2", "flaps=", timeout_s=90.0)
        _keys(session, "q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
