"""A fleet process's NATS session: what the worker, the edge owner and the solver share
(`controller.fleet.workerloop`, `controller.fleet.ownerloop`, `controller.fleet.solverloop`).

- `run_sessions`: the one run loop, run again after each link error, on the one reconnect
  helper (`mqttlink.reconnect.reconnect_loop`) with the settings' backoff;
- `fleet_link`: one connection with the plane set up on it (the partial stream, the probe
  stream for a worker, the lease and clock buckets; idempotent), its leases bound to the
  lease bucket (whose TTL rules), the clock bucket's large values in chunks
  (`natslink.bigkv.ChunkedKV`: the models and a learned fabric's versions);
- `run_side`: a connection's side tasks until one fails or the link is lost (`first_error`);
- `follow_key`: a clock bucket key's whole versions, each to a callback (the models, a
  learned fabric), its watch set up again after a failure;
- `FairShare.step`: the worker's partitions and the owner's indices held alike: register,
  give back what is above a fair share, claim free ones up to it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from controller.fleet.plane import Plane
from mqttlink.reconnect import Backoff, Session, reconnect_loop, stop_tasks
from natslink.bigkv import ChunkedKV
from natslink.errors import LINK_ERRORS, NatsUnavailable
from natslink.kvchunks import ChunkError
from natslink.lease import LeaseClock, Leases
from natslink.link import Link, connect
from natslink.settings import NatsSettings
from natslink.streams import Bucket, Entry, ensure_bucket, ensure_stream
from natslink.subjects import fnv1a32

Log = Callable[..., None]
LINK_POLL_S = 0.5


async def run_sessions(
    settings: NatsSettings, session: Session, log: Log, clock_ns: Callable[[], int],
    *, max_attempts: int | None = None,
) -> None:  # fmt: skip
    """Run ``session(connected)`` until it returns or is cancelled, again after each link
    error (`natslink.errors.LINK_ERRORS`, logged as ``nats error`` with the delay) with the
    backoff of ``settings`` (jittered); returns after ``max_attempts`` attempts at most (None:
    no bound). Other exceptions propagate."""

    def on_error(exc: BaseException, delay_s: float) -> None:
        log(clock_ns(), "nats error", error=str(exc), retry_in_s=round(delay_s, 3))

    backoff = Backoff(settings.backoff_min_s, settings.backoff_max_s, jitter=0.2)
    await reconnect_loop(session, backoff, on_error=on_error, max_attempts=max_attempts,
                         errors=LINK_ERRORS)  # fmt: skip


@dataclass(frozen=True, slots=True)
class FleetLink:
    """One connection with the plane set up: the ``link``, the ``leases`` bucket and the
    ``clocks`` bucket (its values in chunks)."""

    link: Link
    leases: Bucket
    clocks: ChunkedKV


@asynccontextmanager
async def fleet_link(
    settings: NatsSettings, plane: Plane, name: str, leases: Leases, *, probes: bool = False
) -> AsyncIterator[FleetLink]:
    """Connect as ``name`` (`natslink.link.connect`), set up the partial stream (and the
    probe stream with ``probes``) and the two buckets, and bind ``leases`` to the lease
    bucket (its clock set to the bucket's TTL where that differs from the plane's: every
    party uses the bucket's). Raises `natslink.errors.NatsLinkError` as the set-up does."""
    async with connect(settings, name) as link:
        if probes:
            await ensure_stream(link, plane.probe_stream_spec(settings.subjects))
        await ensure_stream(link, plane.partial_stream_spec(settings.subjects))
        lease_bucket = await ensure_bucket(link, plane.lease_bucket_spec())
        clocks = await ensure_bucket(link, plane.clock_bucket_spec())
        if abs(lease_bucket.ttl_s - plane.lease_ttl_s) > 1e-6:  # the bucket's TTL rules
            leases.clock = LeaseClock(lease_bucket.ttl_s)
        leases.bind(lease_bucket)
        yield FleetLink(link, lease_bucket, ChunkedKV.for_link(link, clocks))


async def first_error(tasks: list[asyncio.Task[None]], link: Link) -> None:
    """Wait until a task fails or the link is lost; raise that error. The link is also
    checked every `LINK_POLL_S`: nats-py marks a connection closed before it runs the
    callbacks that set ``link.lost``, and a close that stalls on a dead server's socket
    may never run them."""
    lost = asyncio.create_task(link.lost.wait())
    try:
        while True:
            done, _ = await asyncio.wait([*tasks, lost], timeout=LINK_POLL_S,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if done or link.nc.is_closed:
                break
    finally:
        lost.cancel()
    for t in done:
        if t is not lost:
            t.result()
    raise NatsUnavailable("connection to the NATS server lost")


async def run_side(link: Link, side: list[Coroutine[Any, Any, None]]) -> None:
    """Run the ``side`` tasks of a connection until one fails or ``link`` is lost; raise
    that error (`first_error`) after cancelling them all."""
    tasks = [asyncio.create_task(c) for c in side]
    try:
        await first_error(tasks, link)
    finally:
        await stop_tasks(tasks)


@dataclass(frozen=True, slots=True)
class Follow:
    """How `follow_key` watches: ``timeout_s`` a watch waits before checking the link,
    ``pause_s`` after a failed watch; ``log`` and ``clock_ns`` (UNIX ns) for its lines."""

    timeout_s: float
    pause_s: float
    log: Log
    clock_ns: Callable[[], int]


async def follow_key(
    link: Link, clocks: ChunkedKV, key: str, what: str, take: Callable[[Entry], None],
    how: Follow,
) -> None:  # fmt: skip
    """Hand ``take`` each whole version of ``key`` (the newest first, then each update:
    the assembled value and its manifest's revision). A version that is not whole (a
    newer one replaced it while it was read: `natslink.kvchunks.ChunkError`) is logged
    (``<what> not whole``) and skipped: the watch brings the newer one. A watch that
    fails (a cluster electing leaders) is logged (``<what> watch failed``) and set up
    again after ``how.pause_s`` instead of ending the connection. Raises `NatsUnavailable`
    once the connection itself is gone."""
    while True:
        link.check()
        try:
            async for entry in clocks.watch(key, timeout_s=how.timeout_s):
                if entry is None or not entry.value:
                    continue
                try:
                    whole = await clocks.read(entry)
                except ChunkError as exc:
                    how.log(how.clock_ns(), f"{what} not whole", error=str(exc))
                    continue
                take(whole)
        except LINK_ERRORS as exc:
            how.log(how.clock_ns(), f"{what} watch failed", error=str(exc))
            await asyncio.sleep(how.pause_s)


def lease_index(key: str) -> int:
    """Return the index a lease key names (``part.<p>``, ``edge.<k>``)."""
    return int(key.split(".")[1])


@dataclass(frozen=True, slots=True)
class FairShare:
    """How a process holds ``total`` indices (partitions, edge owner indices) with its
    peers: it registers as ``<kind>.<me>`` in the lease bucket (same TTL), and its lease
    of index ``i`` is ``key_of(i)``."""

    kind: str
    me: str
    total: int
    key_of: Callable[[int], str]

    async def step(
        self, leases: Leases, bucket: Bucket, release: Callable[[int], Awaitable[None]],
        claimed: Callable[[int], None],
    ) -> tuple[int, int]:  # fmt: skip
        """Register, give back the indices held above the fair share
        ``ceil(total / live processes)`` (each stopped by ``release(i)`` first, then its
        lease released: a clean crash), and claim free ones up to it, from
        ``fnv1a32(me) mod total`` on (each told to ``claimed(i)``); return (claimed,
        released). Raises `natslink.errors.NatsLinkError` as the bucket does."""
        await bucket.put(f"{self.kind}.{self.me}", b"1")
        share = math.ceil(self.total / max(1, await bucket.count(f"{self.kind}.")))
        held = sorted(lease_index(key) for key in leases.held)
        for i in held[share:]:
            await release(i)
            await leases.release(self.key_of(i))
        got = 0
        start = fnv1a32(self.me.encode()) % self.total
        for n in range(self.total):
            if len(leases.held) >= share:
                break
            i = (start + n) % self.total
            if self.key_of(i) not in leases.held and await leases.claim(self.key_of(i)):
                got += 1
                claimed(i)
        return got, len(held[share:])


__all__ = [
    "LINK_POLL_S",
    "FairShare",
    "FleetLink",
    "Follow",
    "first_error",
    "fleet_link",
    "follow_key",
    "lease_index",
    "run_sessions",
    "run_side",
]
