"""A probe stream that stores nothing for a while (the server that led it killed: a new leader
takes 4-9 s) must not close windows over the batches the probers spool meanwhile.

The sequence of `tests/test_fleet_faults.py`'s failure (132 of 1296 batches lost, the same
batch_seq of every host and the ten after it): the stream's leader died late in a window,
the election outlasted that window's grace, and the first message stored afterwards (a
spooled batch, or the owner's tick) closed the window before the spooled batches of its end
were read; the stand-in core dropped them as late (the real core puts them in a later
window). Here the same stream, as stored times, goes through a partition's close point
(`controller.fleet.watermark.StreamClock`, as `controller.fleet.workerloop` uses it) and the
stand-in core, with time passed in.
"""

from __future__ import annotations

from collections import Counter

from controller.fleet.plane import Plane
from controller.fleet.watermark import StreamClock
from tests.fleetstub import StubWorker, batch

S = 1_000_000_000
PLANE = Plane(partitions=1, window_ns=4 * S, grace_ns=2_500_000_000,
              solver_wait_ns=2 * S, duplicate_window_s=120.0)  # fmt: skip
HOSTS = ("h0", "h1", "h2")
TICK = b""


def _stream(kill_ns: int, outage_ns: int, end_ns: int) -> list[tuple[int, bytes]]:
    """Return (stored ns, payload) in stream order: every host sends a batch every 250 ms
    from 0 to ``end_ns`` and the owner stores a tick every 500 ms; from ``kill_ns`` for
    ``outage_ns`` nothing is stored: the owner's first tick and then the spooled batches
    (in order, 1 ms apart) are stored when it ends."""
    sends = [(t, h, i + 1) for i, t in enumerate(range(0, end_ns, S // 4)) for h in HOSTS]
    resume = kill_ns + outage_ns
    out: list[tuple[int, bytes]] = [(t, TICK) for t in range(0, end_ns, S // 2)
                                    if not kill_ns <= t < resume]  # fmt: skip
    out.append((resume, TICK))  # the tick stored first: it alone closes the window
    spooled = [(t, h, seq) for t, h, seq in sends if kill_ns <= t < resume]
    out += [
        (resume + 1_000_000 * (i + 1), batch(h, seq, t)) for i, (t, h, seq) in enumerate(spooled)
    ]
    out += [(t + 1000, batch(h, seq, t)) for t, h, seq in sends if not kill_ns <= t < resume]
    return sorted(out, key=lambda m: m[0])


def _covered(stream: list[tuple[int, bytes]], clock: StreamClock) -> Counter[tuple[str, int]]:
    """Run ``stream`` through a stand-in core as the worker loop does (close at each
    message's close point, then admit it); return how often each batch was in a partial."""
    core = StubWorker(PLANE.window_ns, PLANE.grace_ns)
    covered = Counter[tuple[str, int]]()
    for stored, payload in stream:
        for part in core.close(clock.at(stored)):
            covered.update(part.covers.keys)
        if payload:
            core.admit(payload.decode().split(":")[0], payload, stored)  # late: dropped
    for part in core.close(1 << 62):
        covered.update(part.covers.keys)
    return covered


def _clock() -> StreamClock:
    return StreamClock(PLANE.grace_ns, PLANE.stream_gap_ns)


def _sent(stream: list[tuple[int, bytes]]) -> dict[tuple[str, int], int]:
    """Return each batch's send time."""
    out = {}
    for _, payload in stream:
        if payload:
            host, seq, t = payload.decode().split(":")
            out[(host, int(seq))] = int(t)
    return out


WINDOW = PLANE.window_ns
KILL = 10 * WINDOW + 3 * WINDOW // 4  # a quarter window before its end, as the test kills
OUTAGE = 6 * S  # the election outlasts the rest of the window and its grace (3.5 s)


def test_an_outage_past_a_windows_grace_loses_no_spooled_batch() -> None:
    stream = _stream(KILL, OUTAGE, 16 * WINDOW)
    covered = _covered(stream, _clock())
    assert set(covered) == set(_sent(stream)), "a spooled batch lost"
    assert max(covered.values()) == 1


def test_without_the_hold_the_spooled_end_of_the_window_is_late() -> None:
    """The failure itself: with stored time as the close point (a jump never taken for an
    outage), the batches sent from the kill to the window's end come after its close."""
    stream = _stream(KILL, OUTAGE, 16 * WINDOW)
    covered = _covered(stream, StreamClock(PLANE.grace_ns, gap_ns=1 << 62))
    lost = {k for k, t in _sent(stream).items() if k not in covered}
    assert lost == {k for k, t in _sent(stream).items() if KILL <= t < 11 * WINDOW}
    assert len(lost) == 4 * len(HOSTS)


def test_stream_clock_holds_after_a_jump_and_lets_go_after_a_grace() -> None:
    c = StreamClock(grace_ns=10, gap_ns=5)
    assert [c.at(t) for t in (100, 103, 107)] == [100, 103, 107]  # jumps up to gap: time
    assert c.at(120) == 107 and c.holding()  # a jump of 13: held before it
    assert c.at(125) == 107 and c.at(129) == 107
    assert c.at(136) == 107  # a jump during the hold does not prolong it (ends at 130)...
    assert c.at(137) == 107  # ...but a jump after it starts a new hold at its point
    c2 = StreamClock(grace_ns=10, gap_ns=5)
    for t in (100, 120, 129):
        c2.at(t)
    assert c2.at(130) == 130 and not c2.holding()  # a grace after the jump: stored time
    assert c2.at(131) == 131


def test_an_owner_seeded_at_its_ack_floor_closes_where_its_predecessor_did() -> None:
    """A takeover replays from the message after the ack floor, which stays before the
    outage while its hold lasts (a tick is acked with its window, as a batch: the last
    message before the outage is in a window the hold keeps open); seeded with the floor's
    stored time, the new owner's clock sees the jump its predecessor saw."""
    times = [t for t, _ in _stream(KILL, OUTAGE, 16 * WINDOW)]
    whole = _clock()
    points = [whole.at(t) for t in times]
    first_after = next(i for i, t in enumerate(times) if t >= KILL)  # first stored after it
    for start in range(first_after - 5, first_after + 1):  # taken over up to the jump
        c = _clock()
        c.seed(times[start - 1])
        assert [c.at(t) for t in times[start:]] == points[start:], start
    unseeded = _clock()  # without the floor's stored time the jump is not seen
    assert unseeded.at(times[first_after]) != points[first_after]
