"""Test brains: stand-ins for `controller.brain.Brain` that keep `controller.brainlike.BrainLike`
(one helper for every test module that needs a brain with a known table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.brain import BrainConfig
from controller.detect.window import WindowPart
from controller.observations import Observations
from mesh.fabric import Fabric
from mesh.snapshot import Health


class AllUp:
    """A brain whose table says every link and NIC of ``fabric`` is up (as the real one does
    before evidence); it judges nothing and raises no event. Subclass it to record calls."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.config = BrainConfig()

    def tap(self, obs: Observations) -> None:
        pass

    def judge(self, end_ns: int, parts: Sequence[WindowPart]) -> list[EventDoc]:
        return []

    def take_pending(self) -> list[EventDoc]:
        return []

    def presence(self, host: str, alive: bool, now_ns: int) -> None:
        pass

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None:
        pass

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        pass

    def link_health(self) -> dict[str, Health]:
        return {lk.id: Health.UP for lk in self.fabric.links}

    def nic_health(self) -> list[Health]:
        return [Health.UP] * len(self.fabric.nics)

    def flap_counts(self) -> dict[str, int]:
        return {}

    def hosts_down(self) -> frozenset[str]:
        return frozenset()

    def path_baselines(self, sig: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return np.full(len(sig), np.nan)

    def baselines(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.float64]]:
        return np.zeros(0, np.int64), np.zeros((0, 4), np.int32), np.zeros(0)
