"""The prober's own lateness: how far its sends slipped behind their planned times.

A starved prober (a CPU quota, a busy host) queues its probes late and publishes its batches
late; its delays then measure its CPU, and the windows its batches belong to reach the
controller late. `SlipMeter` keeps the worst slip seen since it was last read; the agent
notes, whenever it queues probes, how overdue the plan's next probe already is, and whenever
it flushes a batch, how late the flush is, and reports the worst in its health document
(`contract.documents.HealthDoc.send_slip_ns`). Pure: times are passed in.
"""

from __future__ import annotations


class SlipMeter:
    """The worst lateness noted since the last `take` (ns, 0: none)."""

    def __init__(self) -> None:
        self._worst = 0

    def note(self, planned_ns: int | float | None, now_ns: int | float) -> int:
        """Note that something planned for ``planned_ns`` happens at ``now_ns`` (same clock;
        None: nothing planned). Return its slip (ns, 0 when on time or early)."""
        if planned_ns is None:
            return 0
        slip = max(0, int(now_ns - planned_ns))
        self._worst = max(self._worst, slip)
        return slip

    def take(self) -> int:
        """Return the worst slip noted since the previous call (0: none) and start again."""
        worst, self._worst = self._worst, 0
        return worst
