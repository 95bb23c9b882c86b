"""Clock frequency wander: a random walk of frequency plus temperature steps (pure, seeded).

Frequency is piecewise constant on a grid of ``DT_S``; it takes a Gaussian step of
``wander_ppb_sqrt_s * sqrt(DT_S)`` ppb per knot (random-walk FM: the frequency's variance grows
linearly with time) and, with a Poisson rate per NIC, a temperature step of +-``temp_step_ppb``.
The offset it adds is the integral (continuous, piecewise linear). The grid is extended lazily
in fixed chunks, so values do not depend on the order of queries; knots more than
``HISTORY_S`` behind the latest one reached are dropped as it grows, so a day's run holds a
bounded grid (a query that far back raises ValueError).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]
DT_S = 1.0
CHUNK = 64
HISTORY_S = 600.0  # knots kept behind the latest one reached (a step's stamps look back ms)


class ClockWander:
    """Offset (ns) added to each NIC's clock by frequency wander, at any true time >= 0."""

    def __init__(self, n_nics: int, knobs: ModelKnobs, seed: int) -> None:
        self.n, self.knobs = n_nics, knobs
        self._rng = np.random.default_rng([seed, 301])
        self.base = 0  # the knot of column 0 of ``freq_ppb`` and ``off_ns``
        self.freq_ppb = np.zeros((n_nics, 0))
        self.off_ns = np.zeros((n_nics, 0))
        self._extend(1)

    def _extend(self, knots: int) -> None:
        k = self.knobs
        while self.base + self.freq_ppb.shape[1] < knots + 1:
            step = self._rng.normal(0.0, k.wander_ppb_sqrt_s * np.sqrt(DT_S), (self.n, CHUNK))
            p = k.temp_steps_per_h * DT_S / 3600.0
            temp = (self._rng.random((self.n, CHUNK)) < p) * self._rng.choice(
                [-1.0, 1.0], (self.n, CHUNK)
            )
            step = step + temp * k.temp_step_ppb
            last_f = self.freq_ppb[:, -1] if self.freq_ppb.shape[1] else np.zeros(self.n)
            last_o = self.off_ns[:, -1] if self.off_ns.shape[1] else np.zeros(self.n)
            if not self.freq_ppb.shape[1]:
                step[:, 0] = 0.0  # the wander starts at zero frequency error at t = 0
            f = last_f[:, None] + np.cumsum(step, axis=1)
            # offset at each knot start: integral of the previous knots' frequency
            prev = np.concatenate([last_f[:, None], f[:, :-1]], axis=1)
            if not self.freq_ppb.shape[1]:
                prev[:, 0] = 0.0
            o = last_o[:, None] + np.cumsum(prev * DT_S, axis=1)
            if not self.off_ns.shape[1]:
                o -= o[:, :1]
            held = self.freq_ppb.shape[1]
            drop = min(held, max(0, knots - int(HISTORY_S / DT_S) - self.base))
            self.freq_ppb = np.concatenate([self.freq_ppb[:, drop:], f], axis=1)
            self.off_ns = np.concatenate([self.off_ns[:, drop:], o], axis=1)
            self.base += drop

    def offset_ns(self, t_ns: F64 | float, idx: npt.NDArray[np.int64]) -> F64:
        """Return the wander offset (ns) of NICs ``idx`` at true times ``t_ns`` (broadcast).
        Raises ValueError for a time more than ``HISTORY_S`` before the latest reached."""
        t_s = np.maximum(np.asarray(t_ns, dtype=np.float64) / 1e9, 0.0)
        kn = np.floor(t_s / DT_S).astype(np.int64)
        top = int(kn.max()) if kn.size else 0
        if top + 1 >= self.base + self.freq_ppb.shape[1]:
            self._extend(top + 1)
        if kn.size and int(kn.min()) < self.base:
            raise ValueError(f"clock wander before {self.base * DT_S:g} s is no longer held")
        kb, ib = np.broadcast_arrays(kn - self.base, idx)
        frac = np.broadcast_to(t_s - kn * DT_S, kb.shape)
        return np.asarray(self.off_ns[ib, kb] + self.freq_ppb[ib, kb] * frac, dtype=np.float64)
