"""Whether the controller is behind, and by how much: starvation is not a fabric fault.

A controller starved of CPU (a quota, a busy host) ingests its probers' batches late, ticks
late and solves late. Its windows then hold only the timely probers' probes, and its silence
rule sees probers that merely wait in its socket. `BehindMeter` measures the three ways it
shows, with time passed in:

- batch age at ingest: the ingest time minus the newest send time in the batch (what the
  broker delivered late, or what waited in the controller's socket and queue);
- loop lag: how late a tick ran after the time it was planned for;
- solve overrun: how much a window's judging cost beyond the window's width (the loop cannot
  keep up when each window costs more than it lasts);

and the probers' own lateness (`contract.documents.HealthDoc.send_slip_ns`). Each measure
keeps its worst value for ``memory_ns`` after it was seen (a backlog taken keeps the
controller "behind" a little while, so that the windows judged from it are marked as well).
`Behind` is the verdict the snapshot, the status and the findings carry: "controller behind
by 3.2 s (batch age at ingest)". Pure: values in, a frozen value out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from contract.documents import EventDoc

BEHIND_NS = 2_000_000_000
"""Behind from this far (a batch's age at ingest is normally a batch interval and a hop of
the broker: well under a second)."""

MEMORY_NS = 5_000_000_000
"""How long a measure's worst value counts after it was seen."""

TIMING_KINDS = frozenset({"contention", "prober_down", "loss"})
"""Findings that depend on timing: a delay judged late, a silence that is the controller's
own, a probe a starved prober timed out on. While the controller is behind they are marked
degraded (`mark_degraded`)."""

_CAUSES = ("batch age at ingest", "loop lag", "solve overrun")


@dataclass(frozen=True, slots=True)
class Behind:
    """The verdict at one time: the worst recent ``batch_age_ns``, ``loop_lag_ns`` and
    ``solve_overrun_ns`` (0: none), ``by_ns`` their maximum, whether that is ``behind`` (at
    least the threshold), and the probers late by at least the threshold by their own report
    (``late_probers``: host -> slip ns)."""

    batch_age_ns: int = 0
    loop_lag_ns: int = 0
    solve_overrun_ns: int = 0
    threshold_ns: int = BEHIND_NS
    late_probers: Mapping[str, int] = field(default_factory=dict)

    @property
    def by_ns(self) -> int:
        """Return how far behind the controller is (the worst of its three measures)."""
        return max(self.batch_age_ns, self.loop_lag_ns, self.solve_overrun_ns)

    @property
    def behind(self) -> bool:
        """Return True when the controller is behind by at least the threshold."""
        return self.by_ns >= self.threshold_ns

    @property
    def degraded(self) -> bool:
        """Return True when timing findings are not to be trusted: the controller or a prober
        is behind."""
        return self.behind or bool(self.late_probers)

    def controller_status(self) -> str:
        """Return "controller behind by 3.2 s (batch age at ingest)" ("" when on time)."""
        if not self.behind:
            return ""
        values = (self.batch_age_ns, self.loop_lag_ns, self.solve_overrun_ns)
        cause = _CAUSES[values.index(self.by_ns)]
        return f"controller behind by {self.by_ns / 1e9:.1f} s ({cause})"

    def status(self) -> str:
        """Return the status line ("" when on time): `controller_status`, then "; probers
        late: host2 1.1 s" for the probers that say so."""
        parts = [self.controller_status()] if self.behind else []
        if self.late_probers:
            late = ", ".join(f"{h} {s / 1e9:.1f} s" for h, s in sorted(self.late_probers.items()))
            parts.append(f"probers late: {late}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        """Return the status document's ``behind`` object (seconds)."""
        return {
            "behind": self.behind,
            "by_s": round(self.by_ns / 1e9, 3),
            "batch_age_s": round(self.batch_age_ns / 1e9, 3),
            "loop_lag_s": round(self.loop_lag_ns / 1e9, 3),
            "solve_overrun_s": round(self.solve_overrun_ns / 1e9, 3),
            "late_probers": {h: round(s / 1e9, 3) for h, s in sorted(self.late_probers.items())},
            "status": self.status(),
        }


class _Worst:
    """The worst value seen within ``memory_ns`` of the latest call (approximately: a value
    replaces the kept one when it is larger or the kept one is older than the memory)."""

    __slots__ = ("at", "value")

    def __init__(self) -> None:
        self.value, self.at = 0, 0

    def note(self, value: int, now_ns: int, memory_ns: int) -> None:
        if value >= self.value or now_ns - self.at > memory_ns:
            self.value, self.at = value, now_ns

    def read(self, now_ns: int, memory_ns: int) -> int:
        return self.value if now_ns - self.at <= memory_ns else 0


class BehindMeter:
    """The controller's own lateness (see the module docstring). Raises ValueError unless
    ``threshold_ns`` and ``memory_ns`` are positive."""

    def __init__(self, threshold_ns: int = BEHIND_NS, memory_ns: int = MEMORY_NS) -> None:
        if threshold_ns <= 0 or memory_ns <= 0:
            raise ValueError("threshold_ns and memory_ns must be > 0")
        self.threshold_ns, self.memory_ns = threshold_ns, memory_ns
        self._age, self._lag, self._overrun = _Worst(), _Worst(), _Worst()
        self._slip: dict[str, tuple[int, int]] = {}  # host -> (slip ns, when reported)

    def ingested(self, newest_send_ns: int, now_ns: int) -> None:
        """Note a batch ingested at ``now_ns`` whose newest probe was sent at
        ``newest_send_ns`` (its age; a send time in the future counts 0)."""
        self._age.note(max(0, now_ns - newest_send_ns), now_ns, self.memory_ns)

    def ticked(self, planned_ns: int, now_ns: int) -> None:
        """Note a tick planned for ``planned_ns`` that ran at ``now_ns``."""
        self._lag.note(max(0, now_ns - planned_ns), now_ns, self.memory_ns)

    def solved(self, cost_ns: int, budget_ns: int, now_ns: int) -> None:
        """Note a window judged at a cost of ``cost_ns`` against ``budget_ns`` (its width)."""
        self._overrun.note(max(0, cost_ns - budget_ns), now_ns, self.memory_ns)

    def prober_slip(self, host: str, slip_ns: int, now_ns: int) -> None:
        """Note a prober's own report of its lateness (its health's ``send_slip_ns``)."""
        self._slip[host] = (max(0, slip_ns), now_ns)

    def state(self, now_ns: int) -> Behind:
        """Return the verdict at ``now_ns``."""
        mem = self.memory_ns
        late = {
            h: s
            for h, (s, at) in self._slip.items()
            if s >= self.threshold_ns and now_ns - at <= 2 * mem
        }
        return Behind(
            self._age.read(now_ns, mem),
            self._lag.read(now_ns, mem),
            self._overrun.read(now_ns, mem),
            self.threshold_ns,
            late,
        )


def degrade(events: list[EventDoc], why: str) -> list[EventDoc]:
    """Return ``events`` with the timing findings (`TIMING_KINDS`) marked degraded in their
    detail ("degraded: " and ``why``); clears and other findings unchanged; ``why`` "": as
    they are."""
    if not why:
        return events
    note = f"degraded: {why}"
    return [
        replace(e, detail=f"{e.detail}; {note}" if e.detail else note)
        if e.kind in TIMING_KINDS
        else e
        for e in events
    ]


def mark_degraded(events: list[EventDoc], behind: Behind) -> list[EventDoc]:
    """Return ``events`` with the timing findings raised while ``behind`` is degraded marked
    so ("degraded: controller behind by 3.2 s ...", `degrade`)."""
    return degrade(events, behind.status() if behind.degraded else "")


def short_window(short: int) -> str:
    """Return why a window closed short of ``short`` live probers' batches is degraded (""
    when it was whole: `controller.fleet.watermark`)."""
    return f"window judged without {short} late prober(s)' batches" if short else ""
