"""HCA clock: raw completion timestamps (NIC cycles) to nanoseconds, pure and vectorized.

A CQ created with ``IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`` reports the free-running NIC cycle
counter (``read_timestamp``). The NIC runs at ``hca_core_clock`` kHz (``query_device_ex``)
and the counter wraps at ``completion_timestamp_mask``. `HcaClock` anchors the counter with
one reference pair (cycles, ns) from ``query_rt_values_ex`` read next to a host clock read,
and converts linearly:

    ns = ref_ns + wrap(cycles - ref_cycles) * 1e6 / khz

with the cycle difference taken modulo the mask as a signed value (so stamps shortly before
the reference work too). The probe math only needs one consistent clock per NIC: the anchor
offset cancels in the clock-sync fit, the rate (khz) must be right. Re-anchor periodically
(`HcaClock.reanchor`) so the difference stays well inside the wrap period.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class HcaClock:
    """Linear cycle -> ns map of one NIC; validated (ValueError)."""

    khz: int
    ref_cycles: int
    ref_ns: int
    mask: int = (1 << 64) - 1

    def __post_init__(self) -> None:
        if self.khz <= 0:
            raise ValueError(f"hca_core_clock must be positive kHz, got {self.khz}")
        if self.mask <= 0 or self.mask & (self.mask + 1):
            raise ValueError(f"timestamp mask must be 2**k - 1, got {self.mask:#x}")
        if not 0 <= self.ref_cycles <= self.mask:
            raise ValueError("reference cycles outside the counter mask")

    def _delta(self, cycles: int) -> int:
        d = (cycles - self.ref_cycles) & self.mask
        half = (self.mask + 1) >> 1
        return d - (self.mask + 1) if d >= half else d

    def to_ns(self, cycles: int) -> int:
        """Return NIC time in ns of raw counter value ``cycles`` (exact integer math)."""
        return self.ref_ns + (self._delta(int(cycles)) * 1_000_000) // self.khz

    def to_ns_array(self, cycles: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Return `to_ns` of every element (object math for 64-bit safety, then int64)."""
        arr = np.asarray(cycles, dtype=np.uint64).ravel()
        return np.array([self.to_ns(int(c)) for c in arr], dtype=np.int64)

    def reanchor(self, cycles: int) -> HcaClock:
        """Return the same clock anchored at ``cycles`` (keeps the mapping, resets the base)."""
        return replace(self, ref_cycles=int(cycles) & self.mask, ref_ns=self.to_ns(cycles))

    @property
    def wrap_ns(self) -> int:
        """Return how many ns the counter takes to wrap."""
        return ((self.mask + 1) * 1_000_000) // self.khz
