"""When a window is whole: per host, the newest send time ingested (its watermark).

A window of the grid holds the probes *sent* in it. Closed at a fixed time after its end, it
holds what had arrived by then: when the controller is behind on some probers (a busy host,
a backlog in its socket or queue) or some probers are late (starved), it holds only the
timely probers' probes, and a window of one leaf's probes blames the hops that leaf's paths
share (docs/reliability.md, "A busy controller host lies"). So a window that some prober's
batches already cover waits until every live prober's do (`close_until`): its watermark at
or past the window's end. A window no prober covers yet is not waited for (every prober is
as far behind: nothing in it is one-sided; closed on the clock as before), nor is one whose
end is ``wait_ns`` behind the controller's clock (a prober that stopped without a last will
must not hold every window). A window closed while a live prober had not covered it is
short: `Watermarks.short` counts those probers, and its findings are marked degraded.

"Live" is the caller's: the hosts whose prober is not down (presence, or silence judged).
Hosts never heard from are not waited for (a prober that never sent has nothing late). Pure:
arrays in, integers out.

`StreamClock` is the same question for a fleet worker, which closes windows on stream time
(when the stream stored each message of its partition): a window is whole once the stream
has *taken batches* for its grace after its end. An outage of the stream (the server that led
it died: electing a new leader takes 4-9 s) stores nothing while the probers spool; the first
message after it has a stored time past windows whose grace ran out meanwhile, and the
spooled batches stored after it would be late for them (counted in a later window). So a jump
of stream time longer than ``gap_ns`` between two messages holds the close point where it was
before the jump until ``grace_ns`` of stream time has passed after it. A second outage while
the hold lasts (a step of ``stall_ns`` or more: the stream stalled again, say its new leader
lost its quorum once more, before the first outage's spool was stored) holds it until a
grace after that step too, but never past ``HOLD_GRACES`` graces after the outage's jump: a
stream that keeps stalling (a starved owner's ticks come a second or more apart) still lets
go. Every jump longer than ``gap_ns`` is an outage of its own, held a grace after it (two at
the latest), as before; an outage that begins while a hold lasts keeps that hold's point
(the first outage's spool may not be stored yet), but a chain of such outages keeps it for at
most ``max_hold_ns`` of stored time after the chain's first jump (`MAX_HOLD_NS`): past that, a
jump holds at the stored time before it, as a lone outage does. So the point lags stored time
by at most ``max_hold_ns`` and two graces; without the bound a partition whose every message
came more than a gap after the one before (its owner's ticks starved, no batch in between)
was held for as long as that lasted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

WAIT_NS = 5_000_000_000
"""A window closes, short, once the controller's clock is this far past its end."""

STALL_NS = 1_000_000_000
"""A step of stored time this long during a hold is another outage (an owned partition
stores a tick every half second when no batch comes)."""

HOLD_GRACES = 2
"""A hold ends at the latest this many graces after the last outage's jump (docs/scale.md:
a stall under the gap that starts within the first grace ends within two)."""

MAX_HOLD_NS = 20_000_000_000
"""Outages chained within a hold keep its point for at most this long after the chain's first
jump: two leader elections back to back (4.2-8.3 s each, measured: docs/scale.md) and a grace
fit; a hold of it plus two graces stays inside the consumers' ack wait (a window, two graces
and 30 s: `controller.fleet.workerloop`), so held deliveries are not redelivered."""


class Watermarks:
    """The newest send time ingested per host (-1: none yet)."""

    def __init__(self, n_hosts: int) -> None:
        self.t = np.full(n_hosts, -1, np.int64)

    def note(self, host: npt.NDArray[np.integer], t_ns: I64) -> None:
        """Note records sent at ``t_ns`` by the hosts of index ``host``."""
        if len(t_ns):
            np.maximum.at(self.t, host, t_ns)

    def close_until(self, live: B, now_ns: int, wait_ns: int) -> int | None:
        """Return the time that windows must end at or before to close now (see the module
        docstring): the slowest live prober's watermark, unless that window is past the wait
        (``now_ns - wait_ns``); None: no live prober heard from, nothing to wait for. A
        window past the newest watermark is the caller's to close on its clock."""
        mark = self.t[live & (self.t >= 0)]
        if not len(mark):
            return None
        return max(int(mark.min()), now_ns - wait_ns)

    def newest(self) -> int:
        """Return the newest watermark (-1: none)."""
        return int(self.t.max()) if len(self.t) else -1

    def short(self, live: B, end_ns: int) -> int:
        """Return how many live hosts heard from had not sent up to ``end_ns`` while another
        had (0 when none had: every prober as far behind is not a one-sided window)."""
        if self.newest() < end_ns:
            return 0
        return int((live & (self.t >= 0) & (self.t < end_ns)).sum())


@dataclass
class StreamClock:
    """The close point of one partition's messages (see the module docstring): ``at`` each
    message's stored time (UNIX ns) in stream order; windows close on what it returns. A jump
    of more than ``gap_ns`` holds the point at its value before the jump until ``grace_ns``
    after the jump; during the hold a step of ``min(stall_ns, gap_ns)`` or more (a stall)
    holds it until ``grace_ns`` after that step, but not past ``HOLD_GRACES * grace_ns``
    after the last jump; a jump that comes while a hold lasts keeps its point, for at most
    ``max_hold_ns`` after the first jump of that chain. Deterministic in the stored times:
    an owner that replays the stream from its ack floor, `seed`-ed with the stored time of
    the message before it, returns what its predecessor returned (a chain's first jump
    before that floor is not seen: the replay's chain may let go later)."""

    grace_ns: int
    gap_ns: int
    stall_ns: int = STALL_NS
    max_hold_ns: int = MAX_HOLD_NS
    last: int | None = None  # the newest stored time seen
    point: int | None = None  # the close point so far (never goes back)
    frozen: int = 0  # the point held during a hold
    until: int = 0  # the stored time a hold ends at
    bound: int = 0  # the stored time a hold ends at the latest, however often it stalls
    since: int = 0  # the stored time of the jump that began the chain of outages held

    def seed(self, stored_ns: int) -> None:
        """Note the stored time of the message before the first one this clock will see."""
        self.last = stored_ns if self.last is None else max(self.last, stored_ns)

    def at(self, stored_ns: int) -> int:
        """Return the close point for a message stored at ``stored_ns``: ``stored_ns``, or
        during a hold the point before the outage (never less than it returned before)."""
        prev = self.last
        self.last = stored_ns if prev is None else max(prev, stored_ns)
        if prev is not None:
            step = stored_ns - prev
            if step > self.gap_ns:  # an outage: held a grace after it, two at the latest
                chained = prev < self.until  # it began while a hold lasted: keep its point
                if not chained or stored_ns - self.since > self.max_hold_ns:
                    self.frozen, self.since = prev, stored_ns  # held at the time before it
                    self.until = self.bound = 0
                self.until = max(self.until, stored_ns + self.grace_ns)
                self.bound = max(self.bound, stored_ns + HOLD_GRACES * self.grace_ns)
            elif prev < self.until and step >= min(self.stall_ns, self.gap_ns):
                # a stall during the hold: a grace after it too, up to the bound
                self.until = max(self.until, min(stored_ns + self.grace_ns, self.bound))
        point = self.frozen if stored_ns < self.until else stored_ns
        self.point = point if self.point is None else max(self.point, point)
        return self.point

    def holding(self) -> bool:
        """Return True while the close point is held after an outage."""
        return self.last is not None and self.last < self.until
