"""Strict type checks shared by the JSON documents and the TOML validator.

One rule for both: a value is taken only if it already has the wanted type. ``bool`` is never
an ``int`` (``True`` is not 1), an ``int`` is accepted where a ``float`` is wanted (``5`` for
``5.0``, both in TOML and JSON), nothing is coerced from a string (``"3"`` is not 3,
``"false"`` is not a bool).
"""

from __future__ import annotations

from typing import Any

_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def is_kind(value: object, kind: type) -> bool:
    """Return True when ``value`` may be read as ``kind`` under the rule above."""
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def as_kind(value: Any, kind: type) -> Any:
    """Return ``value`` as ``kind`` (an int becomes a float where a float is wanted).

    Call only after `is_kind` returned True.
    """
    return float(value) if kind is float else value


def kind_name(kind: type) -> str:
    """Return how messages name ``kind`` ("an integer", "true or false", ...)."""
    return _NAMES.get(kind, f"a {kind.__name__}")
