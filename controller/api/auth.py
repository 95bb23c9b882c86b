"""Who is asking: bearer tokens, principals and per-token rate limits (pure).

A `Principal` is an operator (sees the fleet, may write Control) or a tenant (sees only the
NICs of its jobs). `TokenTable` maps bearer tokens to principals; `parse_token_file` reads a
token file (one ``operator NAME TOKEN`` or ``tenant NAME TOKEN`` per line, ``#`` comments) and
raises `TokenError` naming the line. `bearer` extracts the token of an ``Authorization``
header. `TokenBucket` is a pure token bucket: `take(now_s)` returns (allowed, next bucket,
seconds until a token is available); time is passed in.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

OPERATOR = "operator"
TENANT = "tenant"


class TokenError(ValueError):
    """A bad token file or token entry (one line naming the place)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The holder of a token: ``role`` operator or tenant, and a ``name`` (the tenant's name
    for a tenant; an audit name for an operator)."""

    role: str
    name: str

    def __post_init__(self) -> None:
        if self.role not in (OPERATOR, TENANT) or not self.name:
            raise TokenError(f"bad principal {self.role!r} {self.name!r}")

    @property
    def is_operator(self) -> bool:
        """Return True for an operator."""
        return self.role == OPERATOR


class TokenTable:
    """Bearer token -> `Principal` (comparisons in constant time)."""

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        for tok in tokens:
            if len(tok) < 8 or any(c.isspace() for c in tok):
                raise TokenError("tokens must be at least 8 characters without spaces")
        self._tokens = dict(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def lookup(self, token: str) -> Principal | None:
        """Return the principal of ``token`` or None."""
        found = None
        for tok, who in self._tokens.items():
            if hmac.compare_digest(tok.encode(), token.encode()):
                found = who
        return found

    def merged(self, other: TokenTable) -> TokenTable:
        """Return a table with the tokens of both (``other`` wins on a clash)."""
        return TokenTable({**self._tokens, **other._tokens})


def parse_token_lines(lines: Iterable[str], source: str) -> TokenTable:
    """Return the tokens of ``lines`` (``ROLE NAME TOKEN``); raise `TokenError` naming the
    source and line."""
    out: dict[str, Principal] = {}
    for no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or parts[0] not in (OPERATOR, TENANT):
            raise TokenError(f"{source}:{no}: want 'operator|tenant NAME TOKEN'")
        role, name, tok = parts
        if tok in out:
            raise TokenError(f"{source}:{no}: duplicate token")
        try:
            out[tok] = Principal(role, name)
            TokenTable({tok: out[tok]})
        except TokenError as exc:
            raise TokenError(f"{source}:{no}: {exc}") from None
    return TokenTable(out)


def parse_token_file(path: Path) -> TokenTable:
    """Read a token file; raise `TokenError` (bad content) or OSError (unreadable)."""
    return parse_token_lines(path.read_text().splitlines(), str(path))


def bearer(header: str | None) -> str | None:
    """Return the token of ``Authorization: Bearer TOKEN`` or None if absent or malformed."""
    if not header:
        return None
    scheme, _, tok = header.strip().partition(" ")
    tok = tok.strip()
    if scheme.lower() != "bearer" or not tok or " " in tok:
        return None
    return tok


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """``rate`` tokens per second up to ``burst``; ``tokens`` left at ``t_s``."""

    rate: float
    burst: float
    tokens: float
    t_s: float

    @classmethod
    def full(cls, rate: float, burst: float, t_s: float) -> TokenBucket:
        """Return a full bucket at ``t_s``; raise ValueError unless rate > 0 and burst >= 1."""
        if not (rate > 0 and burst >= 1 and math.isfinite(rate) and math.isfinite(burst)):
            raise ValueError("rate limit needs rate > 0 and burst >= 1")
        return cls(rate, burst, burst, t_s)

    def take(self, now_s: float) -> tuple[bool, TokenBucket, float]:
        """Try to take one token at ``now_s``; return (allowed, the bucket after, seconds until
        the next token if refused else 0). Time going backwards adds nothing."""
        dt = max(0.0, now_s - self.t_s)
        tokens = min(self.burst, self.tokens + dt * self.rate)
        t = max(now_s, self.t_s)
        if tokens >= 1.0:
            return True, TokenBucket(self.rate, self.burst, tokens - 1.0, t), 0.0
        return False, TokenBucket(self.rate, self.burst, tokens, t), (1.0 - tokens) / self.rate
