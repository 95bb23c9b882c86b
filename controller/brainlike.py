"""What the live controller needs from detection and localization: the `BrainLike` protocol.

`controller.brain.Brain` is the real one; `controller.measured.Measured` (unknown without a
measurement) and `controller.timeseries.recorder.TeeBrain` (the time series see what the
brain sees) wrap one. A module of its own so the wrappers and `controller.live` import it
without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from contract.documents import EventDoc
from controller.observations import Observations
from mesh.snapshot import Health


class BrainLike(Protocol):
    """What the controller needs from detection/localization (`controller.brain.Brain`)."""

    def observe(self, obs: Observations) -> None: ...
    def presence(self, host: str, alive: bool, now_ns: int) -> None: ...
    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None: ...
    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None: ...
    def tick(self, now_ns: int) -> list[EventDoc]: ...
    def link_health(self) -> dict[str, Health]: ...
    def nic_health(self) -> list[Health]: ...
    def flap_counts(self) -> dict[str, int]: ...
