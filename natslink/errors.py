"""The one small exception family of the NATS boundary, and where errors are translated.

Every call into nats-py goes through `translate`: a connection that cannot be made or was
lost, a request that timed out, a server that answered with an API error all leave the
boundary as a `NatsLinkError` (one line naming what was being done), so the services catch
one family (`LINK_ERRORS`, with `mqttlink.settings.CredentialError` for a credential file that
went away) in the project's one reconnect loop and let every other exception (a bug) fail
loudly. A cancel that nats-py's waits swallowed is delivered at the same boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import nats.errors
import nats.js.errors

from mqttlink.settings import CredentialError


class NatsLinkError(Exception):
    """The NATS servers could not do what was asked (unreachable, closed, timed out, refused)."""


class NatsUnavailable(NatsLinkError):
    """No server answered in time or the connection was lost: retry after a backoff."""


class NatsRefused(NatsLinkError):
    """A server answered with an error (an API error, a payload over its limit, a
    conflicting stream or bucket): retrying the same request will not help."""


LINK_ERRORS: tuple[type[BaseException], ...] = (NatsLinkError, CredentialError)

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoServersError,
    nats.errors.ConnectionClosedError,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.NoRespondersError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    asyncio.TimeoutError,
    OSError,
)


@contextmanager
def translate(what: str) -> Iterator[None]:
    """Run the block; re-raise the NATS boundary's errors as `NatsUnavailable` or
    `NatsRefused` with ``what`` in the message, and deliver a cancel the block's call
    swallowed (`_cancels`). Anything else passes unchanged."""
    task, before = _cancels()
    try:
        yield
    except NatsLinkError:
        raise
    except _UNAVAILABLE as exc:
        raise NatsUnavailable(f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    except (nats.errors.Error, nats.js.errors.Error) as exc:
        raise NatsRefused(f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError


def _cancels() -> tuple[asyncio.Task[object] | None, int]:
    """Return the running task (None: a synchronous call) and its pending cancels now.

    nats-py waits with `asyncio.wait_for`, which on Python 3.11 returns the awaited call's
    result when a cancel comes the moment that call completes, and the cancel is lost
    (python/cpython gh-86296, fixed in 3.12): a service loop cancelled there would run on
    for good (a fleet solver cancelled in a test went on fetching partials until the test's
    timeout). A cancel requested while the block ran that the block returned from is one
    such: `translate` raises it. One requested before (a task unwinding from a delivered
    cancel, closing its connection in a ``finally``) is not raised again."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return None, 0
    return task, 0 if task is None else task.cancelling()
