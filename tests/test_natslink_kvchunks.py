"""KV values past max_payload: split and assemble (pure: torn writes, digest mismatch, a
version replaced mid-read), and a value many times a 64 KB server's max_payload through a
real nats-server's KV (`natslink.bigkv.ChunkedKV`)."""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path

import pytest

from natslink.bigkv import ChunkedKV
from natslink.errors import NatsRefused
from natslink.kvchunks import (
    HEADROOM,
    ChunkError,
    Manifest,
    assemble,
    chunk_key,
    chunk_limit,
    split,
)
from natslink.link import connect
from natslink.settings import NatsSettings
from natslink.streams import BucketSpec, Entry, ensure_bucket
from tests.natscluster import Cluster

LIMIT = 4096


def _value(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def test_a_value_round_trips_in_chunks_under_the_limit() -> None:
    value = _value(50_000)
    s = split("models", value, LIMIT)
    assert s.manifest.chunks == len(s.chunks) > 10 and not s.manifest.inline
    assert all(len(msg) <= LIMIT for _, msg in s.chunks)
    assert [k for k, _ in s.chunks] == [chunk_key("models", s.manifest.digest, i)
                                        for i in range(len(s.chunks))]  # fmt: skip
    assert all(k.startswith("models.c.") for k, _ in s.chunks)
    m = Manifest.decode(s.manifest.encode())
    assert m == s.manifest and m.digest == hashlib.sha256(value).digest()
    assert assemble(m, [msg for _, msg in s.chunks]) == value


def test_a_small_value_travels_inline_and_limits_are_checked() -> None:
    for value in (b"", b"x", _value(LIMIT)):
        s = split("fabric", value, LIMIT)
        assert s.chunks == () and assemble(Manifest.decode(s.manifest.encode()), []) == value
    assert split("fabric", _value(LIMIT + 1), LIMIT).manifest.chunks == 2
    assert chunk_limit(8 << 20) == (8 << 20) - HEADROOM
    with pytest.raises(ValueError, match="max_payload"):
        chunk_limit(HEADROOM + 10)
    with pytest.raises(ValueError, match="limit"):
        split("k", b"v", 100)
    with pytest.raises(ChunkError, match="not a chunk manifest"):
        Manifest.decode(b"QPF1" + bytes(60))


def test_a_torn_write_is_never_assembled() -> None:
    """The writer died after some chunks (or a reader read the manifest before all came):
    a missing chunk fails the whole version."""
    s = split("models", _value(20_000), LIMIT)
    msgs: list[bytes | None] = [msg for _, msg in s.chunks]
    msgs[2] = None
    with pytest.raises(ChunkError, match=r"chunk 2 of \d+ is gone"):
        assemble(s.manifest, msgs)
    with pytest.raises(ChunkError, match="chunks, not"):
        assemble(s.manifest, msgs[:-1])
    cut = [msg for _, msg in s.chunks]
    cut[-1] = cut[-1][:-1]  # a chunk short of a byte
    with pytest.raises(ChunkError, match="do not hash"):
        assemble(s.manifest, cut)
    flipped = [msg for _, msg in s.chunks]
    flipped[1] = flipped[1][:-1] + bytes([flipped[1][-1] ^ 1])  # its head intact, a bit off
    with pytest.raises(ChunkError, match="do not hash"):
        assemble(s.manifest, flipped)


def test_a_chunk_of_another_digest_or_place_is_refused() -> None:
    a = split("models", _value(20_000, 1), LIMIT)
    b = split("models", _value(20_000, 2), LIMIT)
    mixed = [msg for _, msg in a.chunks]
    mixed[1] = b.chunks[1][1]  # the same index of another version
    with pytest.raises(ChunkError, match="is chunk 1 of"):
        assemble(a.manifest, mixed)
    swapped = [msg for _, msg in a.chunks]
    swapped[0], swapped[1] = swapped[1], swapped[0]
    with pytest.raises(ChunkError, match="chunk 0 is chunk 1"):
        assemble(a.manifest, swapped)
    # the right chunks, a manifest whose digest is off: the body is checked too
    forged = Manifest(bytes(32), a.manifest.size, a.manifest.chunks)
    with pytest.raises(ChunkError):
        assemble(forged, [msg for _, msg in a.chunks])


def test_a_version_replaced_mid_read_is_not_half_seen() -> None:
    """A reader took manifest v1 and read some chunks; the writer stored v2's chunks (other
    keys), its manifest, and purged v1's chunks: the reader's next chunk is gone, so it gets
    an error, never a mix, and v2 assembles from its own keys."""
    store: dict[str, bytes] = {}

    def put(key: str, value: bytes) -> Manifest:
        s = split(key, value, LIMIT)
        store.update(s.chunks)
        store[key] = s.manifest.encode()
        return s.manifest

    v1, v2 = _value(30_000, 1), _value(30_000, 2)
    m1 = put("fabric", v1)
    first = [store.get(chunk_key("fabric", m1.digest, i)) for i in range(3)]
    m2 = put("fabric", v2)
    assert not set(split("fabric", v1, LIMIT).chunks) & set(split("fabric", v2, LIMIT).chunks)
    for k in [k for k in store if k.startswith("fabric.c.") and m2.version not in k]:
        del store[k]  # the writer's clean-up after the new manifest
    rest = [store.get(chunk_key("fabric", m1.digest, i)) for i in range(3, m1.chunks)]
    with pytest.raises(ChunkError, match="gone"):
        assemble(m1, first + rest)
    now = Manifest.decode(store["fabric"])
    assert assemble(now, [store[chunk_key("fabric", now.digest, i)]
                          for i in range(now.chunks)]) == v2  # fmt: skip


@pytest.mark.slow
def test_a_value_many_times_max_payload_round_trips_through_a_real_kv(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "nats", 1, max_payload="64KB")
    try:
        cluster.start(0)
        cluster.wait_ready()
        settings = NatsSettings(servers=cluster.urls, timeout_s=5.0, connect_timeout_s=1.0)
        asyncio.run(_round_trip(settings))
    finally:
        cluster.stop()


async def _round_trip(settings: NatsSettings) -> None:
    async with connect(settings, "kvchunks-test") as link:
        assert link.max_payload == 64 << 10
        bucket = await ensure_bucket(link, BucketSpec("t_chunks", replicas=1))
        kv = ChunkedKV.for_link(link, bucket)
        assert kv.limit == (64 << 10) - HEADROOM
        v1, v2 = _value(1_000_000, 1), _value(700_000, 2)  # ~16 and ~11 chunks
        with pytest.raises(NatsRefused):
            await bucket.put("big", v1)  # what the servers refuse as one value
        r1 = await kv.put("big", v1)
        got = await kv.get("big")
        assert got is not None and got.value == v1 and got.revision == r1
        m1 = Manifest.decode((await bucket.get("big") or Entry("", b"", 0)).value)
        assert m1.chunks == -(-len(v1) // (kv.limit - 40))
        stale = await bucket.get("big")
        assert stale is not None
        r2 = await kv.put("big", v2)
        assert r2 > r1
        got = await kv.get("big")
        assert got is not None and got.value == v2
        # the old version's chunks were purged after the new manifest: a reader still
        # holding its manifest gets an error, not half a version
        assert await bucket.get(chunk_key("big", m1.digest, 0)) is None
        with pytest.raises(ChunkError, match="gone"):
            await kv.read(stale)
        assert (
            await bucket.count("big.c.")
            == Manifest.decode((await bucket.get("big") or Entry("", b"", 0)).value).chunks
        )  # only the current version's chunks are left, no markers
        await kv.put("big", b"small")  # inline: every chunk purged
        assert await bucket.count("big.c.") == 0
        got = await kv.get("big")
        assert got is not None and got.value == b"small"
        # a watch brings manifests; read assembles each
        await kv.put("big", v1)
        async for entry in kv.watch("big", timeout_s=2.0):
            assert entry is not None
            assert (await kv.read(entry)).value == v1
            break
