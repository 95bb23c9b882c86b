"""Streams, pull consumers and KV buckets: specs and their idempotent setup on a `Link`.

`ensure_stream` creates a stream or leaves an existing one as it is (its subjects must agree:
`NatsRefused` otherwise, naming both); `ensure_bucket` does the same for a KV bucket and
returns a `Bucket` whose operations translate errors at the boundary. `Pull` is one durable
pull consumer: `fetch` returns the messages that are there (an empty list when none came in
time, not an error), each a `Delivery` to ack once its content is safe elsewhere.
`restart_from_ack_floor` puts a durable consumer back to its first unacknowledged message
so a new owner gets at once what an old owner held unacknowledged (instead of after the ack
wait).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue

from natslink.errors import NatsRefused, NatsUnavailable, translate
from natslink.link import Link


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A file-backed stream: ``name``, captured ``subjects``, ``replicas`` (R3: survives one
    server lost), ``max_age_s`` and ``max_bytes`` (the bounded replay buffer; oldest dropped),
    ``duplicate_window_s`` (how long a ``Nats-Msg-Id`` is remembered). ValueError if invalid."""

    name: str
    subjects: tuple[str, ...]
    replicas: int = 3
    max_age_s: float = 600.0
    max_bytes: int = 8 << 30
    duplicate_window_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in ". *>"):
            raise ValueError(f"bad stream name {self.name!r}")
        if not self.subjects or not 1 <= self.replicas <= 5:
            raise ValueError("a stream needs subjects and 1..5 replicas")
        if not 0 < self.duplicate_window_s <= self.max_age_s or self.max_bytes <= 0:
            raise ValueError("need 0 < duplicate_window_s <= max_age_s and max_bytes > 0")


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """A KV bucket: ``name``, entry ``ttl_s`` (0: none; a lease bucket's TTL is the lease's),
    ``replicas``, ``max_value_bytes`` (-1: the server's limit)."""

    name: str
    ttl_s: float = 0.0
    replicas: int = 3
    max_value_bytes: int = -1


async def ensure_stream(link: Link, spec: StreamSpec) -> None:
    """Create stream ``spec`` unless it exists; raise `NatsRefused` if one of that name
    captures other subjects, `NatsUnavailable` when JetStream does not answer."""
    with translate(f"stream {spec.name}"):
        try:
            info = await link.js.stream_info(spec.name)
        except nats.js.errors.NotFoundError:
            info = None
        if info is None:
            await link.js.add_stream(StreamConfig(
                name=spec.name, subjects=list(spec.subjects), num_replicas=spec.replicas,
                max_age=spec.max_age_s, max_bytes=spec.max_bytes, storage=StorageType.FILE,
                duplicate_window=spec.duplicate_window_s,
            ))  # fmt: skip
            return
    have = tuple(info.config.subjects or ())
    if sorted(have) != sorted(spec.subjects):
        raise NatsRefused(f"stream {spec.name} captures {list(have)}, not {list(spec.subjects)}")


@dataclass(frozen=True, slots=True)
class Entry:
    """A KV entry: ``key``, ``value``, ``revision`` (0 and empty for a deleted key)."""

    key: str
    value: bytes
    revision: int


class Bucket:
    """A KV bucket with errors translated; ``ttl_s`` is the bucket's (read at open)."""

    def __init__(self, kv: KeyValue, js: JetStreamContext, name: str, ttl_s: float) -> None:
        self._kv, self._js, self.name, self.ttl_s = kv, js, name, ttl_s

    async def create(self, key: str, value: bytes) -> int | None:
        """Store ``key`` only if it is absent (or deleted, or expired); return its revision,
        None when someone holds it."""
        with translate(f"kv {self.name} create {key}"):
            try:
                return int(await self._kv.create(key, value))
            except nats.js.errors.KeyWrongLastSequenceError:
                return None

    async def update(self, key: str, value: bytes, last: int) -> int | None:
        """Store ``key`` only if its revision is still ``last``; return the new revision,
        None when it changed (someone else wrote it, or it expired and was taken)."""
        with translate(f"kv {self.name} update {key}"):
            try:
                return int(await self._kv.update(key, value, last=last))
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.NotFoundError):
                return None

    async def put(self, key: str, value: bytes) -> int:
        """Store ``key`` unconditionally; return its revision."""
        with translate(f"kv {self.name} put {key}"):
            return int(await self._kv.put(key, value))

    async def delete(self, key: str, last: int | None = None) -> bool:
        """Delete ``key`` (only at revision ``last`` if given); return whether it was."""
        with translate(f"kv {self.name} delete {key}"):
            try:
                await self._kv.delete(key, last=last)
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.NotFoundError):
                return False
            return True

    async def get(self, key: str) -> Entry | None:
        """Return ``key``'s entry, None if absent, deleted or expired."""
        with translate(f"kv {self.name} get {key}"):
            try:
                e = await self._kv.get(key)
            except nats.js.errors.NotFoundError:
                return None
        return Entry(e.key, e.value or b"", int(e.revision or 0))

    async def purge_before(self, prefix: str, revision: int) -> None:
        """Remove the entries of every key under ``prefix`` (whole tokens, e.g. ``models.c.``)
        stored before ``revision``, leaving no delete marker (a stream purge by subject)."""
        if revision <= 1:  # nothing is before the first; nats-server 2.9 reads 1 as "all"
            return
        subject = f"$KV.{self.name}.{prefix}>"
        with translate(f"kv {self.name} purge {prefix}"):
            await self._js.purge_stream(f"KV_{self.name}", seq=revision, subject=subject)

    async def count(self, prefix: str) -> int:
        """Return how many live keys start with ``prefix`` (a whole token, e.g. ``worker.``):
        one stream-info request, no consumer (a deleted key's marker counts until it
        expires)."""
        subject = f"$KV.{self.name}.{prefix}>"
        with translate(f"kv {self.name} count {prefix}"):
            info = await self._js.stream_info(f"KV_{self.name}", subjects_filter=subject)
        return len(info.state.subjects or {})

    async def watch(self, key: str, timeout_s: float) -> AsyncIterator[Entry | None]:
        """Yield ``key``'s current entry, then each update, and None after every
        ``timeout_s`` without one (so the caller can check its connection and stop)."""
        with translate(f"kv {self.name} watch {key}"):
            watcher = await self._kv.watch(key)
        try:
            while True:
                with translate(f"kv {self.name} watch {key}"):
                    try:
                        e = await watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
                    except TimeoutError:  # nats-py's or asyncio's: no update in time
                        e = None
                if e is None:
                    yield None
                else:
                    yield Entry(e.key, e.value or b"", int(e.revision or 0))
        finally:
            with translate(f"kv {self.name} unwatch {key}"):
                await watcher.stop()  # type: ignore[no-untyped-call]


async def ensure_bucket(link: Link, spec: BucketSpec) -> Bucket:
    """Open bucket ``spec``, creating it if absent; the `Bucket` keeps the bucket's own TTL
    (an existing bucket's, which may differ from ``spec``: every party uses the same)."""
    with translate(f"kv bucket {spec.name}"):
        try:
            kv = await link.js.key_value(spec.name)
        except nats.js.errors.BucketNotFoundError:
            kv = await link.js.create_key_value(KeyValueConfig(
                bucket=spec.name, history=1, ttl=spec.ttl_s or None, replicas=spec.replicas,
                max_value_size=spec.max_value_bytes, storage=StorageType.FILE,
            ))  # fmt: skip
        status = await kv.status()
    return Bucket(kv, link.js, spec.name, float(status.ttl or 0.0))


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message from a pull consumer: ``subject``, ``data``, ``headers``, its
    ``stream_seq``, when the stream stored it (``stored_ns``, UNIX ns: the same for every
    consumer and every delivery), how many more wait (``pending``), whether it was delivered
    before (``redelivered``). `ack` once its content is safe; `term` to never see it again."""

    subject: str
    data: bytes
    headers: Mapping[str, str]
    stream_seq: int
    stored_ns: int
    pending: int
    redelivered: bool
    msg: Msg = field(repr=False, compare=False)

    async def ack(self) -> None:
        """Acknowledge it (fire and forget: a lost ack means one redelivery)."""
        with translate(f"ack {self.subject}"):
            await self.msg.ack()

    async def term(self) -> None:
        """Tell the server never to deliver it again."""
        with translate(f"term {self.subject}"):
            await self.msg.term()


def delivery(msg: Msg) -> Delivery:
    """Return ``msg`` (from a JetStream consumer) as a `Delivery`."""
    md = msg.metadata
    ts = md.timestamp
    stored = int(ts.timestamp()) * 1_000_000_000 + ts.microsecond * 1000 if ts else 0
    return Delivery(msg.subject, msg.data, dict(msg.headers or {}), int(md.sequence.stream),
                    stored, int(md.num_pending or 0), int(md.num_delivered or 1) > 1,
                    msg)  # fmt: skip


class Pull:
    """One durable pull consumer bound on a `Link` (`open_pull`)."""

    def __init__(self, sub: nats.js.JetStreamContext.PullSubscription, name: str) -> None:
        self._sub, self.name = sub, name

    async def fetch(self, batch: int, timeout_s: float) -> list[Delivery]:
        """Return up to ``batch`` messages; an empty list when none came within ``timeout_s``."""
        with translate(f"fetch {self.name}"):
            try:
                msgs = await self._sub.fetch(batch, timeout=timeout_s)
            except TimeoutError:  # nats-py raises its own or asyncio's: nothing came in time
                return []
        return [delivery(m) for m in msgs]

    async def pending(self) -> int:
        """Return how many messages the consumer has yet to deliver (the server's count)."""
        with translate(f"consumer info {self.name}"):
            info = await self._sub.consumer_info()
        return int(info.num_pending or 0)

    async def close(self) -> None:
        """Stop the subscription (the durable consumer stays on the server)."""
        with translate(f"unsubscribe {self.name}"):
            await self._sub.unsubscribe()


async def open_pull(
    link: Link, stream: str, durable: str, subject: str, *, ack_wait_s: float,
    max_ack_pending: int = 100_000,
) -> Pull:  # fmt: skip
    """Bind durable pull consumer ``durable`` of ``stream`` (filter ``subject``), creating it
    (from the stream's first message) if absent."""
    cfg = ConsumerConfig(durable_name=durable, filter_subject=subject,
                         ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait_s,
                         deliver_policy=DeliverPolicy.ALL, max_ack_pending=max_ack_pending)  # fmt: skip
    with translate(f"consumer {stream}/{durable}"):
        sub = await link.js.pull_subscribe(subject, durable=durable, stream=stream, config=cfg)
    return Pull(sub, f"{stream}/{durable}")


async def consumer_names(link: Link, stream: str) -> list[str]:
    """Return the names of ``stream``'s consumers as the cluster's metadata holds them (the
    meta leader answers, also for a consumer whose own leader is being elected, when its
    info says "not found"). Raises `NatsUnavailable` when no answer comes in time."""
    subject = f"$JS.API.CONSUMER.NAMES.{stream}"
    with translate(f"consumer names {stream}"):
        msg = await link.nc.request(subject, b"{}", timeout=link.settings.timeout_s)
    doc = json.loads(msg.data or b"{}")
    if "error" in doc:
        raise NatsUnavailable(f"consumer names {stream}: {doc['error']}")
    return [str(n) for n in doc.get("consumers") or ()]


async def restart_from_ack_floor(
    link: Link, stream: str, durable: str, subject: str, *, ack_wait_s: float,
    max_ack_pending: int = 100_000,
) -> int:  # fmt: skip
    """Re-create durable consumer ``durable`` so it delivers again from its first
    unacknowledged message (the stream keeps what was acked: limits retention), at once
    rather than after the ack wait; return that stream sequence (1 for a new consumer).

    What an old owner acked above the floor comes again too: the caller must recognise work
    already committed (qpmesh's partials do: `controller.fleet.workerloop`). Raises
    `NatsUnavailable` when the consumer exists but its info cannot be read (its leader is
    being elected after a server died: `consumer_names` tells the two apart).
    """
    with translate(f"consumer {stream}/{durable}"):
        try:
            info = await link.js.consumer_info(stream, durable)
            start = int(info.ack_floor.stream_seq if info.ack_floor else 0) + 1
            await link.js.delete_consumer(stream, durable)
        except nats.js.errors.NotFoundError:
            if durable in await consumer_names(link, stream):
                # it exists, its leader is being elected: binding it as it stands would
                # continue past what the old owner held unacked (until the ack wait)
                raise NatsUnavailable(f"consumer {stream}/{durable}: no leader yet") from None
            return 1
        await link.js.add_consumer(stream, ConsumerConfig(
            durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start, max_ack_pending=max_ack_pending,
        ))  # fmt: skip
    return start


async def stored_at(link: Link, stream: str, seq: int) -> int | None:
    """Return when ``stream`` stored its message ``seq`` (UNIX ns), None when ``seq`` is
    below 1 or the message is gone (its age or the stream's size). Raises `NatsUnavailable`
    when the stream does not answer."""
    if seq < 1:
        return None
    with translate(f"stream {stream} message {seq}"):
        try:
            msg = await link.js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            return None
    ts = msg.time
    return int(ts.timestamp()) * 1_000_000_000 + ts.microsecond * 1000 if ts else None


async def open_reader(
    link: Link, stream: str, subject: str, start_seq: int = 1, *, start_ns: int | None = None
) -> Pull:
    """Bind an ephemeral pull consumer reading ``subject`` of ``stream`` from ``start_seq``
    (1: from the first message kept), or from the first message stored at or after
    ``start_ns`` (UNIX ns) when given, with no acks (a reader that keeps its own place)."""
    if start_ns is not None:
        when = datetime.fromtimestamp(start_ns / 1e9, UTC)
        cfg = ConsumerConfig(filter_subject=subject, ack_policy=AckPolicy.NONE,
                             deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=when,
                             inactive_threshold=60.0)  # fmt: skip
    else:
        cfg = ConsumerConfig(filter_subject=subject, ack_policy=AckPolicy.NONE,
                             deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                             opt_start_seq=max(start_seq, 1), inactive_threshold=60.0)  # fmt: skip
    with translate(f"reader {stream}"):
        sub = await link.js.pull_subscribe(subject, stream=stream, config=cfg)
    return Pull(sub, f"{stream}/reader")
