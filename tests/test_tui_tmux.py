"""The real app in a real terminal: tmux runs ``qpmesh tui --fake``, we send keys and read the
grid back from the pane. Skipped without tmux. The session has a unique name and is killed by
that name in a finally."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
ROOT = Path(__file__).resolve().parent.parent


def _capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def _wait_for(session: str, needle: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = _capture(session)
        if needle in screen:
            return screen
        time.sleep(0.2)  # polling a real terminal: no simulated time to pass in here
    raise AssertionError(f"{needle!r} not on screen:\n{screen}")


def test_tui_in_tmux_draws_grid_and_selects() -> None:
    session = f"qpmesh-tui-test-{uuid.uuid4().hex[:10]}"
    cmd = f"{sys.executable} -m qpmesh.cli tui --fake --interval 0.5"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "32", "-c", str(ROOT), cmd],
        check=True,
    )
    try:
        screen = _wait_for(session, "ecmp3")
        assert "Healthy NICs 29/32" in screen
        for g in ("ecmp0", "ecmp1", "ecmp2", "ecmp3"):
            assert f"┌ {g} " in screen
        assert " 3x" in screen and "10~" in screen and "17!" in screen  # text markers
        subprocess.run(["tmux", "send-keys", "-t", session, "Right", "Right", "Down"], check=True)
        time.sleep(0.3)
        subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)
        screen = _wait_for(session, "nic5  host5")
        assert "clock offset" in screen
        # one key per write: a burst of characters in one write reads as a paste
        for key in "/ecmp2":
            subprocess.run(["tmux", "send-keys", "-t", session, "-l", key], check=True)
            time.sleep(0.1)
        screen = _wait_for(session, "┌ ecmp2")
        time.sleep(0.5)
        screen = _capture(session)
        assert "┌ ecmp0" not in screen and "┌ ecmp2" in screen
        subprocess.run(["tmux", "send-keys", "-t", session, "Escape", "q"], check=True)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
