"""``qpmesh demo --headless --json`` prints its JSON when stopped by SIGTERM or SIGINT, with
``"interrupted": true`` (issue 33 item 7: it printed nothing)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_headless_demo_still_prints_its_json(sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # --serve makes the demo run in real time: 120 simulated seconds would take 2 minutes
    proc = subprocess.Popen(
        [sys.executable, "-m", "qpmesh.cli", "demo", "--headless", "--json", "--duration",
         "120", "--serve", "127.0.0.1:0", "--token", "signal-test-token"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        # "API on ..." once it runs; bounded, as every wait here (a stuck child fails the
        # test, never hangs it)
        ready, _, _ = select.select([proc.stderr], [], [], 120)
        assert ready, "the demo announced no API within 120 s"
        line = proc.stderr.readline()
        assert "API on" in line, line
        time.sleep(1.0)  # a few steps
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # by pid: a deadlocked child ignores SIGTERM
            proc.wait(10)
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["interrupted"] is True and 0 < doc["duration_s"] < 120
    assert "Traceback" not in err
