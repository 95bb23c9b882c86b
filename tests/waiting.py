"""Waiting in tests on real servers and services, which have no clock to pass time into."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def until(
    what: Callable[[], bool | Awaitable[bool]], timeout_s: float = 60.0, every_s: float = 0.01
) -> None:
    """Return once ``what()`` (a bool, or an awaitable of one) holds, polling every
    ``every_s``; raise AssertionError after ``timeout_s`` (a bound for something stuck, not a
    timing claim: a busy machine may take seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = what()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s")
        await asyncio.sleep(every_s)


def until_blocking(
    what: Callable[[], bool], timeout_s: float = 30.0, every_s: float = 0.02
) -> None:
    """`until` for a test without an event loop (a client thread on a real socket): block
    until ``what()`` holds; raise AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s")
        time.sleep(every_s)
