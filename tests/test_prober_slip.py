"""The prober's own lateness (`prober.slip.SlipMeter`, issue 32): time passed in."""

from __future__ import annotations

from prober.slip import SlipMeter


def test_the_worst_slip_since_the_last_read() -> None:
    m = SlipMeter()
    assert m.take() == 0
    assert m.note(100, 90) == 0  # early: no slip
    assert m.note(None, 5_000) == 0  # nothing planned
    assert m.note(1_000, 1_400) == 400
    assert m.note(2_000, 2_100) == 100
    assert m.note(1.0e9, 1.5e9) == 500_000_000  # seconds of a loop clock, in ns
    assert m.take() == 500_000_000
    assert m.take() == 0
