"""The fleet's shared session pieces against a real nats-server taking messages up to 64 KB:
`fleet_link` sets the plane up with the clock bucket in chunks under the server's limit,
and `follow_key` hands a reader each whole version of a value many times that limit (the
models and a learned fabric travel so), never a torn one."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from controller.fleet.plane import MODELS_KEY, Plane
from controller.fleet.sessions import Follow, fleet_link, follow_key
from natslink.kvchunks import HEADROOM, Manifest, chunk_key
from natslink.lease import LeaseClock, Leases
from natslink.settings import NatsSettings
from natslink.streams import Entry
from tests.natscluster import Cluster

BOUND_S = 60.0
"""How long a version may take to reach the reader (a loaded machine is slow, never stuck)."""


@pytest.mark.slow
def test_a_follower_takes_each_whole_version_past_max_payload(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "nats", 1, max_payload="64KB")
    try:
        cluster.start(0)
        cluster.wait_ready()
        settings = NatsSettings(servers=cluster.urls, timeout_s=5.0, connect_timeout_s=1.0)
        asyncio.run(_follow(settings))
    finally:
        cluster.stop()


async def _until(cond: object, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _follow(settings: NatsSettings) -> None:
    plane = Plane(replicas=1, max_bytes=64 << 20, lease_bucket="t_leases", clock_bucket="t_clock")
    leases = Leases("w1", LeaseClock(plane.lease_ttl_s))
    logs: list[str] = []
    taken: list[Entry] = []
    async with fleet_link(settings, plane, "sessions-test", leases, probes=True) as fl:
        assert fl.clocks.limit == (64 << 10) - HEADROOM
        how = Follow(1.0, 0.1, lambda t, what, **kw: logs.append(what), time.time_ns)
        reader = asyncio.create_task(
            follow_key(fl.link, fl.clocks, MODELS_KEY, "models", taken.append, how)
        )
        try:
            rng = random.Random(3)
            v1, v2 = rng.randbytes(900_000), rng.randbytes(600_000)
            r1 = await fl.clocks.put(MODELS_KEY, v1)
            await _until(lambda: len(taken) >= 1, "the first version never came")
            r2 = await fl.clocks.put(MODELS_KEY, v2)
            await _until(lambda: len(taken) >= 2, "the second version never came")
            assert [(e.value, e.revision) for e in taken] == [(v1, r1), (v2, r2)]
            # a manifest whose chunks are gone (a writer that purged them after a newer
            # one, here forged): logged, skipped, the reader stays on what it has
            m = Manifest.decode((await fl.clocks.bucket.get(MODELS_KEY) or taken[0]).value)
            assert await fl.clocks.bucket.get(chunk_key(MODELS_KEY, m.digest, 0)) is not None
            await fl.clocks.bucket.put(MODELS_KEY, Manifest(bytes(32), 10, 1).encode())
            await _until(lambda: "models not whole" in logs, "the torn version was not seen")
            assert len(taken) == 2
            v3 = rng.randbytes(200_000)
            await fl.clocks.put(MODELS_KEY, v3)
            await _until(lambda: len(taken) >= 3, "the third version never came")
            assert taken[-1].value == v3
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
