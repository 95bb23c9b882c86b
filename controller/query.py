"""Query-string values shared by the API's filters (events, actions): pure, one-line errors.

Integers are ASCII digits only, optionally after one ``-`` (``int()`` would also take
``+5``, `` 5 ``, ``5_0`` and other scripts' digits such as ``٣``); at most 19 digits, so a
value is parsed in bounded time and fits a signed 64-bit column. A time range whose end is
not after its start is empty, not an error: what OpenAPI can state of two parameters is
their own type and bounds, and the API answers everything its description allows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_INT = re.compile(r"-?[0-9]{1,19}")


def parse_int(raw: str) -> int | None:
    """Return the integer ``raw`` spells in ASCII digits (an optional leading ``-``), None
    for anything else."""
    return int(raw) if _INT.fullmatch(raw) else None


def int_param(
    q: Mapping[str, str], key: str, lo: int, hi: int, error: type[ValueError]
) -> int | None:
    """Return the integer ``q[key]`` (None when absent); raise ``error`` with one line when it
    is not an ASCII-digit integer or lies outside ``lo..hi``."""
    raw = q.get(key)
    if raw is None:
        return None
    v = parse_int(raw)
    if v is None:
        raise error(f"{key} must be an integer in ASCII digits, got {raw!r}")
    if not lo <= v <= hi:
        raise error(f"{key} must be in {lo}..{hi}, got {v}")
    return v


def time_range(
    q: Mapping[str, str], error: type[ValueError], lo_key: str = "since_ns",
    hi_key: str = "until_ns",
) -> tuple[int | None, int | None]:  # fmt: skip
    """Return (``q[lo_key]``, ``q[hi_key]``), each an integer in 0..2**63-1 or None when
    absent; raise ``error`` on a bad integer. ``hi <= lo`` is an empty range (nothing
    matches), not an error."""
    top = 2**63 - 1
    return int_param(q, lo_key, 0, top, error), int_param(q, hi_key, 0, top, error)
