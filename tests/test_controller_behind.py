"""The controller's own lateness (`controller.behind`, issue 32): time passed in."""

from __future__ import annotations

import pytest

from contract.documents import EventDoc
from controller.behind import BehindMeter, mark_degraded

S = 1_000_000_000


def test_on_time_is_not_behind() -> None:
    m = BehindMeter()
    m.ingested(10 * S - S // 2, 10 * S)  # a batch half a second old: normal
    m.ticked(10 * S, 10 * S + S // 10)
    m.solved(S // 10, S, 10 * S)
    b = m.state(10 * S)
    assert not b.behind and not b.degraded and b.status() == ""
    assert b.by_ns == S // 2


def test_each_measure_says_behind_and_why() -> None:
    m = BehindMeter()
    m.ingested(10 * S, 13 * S + S // 5)  # batches 3.2 s old at ingest
    b = m.state(13 * S + S // 5)
    assert b.behind and b.status() == "controller behind by 3.2 s (batch age at ingest)"
    assert b.to_json()["by_s"] == 3.2
    m = BehindMeter()
    m.ticked(20 * S, 24 * S)
    assert m.state(24 * S).status() == "controller behind by 4.0 s (loop lag)"
    m = BehindMeter()
    m.solved(3 * S + S // 2, S, 30 * S)
    assert m.state(30 * S).status() == "controller behind by 2.5 s (solve overrun)"


def test_behind_lasts_the_memory_after_the_backlog_is_taken() -> None:
    m = BehindMeter(memory_ns=5 * S)
    m.ingested(10 * S, 14 * S)  # 4 s behind
    m.ingested(14 * S, 14 * S + S // 10)  # caught up: the worst is still remembered
    assert m.state(18 * S).behind
    m.ingested(19 * S + S // 2, 20 * S)
    assert not m.state(20 * S).behind  # more than the memory later: on time again


def test_a_late_prober_degrades_without_the_controller_behind() -> None:
    m = BehindMeter()
    m.prober_slip("host3", 3 * S, 5 * S)
    m.prober_slip("host2", S // 100, 5 * S)  # 10 ms: on time
    b = m.state(6 * S)
    assert not b.behind and b.degraded and b.late_probers == {"host3": 3 * S}
    assert b.status() == "probers late: host3 3.0 s"
    m.prober_slip("host3", 0, 7 * S)
    assert not m.state(7 * S).degraded


def test_timing_findings_are_marked_degraded_others_not() -> None:
    m = BehindMeter()
    m.ticked(0, 3 * S)
    events = [
        EventDoc(3 * S, "contention", "leaf0->spine0", "queueing delay"),
        EventDoc(3 * S, "prober_down", "host2"),
        EventDoc(3 * S, "clear", "leaf1->spine0"),
        EventDoc(3 * S, "link_down", "leaf1-spine1", "all probes lost"),
    ]
    out = mark_degraded(events, m.state(3 * S))
    assert out[0].detail == "queueing delay; degraded: controller behind by 3.0 s (loop lag)"
    assert out[1].detail == "degraded: controller behind by 3.0 s (loop lag)"
    assert out[2:] == events[2:]
    assert mark_degraded(events, BehindMeter().state(3 * S)) == events


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        BehindMeter(threshold_ns=0)
