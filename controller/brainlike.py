"""What the live controller needs from detection and localization (`BrainLike`), and the tee
that lets others see what detection sees (`TeeBrain`).

`controller.brain.Brain` is the real brain; `controller.measured.Measured` (unknown without a
measurement) and `TeeBrain` wrap one. A module of its own so that the wrappers, their users
(the time-series recorder, the benchmarks) and `controller.live` (which wraps every brain in
`Measured`) import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


class TeeBrain:
    """A `BrainLike` that forwards everything to ``brain`` and hands the same input to taps:
    each batch of observations to every one of ``observers`` (the time-series recorder's
    ``observe``, a voting baseline's, a list's ``append``) and each tick's new events to
    ``on_events`` (the recorder's ``events``), so they see exactly what detection sees."""

    def __init__(
        self,
        brain: BrainLike,
        *observers: Callable[[Observations], object],
        on_events: Callable[[list[EventDoc]], object] | None = None,
    ) -> None:
        self.brain = brain
        self.observers = observers
        self.on_events = on_events

    def observe(self, obs: Observations) -> None:
        self.brain.observe(obs)
        for observe in self.observers:
            observe(obs)

    def presence(self, host: str, alive: bool, now_ns: int) -> None:
        self.brain.presence(host, alive, now_ns)

    def gpu(self, host: str, ok: bool, detail: str, now_ns: int) -> None:
        self.brain.gpu(host, ok, detail, now_ns)

    def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
        self.brain.nic_links(host, up, now_ns)

    def tick(self, now_ns: int) -> list[EventDoc]:
        events = self.brain.tick(now_ns)
        if self.on_events is not None:
            self.on_events(events)
        return events

    def link_health(self) -> dict[str, Health]:
        return self.brain.link_health()

    def nic_health(self) -> list[Health]:
        return self.brain.nic_health()

    def flap_counts(self) -> dict[str, int]:
        return self.brain.flap_counts()
