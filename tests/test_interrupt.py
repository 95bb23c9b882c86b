"""A long ``--json`` command stopped by SIGTERM or SIGINT still prints its JSON, with
``"interrupted": true``, and exits 130 (issue 33 item 7): `contract.interrupt`, the one
helper, and the commands that use it, each stopped for real in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.interrupt import EXIT_INTERRUPTED, finish, interruptible

ROOT = Path(__file__).parents[1]


def test_a_signal_ends_the_block_and_the_report_covers_the_work_done(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    done: list[int] = []
    with interruptible() as stop:
        for i in range(10):
            if i == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # raised at the next bytecode boundary
                time.sleep(1.0)  # never reached in full
            done.append(i)
    assert done == [0, 1, 2] and stop.interrupted and stop.signals == 1
    assert signal.getsignal(signal.SIGTERM) == before  # the handler before is back
    assert finish(stop, {"runs": done}, as_json=True) == EXIT_INTERRUPTED
    assert json.loads(capsys.readouterr().out) == {"runs": [0, 1, 2], "interrupted": True}
    with interruptible() as quiet:
        pass
    assert finish(quiet, {"runs": []}, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["interrupted"] is False
    assert finish(stop, None, as_json=True) == EXIT_INTERRUPTED  # stopped before a report
    assert json.loads(capsys.readouterr().out) == {"interrupted": True}
    assert finish(stop, None, as_json=False) == EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err


def test_a_second_signal_does_not_cut_the_cleanup_short() -> None:
    cleaned = False
    with interruptible() as stop:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # impatient: only counted
            time.sleep(0.01)
            cleaned = True
    assert cleaned and stop.interrupted and stop.signals == 2


def test_cooperative_work_is_asked_to_stop_and_never_cut() -> None:
    steps = 0
    with interruptible(cooperative=True) as stop:
        while not stop.event.is_set():
            steps += 1
            if steps == 5:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.001)
    assert stop.interrupted and stop.signals == 2 and 5 <= steps <= 6


def test_a_signal_while_the_loop_is_inside_its_wait_sets_the_event() -> None:
    """A paced loop (the headless demo's) waits on `Stop.event` between steps; a signal
    handled while that wait holds the event's lock (a few bytecodes each side of the wait)
    set it without deadlocking its own thread: the handler runs here with the lock held, as
    Python runs it there. In a subprocess, killed by pid at the bound if it hangs."""
    code = (
        "import signal\n"
        "from contract.interrupt import interruptible\n"
        "with interruptible(cooperative=True) as stop:\n"
        "    handler = signal.getsignal(signal.SIGINT)\n"
        "    with stop.event._cond:  # held, as inside Event.wait\n"
        "        handler(signal.SIGINT, None)\n"
        "    print(stop.event.wait(5), stop.signals)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # a deadlocked child ignores SIGTERM
            proc.wait(10)
    assert proc.returncode == 0 and out.split() == ["True", "1"], err


def _catches_sigterm(pid: int) -> bool:
    """Return True once ``pid`` has a SIGTERM handler (its work is inside `interruptible`:
    Python catches no SIGTERM before)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


QP = [sys.executable, "-m", "qpmesh.cli"]
COMMANDS = {
    "sim localize": [*QP, "sim", "localize", "--json", "--seeds", "500", "--nics", "16",
                     "--duration", "4"],
    "sim sync": [*QP, "sim", "sync", "--json", "--nics", "256", "--windows", "50"],
    "sim run": [*QP, "sim", "run", "--json", "testbed/scenarios/demo.toml", "--duration",
                "100000"],
    "sim ingest": [*QP, "sim", "ingest", "--json", "--nics", "256", "--seconds", "400"],
    "sim fleet": [*QP, "sim", "fleet", "--json", "--nics", "100000", "--broker-messages", "0"],
    "prober bench": [*QP, "prober", "bench", "--json", "--seconds", "60", "--repeats", "5"],
    "timeseries bench": [sys.executable, "-m", "controller.timeseries.bench", "--json",
                         "--records", "100000000"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "sig"),
    [(n, signal.SIGTERM) for n in COMMANDS] + [("sim localize", signal.SIGINT)],
)
def test_a_long_json_command_stopped_by_a_signal_prints_its_json(
    name: str, sig: signal.Signals
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(COMMANDS[name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # imports on a busy machine
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the work never started"
            time.sleep(0.02)
        time.sleep(0.5)  # into the work
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == EXIT_INTERRUPTED, err
    doc = json.loads(out)
    assert doc["interrupted"] is True, doc
    assert "Traceback" not in err, err
    if name == "sim run":  # cooperative: the report of the steps played
        assert 0 < doc["duration_s"] < 100000 and "fault_results" in doc
    if name == "sim localize" and "runs" in doc:  # what ran is reported, and only that
        assert doc["seeds"] == [r["seed"] for r in doc["runs"]]
