"""The prober's JetStream sender: the spool forgets a batch only on the stream's ack (a
duplicate ack counts as delivered), order kept through lost connections, batches too large
for the server dropped and counted; the ``[nats]`` table; and against a real 3-server cluster
with the prober's server killed mid-run: every batch stored once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from natslink.errors import NatsUnavailable
from natslink.link import Ack, connect
from natslink.settings import NatsSettings
from natslink.streams import StreamSpec, ensure_stream
from prober.config import ConfigError, parse_config
from prober.jspublish import JetStreamBatches, LinkLike
from prober.publish import Publisher
from prober.spool import Spool
from tests.natscluster import Cluster, nats_cluster, read_stored
from tests.waiting import until

__all__ = ["nats_cluster"]

HOST = "hostA"


class FakeStream:
    """A stream that de-duplicates by message id; ``up`` decides connects; ``lose_ack``:
    message ids whose publish is stored but whose ack is lost (once each)."""

    def __init__(self, max_payload: int = 1 << 20) -> None:
        self.up = True
        self.stored: dict[str, bytes] = {}
        self.order: list[str] = []
        self.lose_ack: set[str] = set()
        self.max_payload = max_payload
        self.connects = 0

    def factory(self):  # type: ignore[no-untyped-def]
        stream = self

        class FakeLink:
            def __init__(self) -> None:
                self.lost = asyncio.Event()
                self.max_payload = stream.max_payload
                self.server = "nats://fake:4222"

            async def publish(self, subject: str, payload: bytes, *, msg_id: str = "") -> Ack:
                assert subject == f"qpmesh.v1.probes.{HOST}"
                if not stream.up:
                    self.lost.set()
                    raise NatsUnavailable("lost")
                dup = msg_id in stream.stored
                if not dup:
                    stream.stored[msg_id] = payload
                    stream.order.append(msg_id)
                if msg_id in stream.lose_ack:
                    stream.lose_ack.discard(msg_id)
                    raise NatsUnavailable("publish: TimeoutError")
                return Ack("P", len(stream.order), dup)

        @asynccontextmanager
        async def make(settings: NatsSettings, name: str) -> AsyncIterator[LinkLike]:
            if not stream.up:
                raise NatsUnavailable("connect: refused")
            stream.connects += 1
            yield FakeLink()

        return make


def test_spool_forgets_only_on_ack_and_duplicates_count_as_delivered() -> None:
    stream = FakeStream(max_payload=4096)
    spool = Spool()
    delays: list[float] = []

    async def fake_sleep(d: float) -> None:
        delays.append(d)
        stream.up = True  # the servers come back after one backoff
        await asyncio.sleep(0)

    settings = NatsSettings(backoff_min_s=0.5, backoff_max_s=4.0)
    sender = JetStreamBatches(settings, HOST, spool, link_factory=stream.factory(),
                              sleep=fake_sleep)  # fmt: skip

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        stream.lose_ack.add(f"{HOST}:2")  # stored, ack lost: sent again, ack says duplicate
        for seq in (1, 2, 3):
            spool.put(seq, b"b%d" % seq)
            sender.wake()
        await until(lambda: len(spool) == 0, 10.0)
        spool.put(4, bytes(5000))  # over max_payload: dropped, counted, not blocking
        spool.put(5, b"b5")
        sender.wake()
        await until(lambda: len(spool) == 0, 10.0)
        stream.up = False  # servers away: the batch stays spooled, in order
        spool.put(6, b"b6")
        sender.wake()
        await until(lambda: len(delays) >= 1 and len(spool) == 0, 10.0)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert stream.order == [f"{HOST}:{s}" for s in (1, 2, 3, 5, 6)]
    assert sender.duplicates == 1 and sender.too_large == 1 and spool.dropped_batches == 1
    assert spool.delivered == 5 and sender.published == 5 and sender.errors >= 2
    assert delays and 0.4 <= delays[0] <= 0.5  # the [nats] backoff, with jitter


def test_publisher_hands_batches_to_the_sender() -> None:
    spool = Spool()

    class Sender:
        woken = 0

        def wake(self) -> None:
            Sender.woken += 1

        async def run(self, stop: asyncio.Event) -> None:
            await stop.wait()

        def counters(self) -> dict[str, int]:
            return {"nats_published": 7}

    from mqttlink.settings import BrokerSettings

    pub = Publisher(BrokerSettings(), HOST, spool, batches=Sender())
    pub.submit(1, b"x")
    assert Sender.woken == 1 and len(spool) == 1 and pub.counters()["nats_published"] == 7


def _cfg(extra: str, host: str = "h1") -> str:
    return (f'[prober]\nhost = "{host}"\n[[nics]]\nid = "n0"\naddress = "10.0.0.1"\n'
            + extra)  # fmt: skip


def test_prober_config_nats_table() -> None:
    import tomllib

    cfg = parse_config(
        tomllib.loads(_cfg('[nats]\nservers = ["nats://10.0.0.9:4222"]\n')), "p.toml"
    )
    assert cfg.nats is not None and cfg.nats.servers == ("nats://10.0.0.9:4222",)
    assert parse_config(tomllib.loads(_cfg("")), "p.toml").nats is None
    with pytest.raises(ConfigError, match=r"p\.toml: prober\.host: with \[nats\]"):
        parse_config(tomllib.loads(_cfg('[nats]\nservers = ["nats://a:1"]\n', "h.1")), "p.toml")
    with pytest.raises(ConfigError, match=r"p\.toml: nats\.port: unknown key"):
        parse_config(tomllib.loads(_cfg('[nats]\nservers = ["nats://a:1"]\nport = 1\n')), "p.toml")


@pytest.mark.slow
def test_cluster_server_killed_every_batch_stored_once(
    nats_cluster: Cluster, tmp_path: Path
) -> None:
    """The prober's server is killed mid-run: the sender reconnects to another server and
    every batch is in the (R3) stream exactly once; the spool on disk kept them meanwhile."""
    subj = nats_cluster.subjects
    settings = NatsSettings(servers=nats_cluster.urls, timeout_s=2.0, connect_timeout_s=1.0,
                            backoff_min_s=0.1, backoff_max_s=0.5)  # fmt: skip
    spool = Spool(directory=tmp_path / "spool")
    sender = JetStreamBatches(settings, HOST, spool)
    spec = StreamSpec("PROBES", (subj.probes_mapped(),), max_bytes=64 << 20)

    async def main() -> list[bytes]:
        async with connect(settings, "setup") as link:
            for _ in range(100):
                try:
                    await ensure_stream(link, spec)
                    break
                except NatsUnavailable:
                    await asyncio.sleep(0.2)
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        for seq in range(1, 41):
            spool.put(seq, b"batch-%d" % seq)
            sender.wake()
            if seq == 15:
                await until(lambda: len(spool) == 0, 10.0)
                port = int(sender.server.rsplit(":", 1)[1])  # the server the sender is on
                nats_cluster.kill([s.port for s in nats_cluster.specs].index(port))
            await asyncio.sleep(0.02)
        await until(lambda: len(spool) == 0, 30.0)
        stop.set()
        await asyncio.wait_for(task, 10)
        async with connect(settings, "check") as link:
            for _ in range(100):  # the cluster may still be electing a new meta leader
                try:
                    return [d.data for d in await read_stored(link, "PROBES", subj.probes_mapped())]
                except NatsUnavailable:
                    await asyncio.sleep(0.2)
            raise AssertionError("no reader of PROBES in 100 tries")

    got = asyncio.run(main())
    assert sorted(got) == sorted(b"batch-%d" % s for s in range(1, 41))  # each exactly once
    assert sender.connects >= 2 and spool.delivered == 40
    assert not list((tmp_path / "spool").glob("*.qpb"))
