"""The one small exception family of the NATS boundary, and where errors are translated.

Every call into nats-py goes through `translate`: a connection that cannot be made or was
lost, a request that timed out, a server that answered with an API error all leave the
boundary as a `NatsLinkError` (one line naming what was being done), so the services catch
one family (`LINK_ERRORS`, with `mqttlink.settings.CredentialError` for a credential file that
went away) in the project's one reconnect loop and let every other exception (a bug) fail
loudly.
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
    `NatsRefused` with ``what`` in the message. Anything else passes unchanged."""
    try:
        yield
    except NatsLinkError:
        raise
    except _UNAVAILABLE as exc:
        raise NatsUnavailable(f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    except (nats.errors.Error, nats.js.errors.Error) as exc:
        raise NatsRefused(f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
