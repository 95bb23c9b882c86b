"""The Soft-RoCE VM of ``tests/test_rxe.py``, started when the session starts.

Booting it and running the scenario takes minutes of one core under software emulation, most
of them waiting on the guest; started by a session fixture (`tests.conftest`) as soon as the
collected tests include one marked ``rxe``, it runs beside the rest of the suite, and the
module's fixture only waits for it. Without an early start (the module run alone, or no VM
here) the module's fixture starts it itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from testbed.rxevm.vm import VmRun, start_in_vm

REPO = Path(__file__).resolve().parents[1]
VM_TIMEOUT_S = 1080.0  # a busy 2-core host slows emulation down a lot

EARLY: pytest.StashKey[tuple[VmRun, Path]] = pytest.StashKey()


def start_scenario(out: Path) -> VmRun:
    """Start the VM running ``testbed.rxevm.scenario`` with its result in ``out``. Raises
    `testbed.rxevm.vm.VmError` when no VM can run here."""
    py = REPO / ".venv" / "bin" / "python"
    python = py if py.exists() else Path(sys.executable)  # a worktree runs another's venv
    return start_in_vm(f"cd {REPO} && {python} -m testbed.rxevm.scenario --out {out}", out)
