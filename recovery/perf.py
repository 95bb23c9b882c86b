"""The agent's step-time and collective-timeout meter (pure: times passed in).

The training loop calls `StepMeter.step(now_ns)` at each step boundary and
`StepMeter.timed_out()` when a collective timed out (the gloo shell counts these itself);
`report(now_ns, nic)` returns a `contract.remediation.PerfDoc` when one is due (every
``every_steps`` steps, or at once after a new collective timeout) and None otherwise. The
report's ``step_s`` is the median of the last ``window`` step durations (a median: one step
that waited on a checkpoint write or a re-form does not make the job look slow). The follower
publishes it on ``<prefix>/jobs/<job>/rank<k>/perf``.
"""

from __future__ import annotations

import statistics
from collections import deque

from contract.remediation import PerfDoc


class StepMeter:
    """Step durations and collective timeouts of one rank (see the module docstring).

    Raises ValueError unless ``window`` and ``every_steps`` are >= 1.
    """

    def __init__(self, job: str, rank: int, *, window: int = 20, every_steps: int = 10) -> None:
        if window < 1 or every_steps < 1:
            raise ValueError("window and every_steps must be >= 1")
        self.job, self.rank = job, rank
        self.window, self.every_steps = window, every_steps
        self._durations: deque[int] = deque(maxlen=window)
        self._last_ns: int | None = None
        self.steps = 0
        self.timeouts = 0
        self._reported_steps = 0
        self._reported_timeouts = 0

    def step(self, now_ns: int) -> None:
        """Mark a step boundary at ``now_ns`` (the first call only starts the clock)."""
        if self._last_ns is not None:
            self._durations.append(max(0, now_ns - self._last_ns))
            self.steps += 1
        self._last_ns = now_ns

    def timed_out(self, n: int = 1) -> None:
        """Count ``n`` collective timeouts."""
        self.timeouts += n

    def median_s(self) -> float | None:
        """Return the median step time (s) over the window, None before the first step."""
        if not self._durations:
            return None
        return statistics.median(self._durations) / 1e9

    def report(self, now_ns: int, nic: str = "") -> PerfDoc | None:
        """Return the report due now (see the module docstring), or None."""
        med = self.median_s()
        if med is None or med <= 0:
            return None
        due = self.steps - self._reported_steps >= self.every_steps
        if not due and self.timeouts == self._reported_timeouts:
            return None
        self._reported_steps, self._reported_timeouts = self.steps, self.timeouts
        return PerfDoc(self.job, self.rank, now_ns, self.steps, med, self.timeouts, nic,
                       len(self._durations))  # fmt: skip
