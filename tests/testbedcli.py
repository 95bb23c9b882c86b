"""What the namespace testbed's tests share: the marks of a test that needs root and network
namespaces, and `qpmesh` (the command line run from the repository root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NETNS_MARKS = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
        reason="needs root and network namespaces",
    ),
]
"""``pytestmark`` of a testbed test: slow, netns, skipped without root or namespaces."""


def qpmesh(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Return the finished ``python -m qpmesh.cli ARGS`` run from the repository root, its
    output captured as text (not checked); raises subprocess.TimeoutExpired after
    ``timeout`` seconds."""
    return subprocess.run([sys.executable, "-m", "qpmesh.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
