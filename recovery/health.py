"""qpmesh's NIC verdicts where resiliency frameworks look for them.

`NicVerdicts` holds the latest verdict per NIC, fed by remediation actions (``move_off_nic``
marks a NIC bad, ``may_move_back`` good again; thread-safe: the MQTT follower's thread writes,
the training thread reads). `QpmeshNicHealthCheck` is a callable health check in the shape
nvidia-resiliency-ext's in-process restart (``inprocess.Wrapper(health_check=...)``) and
torchft call before re-forming a group: it returns its argument when this rank's NICs are
healthy and raises `NicUnhealthy` naming the bad NIC and why otherwise, so a job that already
uses those frameworks gains the fabric view without adopting the qpmesh agent.
"""

from __future__ import annotations

import threading
from typing import TypeVar

from contract.remediation import ActionDoc

T = TypeVar("T")


class NicUnhealthy(RuntimeError):
    """A NIC of this rank is failing according to qpmesh."""


class NicVerdicts:
    """NIC -> (healthy, reason), updated from actions; unknown NICs count as healthy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bad: dict[str, str] = {}

    def apply(self, action: ActionDoc) -> None:
        """Fold one action in (other kinds than move_off_nic / may_move_back are ignored)."""
        with self._lock:
            if action.kind == "move_off_nic":
                self._bad[action.nic] = action.reason or action.finding
            elif action.kind == "may_move_back":
                self._bad.pop(action.nic, None)

    def bad(self, nics: tuple[str, ...]) -> dict[str, str]:
        """Return the failing NICs among ``nics`` with their reasons."""
        with self._lock:
            return {n: self._bad[n] for n in nics if n in self._bad}


class QpmeshNicHealthCheck:
    """Health check over this rank's ``nics``: ``check(state) -> state`` or `NicUnhealthy`."""

    def __init__(self, verdicts: NicVerdicts, nics: tuple[str, ...]) -> None:
        self.verdicts, self.nics = verdicts, nics

    def __call__(self, state: T = None) -> T:  # type: ignore[assignment]
        bad = self.verdicts.bad(self.nics)
        if bad:
            nic, why = sorted(bad.items())[0]
            raise NicUnhealthy(f"qpmesh: {nic} is failing: {why}")
        return state

    def healthy_nics(self) -> tuple[str, ...]:
        """Return this rank's NICs qpmesh has no complaint about, in order."""
        bad = self.verdicts.bad(self.nics)
        return tuple(n for n in self.nics if n not in bad)
