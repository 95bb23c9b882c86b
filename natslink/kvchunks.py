"""A KV value larger than one message, as chunks and a manifest (pure: bytes in, chunks out).

NATS refuses a message over the server's ``max_payload`` (1 MB by default, 8 MB in
`natslink.serverconf`), and a KV value is one message. `split` cuts a value under a limit
(`chunk_limit`: the server's ``max_payload`` less `HEADROOM` for the message's headers)
into chunks stored under their own keys, and a manifest stored under the value's key
itself, **written last**:

- the manifest (`Manifest`, `MANIFEST_MAGIC`): the value's SHA-256 ``digest``, its ``size``
  and how many ``chunks``; a value that fits the limit travels inside the manifest
  (``chunks`` 0: one message, as before);
- chunk ``i`` of a value (`CHUNK_MAGIC`) under ``<key>.c.<digest, 16 hex>.<i>``
  (`chunk_key`), led by the whole digest and its index, so a chunk names the version it
  belongs to. Another version's chunks have other keys: a writer never overwrites a chunk
  that a manifest names.

`assemble` returns a version only when every chunk its manifest names is present, carries
the manifest's digest and index, and the whole hashes to the digest; anything else raises
`ChunkError` (torn: a chunk missing, one of another version; malformed): a reader never
sees half a version and keeps the one it has. The writer's shell
(`natslink.bigkv.ChunkedKV.put`) removes the older versions' chunks after the new manifest
(`CHUNKS`: every chunk key of ``key`` is under ``<key>.c.``); a reader that was still
reading one of them then meets a missing chunk (`ChunkError`) and takes the new manifest.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

MANIFEST_MAGIC = b"QPKM"
CHUNK_MAGIC = b"QPKC"
HEADROOM = 4096
"""Bytes of ``max_payload`` kept for a message's headers and the chunk's own head."""
MIN_LIMIT = 1024
DIGEST_LEN = 32
_MANIFEST = struct.Struct("<4sQI32s")  # magic, size, chunks, digest
_CHUNK = struct.Struct("<4s32sI")  # magic, digest, index
CHUNKS = ".c."
"""What follows a value's key in its chunks' keys (`chunk_key`)."""


class ChunkError(ValueError):
    """A manifest or chunk that is malformed, or a version not (or no longer) whole: the
    reason in one line."""


def chunk_limit(max_payload: int, headroom: int = HEADROOM) -> int:
    """Return the largest chunk (message) to write for a server of ``max_payload`` bytes:
    ``max_payload - headroom``. Raises ValueError when that is under `MIN_LIMIT`."""
    limit = max_payload - headroom
    if limit < MIN_LIMIT:
        raise ValueError(f"max_payload {max_payload} leaves {limit} bytes a chunk (< {MIN_LIMIT})")
    return limit


def chunk_key(key: str, digest: bytes, index: int) -> str:
    """Return the key of chunk ``index`` of ``key``'s version ``digest``."""
    return f"{key}{CHUNKS}{digest.hex()[:16]}.{index}"


@dataclass(frozen=True, slots=True)
class Manifest:
    """A version of a value: its SHA-256 ``digest``, ``size`` in bytes, ``chunks`` (0: the
    value is ``inline``, in the manifest itself). ValueError if inconsistent."""

    digest: bytes
    size: int
    chunks: int
    inline: bytes = b""

    def __post_init__(self) -> None:
        if len(self.digest) != DIGEST_LEN or self.size < 0 or self.chunks < 0:
            raise ValueError("a manifest needs a 32-byte digest, size and chunks >= 0")
        if bool(self.inline) if self.chunks else len(self.inline) != self.size:
            raise ValueError("a manifest holds its value inline exactly when it has no chunks")

    def encode(self) -> bytes:
        """Return the manifest as it is stored (`decode` reads it back)."""
        head = _MANIFEST.pack(MANIFEST_MAGIC, self.size, self.chunks, self.digest)
        return head + self.inline

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        """Return the manifest ``data`` holds; raise `ChunkError` if it is not one."""
        if len(data) < _MANIFEST.size or not data.startswith(MANIFEST_MAGIC):
            raise ChunkError("not a chunk manifest (bad magic or too short)")
        _, size, chunks, digest = _MANIFEST.unpack_from(data)
        try:
            return cls(digest, size, chunks, data[_MANIFEST.size :])
        except ValueError as exc:
            raise ChunkError(f"manifest {digest.hex()[:16]}: {exc}") from None

    @property
    def version(self) -> str:
        """Return the version's short name (its digest's first 16 hex digits)."""
        return self.digest.hex()[:16]


@dataclass(frozen=True, slots=True)
class Split:
    """What a writer stores for one value, in this order: the ``chunks`` (key, message),
    then the ``manifest`` under the value's own key."""

    manifest: Manifest
    chunks: tuple[tuple[str, bytes], ...]


def split(key: str, value: bytes, limit: int) -> Split:
    """Return ``value`` (stored under ``key``) cut into chunk messages of at most ``limit``
    bytes (`chunk_limit`), and its manifest; a value of at most ``limit`` bytes goes inline
    (no chunk). Raises ValueError for a ``limit`` under `MIN_LIMIT` or an empty ``key``."""
    if limit < MIN_LIMIT or not key:
        raise ValueError(f"need a key and a limit >= {MIN_LIMIT}, got {key!r}, {limit}")
    digest = hashlib.sha256(value).digest()
    if len(value) <= limit:
        return Split(Manifest(digest, len(value), 0, value), ())
    step = limit - _CHUNK.size
    out = tuple(
        (chunk_key(key, digest, i), _CHUNK.pack(CHUNK_MAGIC, digest, i) + value[at : at + step])
        for i, at in enumerate(range(0, len(value), step))
    )
    return Split(Manifest(digest, len(value), len(out)), out)


def assemble(manifest: Manifest, chunks: Sequence[bytes | None]) -> bytes:
    """Return the value of ``manifest`` from its ``chunks`` (chunk ``i``'s message, None
    where its key held nothing). Raises `ChunkError` (the version is not whole) when a chunk
    is missing, malformed, of another version or out of place, or the whole does not hash
    to the manifest's digest."""
    name = manifest.version
    if not manifest.chunks:
        body = manifest.inline
    else:
        if len(chunks) != manifest.chunks:
            raise ChunkError(f"version {name}: {len(chunks)} chunks, not {manifest.chunks}")
        parts: list[bytes] = []
        for i, c in enumerate(chunks):
            if c is None:
                raise ChunkError(f"version {name}: chunk {i} of {manifest.chunks} is gone")
            if len(c) < _CHUNK.size or not c.startswith(CHUNK_MAGIC):
                raise ChunkError(f"version {name}: chunk {i} is not a chunk")
            _, digest, index = _CHUNK.unpack_from(c)
            if digest != manifest.digest or index != i:
                raise ChunkError(f"version {name}: chunk {i} is chunk {index} of "
                                 f"{digest.hex()[:16]}")  # fmt: skip
            parts.append(c[_CHUNK.size :])
        body = b"".join(parts)
    if len(body) != manifest.size or hashlib.sha256(body).digest() != manifest.digest:
        raise ChunkError(f"version {name}: its {len(body)} bytes do not hash to its digest")
    return body


__all__ = [
    "CHUNKS",
    "HEADROOM",
    "ChunkError",
    "Manifest",
    "Split",
    "assemble",
    "chunk_key",
    "chunk_limit",
    "split",
]
