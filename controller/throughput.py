"""NIC throughput from the probers' health documents (pure: values in, values out).

Each prober's health document carries, per NIC, the kernel's cumulative byte counters
(``nics[<nic id>].counters.rx_bytes/tx_bytes``, `prober.telemetry.nic`; -1 = unavailable).
`nic_byte_counters` reads them out of a document; `NicRates` turns two readings of one NIC
into its rate over that interval, and `NicRates.average_bps` is the header's "average NIC
throughput": the mean over NICs with a fresh rate of each NIC's busier direction
(max(rx, tx) in bits/s, comparable with its line rate). None when no NIC has two readings yet
(no prober sends counters: the simulator, a prober without sysfs) — unknown, never 0.
A counter that went backwards (driver reload) starts that NIC over.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def nic_byte_counters(nics: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Return ``{nic id: (rx_bytes, tx_bytes)}`` of a health document's ``nics`` section,
    leaving out NICs whose counters are missing, unavailable (< 0) or not integers."""
    out: dict[str, tuple[int, int]] = {}
    for nic, doc in nics.items():
        c = doc.get("counters") if isinstance(doc, Mapping) else None
        if not isinstance(c, Mapping):
            continue
        rx, tx = c.get("rx_bytes"), c.get("tx_bytes")
        if (isinstance(rx, int) and isinstance(tx, int) and not isinstance(rx, bool)
                and not isinstance(tx, bool) and rx >= 0 and tx >= 0):  # fmt: skip
            out[str(nic)] = (rx, tx)
    return out


@dataclass(frozen=True, slots=True)
class Rate:
    """One NIC's rate over its last interval: bits/s received and sent, measured by the
    prober at ``t_ns`` (its clock), received by the controller at ``at_ns`` (ours)."""

    rx_bps: float
    tx_bps: float
    t_ns: int
    at_ns: int


class NicRates:
    """Per-NIC byte counters -> rates (time passed in: the prober's stamp of each reading)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int, int]] = {}
        self.rates: dict[str, Rate] = {}

    def update(self, nic: str, rx_bytes: int, tx_bytes: int, t_ns: int, now_ns: int) -> Rate | None:
        """Record a reading of ``nic`` taken at ``t_ns`` (the prober's stamp: the interval is
        measured on its clock) and received at ``now_ns`` (ours: freshness); return its rate
        since the previous reading, or None (first reading, no time passed, or a counter went
        backwards)."""
        prev = self._last.get(nic)
        if prev is not None and t_ns <= prev[2]:
            return None  # a reading out of order or repeated: keep what we have
        self._last[nic] = (rx_bytes, tx_bytes, t_ns)
        if prev is None or rx_bytes < prev[0] or tx_bytes < prev[1]:
            self.rates.pop(nic, None)
            return None
        dt_s = (t_ns - prev[2]) / 1e9
        rate = Rate((rx_bytes - prev[0]) * 8 / dt_s, (tx_bytes - prev[1]) * 8 / dt_s, t_ns, now_ns)
        self.rates[nic] = rate
        return rate

    def forget(self, nic: str) -> None:
        """Drop ``nic`` (it left the fabric)."""
        self._last.pop(nic, None)
        self.rates.pop(nic, None)

    def average_bps(self, now_ns: int, stale_ns: int) -> float | None:
        """Return the mean over NICs whose rate arrived at most ``stale_ns`` before ``now_ns``
        of max(rx, tx) bits/s, or None when no NIC has a fresh rate."""
        fresh = [
            max(r.rx_bps, r.tx_bps) for r in self.rates.values() if now_ns - r.at_ns <= stale_ns
        ]
        return sum(fresh) / len(fresh) if fresh else None
