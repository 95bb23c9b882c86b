"""No measurement, no verdict: a NIC or link nobody measured lately is ``unknown`` (pure).

The health table (`controller.health`) starts every entity ``up`` and keeps a state while no
evidence arrives, which is right for hysteresis and wrong for a screen: a controller with a
fabric and no prober would call every NIC healthy. `Measured` wraps the detection brain
(a `controller.live.BrainLike`) and overrides its verdicts: a NIC or link that no probe has
measured (a probe sent from or to the NIC, lost or not; a probe whose known path crosses the
link, either way) and no prober has reported on (its NIC link state, `nic_links`) within the
last ``stale_ns`` is `Health.UNKNOWN`, whatever the brain says. The brain itself is not
touched: its states, streaks and events go on as before.

A measurement counts from the tick after it arrives (`tick` stamps what was seen since the
last tick with that tick's time; the observations' own send times may lie on another time
base). Everything is unknown before the first tick.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.brainlike import BrainLike
from controller.observations import Observations
from mesh.fabric import Fabric
from mesh.snapshot import Health

NEVER = np.iinfo(np.int64).min // 2


class Measured:
    """A `BrainLike` whose NIC and link health is ``unknown`` without a recent measurement."""

    def __init__(self, brain: BrainLike, fabric: Fabric, stale_ns: int) -> None:
        """Raises ValueError unless ``stale_ns`` > 0."""
        if stale_ns <= 0:
            raise ValueError("stale_ns must be > 0")
        self.brain, self.fabric, self.stale_ns = brain, fabric, stale_ns
        n_links = len(fabric.links)
        self._nic_link = np.asarray(fabric.nic_link, np.int64)
        self._seen = np.zeros(n_links, bool)  # links measured since the last tick
        self._last = np.full(n_links, NEVER, np.int64)  # tick a link was last measured at
        self._now: int | None = None

    def observe(self, obs: Observations) -> None:
        """Hand ``obs`` to the brain; its NICs' links and the links of its paths are measured."""
        self.brain.observe(obs)
        if not len(obs):
            return
        self._seen[self._nic_link[obs.src]] = True
        self._seen[self._nic_link[obs.dst]] = True
        for hops in (obs.hops_fwd, obs.hops_rev):
            links = hops[hops >= 0] >> 1
            self._seen[links] = True

    def presence(self, host: str, alive: bool, now_ns: int) -> None:
        self.brain.presence(host, alive, now_ns)

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None:
        self.brain.gpu(host, ok, detail, now_ns)

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        """Hand the host's NIC link states to the brain; those NICs' links are measured."""
        self.brain.nic_links(host, up, now_ns)
        idx = self.fabric.nic_index
        for nic in up:
            i = idx.get(nic)
            if i is not None:
                self._seen[self._nic_link[i]] = True

    def tick(self, now_ns: int) -> list[EventDoc]:
        """Stamp what was measured since the last tick with ``now_ns``; run the brain's tick."""
        self._last[self._seen] = now_ns
        self._seen[:] = False
        self._now = now_ns if self._now is None else max(self._now, now_ns)
        return self.brain.tick(now_ns)

    def _stale(self) -> npt.NDArray[np.bool_]:
        """Per link: True when not measured within ``stale_ns`` of the last tick."""
        if self._now is None:
            return np.ones(len(self._last), bool)
        return self._last < self._now - self.stale_ns

    def link_health(self) -> dict[str, Health]:
        """Return the brain's link health, ``unknown`` for links not measured lately."""
        out = self.brain.link_health()
        stale = self._stale()
        for i in np.flatnonzero(stale).tolist():
            out[self.fabric.links[i].id] = Health.UNKNOWN
        return out

    def nic_health(self) -> list[Health]:
        """Return the brain's NIC health, ``unknown`` for NICs not measured lately."""
        out = list(self.brain.nic_health())
        stale = self._stale()[self._nic_link]
        if len(out) != len(stale):  # not a verdict per NIC: the snapshot says unknown anyway
            return out
        return [Health.UNKNOWN if s else h for h, s in zip(out, stale.tolist(), strict=True)]

    def flap_counts(self) -> dict[str, int]:
        return self.brain.flap_counts()

    def measured_links(self) -> frozenset[str]:
        """Return the ids of the links measured within ``stale_ns`` of the last tick."""
        return frozenset(self.fabric.links[i].id for i in np.flatnonzero(~self._stale()).tolist())
