"""What the controller needs from detection and localization (`BrainLike`), and the tee
that lets others see what detection sees (`TeeBrain`).

`controller.brain.Brain` is the real brain; `controller.measured.Measured` (unknown without a
measurement) and `TeeBrain` wrap one. The fleet's solver (`controller.fleet.solver.FleetSolver`)
hands it windows made of the workers' parts (`judge`), host facts and, in one process, the
observations a worker made (`tap`). A module of its own, below all of them, so that the
wrappers, their users (the time-series recorder, the benchmarks), the solver and
`controller.live` (which wraps every brain in `Measured`) import it without importing each
other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.brain import BrainConfig
from controller.detect.window import WindowPart
from controller.observations import Observations
from mesh.snapshot import Health

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class BrainLike(Protocol):
    """What the controller needs from detection (`controller.brain.Brain`): windows made of
    the workers' parts judged (`judge`), host facts, health; ``tap`` hands the observations a
    worker made to whatever listens beside detection (`TeeBrain`)."""

    @property
    def config(self) -> BrainConfig: ...
    def tap(self, obs: Observations) -> None: ...
    def judge(self, end_ns: int, parts: Sequence[WindowPart]) -> list[EventDoc]: ...
    def take_pending(self) -> list[EventDoc]: ...
    def presence(self, host: str, alive: bool, now_ns: int) -> None: ...
    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None: ...
    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None: ...
    def link_health(self) -> dict[str, Health]: ...
    def nic_health(self) -> list[Health]: ...
    def flap_counts(self) -> dict[str, int]: ...
    def hosts_down(self) -> frozenset[str]: ...
    def path_baselines(self, sig: I64) -> F64: ...
    def baselines(self) -> tuple[I64, I32, F64]: ...


class TeeBrain:
    """A `BrainLike` that forwards everything to ``brain`` and hands the same input to taps:
    each batch of observations the workers made to every one of ``observers`` (the
    time-series recorder's ``observe``, a voting baseline's, a list's ``append``) and each
    judged window's or host fact's new events to ``on_events`` (the recorder's ``events``),
    so they see exactly what detection sees."""

    def __init__(
        self,
        brain: BrainLike,
        *observers: Callable[[Observations], object],
        on_events: Callable[[list[EventDoc]], object] | None = None,
    ) -> None:
        self.brain = brain
        self.observers = observers
        self.on_events = on_events

    @property
    def config(self) -> BrainConfig:
        """Return the wrapped brain's thresholds."""
        return self.brain.config

    def tap(self, obs: Observations) -> None:
        self.brain.tap(obs)
        for observe in self.observers:
            observe(obs)

    def _told(self, events: list[EventDoc]) -> list[EventDoc]:
        if self.on_events is not None:
            self.on_events(events)
        return events

    def judge(self, end_ns: int, parts: Sequence[WindowPart]) -> list[EventDoc]:
        return self._told(self.brain.judge(end_ns, parts))

    def take_pending(self) -> list[EventDoc]:
        return self._told(self.brain.take_pending())

    def presence(self, host: str, alive: bool, now_ns: int) -> None:
        self.brain.presence(host, alive, now_ns)

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None:
        self.brain.gpu(host, ok, detail, now_ns)

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        self.brain.nic_links(host, up, now_ns)

    def link_health(self) -> dict[str, Health]:
        return self.brain.link_health()

    def nic_health(self) -> list[Health]:
        return self.brain.nic_health()

    def flap_counts(self) -> dict[str, int]:
        return self.brain.flap_counts()

    def hosts_down(self) -> frozenset[str]:
        return self.brain.hosts_down()

    def path_baselines(self, sig: I64) -> F64:
        return self.brain.path_baselines(sig)

    def baselines(self) -> tuple[I64, I32, F64]:
        return self.brain.baselines()
