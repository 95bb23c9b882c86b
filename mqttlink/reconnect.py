"""The one reconnect loop every long-lived MQTT client of qpmesh runs.

`Backoff` is pure (exponential, capped, optionally jittered from a passed-in random source,
reset by a connection that worked); the controller's time-series writer retries its requests
with it too. `reconnect_loop`
runs one connection's lifetime (``session``) again and again: a broker error waits the next
backoff delay and retries; a session that reported ``connected()`` before it failed starts the
next wait from the minimum again, so a controller that was connected for an hour reconnects
at once instead of after the cap it reached during some outage long ago. `stop_tasks`
ends a connection's side tasks (or any tasks) and waits for them: it cancels again until they
have ended, since a library's `asyncio.wait_for` can lose a cancel.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from contract.connection import backoff_delay
from mqttlink.settings import BROKER_ERRORS

Session = Callable[[Callable[[], None]], Awaitable[None]]


class Backoff:
    """Retry delays lo, 2 lo, 4 lo, ... capped at hi; `reset` after an attempt that worked.

    With ``jitter`` each delay is shortened by up to that share of itself: times
    ``1 - jitter * rand()``, ``rand`` drawing from [0, 1) (passed in: tests give a constant),
    so clients that failed together do not retry together. Raises ValueError unless
    0 < lo <= hi and 0 <= jitter < 1.
    """

    def __init__(
        self,
        lo_s: float,
        hi_s: float,
        *,
        jitter: float = 0.0,
        rand: Callable[[], float] = random.random,
    ) -> None:
        backoff_delay(0, lo_s, hi_s)  # validates
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {jitter}")
        self.lo_s, self.hi_s, self.jitter, self.rand = lo_s, hi_s, jitter, rand
        self.attempt = 0

    def next_delay(self) -> float:
        """Return the wait before the next attempt and advance."""
        delay = backoff_delay(self.attempt, self.lo_s, self.hi_s)
        self.attempt += 1
        return delay * (1.0 - self.jitter * self.rand()) if self.jitter else delay

    def reset(self) -> None:
        """Start again from the minimum delay (a connection worked)."""
        self.attempt = 0


async def _sleep(delay_s: float) -> bool:
    await asyncio.sleep(delay_s)
    return False


async def reconnect_loop(
    session: Session,
    backoff: Backoff,
    *,
    on_error: Callable[[BaseException, float], None],
    pause: Callable[[float], Awaitable[bool]] = _sleep,
    max_attempts: int | None = None,
    errors: tuple[type[BaseException], ...] = BROKER_ERRORS,
) -> int:
    """Run ``session(connected)`` until it returns; return the number of attempts made.

    ``session`` calls ``connected()`` once its connection works (subscribed, presence sent);
    that resets ``backoff``. A raised ``errors`` exception is reported as
    ``on_error(exc, next_delay_s)``, then ``pause(next_delay_s)`` waits (it returns True to
    stop: e.g. a stop event was set). ``max_attempts`` bounds the attempts (tests). Anything
    not in ``errors`` (and cancellation) propagates.
    """
    attempts = 0
    while max_attempts is None or attempts < max_attempts:
        attempts += 1
        try:
            await session(backoff.reset)
            return attempts
        except errors as exc:
            delay = backoff.next_delay()
            on_error(exc, delay)
            if await pause(delay):
                return attempts
    return attempts


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], *, again_s: float = 1.0) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling the rest again every
    ``again_s``: nats-py and aiomqtt wait with `asyncio.wait_for`, which on Python 3.11
    returns its call's result when a cancel arrives the moment the call completes, and the
    cancel is lost (cpython gh-86296); awaited after one cancel, such a task is awaited for
    ever (a fleet solver in a test was, 2026-11-29). The tasks' exceptions are retrieved, not
    raised: read them from the tasks (``task.result()``)."""
    every = list(tasks)
    pending = {t for t in every if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_s)
    for t in every:
        if not t.cancelled():
            t.exception()  # retrieved: no "never retrieved" warning for what the caller drops
