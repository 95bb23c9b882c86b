"""Waiting in tests on real servers and services, which have no clock to pass time into."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(what: Callable[[], bool], timeout_s: float = 60.0, every_s: float = 0.01) -> None:
    """Return once ``what()`` holds, polling every ``every_s``; raise AssertionError after
    ``timeout_s`` (a bound for something stuck, not a timing claim: a busy machine may take
    seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not what():
        if loop.time() > deadline:
            raise AssertionError("not reached within the deadline")
        await asyncio.sleep(every_s)
