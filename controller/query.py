"""Query-string values shared by the API's filters (events, actions): pure, one-line errors."""

from __future__ import annotations

from collections.abc import Mapping


def int_param(
    q: Mapping[str, str], key: str, lo: int, hi: int, error: type[ValueError]
) -> int | None:
    """Return the integer ``q[key]`` (None when absent); raise ``error`` with one line when it
    is not an integer or lies outside ``lo..hi``."""
    raw = q.get(key)
    if raw is None:
        return None
    try:
        v = int(raw)
    except ValueError:
        raise error(f"{key} must be an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise error(f"{key} must be in {lo}..{hi}, got {v}")
    return v
