"""Background random loss and loss bursts per link (pure, seeded).

Background: each directed hop traversal drops a probe with ``background_loss``. Bursts: per
link a Poisson process of ``burst_per_link_h`` bursts per hour, each ``burst_ms`` long, during
which a traversal of the link (either direction) drops with ``burst_loss``. Bursts are drawn
per hour of simulated time, so they do not depend on the step size.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
HOUR_S = 3600.0


class LossModel:
    """Background loss and loss bursts of a fabric with ``n_links`` links."""

    def __init__(self, n_links: int, knobs: ModelKnobs, seed: int) -> None:
        self.n_links, self.knobs, self.seed = n_links, knobs, seed
        self._hour = lru_cache(maxsize=4)(self._draw_hour)

    def _draw_hour(self, hour: int) -> tuple[I64, F64]:
        rng = np.random.default_rng([self.seed, 501, hour])
        counts = rng.poisson(self.knobs.burst_per_link_h, self.n_links)
        links = np.repeat(np.arange(self.n_links, dtype=np.int64), counts)
        starts = hour * HOUR_S + rng.uniform(0.0, HOUR_S, len(links))
        return links, starts

    def bursts(self, t0_s: float, t1_s: float) -> list[tuple[int, float, float]]:
        """Return the bursts (link index, start s, end s) overlapping [t0_s, t1_s)."""
        k = self.knobs
        if k.burst_per_link_h <= 0 or k.burst_loss <= 0:
            return []
        dur = k.burst_ms / 1000.0
        out = []
        for h in range(
            max(0, int(np.floor((t0_s - dur) / HOUR_S))), int(np.floor(t1_s / HOUR_S)) + 1
        ):
            links, starts = self._hour(h)
            sel = (starts < t1_s) & (starts + dur > t0_s)
            out += [
                (int(li), float(s), float(s) + dur)
                for li, s in zip(links[sel], starts[sel], strict=True)
            ]
        return out
