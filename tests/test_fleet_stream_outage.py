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
from controller.fleet.watermark import MAX_HOLD_NS, StreamClock
from tests.fleetstub import StubWorker, batch

S = 1_000_000_000
PLANE = Plane(partitions=1, window_ns=4 * S, grace_ns=2_500_000_000,
              solver_wait_ns=2 * S, duplicate_window_s=120.0)  # fmt: skip
HOSTS = ("h0", "h1", "h2")
TICK = b""


def _stream(
    kill_ns: int, outage_ns: int, end_ns: int, *, more: tuple[tuple[int, int], ...] = (),
    drain_ns: int = 1_000_000,
) -> list[tuple[int, bytes]]:  # fmt: skip
    """Return (stored ns, payload) in stream order: every host sends a batch every 250 ms
    from 0 to ``end_ns`` and the owner stores a tick every 500 ms; from ``kill_ns`` for
    ``outage_ns`` (and each further (kill, outage) of ``more``) nothing is stored: the
    owner's first tick and then the spooled batches (in order, ``drain_ns`` apart) are
    stored when it ends (when the next outage ends, if it is down again by then)."""
    outages = ((kill_ns, outage_ns), *more)

    def resume(t: int) -> int | None:  # when what is sent at t is stored (None: at once)
        for k, o in outages:
            if k <= t < k + o:
                return resume(k + o) or k + o
        return None

    sends = [(t, h, i + 1) for i, t in enumerate(range(0, end_ns, S // 4)) for h in HOSTS]
    out: list[tuple[int, bytes]] = [(t, TICK) for t in range(0, end_ns, S // 2)
                                    if resume(t) is None]  # fmt: skip
    out += [(k + o, TICK) for k, o in outages]  # the tick stored first: it alone closes
    spooled: dict[int, list[tuple[int, str, int]]] = {}
    for t, h, seq in sends:
        r = resume(t)
        if r is None:
            out.append((t + 1000, batch(h, seq, t)))
        else:
            spooled.setdefault(r, []).append((t, h, seq))
    for r, sent in spooled.items():
        out += [(r + drain_ns * (i + 1), batch(h, seq, t)) for i, (t, h, seq) in enumerate(sent)]
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


def test_one_outage_holds_the_point_before_it_for_exactly_one_grace() -> None:
    """A single outage, no stall after it (ticks every half second): the point is stored
    time up to the outage, the last stored time before it until a grace after the jump,
    then stored time again: the hold as it was before stalls could prolong it."""
    stream = _stream(KILL, OUTAGE, 16 * WINDOW)
    clock, before = _clock(), max(t for t, _ in stream if t < KILL)
    for t, _ in stream:
        held = KILL + OUTAGE <= t < KILL + OUTAGE + PLANE.grace_ns
        assert clock.at(t) == (before if held else t), t


def test_a_second_outage_during_the_hold_loses_no_spooled_batch() -> None:
    """The stream stores one tick after a 3 s outage and is down again for 2 s (under the
    gap, over a stall) before the first outage's spool is read; spooled batches come 20 ms
    apart. The hold runs on to a grace after the second outage's end (within its bound, two
    graces after the first jump): nothing is late. Ended a grace after the first jump, the
    hold let 12 of them be."""
    kill, outage = 10 * WINDOW + S, 3 * S
    stream = _stream(kill, outage, 16 * WINDOW, more=((kill + outage, 2 * S),),
                     drain_ns=20_000_000)  # fmt: skip
    covered = _covered(stream, _clock())
    assert set(covered) == set(_sent(stream)), "a spooled batch lost"
    assert max(covered.values()) == 1
    no_restart = StreamClock(PLANE.grace_ns, PLANE.stream_gap_ns, stall_ns=1 << 62)
    assert len(set(_sent(stream)) - set(_covered(stream, no_restart))) == 12


def test_a_stream_that_keeps_stalling_lets_go_of_the_hold_two_graces_after_the_jump() -> None:
    """After a 6 s outage the stream stores a message only every 1.2 s (a starved owner's
    ticks; each a stall): every stall holds a grace after it, yet the point follows stored
    time again from the first message two graces after the jump, and every window the
    steady stream fills closes, whole."""
    resume = KILL + OUTAGE
    stream = [m for m in _stream(KILL, OUTAGE, 16 * WINDOW)
              if m[0] <= resume or (m[0] - resume) % 1_200_000_000 == 0]  # fmt: skip
    stream += [(t, TICK) for t in range(resume, 16 * WINDOW, 1_200_000_000)]
    stream.sort(key=lambda m: m[0])
    clock = _clock()
    points = [(t, clock.at(t)) for t, _ in stream]
    held = [t for t, p in points if t > resume and p < t]
    assert held and max(held) < resume + 2 * PLANE.grace_ns, "held past the bound"
    assert max(held) > resume + PLANE.grace_ns, "the stalls did not hold on"
    assert all(p == t for t, p in points if t >= resume + 2 * PLANE.grace_ns)


def test_an_outage_over_the_gap_that_begins_in_the_hold_loses_no_spooled_batch() -> None:
    """The election after the kill outlasts the window's grace and its first message (a
    tick) is all the stream stores before it is down again for 4 s (over the gap: an outage
    of its own, begun while the first's hold lasts), so the first outage's spool is read
    after the second. The first outage's point is kept a grace after the second's end (the
    chain is well inside `MAX_HOLD_NS`): nothing is late, nothing twice. Held at the stored
    time before the second jump instead, the end of the killed window is late."""
    stream = _stream(KILL, OUTAGE, 16 * WINDOW, more=((KILL + OUTAGE, 4 * S),),
                     drain_ns=20_000_000)  # fmt: skip
    covered = _covered(stream, _clock())
    assert set(covered) == set(_sent(stream)), "a spooled batch lost"
    assert max(covered.values()) == 1
    unchained = StreamClock(PLANE.grace_ns, PLANE.stream_gap_ns, max_hold_ns=0)
    assert set(_sent(stream)) - set(_covered(stream, unchained)), "the chain kept nothing"


def test_a_stream_whose_every_step_is_over_the_gap_is_not_held_for_ever() -> None:
    """A partition whose owner is starved stores only its ticks, 3 s apart (over the 2.5 s
    gap) for ten minutes: each step is an outage begun while the last one's hold lasts. The
    chain keeps the first point for `MAX_HOLD_NS` at most, then holds each jump at the
    stored time before it: the point lags stored time by at most that and two graces, and
    every window of the steady stream after it closes. Before the bound, the point stayed
    where the first step found it for as long as the steps did."""
    step = 3 * S
    times = list(range(0, 10 * S, S // 2)) + list(range(10 * S, 610 * S, step))
    clock = _clock()
    points = [clock.at(t) for t in times]
    lag = max(t - p for t, p in zip(times, points, strict=True))
    assert lag <= MAX_HOLD_NS + 2 * PLANE.grace_ns + step, lag
    assert points[-1] >= times[-1] - MAX_HOLD_NS - 2 * PLANE.grace_ns - step
    assert points == sorted(points)  # never goes back


def test_stream_clock_holds_after_a_jump_and_lets_go_after_a_grace() -> None:
    c = StreamClock(grace_ns=10, gap_ns=5, stall_ns=3)
    assert [c.at(t) for t in (100, 102, 105)] == [100, 102, 105]  # steps up to the gap: time
    assert c.at(118) == 105 and c.holding()  # a jump of 13: held before it, to 128
    assert [c.at(t) for t in (120, 122, 124, 126)] == [105] * 4  # steps under a stall
    assert c.at(128) == 128 and not c.holding()  # a grace after the jump: stored time
    assert c.at(130) == 130
    assert c.at(137) == 130  # a jump after the hold starts a new one at its point


def test_a_stall_during_the_hold_holds_a_grace_after_it_but_not_past_two_graces() -> None:
    c = StreamClock(grace_ns=10, gap_ns=5, stall_ns=3)
    assert [c.at(t) for t in (100, 120)] == [100, 100]  # held to 130, to 140 at the latest
    assert c.at(124) == 100  # a stall of 4 (under the gap): held to 134
    assert c.at(128) == 100  # another: to 138
    assert c.at(131) == 100 and c.holding()  # past the first grace: to the bound, 140
    assert c.at(135) == 100 and c.at(139) == 100  # stalls of 4: held to the bound, not later
    assert c.at(140) == 140 and not c.holding()  # the bound
    steady = StreamClock(grace_ns=10, gap_ns=5, stall_ns=3)
    steady.at(100)
    points = [steady.at(t) for t in range(120, 150, 3)]  # a stall at every step
    assert points == [100] * 7 + [141, 144, 147]  # held to the bound (140), then time
    again = StreamClock(grace_ns=10, gap_ns=5, stall_ns=3)
    assert [again.at(t) for t in (100, 120, 125, 141, *range(143, 152, 2))] == [100] * 8 + [151]
    # an outage longer than the gap ending after the hold (141: past 135) is a hold of
    # its own, from the point before the first: to 151


def test_an_outage_inside_a_hold_that_stalls_prolonged_is_held_a_grace_after_it() -> None:
    """Every jump past the gap is an outage with its own grace, as it was before stalls
    prolonged holds: one that ends inside a hold already prolonged to its bound moves the
    bound too."""
    c = StreamClock(grace_ns=10, gap_ns=5, stall_ns=3)
    assert [c.at(t) for t in (100, 120, 124, 128, 131)] == [100] * 5  # held to 140
    assert c.at(138) == 100  # a jump of 7: an outage, held to 148 (158 at the latest)
    assert [c.at(t) for t in range(140, 148, 2)] == [100] * 4  # steps under a stall
    assert c.at(148) == 148 and not c.holding()


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
