"""Issue 32, "a busy controller host lies": a spurious ``contention`` on leaf0<->spine0 and
``prober_down`` of healthy hosts while leaf1<->spine0 is really congested and the controller
is behind on some of its probers (``tests/test_testbed_run.py`` on a busy machine).

The mechanism (docs/reliability.md, "A busy controller host lies"): a detection window closed
at a fixed time after its end holds what arrived by then. A controller two seconds behind on
the probers of leaf1 and leaf2 (their batches wait in its socket, or the probers are starved)
closes windows that hold only leaf0's probes: every slow one crosses leaf0->spine0 (or
spine0->leaf0) *and* the congested hop, the two tie in the cover, and the late probers look
silent. The fix (`controller.fleet.watermark`): a window some prober's batches cover waits
until every live prober's do, and the cover's tie goes to the higher bad rate.

`LiveController` is fed here, through its real door (`admit`, `tick` every second), the
per-host batches of a simulated run of netns_small's fabric with both directions of
leaf1-spine0 congested from 20 s to 36 s; the leaf1 and leaf2 probers' batches of 26-30 s
reach it 2 s late, in order. On time and behind must find the congestion and nothing
else.
"""

from __future__ import annotations

import pytest

from contract.documents import EventDoc
from contract.records import decode_batch
from controller.live import LiveConfig, LiveController
from mesh.fabric import FabricShape, build_fabric
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches
from testbed.sim.model import ModelKnobs

FAB = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, nics_per_host=1, spines=2))
S = 1_000_000_000
LATE = {n.host for n in FAB.nics if n.leaf != "leaf0"}  # the probers it is behind on
CONGESTED = {"leaf1->spine0", "spine0->leaf1"}


def _run(seed: int, behind_s: int, wait_ns: int | None = None) -> list[EventDoc]:
    """The findings of the run (see the module docstring); ``wait_ns``: the controller's
    (None: `LiveConfig`'s)."""
    congest = Fault(FaultKind.CONGEST, "leaf1-spine0", 20.0, 16.0, 2000.0)  # 2 ms of queue
    # a background that queues nowhere (the realistic model's own hot spots are real
    # congestion, scored as truth elsewhere) and NIC stamps: any other finding is the
    # timing's. (With software stamps the merged main of 2026-11-28 also raises contention on
    # the NIC uplinks under this 2 ms queue, late probers or not: an open defect, named in
    # docs/reliability.md.)
    quiet = ModelKnobs.ideal_model()
    sim = Simulator(FAB, SimConfig(seed=seed, peers=4, timestamps="hw", model=quiet), [congest])
    cfg = LiveConfig() if wait_ns is None else LiveConfig(wait_ns=wait_ns)
    lc = LiveController(FAB, cfg)
    for h in FAB.hosts:
        lc.presence(h.id, True, EPOCH_NS)
    held: list[tuple[int, bytes]] = []
    out: list[EventDoc] = []
    tick = EPOCH_NS + S
    for i, st in enumerate(sim.run(45, 0.25)):
        now = EPOCH_NS + round(st.t1_s * S)
        for p in host_batches(FAB, st.batch, i + 1)[0]:
            b = decode_batch(p)
            host = FAB.nics[FAB.nic_index[b.nic_ids[int(b.src[0])]]].host
            if behind_s and host in LATE and 26 <= st.t1_s < 30:
                held.append((now + behind_s * S, p))
            elif host in LATE and held:  # in order: a later batch comes after the held ones
                held.append((held[-1][0], p))
            else:
                lc.admit(p, now)
        while held and held[0][0] <= now:
            lc.admit(held.pop(0)[1], now)
        while tick <= now:
            out += lc.tick(tick)
            tick += S
    return out


def _findings(events: list[EventDoc]) -> set[tuple[str, str]]:
    return {(e.kind, e.target) for e in events if e.kind != "clear"}


@pytest.mark.parametrize("seed", [2, 3])
def test_behind_on_some_probers_blames_only_the_congested_link(seed: int) -> None:
    for behind_s in (0, 2):
        found = _findings(_run(seed, behind_s))
        assert found, behind_s  # the congestion is found (one direction or both) ...
        assert {k for k, _ in found} == {"contention"}, found  # ... no prober is down ...
        assert {t for _, t in found} <= CONGESTED, found  # ... and no healthy hop blamed


def test_without_waiting_for_the_late_probers_it_lies() -> None:
    """The reproduction: the same run with windows closed whatever arrived (``wait_ns`` 0,
    the controller before the fix) calls the late probers down. (The healthy hop it also
    blamed, leaf0->spine0, was a tie of the cover's, now broken by bad rate: not here.)"""
    found = _findings(_run(2, 2, wait_ns=0))
    assert {("prober_down", h) for h in LATE} <= found
    assert ("contention", "leaf0->spine0") not in found


def test_a_window_past_the_wait_is_judged_and_marked_degraded() -> None:
    """Behind by more than the wait: the windows close short of the late probers' batches,
    and what they raise says it is degraded."""
    events = _run(2, 4, wait_ns=S)
    late = [e for e in events if e.kind != "clear" and "degraded" in e.detail]
    assert late and all("late prober" in e.detail for e in late)


def _run_starved(seed: int, starve: tuple[float, float], max_age_s: float) -> list[EventDoc]:
    """The findings of a quiet run whose controller is starved over ``starve`` (wall s): it
    ticks every second but ingests ever later, every prober alike (a batch sent ``t`` s into
    the starvation waits ``t * max_age_s / half`` s, ``half`` its first half), then drains
    the backlog in order when the starvation ends."""
    quiet = ModelKnobs.ideal_model()
    sim = Simulator(FAB, SimConfig(seed=seed, peers=4, timestamps="hw", model=quiet), [])
    lc = LiveController(FAB, LiveConfig())
    for h in FAB.hosts:
        lc.presence(h.id, True, EPOCH_NS)
    t0, t1 = starve
    half = (t1 - t0) / 2
    backlog: list[tuple[float, bytes]] = []  # (arrival s, payload), in order
    out: list[EventDoc] = []
    tick = EPOCH_NS + S
    for i, st in enumerate(sim.run(50, 0.25)):
        sent = st.t1_s
        for p in host_batches(FAB, st.batch, i + 1)[0]:
            if t0 <= sent < t0 + half:  # the backlog grows: each waits longer
                at = sent + (sent - t0) * max_age_s / half
            elif t0 + half <= sent < t1:  # behind it, drained once the starvation ends
                at = t1
            else:
                at = sent
            backlog.append((max(at, backlog[-1][0]) if backlog else at, p))  # in order
        while tick <= EPOCH_NS + round(sent * S):
            wall = (tick - EPOCH_NS) / S
            while backlog and backlog[0][0] <= wall:
                lc.admit(backlog.pop(0)[1], tick)
            out += lc.tick(tick)
            tick += S
    return out


@pytest.mark.parametrize("seed", [2, 3])
def test_a_starved_controller_waits_for_its_own_backlog_instead_of_calling_probers_down(
    seed: int,
) -> None:
    """The whole controller 8 s behind (chaos seed 1's starve:controller, 2 % of a CPU for
    20 s: 'controller behind by 7.5 s (batch age at ingest)'): past the 5 s wait its windows
    closed short of every prober's batches and it raised prober_down for all six. It knows
    it is behind, so its windows wait for what waits in its socket: nothing is raised."""
    events = _run_starved(seed, (20.0, 36.0), 8.0)
    assert _findings(events) == set(), [(e.kind, e.target, e.detail) for e in events]
