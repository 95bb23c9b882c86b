"""testbed run scored like sim localize: causes checked, voting replayed on the same probes."""

from __future__ import annotations

from mesh.fabric import FabricShape, build_fabric
from testbed.runscore import estimators, score_alerts
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import SimConfig, Simulator
from testbed.sim.model import ModelKnobs

FLAP = Fault(FaultKind.FLAP, "leaf0-spine1", 1.0, 3.0, down_s=0.5, up_s=0.5)
NIC = Fault(FaultKind.NIC_DOWN, "nic3", 1.0, 3.0)


def test_right_target_wrong_cause_counts_against_precision() -> None:
    ok = score_alerts([FLAP, NIC], [("link_flap", "spine1->leaf0"), ("nic_down", "nic3")])
    assert ok["precision"] == ok["recall"] == ok["f1"] == 1.0
    wrong = score_alerts([FLAP, NIC], [("link_flap", "leaf0-spine1"), ("contention", "nic3")])
    assert wrong["recall"] == 0.5 and wrong["precision"] == 0.5
    assert wrong["wrong_cause_alerts"] == 1 and wrong["false_alerts"] == 1
    voting = score_alerts([FLAP], [(None, "leaf0-spine1"), (None, "leaf1-spine0")])
    assert voting["precision"] == 0.5 and voting["recall"] == 1.0


def test_estimators_replay_the_probes_into_the_voting_baseline() -> None:
    fab = build_fabric(FabricShape())
    fault = Fault(FaultKind.LINK_DOWN, "leaf1-spine2", 0.0, 30.0)
    sim = Simulator(fab, SimConfig(seed=3, model=ModelKnobs.ideal_model()), [fault])
    batches = [st.batch for st in sim.run(12.0, 0.5)]
    est = estimators(
        fab, [fault], [{"kind": "link_down", "target": "leaf1-spine2"}], batches, [], {}
    )
    assert est["qpmesh"]["precision"] == est["qpmesh"]["recall"] == 1.0
    v = est["voting_baseline"]
    assert v["recall"] == 1.0 and 0 < v["precision"] <= 1.0
