"""Per-host software-stamp bias and outliers (pure, seeded).

Kernel stamps come late by a host-specific amount (driver, interrupt coalescing, kernel
version): a constant bias per host and direction U(-b, b), and rare scheduler / IRQ outliers of
tens of µs. Hardware stamps are untouched here (their TX outliers live in the engine).
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
