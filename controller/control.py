"""Control: whether the controller may act (automatic remediation) — on/off, audited.

`Control(enabled)` holds the switch. Everyone may read it (`enabled`); `set(enabled, actor,
t_ns)` records who turned it on or off and when and returns the `ControlChange`; `audit()`
returns the changes so far (bounded, oldest dropped). ``on_change`` (optional) is called with
each change (the service logs it). The remediation loop reads `enabled` before acting.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControlChange:
    """One audited change: time (ns), new state, who (an operator token's name), from what."""

    t_ns: int
    enabled: bool
    actor: str
    previous: bool

    def to_dict(self) -> dict[str, object]:
        """Return the change as JSON-ready values."""
        return {"t_ns": self.t_ns, "enabled": self.enabled, "actor": self.actor,
                "previous": self.previous}  # fmt: skip


class Control:
    """The Control switch with its audit trail (thread-safe)."""

    def __init__(
        self,
        enabled: bool = False,
        *,
        max_audit: int = 1000,
        on_change: Callable[[ControlChange], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._enabled = enabled
        self._audit: deque[ControlChange] = deque(maxlen=max_audit)
        self._on_change = on_change

    @property
    def enabled(self) -> bool:
        """Return whether the controller may act."""
        return self._enabled

    def set(self, enabled: bool, actor: str, t_ns: int) -> ControlChange:
        """Turn Control on or off on behalf of ``actor`` at ``t_ns``; return the audited
        change (recorded even when the state does not change)."""
        if not actor:
            raise ValueError("a Control change needs an actor")
        with self._lock:
            change = ControlChange(t_ns, enabled, actor, self._enabled)
            self._enabled = enabled
            self._audit.append(change)
        if self._on_change is not None:
            self._on_change(change)
        return change

    def audit(self) -> tuple[ControlChange, ...]:
        """Return the recorded changes, oldest first."""
        with self._lock:
            return tuple(self._audit)
