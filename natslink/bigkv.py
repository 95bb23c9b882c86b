"""KV values past the server's ``max_payload``: `ChunkedKV`, the shell of `natslink.kvchunks`.

`ChunkedKV.put` stores a value as `natslink.kvchunks.split` cuts it under the connection's
limit (`natslink.kvchunks.chunk_limit` of the server's ``max_payload``, `for_link`): its
chunks, then the manifest under the key itself (a value that fits goes inline: one
message), then removes the chunks of older versions of the key (a purge by subject: no
markers left; one that fails is made good by the next put, which removes every older
chunk). `ChunkedKV.read` returns a manifest's whole value, or raises
`natslink.kvchunks.ChunkError` when the version is not whole (a chunk gone: a newer
version replaced it while it was read); the reader keeps the version it has and takes the
next manifest its watch brings. One writer per key at a time (the solver's lease).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from natslink.kvchunks import CHUNKS, Manifest, assemble, chunk_key, chunk_limit, split
from natslink.link import Link
from natslink.streams import Bucket, Entry


class ChunkedKV:
    """``bucket``'s values in chunks of at most ``limit`` bytes (`natslink.kvchunks`)."""

    def __init__(self, bucket: Bucket, limit: int) -> None:
        self.bucket, self.limit = bucket, limit

    @classmethod
    def for_link(cls, link: Link, bucket: Bucket) -> ChunkedKV:
        """Return ``bucket`` with chunks under the ``max_payload`` of ``link``'s server."""
        return cls(bucket, chunk_limit(link.max_payload))

    async def put(self, key: str, value: bytes) -> int:
        """Store ``value`` under ``key`` (chunks, then the manifest); return the manifest's
        revision. Raises `natslink.errors.NatsLinkError` as `Bucket.put` does (a version
        whose manifest was not written is not seen by any reader)."""
        plan = split(key, value, self.limit)
        first = 0
        for ck, data in plan.chunks:
            rev = await self.bucket.put(ck, data)
            first = first or rev
        revision = await self.bucket.put(key, plan.manifest.encode())
        await self.bucket.purge_before(key + CHUNKS, first or revision)
        return revision

    async def read(self, entry: Entry) -> Entry:
        """Return ``entry`` (a manifest as the bucket holds it) with its whole value.
        Raises `natslink.kvchunks.ChunkError` when it is not a manifest or its version is
        not whole, `natslink.errors.NatsLinkError` as `Bucket.get`."""
        m = Manifest.decode(entry.value)
        parts: list[bytes | None] = []
        for i in range(m.chunks):
            got = await self.bucket.get(chunk_key(entry.key, m.digest, i))
            parts.append(got.value if got is not None else None)
        return Entry(entry.key, assemble(m, parts), entry.revision)

    async def get(self, key: str) -> Entry | None:
        """Return ``key``'s whole value (None: absent or deleted); raises as `read`."""
        entry = await self.bucket.get(key)
        return await self.read(entry) if entry is not None and entry.value else None

    def watch(self, key: str, timeout_s: float) -> AsyncIterator[Entry | None]:
        """Return `Bucket.watch` of ``key``: its manifests (each to `read`)."""
        return self.bucket.watch(key, timeout_s)


__all__ = ["ChunkedKV"]
