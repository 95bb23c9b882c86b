"""The prober's periodic signal windows: readings in, `SignalsDoc` windows out (pure).

`signals_config` says what the agent's collector reads: every configured NIC with a network
device (its RDMA device and port when it has one), the GPUs when ``gpus``, the host's procfs
signals. `SignalsFeed.offer` turns successive readings into windows
(`prober.telemetry.collector.window`): the first reading only starts one, and a reading not
after the previous one (the wall clock stepped back) starts again instead of raising.
"""

from __future__ import annotations

from collections.abc import Iterable

from contract.signals import SignalsDoc
from prober.config import NicConfig
from prober.telemetry.collector import CollectorConfig, NicSource, Reading, window


def signals_config(host: str, nics: Iterable[NicConfig], gpus: bool) -> CollectorConfig:
    """Return the collector configuration of ``host``'s NICs with a ``device``."""
    sources = tuple(
        NicSource(n.id, n.device, (n.rdma_device, n.rdma_port) if n.rdma_device else None)
        for n in nics
        if n.device
    )
    return CollectorConfig(host, sources, gpus=gpus)


class SignalsFeed:
    """Windows of one host's signals from successive readings."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.prev: Reading | None = None
        self.windows = 0

    def offer(self, reading: Reading) -> SignalsDoc | None:
        """Return the window from the previous reading to ``reading`` (None for the first,
        or when ``reading`` is not after the previous one); keep ``reading``."""
        prev, self.prev = self.prev, reading
        if prev is None or reading.t_ns <= prev.t_ns:
            return None
        self.windows += 1
        return window(prev, reading, self.host)
