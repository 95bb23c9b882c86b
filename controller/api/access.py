"""How the API is reached: TLS, browsers (CORS) and websocket tickets.

`WebAccess` is the one small frozen value: ``tls`` (`TlsFiles`: certificate, key and an
optional CA that client certificates must chain to; None = plain HTTP, e.g. behind a
TLS-terminating reverse proxy, docs/security.md), ``cors_origins`` (the browser origins
that may call the API, exact ``scheme://host[:port]`` strings) and ``ticket_ttl_s`` (how
long a websocket ticket lives).

A browser cannot put an ``Authorization`` header on a websocket, and a long-lived token in
a URL ends up in logs and histories. So a client asks ``POST /api/v1/tickets`` with its
token and opens ``/api/v1/ws?ticket=T``: a `Tickets` ticket is random, single-use, bound to
the token that asked for it and dead after ``ticket_ttl_s``. `Tickets` is pure (time passed
in) and bounded.

`cors_headers` and `preflight_headers` are the pure CORS rules; the app's middleware calls
them. `TlsFiles.context` is the only I/O here (reads the files).
"""

from __future__ import annotations

import re
import secrets
import ssl
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from controller.api.auth import Principal

ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+$")
"""A browser origin as a CORS allow-list holds it: scheme and host, optionally a port."""
ALLOW_HEADERS = "Authorization, Content-Type"
EXPOSE_HEADERS = "Retry-After, WWW-Authenticate"
MAX_TICKETS = 10_000


class AccessError(ValueError):
    """A bad access setting (one line)."""


@dataclass(frozen=True)
class TlsFiles:
    """The API's certificate chain and key (PEM); with ``client_ca`` every client must show
    a certificate that chains to it (mutual TLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        """Return the server's TLS context (TLS 1.2 or newer). Raises OSError for an
        unreadable file, `ssl.SSLError` for a bad certificate, key or CA."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            ctx.load_verify_locations(cafile=str(self.client_ca))
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True)
class WebAccess:
    """TLS (None: plain HTTP), the browser origins allowed, the websocket ticket lifetime."""

    tls: TlsFiles | None = None
    cors_origins: frozenset[str] = frozenset()
    ticket_ttl_s: float = 30.0
    cors_max_age_s: int = 600

    def __post_init__(self) -> None:
        for o in self.cors_origins:
            if not ORIGIN.match(o):
                raise AccessError(f"a CORS origin looks like https://host[:port], got {o!r}")
        if not 0 < self.ticket_ttl_s <= 300:
            raise AccessError("ticket_ttl_s must be in (0, 300]")
        if not 0 <= self.cors_max_age_s <= 86_400:
            raise AccessError("cors_max_age_s must be in 0..86400")

    @property
    def scheme(self) -> str:
        """Return ``https`` with TLS, else ``http``."""
        return "https" if self.tls is not None else "http"


def cors_headers(access: WebAccess, origin: str | None) -> dict[str, str]:
    """Return the CORS headers of an answer to a request from ``origin`` (the request's
    ``Origin`` header; None: not a browser's cross-origin request): empty unless the origin
    is allowed. Every answer says it varies by origin (caches must not mix them)."""
    if origin is None or origin not in access.cors_origins:
        return {"Vary": "Origin"}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Expose-Headers": EXPOSE_HEADERS}  # fmt: skip


def preflight_headers(
    access: WebAccess, origin: str | None, methods: Iterable[str], want: str | None
) -> dict[str, str]:
    """Return the headers of an ``OPTIONS`` answer for a route allowing ``methods``: always
    ``Allow``; the CORS grant too when ``origin`` is allowed and the method it asks for
    (``want``, ``Access-Control-Request-Method``; None: not a preflight) is one of them."""
    allowed = sorted({*methods, "OPTIONS"})
    out = {"Allow": ", ".join(allowed), "Vary": "Origin"}
    if origin is not None and origin in access.cors_origins and want in allowed:
        out.update({
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": ", ".join(allowed),
            "Access-Control-Allow-Headers": ALLOW_HEADERS,
            "Access-Control-Max-Age": str(access.cors_max_age_s),
        })  # fmt: skip
    return out


def origin_allowed(access: WebAccess, origin: str | None) -> bool:
    """Return True unless a browser from an origin not on the allow-list asks (a websocket
    is not covered by CORS: the server must refuse foreign pages itself)."""
    return origin is None or origin in access.cors_origins


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a ticket stands for: the principal, the token that asked (its rate limit), the
    time it dies."""

    who: Principal
    token: str
    expires_s: float


@dataclass
class Tickets:
    """Single-use websocket tickets (pure: time passed in; at most `MAX_TICKETS` live, the
    oldest dropped)."""

    ttl_s: float
    _live: OrderedDict[str, Ticket] = field(default_factory=OrderedDict)

    def issue(self, who: Principal, token: str, now_s: float) -> str:
        """Return a new ticket for ``who`` (asked with ``token``) valid until now + ttl."""
        self._expire(now_s)
        while len(self._live) >= MAX_TICKETS:
            self._live.popitem(last=False)
        t = secrets.token_urlsafe(24)
        self._live[t] = Ticket(who, token, now_s + self.ttl_s)
        return t

    def redeem(self, ticket: str, now_s: float) -> Ticket | None:
        """Return what ``ticket`` stands for and forget it; None if unknown, used or dead."""
        self._expire(now_s)
        return self._live.pop(ticket, None)

    def _expire(self, now_s: float) -> None:
        while self._live:
            t, tk = next(iter(self._live.items()))
            if tk.expires_s > now_s:
                return
            del self._live[t]

    def __len__(self) -> int:
        return len(self._live)
