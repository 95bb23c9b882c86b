"""natslink: settings, subjects, the partition hash, lease timing (pure), and against a real
3-server cluster: connect, R3 streams with de-duplication, leases, consumers restarted at
their ack floor, errors translated at the boundary."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from contract.tomlcheck import Table, parse_toml
from natslink.errors import NatsRefused, NatsUnavailable, translate
from natslink.lease import LeaseClock, Leases
from natslink.link import connect
from natslink.serverconf import mapping
from natslink.settings import NatsSettings, read_nats
from natslink.streams import (
    BucketSpec,
    StreamSpec,
    consumer_names,
    ensure_bucket,
    ensure_stream,
    open_pull,
    open_reader,
    restart_from_ack_floor,
)
from natslink.subjects import SubjectError, Subjects, fnv1a32, partition_of
from tests.natscluster import Cluster, nats_cluster

__all__ = ["nats_cluster"]


class _Bad(ValueError):
    pass


def _read(text: str) -> NatsSettings | None:
    root = Table.root(parse_toml(text, "c.toml", _Bad), "c.toml", _Bad)
    tab = root.table("nats")
    out = read_nats(tab, None)
    tab.finish()
    return out


def test_settings_read_and_errors() -> None:
    s = _read('[nats]\nservers = ["nats://a:4222", "nats://b:4222"]\ntimeout_s = 2\n')
    assert s is not None and s.servers == ("nats://a:4222", "nats://b:4222")
    assert s.timeout_s == 2.0 and s.subjects.probes("h1") == "qpmesh.v1.probes.h1"
    assert _read("") is None
    for text, msg in [
        ("[nats]\ntimeout_s = 1\n", "c.toml: nats.servers: is required"),
        ('[nats]\nservers = ["mqtt://a:1"]\n', "c.toml: nats: server must look like"),
        ('[nats]\nservers = ["nats://a:1"]\nsubject_prefix = "a..b"\n', "subject prefix level"),
        ('[nats]\nservers = ["nats://a:1"]\nbogus = 1\n', "c.toml: nats.bogus: unknown key"),
        ('[nats]\nservers = ["nats://u:p@a:1"]\n', "credentials belong in"),
        ('[nats]\nservers = ["nats://a:1"]\npassword_file = "x"\n', "needs a username"),
    ]:
        with pytest.raises(_Bad, match=msg.replace(".", r"\.")):
            _read(text)


def test_mqtt_and_nats_share_one_connection_shape_and_its_reader() -> None:
    """The timeout, backoff, drain and security of ``[mqtt]`` and ``[nats]`` are one shape
    (`contract.connection.ClientLink`), validated and read by one piece of code."""
    from contract.connection import ClientLink
    from mqttlink.settings import BrokerSettings
    from prober.config import read_mqtt

    for cls in (BrokerSettings, NatsSettings):
        assert issubclass(cls, ClientLink)
        for bad in ({"timeout_s": 0.0}, {"backoff_min_s": 2.0, "backoff_max_s": 1.0},
                    {"drain_on_stop_s": -1.0}):  # fmt: skip
            with pytest.raises(ValueError):
                cls(**bad)

    def read_mqtt_text(text: str) -> BrokerSettings:
        return read_mqtt(
            Table.root(parse_toml(text, "c.toml", _Bad), "c.toml", _Bad).table("mqtt"), None
        )

    keys = 'timeout_s = 3\nbackoff_min_s = 0.5\nbackoff_max_s = 7\nusername = "u"\n'
    for got in (
        read_mqtt_text(f"[mqtt]\n{keys}"),
        _read(f'[nats]\nservers = ["nats://a:1"]\n{keys}'),
    ):
        assert got is not None and got.security.username == "u"
        assert (got.timeout_s, got.backoff_min_s, got.backoff_max_s) == (3.0, 0.5, 7.0)
    with pytest.raises(_Bad, match=r"c\.toml: mqtt\.backoff_min_s: must be \(0, 60\]"):
        read_mqtt_text("[mqtt]\nbackoff_min_s = 0\n")
    with pytest.raises(_Bad, match=r"c\.toml: nats\.backoff_min_s: must be \(0, 60\]"):
        _read('[nats]\nservers = ["nats://a:1"]\nbackoff_min_s = 0\n')


def test_partition_hash_is_fnv1a_and_hosts_are_one_token() -> None:
    assert fnv1a32(b"") == 0x811C9DC5 and fnv1a32(b"a") == 0xE40C292C  # FNV-1a test vectors
    # the four values nats-server 2.9.10 gave for partition(8,1) (measured here)
    assert [partition_of(h, 8) for h in ("host0", "host1", "hostA", "h-3")] == [5, 2, 2, 7]
    for bad in ("a.b", "a*", ">", "a b", ""):
        with pytest.raises(SubjectError):
            Subjects().probes(bad)
    assert "{{partition(8,1)}}" in mapping(Subjects(), 8)
    with pytest.raises(SubjectError):
        mapping(Subjects(), 0)


def test_lease_clock() -> None:
    c = LeaseClock(3.0)
    assert c.renew_s == 1.0 and c.margin_s == pytest.approx(0.6)
    assert c.valid(10.0, 12.3) and not c.valid(10.0, 12.4)
    assert not c.renew_due(10.0, 10.9) and c.renew_due(10.0, 11.0)
    with pytest.raises(ValueError):
        LeaseClock(3.0, renew_s=2.5)


def _settings(cluster: Cluster, *servers: int, timeout_s: float = 5.0) -> NatsSettings:
    urls = tuple(cluster.urls[i] for i in servers) if servers else cluster.urls
    return NatsSettings(servers=urls, timeout_s=timeout_s, connect_timeout_s=1.0)


async def _retry(coro_fn, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    """Run ``coro_fn()`` until it does not raise NatsUnavailable (a cluster electing leaders)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await coro_fn()
        except NatsUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.slow
def test_cluster_stream_dedup_leases_and_ack_floor(nats_cluster: Cluster) -> None:
    subj = nats_cluster.subjects
    spec = StreamSpec(
        "T_PROBES", (subj.probes_mapped(),), replicas=3, duplicate_window_s=60, max_bytes=64 << 20
    )

    async def main() -> None:
        async with connect(_settings(nats_cluster), "test") as link:
            await _retry(lambda: ensure_stream(link, spec))
            await ensure_stream(link, spec)  # idempotent
            with pytest.raises(NatsRefused, match="captures"):
                await ensure_stream(link, StreamSpec("T_PROBES", ("other.>",)))
            a1 = await link.publish(subj.probes("host0"), b"one", msg_id="host0:1")
            a2 = await link.publish(subj.probes("host0"), b"one", msg_id="host0:1")
            a3 = await link.publish(subj.probes("host1"), b"two", msg_id="host1:1")
            assert not a1.duplicate and a2.duplicate and a2.seq == a1.seq and a3.seq == a1.seq + 1
            with pytest.raises(NatsRefused, match="max_payload"):
                await link.publish(subj.probes("host0"), bytes(link.max_payload + 1))
            # the servers' max_payload (natslink.serverconf.MAX_PAYLOAD; nats-server's default
            # is 1 MB): larger KV values travel as chunks under it (natslink.bigkv)
            assert link.max_payload == 8 << 20

            # host0 -> partition 5: its consumer sees only its batch
            p5 = subj.probes_partition(partition_of("host0", 8))
            pull = await open_pull(link, "T_PROBES", "p5", p5, ack_wait_s=30)
            got = await pull.fetch(10, 2.0)
            assert [d.data for d in got] == [b"one"] and got[0].pending == 0
            assert got[0].subject == "qpmesh.v1.probes.5.host0"
            await link.publish(subj.probes("host0"), b"three", msg_id="host0:2")
            more = await pull.fetch(10, 2.0)
            await more[0].ack()
            await link.nc.flush()
            assert await pull.fetch(10, 0.2) == []
            await pull.close()
            # the first stays unacked: a new owner starts again there, at once
            assert "p5" in await consumer_names(link, "T_PROBES")
            start = await restart_from_ack_floor(link, "T_PROBES", "p5", p5, ack_wait_s=30)
            assert start == got[0].stream_seq
            assert await restart_from_ack_floor(link, "T_PROBES", "p9", p5, ack_wait_s=30) == 1
            pull = await open_pull(link, "T_PROBES", "p5", p5, ack_wait_s=30)
            again = await pull.fetch(10, 2.0)
            assert [d.data for d in again] == [b"one", b"three"]
            reader = await open_reader(link, "T_PROBES", subj.probes_mapped(), a3.seq)
            assert [d.data for d in await reader.fetch(10, 2.0)] == [b"two", b"three"]

            bucket = await _retry(lambda: ensure_bucket(link, BucketSpec("t_leases", ttl_s=2)))
            assert bucket.ttl_s == pytest.approx(2.0)
            now = [100.0]
            w1 = Leases("w1", LeaseClock(bucket.ttl_s), now=lambda: now[0])
            w2 = Leases("w2", LeaseClock(bucket.ttl_s), now=lambda: now[0])
            w1.bind(bucket)
            w2.bind(bucket)
            assert await w1.claim("part.0") and not await w2.claim("part.0")
            now[0] += 1.0
            assert await w1.renew() == [] and w1.valid("part.0")
            assert (await bucket.get("part.0")).value == b"w1"  # type: ignore[union-attr]
            # w1 falls silent: the servers expire its lease, w2 takes it, w1 learns it lost
            for _ in range(60):
                if await w2.claim("part.0"):
                    break
                await asyncio.sleep(0.1)
            assert w2.valid("part.0")
            now[0] += 1.0  # w1's renewal is due: it finds the key taken
            assert await w1.renew() == ["part.0"] and not w1.valid("part.0")
            await w2.release("part.0")
            assert await bucket.get("part.0") is None
            big = os.urandom(3 << 20)  # over the default 1 MB, as a 100,000-NIC fabric version
            await bucket.put("fabric", big)
            assert (await bucket.get("fabric")).value == big  # type: ignore[union-attr]

    asyncio.run(main())


@pytest.mark.slow
def test_errors_are_translated(nats_cluster: Cluster, tmp_path: Path) -> None:
    async def main() -> None:
        dead = NatsSettings(servers=("nats://127.0.0.1:1",), connect_timeout_s=0.5)
        with pytest.raises(NatsUnavailable, match="connect"):
            async with connect(dead, "t"):
                pass
        # the connection's server dies: the link says so and the next request raises
        async with connect(_settings(nats_cluster, 0, timeout_s=1.0), "t") as link:
            nats_cluster.kill(0)
            await asyncio.wait_for(link.lost.wait(), 10)
            with pytest.raises(NatsUnavailable):
                await link.publish("qpmesh.v1.probes.h", b"x", msg_id="h:1")
        # another server of the list answers
        async with connect(_settings(nats_cluster), "t") as link:
            assert not link.server.endswith(f":{nats_cluster.specs[0].port}")

    asyncio.run(main())


def test_a_cancel_the_library_swallowed_is_delivered_at_the_boundary() -> None:
    """nats-py's `asyncio.wait_for` on Python 3.11 returns the call's result when the cancel
    comes as the call completes (cpython gh-86296); `translate` delivers the cancel then."""

    swallowed: list[bool] = []

    async def call_that_swallows() -> str:  # what wait_for does in that race (once)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)
            return "a message"
        return "timed out"

    async def loop(went_on: list[str]) -> None:
        while True:
            with translate("fetch"):
                went_on.append(await call_that_swallows())

    async def main() -> list[str]:
        went_on: list[str] = []
        task = asyncio.create_task(loop(went_on))
        await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert task in done, "the cancel was lost: the loop runs on"
        assert task.cancelled()
        return went_on

    assert asyncio.run(main()) == ["a message"]  # the call's result, then the cancel
    with translate("a synchronous call"):  # no running loop: nothing to deliver
        pass


def test_a_task_unwinding_from_its_cancel_runs_every_cleanup_call() -> None:
    """A cancel already delivered is not raised again by `translate`: a ``finally`` that
    closes a reader and then a connection (two calls) runs both."""
    closed: list[str] = []

    async def session() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            for what in ("reader", "connection"):
                with translate(f"close {what}"):
                    await asyncio.sleep(0)
                closed.append(what)

    async def main() -> None:
        task = asyncio.create_task(session())
        await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert task in done and task.cancelled()

    asyncio.run(main())
    assert closed == ["reader", "connection"]
