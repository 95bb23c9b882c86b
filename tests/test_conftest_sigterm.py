"""A SIGTERM'd test session tears its fixtures down (`tests.conftest._teardown_on_sigterm`):
what a CI timeout sends must not leave VMs, brokers or namespaces running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROBE = "QPMESH_SIGTERM_PROBE"  # set only by the test below, for the inner session


@pytest.fixture
def _marks_teardown() -> Iterator[Path]:
    out = Path(os.environ[PROBE])
    try:
        yield out
    finally:
        (out / "torn-down").write_text("yes")


@pytest.mark.skipif(PROBE not in os.environ, reason="the inner session of the test below")
def test_waits_to_be_terminated(_marks_teardown: Path) -> None:
    (_marks_teardown / "started").write_text("yes")
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:  # the outer test terminates this session long before
        time.sleep(0.05)
    pytest.fail("was not terminated")


def test_sigterm_runs_the_sessions_teardown(tmp_path: Path) -> None:
    env = {**os.environ, PROBE: str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{__file__}::test_waits_to_be_terminated"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120.0  # a busy host starts pytest slowly
        while not (tmp_path / "started").exists():
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the inner test never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "torn-down").read_text() == "yes", out
    assert proc.returncode != 0
