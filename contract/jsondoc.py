"""The JSON boundary of the contract: bytes <-> plain objects, and typed field reads.

Every document module decodes through `decode_json` and reads fields with `field` /
`optional`, so every malformed payload (bad UTF-8, bad JSON, nesting too deep, wrong type,
missing key, value out of range) becomes one `DocumentError` with a one-line reason naming the
document and the key. Types are strict (`contract.kinds`): ``"false"`` is not a bool, ``1``
is not ``true``. Keys a document does not know are ignored (a newer writer may add some).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from contract.kinds import as_kind, is_kind, kind_name

T = TypeVar("T")


class DocumentError(ValueError):
    """A JSON document of the contract is malformed (one-line reason)."""


def encode_json(doc: object) -> bytes:
    """Return compact UTF-8 JSON of ``doc`` (values JSON cannot hold are written as text)."""
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


def decode_json(payload: bytes | bytearray, what: str) -> Any:
    """Return the JSON value in ``payload``; raise `DocumentError` naming ``what``."""
    try:
        return json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DocumentError(f"{what}: not JSON: {exc}") from None
    except RecursionError:
        raise DocumentError(f"{what}: nested too deeply") from None


def decode_object(payload: bytes | bytearray, what: str) -> Mapping[str, Any]:
    """Return the JSON object in ``payload``; raise `DocumentError` if it is not one."""
    doc = decode_json(payload, what)
    if not isinstance(doc, dict):
        raise DocumentError(f"{what}: must be a JSON object, got {type(doc).__name__}")
    return doc


_REQUIRED: Any = object()


def field(doc: Mapping[str, Any], key: str, kind: type[T], what: str, default: T = _REQUIRED) -> T:
    """Return ``doc[key]`` checked to be ``kind``; ``default`` when absent (else required).

    Raises `DocumentError` (``what: key: must be ..., got ...``).
    """
    if key not in doc:
        if default is _REQUIRED:
            raise DocumentError(f"{what}: {key}: is required")
        return default
    value = doc[key]
    if not is_kind(value, kind):
        raise DocumentError(f"{what}: {key}: must be {kind_name(kind)}, got {_short(value)}")
    out: T = as_kind(value, kind)
    return out


def check(ok: bool, what: str, key: str, want: str, value: object) -> None:
    """Raise `DocumentError` (``what: key: must be want, got value``) unless ``ok``."""
    if not ok:
        raise DocumentError(f"{what}: {key}: must be {want}, got {_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
