"""No `asyncio.wait_for` in qpmesh's own code: on Python 3.11 it returns the awaited call's
result when a cancel arrives the moment that call completes, and the cancel is lost
(cpython gh-86296, fixed in 3.12): a loop cancelled there runs on, and whoever awaits it
hangs (a fleet solver did, 2026-11-29). `asyncio.timeout` runs the call in the same task
and keeps the cancel; nats-py's own waits are covered at `natslink.errors.translate`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("contract", "mesh", "mqttlink", "natslink", "prober", "sync", "controller", "tui",
            "testbed", "qpmesh", "recovery")  # fmt: skip
CALL = re.compile(r"\basyncio\.wait_for\(")


def test_no_package_awaits_with_asyncio_wait_for() -> None:
    files = [f for p in PACKAGES for f in sorted((ROOT / p).rglob("*.py"))]
    assert len(files) > 100
    found = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if CALL.search(line)
    ]
    assert not found, found
