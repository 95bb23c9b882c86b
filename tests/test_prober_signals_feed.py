"""The prober's periodic signal windows: `[signals] interval_s` (on by default), the pure
feed from readings to windows, what the collector reads, and the publisher's latest-only
``signals/<host>`` queue over a fake broker."""

from __future__ import annotations

import pytest

from contract.signals import Entity, SignalsDoc
from prober.config import ConfigError, ProberConfig, parse_config
from prober.publish import Publisher
from prober.spool import Spool
from prober.telemetry.collector import Reading
from prober.telemetry.feed import SignalsFeed, signals_config
from tests.test_prober_publish import HOST, FakeBroker, FakeSleep, run_until, settings

S = 10**9


def cfg(**signals: object) -> ProberConfig:
    return parse_config(
        {"prober": {"host": "h0"}, "signals": signals,
         "nics": [{"id": "nic0", "address": "10.0.0.1", "device": "eth0", "rdma_device": "mlx5_0"},
                  {"id": "nic1", "address": "10.0.0.2"}]},
        "p.toml",
    )  # fmt: skip


def test_signals_are_on_every_10_s_by_default_and_0_turns_them_off() -> None:
    assert cfg().signals_interval_s == 10.0
    assert cfg(interval_s=0.0).signals_interval_s == 0.0
    with pytest.raises(ConfigError, match=r"signals.interval_s"):
        cfg(interval_s=0.5)
    with pytest.raises(ConfigError, match=r"signals.every"):
        cfg(every=3.0)


def test_the_collector_reads_the_nics_with_a_device() -> None:
    c = signals_config("h0", cfg().nics, gpus=False)
    assert [(n.nic, n.netdev, n.rdma) for n in c.nics] == [("nic0", "eth0", ("mlx5_0", 1))]
    assert c.host == "h0" and not c.gpus and c.host_signals


def reading(t_s: int, rx: float) -> Reading:
    return Reading(t_s * S, {Entity.NIC: {"nic0": {"rx_bytes": rx, "mtu": 9000.0}}})


def test_the_feed_makes_a_window_of_each_two_readings_and_skips_a_clock_step_back() -> None:
    feed = SignalsFeed("h0")
    assert feed.offer(reading(10, 1000.0)) is None  # the first only starts one
    doc = feed.offer(reading(20, 6000.0))
    assert isinstance(doc, SignalsDoc) and doc.host == "h0" and doc.interval_s == 10.0
    assert doc.get("nic", "nic0", "rx_bytes") == 500.0 and doc.get("nic", "nic0", "mtu") == 9000.0
    assert feed.offer(reading(15, 7000.0)) is None  # stepped back: starts again
    again = feed.offer(reading(25, 12000.0))
    assert again is not None and again.get("nic", "nic0", "rx_bytes") == 500.0
    assert feed.windows == 2


async def test_only_the_latest_window_goes_out_on_signals_host() -> None:
    broker = FakeBroker()
    broker.up = True
    pub = Publisher(settings(), HOST, Spool(), client_factory=broker.factory(), sleep=FakeSleep())
    pub.set_signals(b'{"w":1}')
    pub.set_signals(b'{"w":2}')
    await run_until(pub, lambda: any("/signals/" in t for t, _, _ in broker.received))
    sent = [p for t, p, _ in broker.received if t == f"qpmesh/v1/signals/{HOST}"]
    assert sent == [b'{"w":2}']
