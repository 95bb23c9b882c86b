"""Stamp errors: software-stamp bias and outliers, completion-queue send stamps, gross bad
hardware stamps (pure, seeded).

Kernel stamps come late by a host-specific amount (driver, interrupt coalescing, kernel
version): a constant bias per host and direction U(-b, b), and rare scheduler / IRQ outliers of
tens of µs (`StampModel`). NIC stamps (docs/simulator.md, "NIC clocks as they are"):

* **completion-queue (CQE) send stamps** (``--timestamps cqe``, qpmesh's RDMA path): mlx5
  stamps a send when it writes the TX completion, "much earlier than when the packet actually
  goes out to the wire" (~600 ns at 100 Gb/s, against < 40 ns with the port-timestamp mode;
  Linux merge "mlx5e port TX timestamping support", mlx5-updates-2020-12-01), so the stamp is
  taken before the NIC's own egress queue and leads the wire by a per-NIC constant
  (`cqe_lead_ns`) plus a per-stamp jitter (`cqe_jitter_ns`: the port stamp "has less jitter",
  the same series);
* **gross bad stamps** (`bad_stamps_ns`): a stamp off by 1-50 µs either way, rarely.

The engine's own hw-stamp TX outliers of 10-300 ns (the ideal model's) are unchanged.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]


class StampModel:
    """Extra software-stamp delay per stamp: host bias + outliers."""

    def __init__(self, n_hosts: int, knobs: ModelKnobs, seed: int) -> None:
        self.knobs = knobs
        rng = np.random.default_rng([seed, 401])
        b = knobs.sw_host_bias_ns
        self.bias_tx: F64 = rng.uniform(-b, b, n_hosts)
        self.bias_rx: F64 = rng.uniform(-b, b, n_hosts)

    def extra_ns(self, host: npt.NDArray[np.int64], *, tx: bool, rng: np.random.Generator) -> F64:
        """Return the extra delay (ns) of software stamps taken on ``host`` (one per stamp)."""
        k = self.knobs
        bias = (self.bias_tx if tx else self.bias_rx)[host]
        if k.sw_outlier_prob <= 0:
            return np.asarray(bias, dtype=np.float64)
        n = len(host)
        out = rng.random(n) < k.sw_outlier_prob
        return np.asarray(
            bias + np.where(out, rng.uniform(*k.sw_outlier_us, n) * 1000.0, 0.0), dtype=np.float64
        )


def cqe_lead_ns(n_nics: int, knobs: ModelKnobs, seed: int) -> F64:
    """Per NIC, how long before the wire its CQE send stamps are taken (ns): ``cqe_lead_ns``
    plus a constant U(-s, s) per NIC (``cqe_lead_spread_ns``). A measured one-way delay is that
    much longer, and the difference between two NICs' leads is a constant asymmetry."""
    rng = np.random.default_rng([seed, 402])
    s = knobs.cqe_lead_spread_ns
    return np.asarray(knobs.cqe_lead_ns + rng.uniform(-s, s, n_nics), dtype=np.float64)


def cqe_jitter_ns(n: int, knobs: ModelKnobs, rng: np.random.Generator) -> F64:
    """Per CQE send stamp, how much earlier than its NIC's lead it was taken (ns: exponential
    with mean ``cqe_jitter_ns``; zeros when that is 0, with nothing drawn)."""
    if knobs.cqe_jitter_ns <= 0:
        return np.zeros(n)
    return np.asarray(rng.exponential(knobs.cqe_jitter_ns, n), dtype=np.float64)


def bad_stamps_ns(n: int, knobs: ModelKnobs, rng: np.random.Generator) -> F64 | None:
    """Per NIC stamp its gross error (ns): with probability ``hw_bad_stamp_prob`` U(lo, hi) µs
    of ``hw_bad_stamp_us`` with a random sign, else 0; None when the probability is 0 (nothing
    drawn)."""
    p = knobs.hw_bad_stamp_prob
    if p <= 0:
        return None
    bad = rng.random(n) < p
    m = int(bad.sum())
    out = np.zeros(n)
    out[bad] = rng.uniform(*knobs.hw_bad_stamp_us, m) * 1e3 * rng.choice([-1.0, 1.0], m)
    return out
