"""The controller's own lateness (`controller.behind`, issue 32): time passed in."""

from __future__ import annotations

import json

import pytest

from contract.documents import EventDoc, HealthDoc
from contract.topics import Topics
from controller.behind import BehindMeter, mark_degraded
from controller.dispatch import handle_message
from controller.live import LiveController
from mesh.documents import fabric_from_doc, snapshot_doc, snapshot_from_doc
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

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


# ---- the live controller: the status, the snapshot and the findings say it --------------

FAB = build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, nics_per_host=1, spines=2))
T0 = EPOCH_NS


def _batches(seconds: float) -> list[tuple[int, list[bytes]]]:
    sim = Simulator(FAB, SimConfig(seed=1, peers=2, timestamps="sw"))
    return [(T0 + round(st.t1_s * S), host_batches(FAB, st.batch, i + 1)[0])
            for i, st in enumerate(sim.run(seconds, 0.5))]  # fmt: skip


def test_a_late_tick_says_controller_behind_in_the_snapshot_and_its_document() -> None:
    lc = LiveController(FAB)
    lc.loop_lag(T0, T0 + 3 * S)  # the tick planned at T0 ran 3 s late
    lc.tick(T0 + 3 * S)
    snap = lc.snapshot()
    assert snap.status == "controller behind by 3.0 s (loop lag)"
    doc = snapshot_doc(snap, control=None, jobs=None)
    assert (doc["status"], doc["behind_s"]) == ("controller behind by 3.0 s (loop lag)", 3.0)
    back = snapshot_from_doc(json.loads(json.dumps(doc)), fabric_from_doc(doc))
    assert (back.status, back.behind_ns) == (snap.status, 3 * S)
    lc.tick(T0 + 9 * S)  # 6 s later, on time: the memory (5 s) is over
    assert lc.snapshot().status == "" and snapshot_doc(lc.snapshot(), control=None,
                                                       jobs=None)["status"] == "ok"  # fmt: skip


def test_batches_ingested_late_say_so_on_time_not() -> None:
    on_time, late = LiveController(FAB), LiveController(FAB)
    for now, payloads in _batches(3):
        for p in payloads:
            on_time.admit(p, now)
            late.admit(p, now + 4 * S)  # each batch 4 s after its probes
    assert on_time.snapshot().status == ""
    assert late.behind.state(late.now_ns).batch_age_ns >= 4 * S
    assert late.snapshot().status.startswith("controller behind by 4.")
    assert late.snapshot().status.endswith("(batch age at ingest)")


def test_a_prober_that_reports_itself_late_is_shown_to_the_operator_only() -> None:
    lc = LiveController(FAB)
    doc = HealthDoc(host="host1", t_ns=T0, send_slip_ns=3 * S)
    assert handle_message(lc, Topics(), Topics().health("host1"), doc.encode(), T0) == "health"
    snap = lc.snapshot()
    assert snap.late_probers == {"host1": 3 * S} and snap.status == ""  # not the controller
    fleet = snapshot_doc(snap, control=None, jobs=None)
    assert fleet["late_probers"] == {"host1": 3.0}
    tenant = snapshot_doc(snap, nics=frozenset({0}), links=frozenset(), control=None, jobs=None)
    assert tenant["late_probers"] == {}


def test_findings_raised_while_behind_are_marked_degraded() -> None:
    lc = LiveController(FAB)
    lc.presence("host2", False, T0)  # a prober_down: a timing finding (silence or its will)
    lc.loop_lag(T0, T0 + 3 * S)
    (ev,) = [e for e in lc.tick(T0 + 3 * S) if e.kind == "prober_down"]
    assert ev.detail.endswith("degraded: controller behind by 3.0 s (loop lag)")
