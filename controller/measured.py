"""No measurement, no verdict: a NIC or link nobody measured lately is ``unknown`` (pure).

The health table (`controller.health`) starts every entity ``up`` and keeps a state while no
evidence arrives, which is right for hysteresis and wrong for a screen: a controller with a
fabric and no prober would call every NIC healthy. `Measured` wraps the detection brain
(a `controller.brainlike.BrainLike`) and overrides its verdicts: a NIC or link that no probe
has measured and no prober has reported on (its NIC link state, `nic_links`) within the last
``stale_ns`` is `Health.UNKNOWN`, whatever the brain says. The brain itself is not touched:
its states, streaks and events go on as before.

What counts as measured is read from the windows the brain judges (`judge`: the parts the
fleet's workers made, `controller.detect.window.WindowPart`), so one process and a fleet of
workers around a solver say the same: the link of every NIC that sent probes in the window
(lost or not), and every link on the paths the window's probes took, either way (a probe's
destination NIC through the last hop of its path; with no known path only its sender is
measured). Probes to or from a host whose prober is down are not evidence (the brain
excludes them: its NICs are unknown to the brain already).

A measurement counts from the end of the window it was judged in (`judge` stamps it with
that window's end; a prober's report with the next window's end). Everything is unknown
before the first window is judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.brain import BrainConfig
from controller.brainlike import BrainLike
from controller.detect.window import WindowPart
from controller.observations import Observations
from mesh.fabric import Fabric
from mesh.snapshot import Health

NEVER = np.iinfo(np.int64).min // 2
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class Measured:
    """A `BrainLike` whose NIC and link health is ``unknown`` without a recent measurement."""

    def __init__(self, brain: BrainLike, fabric: Fabric, stale_ns: int) -> None:
        """Raises ValueError unless ``stale_ns`` > 0."""
        if stale_ns <= 0:
            raise ValueError("stale_ns must be > 0")
        self.brain, self.fabric, self.stale_ns = brain, fabric, stale_ns
        n_links = len(fabric.links)
        self._nic_link = np.asarray(fabric.nic_link, np.int64)
        self._seen = np.zeros(n_links, bool)  # links measured since the last judged window
        self._last = np.full(n_links, NEVER, np.int64)  # window end a link was last measured at
        self._now: int | None = None

    @property
    def config(self) -> BrainConfig:
        """Return the wrapped brain's thresholds."""
        return self.brain.config

    def tap(self, obs: Observations) -> None:
        self.brain.tap(obs)

    def judge(self, end_ns: int, parts: Sequence[WindowPart]) -> list[EventDoc]:
        """Mark what ``parts`` measured (see the module docstring), stamp it and what was
        reported since the last window with ``end_ns``; return the brain's judgement."""
        for part in parts:
            self._seen[self._nic_link[part.nic]] = True
            hops = part.path_hops
            self._seen[hops[hops >= 0] >> 1] = True
        self._last[self._seen] = end_ns
        self._seen[:] = False
        self._now = end_ns if self._now is None else max(self._now, end_ns)
        return self.brain.judge(end_ns, parts)

    def take_pending(self) -> list[EventDoc]:
        return self.brain.take_pending()

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

    def _stale(self) -> npt.NDArray[np.bool_]:
        """Per link: True when not measured within ``stale_ns`` of the last judged window."""
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

    def hosts_down(self) -> frozenset[str]:
        return self.brain.hosts_down()

    def path_baselines(self, sig: I64) -> F64:
        return self.brain.path_baselines(sig)

    def baselines(self) -> tuple[I64, I32, F64]:
        return self.brain.baselines()

    def measured_links(self) -> frozenset[str]:
        """Return the ids of the links measured within ``stale_ns`` of the last judged window."""
        return frozenset(self.fabric.links[i].id for i in np.flatnonzero(~self._stale()).tolist())
