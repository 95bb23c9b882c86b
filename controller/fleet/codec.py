"""The columnar frame the fleet's payloads travel in (partials, worker state): a small JSON
head and numpy columns.

Layout (little-endian): ``magic`` (4 bytes, the payload kind), ``version`` (u16), ``flags``
(u16: bit 0, the body is zlib-compressed), head length (u32), the head (UTF-8 JSON: the
payload's scalars and one ``[name, dtype, shape]`` entry per column), then the body: the
columns' bytes one after another, in the head's order. `pack` writes one, `unpack` reads and
checks one: every way a payload can be malformed (short, wrong magic or version, bad JSON,
a column of an unknown dtype or a size that does not match the body) raises `CodecError`
with a one-line reason, nothing else. Pure: bytes in, values out.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

_PRE = struct.Struct("<4sHHI")
_DTYPES = {"<i4", "<i8", "<f4", "<f8", "|b1", "<u2", "<i2", "|u1"}
_MAX_HEAD = 1 << 24
COMPRESSED = 1


class CodecError(ValueError):
    """A payload that is not a well-formed frame (the reason in one line)."""


def pack(
    magic: bytes,
    version: int,
    head: Mapping[str, Any],
    cols: Mapping[str, NDArray[Any]],
    *,
    compress: bool = False,
) -> bytes:
    """Return the frame of ``head`` (JSON-able scalars) and ``cols`` (numpy arrays, written
    little-endian in their dtype); ``compress``: zlib (level 1) over the body."""
    if len(magic) != 4:
        raise ValueError("magic must be 4 bytes")
    specs: list[list[Any]] = []
    parts: list[bytes] = []
    for name, arr in cols.items():
        a = np.ascontiguousarray(arr)
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        a = a.astype(dt, copy=False)
        if dt.str not in _DTYPES:
            raise ValueError(f"column {name}: dtype {dt.str} cannot travel")
        specs.append([name, dt.str, list(a.shape)])
        parts.append(a.tobytes())
    doc = dict(head)
    doc["columns"] = specs
    hb = json.dumps(doc, separators=(",", ":")).encode()
    body = b"".join(parts)
    flags = 0
    if compress:
        body = zlib.compress(body, 1)
        flags |= COMPRESSED
    return _PRE.pack(magic, version, flags, len(hb)) + hb + body


def unpack(
    data: bytes, magic: bytes, versions: frozenset[int]
) -> tuple[int, dict[str, Any], dict[str, NDArray[Any]]]:
    """Return (version, head, columns) of a frame of kind ``magic`` whose version is one of
    ``versions``. The columns are read-only views (or copies when compressed). Raises
    `CodecError` on anything malformed."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError("payload is not bytes")
    buf = memoryview(data)
    if len(buf) < _PRE.size:
        raise CodecError(f"payload of {len(buf)} bytes is shorter than a frame header")
    got, version, flags, hlen = _PRE.unpack_from(buf)
    if got != magic:
        raise CodecError(f"not a {magic.decode()} payload (magic {bytes(got)!r})")
    if version not in versions:
        raise CodecError(f"{magic.decode()} version {version} is not supported")
    if flags & ~COMPRESSED:
        raise CodecError(f"unknown flags {flags:#x}")
    if hlen > _MAX_HEAD or _PRE.size + hlen > len(buf):
        raise CodecError("head length runs past the payload")
    try:
        head = json.loads(bytes(buf[_PRE.size : _PRE.size + hlen]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"head is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(head, dict) or not isinstance(head.get("columns"), list):
        raise CodecError("head is not an object with a column list")
    body: memoryview | bytes = buf[_PRE.size + hlen :]
    if flags & COMPRESSED:
        try:
            body = zlib.decompress(body, bufsize=_body_size(head["columns"], len(body)))
        except zlib.error as exc:
            raise CodecError(f"body does not decompress ({exc})") from None
    cols: dict[str, NDArray[Any]] = {}
    off = 0
    for spec in head.pop("columns"):
        name, dt, shape = _spec(spec)
        if name in cols:
            raise CodecError(f"column {name} appears twice")
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        if off + size > len(body):
            raise CodecError(f"column {name} runs past the body")
        cols[name] = np.frombuffer(body, np.dtype(dt), int(np.prod(shape)), off).reshape(shape)
        off += size
    if off != len(body):
        raise CodecError(f"{len(body) - off} bytes after the last column")
    return version, head, cols


def _body_size(specs: list[Any], packed: int) -> int:
    """Return the output buffer to decompress a body of ``packed`` bytes into: the size the
    head's column entries add up to (the body, whole, in one buffer: no growing it and no
    joining its pieces), or zlib's default when an entry is malformed (`unpack` says which)
    or the size is over 16 times ``packed`` (a head cannot make a large buffer be taken)."""
    size = 0
    for spec in specs:
        if not (isinstance(spec, list) and len(spec) == 3 and spec[1] in _DTYPES):
            return zlib.DEF_BUF_SIZE
        shape = spec[2]
        if not (isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape)):
            return zlib.DEF_BUF_SIZE
        size += math.prod(shape) * np.dtype(spec[1]).itemsize
        if size > 16 * packed + zlib.DEF_BUF_SIZE:
            return zlib.DEF_BUF_SIZE
    return max(size, 1)


def _spec(spec: Any) -> tuple[str, str, tuple[int, ...]]:
    """Return (name, dtype, shape) of one head column entry; raises `CodecError`."""
    if not (isinstance(spec, list) and len(spec) == 3):
        raise CodecError("a column entry is not [name, dtype, shape]")
    name, dt, shape = spec
    if not isinstance(name, str) or dt not in _DTYPES:
        raise CodecError(f"column {name!r}: bad name or dtype {dt!r}")
    if not (
        isinstance(shape, list)
        and 1 <= len(shape) <= 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)
    ):
        raise CodecError(f"column {name}: bad shape {shape!r}")
    return name, dt, tuple(shape)
