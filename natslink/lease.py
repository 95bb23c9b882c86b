"""Leases on a KV bucket: one owner per key at a time, kept by renewal, lost by silence.

The bucket's TTL is the lease's: an entry that nobody renews expires on the servers, and then
`Bucket.create` (which refuses a live key) lets the next claimant in. Renewal is
`Bucket.update` at the revision the owner last wrote: it fails (and the lease is lost) when the
key expired and someone else took it.

`LeaseClock` is the pure part. A holder counts its lease from the moment it *sent* the write
that made or renewed it (the servers count from when they stored it, later), minus a margin
for clock rates and scheduling: so a holder stops using a lease before the servers can give it
to anyone else. `Leases` holds the revisions of one owner's leases and does the requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from natslink.streams import Bucket


@dataclass(frozen=True, slots=True)
class LeaseClock:
    """Lease timing: ``ttl_s`` (the bucket's), renew after ``renew_s`` (default a third of
    the TTL), trusted until ``ttl_s - margin_s`` after the write was sent (default margin: a
    fifth of the TTL). ValueError unless 0 < renew_s < ttl_s - margin_s and margin_s >= 0."""

    ttl_s: float
    renew_s: float = 0.0
    margin_s: float = -1.0

    def __post_init__(self) -> None:
        if self.renew_s == 0.0:
            object.__setattr__(self, "renew_s", self.ttl_s / 3)
        if self.margin_s < 0:
            object.__setattr__(self, "margin_s", self.ttl_s / 5)
        if not 0 < self.renew_s < self.ttl_s - self.margin_s:
            raise ValueError(f"lease needs 0 < renew_s < ttl_s - margin_s, got "
                             f"ttl {self.ttl_s}, renew {self.renew_s}, margin {self.margin_s}")  # fmt: skip

    def valid(self, sent_s: float, now_s: float) -> bool:
        """Return True while a lease written at ``sent_s`` may still be used at ``now_s``."""
        return now_s < sent_s + self.ttl_s - self.margin_s

    def renew_due(self, sent_s: float, now_s: float) -> bool:
        """Return True once a lease written at ``sent_s`` should be renewed."""
        return now_s >= sent_s + self.renew_s


@dataclass(frozen=True, slots=True)
class Held:
    """A lease held: ``key``, the ``revision`` written, when that write was sent (``sent_s``,
    monotonic seconds)."""

    key: str
    revision: int
    sent_s: float


class Leases:
    """The leases ``owner`` holds on a bucket (`bind` it after every connect: the revisions
    stay valid across connections). ``now`` is a monotonic clock in seconds."""

    def __init__(
        self, owner: str, clock: LeaseClock, *, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.owner, self.clock, self._now = owner, clock, now
        self.held: dict[str, Held] = {}
        self._bucket: Bucket | None = None

    def bind(self, bucket: Bucket) -> None:
        """Use ``bucket`` for the requests from now on."""
        self._bucket = bucket

    def _b(self) -> Bucket:
        if self._bucket is None:
            raise RuntimeError("Leases.bind(bucket) first")
        return self._bucket

    def valid(self, key: str) -> bool:
        """Return True if ``key`` is held and may still be used now."""
        h = self.held.get(key)
        return h is not None and self.clock.valid(h.sent_s, self._now())

    async def claim(self, key: str) -> bool:
        """Try to take ``key``; return True if this owner holds it now."""
        if self.valid(key):
            return True
        sent = self._now()
        rev = await self._b().create(key, self.owner.encode())
        if rev is None:
            return False
        self.held[key] = Held(key, rev, sent)
        return True

    async def renew(self) -> list[str]:
        """Renew every lease that is due; return the keys lost (taken by another, or expired
        here before a renewal got through), which are no longer held. Raises
        `NatsLinkError` when the servers cannot be reached (the leases stay held until they
        expire here: `valid`)."""
        lost = [k for k, h in self.held.items() if not self.clock.valid(h.sent_s, self._now())]
        for k in lost:
            del self.held[k]
        for key, h in list(self.held.items()):
            if not self.clock.renew_due(h.sent_s, self._now()):
                continue
            sent = self._now()
            rev = await self._b().update(key, self.owner.encode(), h.revision)
            if rev is None:
                del self.held[key]
                lost.append(key)
            else:
                self.held[key] = Held(key, rev, sent)
        return lost

    async def release(self, key: str) -> None:
        """Give ``key`` up now (deleted at the revision held, so a key someone else took
        meanwhile is left alone)."""
        h = self.held.pop(key, None)
        if h is not None:
            await self._b().delete(key, last=h.revision)

    def forget(self) -> None:
        """Drop every lease without a request (they expire on the servers)."""
        self.held.clear()
