"""LiveController: simulator batches in, snapshot/history/events out (real Brain)."""

from __future__ import annotations

import numpy as np
import pytest

from contract.documents import EventDoc
from controller.admission import Outcome, Verdict
from controller.control import Control
from controller.jobs import Job, JobRegistry
from controller.live import LiveConfig, LiveController
from controller.observations import Observations
from mesh.fabric import Fabric, FabricShape, build_fabric
from mesh.snapshot import ControlUnavailable
from testbed.sim.engine import SimConfig, Simulator
from tests.brains import AllUp

BASE = 1_700_000_000_000_000_000


class StubBrain(AllUp):
    """Counts the observations tapped; a host's last will is a ``prober_down`` event."""

    def __init__(self, fabric: Fabric) -> None:
        super().__init__(fabric)
        self.seen = 0
        self.pending: list[EventDoc] = []

    def tap(self, obs: Observations) -> None:
        self.seen += len(obs)

    def take_pending(self) -> list[EventDoc]:
        out, self.pending = self.pending, []
        return out

    def presence(self, host: str, alive: bool, now_ns: int) -> None:
        if not alive:
            self.pending.append(EventDoc(now_ns, "prober_down", host))


def _run(lc: LiveController, sim: Simulator, seconds: float) -> list[EventDoc]:
    events: list[EventDoc] = []
    for st in sim.run(seconds, 0.5):
        now = BASE + int(st.t1_s * 1e9)
        lc.admit(st.batch, now)
        events += lc.tick(now)
    return events


def test_live_snapshot_delays_history_and_control() -> None:
    fab = build_fabric(FabricShape.for_nics(32))
    sim = Simulator(fab, SimConfig(seed=2, peers=8))
    lc = LiveController(fab, LiveConfig(max_events=3, window_ns=500_000_000))
    assert _run(lc, sim, 3.0) == []  # healthy fabric: no findings
    snap = lc.snapshot()
    assert snap.t_ns == BASE + 3_000_000_000
    assert snap.control_enabled is None and snap.jobs is None
    assert np.isfinite(snap.worst_in_ns).all() and np.isfinite(snap.worst_out_ns).all()
    assert 300 < np.median(snap.worst_out_ns) < 100_000
    # one entry per probed directed pair, each the worst over its paths
    pairs = {(int(a), int(b)) for a, b in zip(sim.pairs_src, sim.pairs_dst, strict=True)}
    got = set(zip(snap.owd_src.tolist(), snap.owd_dst.tolist(), strict=True))
    assert got == pairs
    k = 0
    key = (int(snap.owd_src[k]), int(snap.owd_dst[k]))
    assert max(snap.path_owd[key].values()) == pytest.approx(snap.owd_ns[k])
    assert np.isfinite(snap.clock_offset_ns).all() and (snap.clock_uncertainty_ns > 0).all()
    fd = lc.flow_delays()
    assert len(fd["owd_ns"]) >= len(pairs)
    assert (fd["queue_ns"] >= 0).all() and (fd["baseline_ns"] > 0).all()
    assert np.allclose(fd["owd_ns"] - fd["baseline_ns"], fd["queue_ns"])
    t, v = lc.history(0, 1.2)
    assert t.tolist() == [-1.0, -0.5, 0.0] and np.isfinite(v).all()
    with pytest.raises(IndexError):
        lc.history(len(fab.nics), 1.0)
    with pytest.raises(ControlUnavailable):
        lc.set_control(True)
    assert snap.control_enabled is None and snap.jobs is None
    control, jobs = Control(False), JobRegistry((Job("j1", "t1", (("nic1", "nic2"), ("nic3",))),))
    lc.attach_remediation(control, jobs, "tester")
    lc.set_control(True)
    assert control.enabled and control.audit()[-1].actor == "tester"
    after = lc.snapshot()
    assert after.control_enabled is True
    assert after.jobs == ({"name": "j1", "tenant": "t1", "nics": ["nic1", "nic2", "nic3"]},)


def test_live_duplicate_batch_not_reingested_and_events_bounded() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    sim = Simulator(fab, SimConfig(seed=4, peers=4))
    brain = StubBrain(fab)
    lc = LiveController(fab, LiveConfig(max_events=2), brain=brain)
    st = sim.step(0.0, 0.5)
    assert lc.admit(st.batch, BASE) == Verdict(Outcome.ACCEPTED, records=len(st.batch))
    assert lc.admit(st.batch, BASE) == Verdict(Outcome.DUPLICATE)
    assert brain.seen == len(st.batch)
    for h in ("host0", "host1", "host2"):
        lc.presence(h, False, BASE + 1)
    assert [e.target for e in lc.tick(BASE + 2)] == ["host0", "host1", "host2"]
    assert [e.target for e in lc.snapshot().events] == ["host1", "host2"]
    lc.gpu("host3", False, "xid 79", BASE + 3)
    assert not lc.snapshot().gpu["host3"].ok
    assert lc.snapshot().healthy_count == 0  # nothing judged yet: unknown
    lc.tick(BASE + 6_000_000_000)  # the batch's window judged (past the wait for the hosts
    # whose batches did not cover it: `LiveConfig.wait_ns`): its NICs measured
    assert lc.snapshot().healthy_count == len(fab.nics)


def test_live_reports_prober_down_with_real_brain() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    lc = LiveController(fab)
    lc.presence("host1", False, BASE)
    ev = lc.tick(BASE + 1)
    assert [(e.kind, e.target) for e in ev] == [("prober_down", "host1")]


def test_probes_sent_to_a_host_before_its_prober_was_alive_are_not_evidence() -> None:
    """A prober that starts after its peers loses their first probes to it (no responder
    yet): the namespace testbed's replays raised `loss` on such a NIC's link at start-up. The
    first alive presence (its own time) starts the host's probes counting; a repeated one (a
    retained presence delivered again) does not move it, a restart after a last will does."""
    from contract.documents import PresenceDoc
    from contract.topics import Topics
    from controller.dispatch import handle_message
    from controller.ingest import Ingestor

    fab = build_fabric(FabricShape.for_nics(16))
    sim = Simulator(fab, SimConfig(seed=4, peers=4))
    brain = StubBrain(fab)
    lc = LiveController(fab, LiveConfig(solve_inline=False), brain=brain)
    st = sim.step(0.0, 0.5)
    ing = Ingestor(fab).ingest(st.batch)
    to3 = np.isin(ing.dst, [n.index for n in fab.nics if n.host == "host3"])
    since = int(np.median(ing.t1[to3]))  # no clock solve yet: a probe's time is its send stamp
    now = int(ing.t1.max()) + 1
    doc = PresenceDoc(alive=True, t_ns=since).encode()  # as the prober publishes it
    assert handle_message(lc, Topics(), Topics().presence("host3"), doc, now) == "presence"
    assert lc.admit(st.batch, now).records == len(st.batch)
    early = int((to3 & (ing.t1 < since)).sum())
    assert early > 0 and brain.seen == len(st.batch) - early
    st2 = sim.step(0.5, 0.5)
    lc.presence("host3", True, now + 10**9, since_ns=now + 10**9)  # again: not a restart
    brain.seen = 0
    lc.admit(st2.batch, now + 10**9)
    assert brain.seen == len(st2.batch)
    lc.presence("host3", False, now + 10**9)  # last will, then back: a restart
    lc.presence("host3", True, now + 2 * 10**9, since_ns=now + 2 * 10**9)
    brain.seen = 0
    st3 = sim.step(1.0, 0.5)
    lc.admit(st3.batch, now + 2 * 10**9)
    ing3 = Ingestor(fab).ingest(st3.batch)
    to3 = np.isin(ing3.dst, [n.index for n in fab.nics if n.host == "host3"])
    assert brain.seen == len(st3.batch) - int(to3.sum())  # all sent before it came back
    # a probe stamped far before the start (stamps on another time base than the
    # controller's clock) is judged as before: the rule must not blind the controller
    far = now + 100 * 10**9
    lc.presence("host5", False, far)
    lc.presence("host5", True, far, since_ns=far)
    brain.seen = 0
    st4 = sim.step(1.5, 0.5)
    lc.admit(st4.batch, far)
    ing4 = Ingestor(fab).ingest(st4.batch)
    to3 = np.isin(ing4.dst, [n.index for n in fab.nics if n.host == "host3"])
    assert brain.seen == len(st4.batch) - int(to3.sum())  # host3's still before its restart
