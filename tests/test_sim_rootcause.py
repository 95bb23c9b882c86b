"""``qpmesh sim rootcause``: the signal simulator's counter rules, what each injected cause
does and claims, the scoring, and a short end-to-end run through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from contract.signals import Entity, names_of
from controller.anomaly.detector import Anomaly, Contributor
from controller.jobs import Job
from controller.rootcause.graph import build_graph
from qpmesh.cli import main
from testbed.sim.rootcause_bench import RunResult, score_flags, score_root_causes
from testbed.sim.signals_causes import ACCEPT, EFFECTS, KINDS, Cause, World, draw_causes
from testbed.sim.signals_model import (
    COL,
    CounterLayer,
    NormalModel,
    build_fleet,
    missing_masks,
    schedule_jobs,
)
from testbed.sim.static_baseline import StaticFlags, naive_root_cause


def test_counter_layer_wraps_saturates_and_keeps_missing_missing() -> None:
    rng = np.random.default_rng(1)
    n_s = len(names_of(Entity.GPU))
    missing = np.zeros((2, n_s), bool)
    missing[1, COL[Entity.GPU]["ecc_corrected"]] = True
    layer = CounterLayer(Entity.GPU, missing, rng)
    j = COL[Entity.GPU]["gpu_pcie_replay"]  # 32-bit, wraps
    layer.cum[:, j] = 2.0**32 - 1e6
    layer.prev = layer.cum.copy()
    vals = np.zeros((2, n_s))
    vals[:, j] = 2e5  # 2e6 per 10 s window: counted exactly, wraps once
    vals[:, COL[Entity.GPU]["temperature_c"]] = 70.0
    out = layer.read(vals, 10.0)
    assert out[0, j] == 2e5 and out[1, j] == 2e5
    assert out[0, COL[Entity.GPU]["temperature_c"]] == 70.0
    assert np.isnan(out[1, COL[Entity.GPU]["ecc_corrected"]])  # not given: NaN, never 0
    assert out[0, COL[Entity.GPU]["ecc_corrected"]] == 0.0
    n = len(names_of(Entity.NIC))
    nic = CounterLayer(Entity.NIC, np.zeros((1, n), bool), rng)
    k = COL[Entity.NIC]["rdma_xmit_wait"]  # 32-bit, saturating (the IB PMA)
    nic.cum[0, k] = 2.0**32 - 10
    nic.prev = nic.cum.copy()
    v = np.zeros((1, n))
    v[0, k] = 1e6
    assert np.isnan(nic.read(v, 10.0)[0, k])  # stuck at its maximum: not available


def _world(seed: int = 3) -> tuple[World, NormalModel]:
    rng = np.random.default_rng(seed)
    fleet = build_fleet(128, rng)
    jobs = schedule_jobs(fleet, 1500, 10.0, rng)
    model = NormalModel(fleet, jobs, 10.0, rng)
    return World(fleet, jobs, model, 10.0, rng), model


def test_the_normal_model_has_no_trouble_signals() -> None:
    w_, model = _world()
    r = model.window(50)
    c = COL[Entity.NIC]
    assert (r.nic[:, c["mtu"]] == 9000).all() and (r.nic[:, c["cnp_ignored"]] == 0).all()
    assert (r.nic[:, c["pcie_replay_rollover"]] == 0).all()
    assert (r.gpu[:, COL[Entity.GPU]["throttle_thermal"]] == 0).all()
    busy = (r.host_job[w_.fleet.nic_host] >= 0) & (r.host_phase[w_.fleet.nic_host] == 0)
    assert r.nic[busy, c["rdma_tx_bytes"]].min() > 1e9
    assert r.nic[~busy, c["rdma_tx_bytes"]].max(initial=0.0) < 1e9


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "unobservable"])
def test_each_cause_touches_what_it_claims(kind: str) -> None:
    w_, model = _world()
    causes = draw_causes(w_, 1, 130, 1500, kinds=(kind,))
    assert causes, kind
    c = causes[0]
    w = c.end - 1
    before = model.window(w)
    after = model.window(w)
    eff = EFFECTS[kind](w_, c, w, after)
    assert eff.affected, "a cause must touch some entity's counters"
    diff = {k: np.abs(after.of(k) - before.of(k)) for k in Entity}
    assert any((d > 0).any() for d in diff.values())
    assert c.targets and ACCEPT[kind]
    for f in eff.findings:
        assert f.kind in ("contention", "loss", "link_flap", "prober_down")


def test_causes_do_not_share_a_job_at_a_time() -> None:
    w_, _ = _world(5)
    causes = draw_causes(w_, 11, 130, 1500)
    assert sorted(c.kind for c in causes) == sorted(KINDS)
    assert all(130 <= c.start < c.end <= 1500 for c in causes)
    for a in causes:  # no two at once on hosts of one job
        for b in causes:
            if a is not b and a.start < b.end and b.start < a.end:
                assert not (a.targets & b.targets)


def _result() -> RunResult:
    causes = [
        Cause("gpu_thermal", "host1.gpu0", 10, 20, 0.5, frozenset({"host1.gpu0"})),
        Cause("unobservable", "job1", 30, 40, 0.5, frozenset({""})),
    ]
    answers = {"q": {(0, w): "gpu_throttle|host1.gpu0" for w in range(10, 20)}}
    answers["q"].update({(1, w): "unknown|" for w in range(30, 40)})
    answers["q"][(0, 12)] = "host_io|host1"  # one stray window: the mode decides
    flags = {"q": [("host1.gpu0", 12), ("nic9", 15), ("host1.gpu0", 50)]}
    return RunResult(flags, answers, {(0, 0): list(range(10, 20)), (1, 1): list(range(30, 40))},
                     [{"host1.gpu0"}, set()], causes, 4, 1.0, 0, [])  # fmt: skip


def test_scoring_root_causes_and_flags() -> None:
    r = _result()
    got = score_root_causes(r, "q", persist=3)
    assert got == [
        ("gpu_thermal", True, "gpu_throttle|host1.gpu0"),
        ("unobservable", True, "unknown|"),
    ]
    r.answers["q"].update({(1, w): "gpu_throttle|host1.gpu0" for w in range(30, 40)})
    assert score_root_causes(r, "q", persist=3)[1][1] is False  # naming a cause that is not
    f = score_flags(r, "q", grace=6)
    assert (f["true"], f["false"], f["causes"], f["found"]) == (1, 2, 1, 1)


def test_static_limits_and_their_naive_answer() -> None:
    st = StaticFlags(Entity.NIC, persist=2)
    names = names_of(Entity.NIC)
    v = np.zeros((2, len(names)))
    v[:, names.index("mtu")] = 9000.0
    v[:, names.index("link_up")] = 1.0
    v[1, names.index("pause_rx")] = 5e4
    from controller.anomaly.frame import SignalFrame

    frame = SignalFrame(Entity.NIC, ("nic0", "nic4"), names, v)
    assert st.step(frame, 0) == ([], {})
    new, active = st.step(frame, 1)
    assert new == ["nic4"] and active["nic4"].signals == ("pause_rx",)
    fab_graph = build_graph(build_fleet(16, np.random.default_rng(0)).fabric,
                            Job("j", "t", (("nic0",), ("nic4",))))  # fmt: skip
    assert naive_root_cause(fab_graph, active) == ("pfc_storm", fab_graph.nic_leaf["nic4"])
    hot = Anomaly(
        0, Entity.GPU, "host0.gpu0", 12.0, 0, (Contributor("temperature_c", 12.0, 91, None, None),)
    )
    assert naive_root_cause(fab_graph, {"host0.gpu0": hot}) == ("gpu_throttle", "host0.gpu0")
    assert naive_root_cause(fab_graph, {}) == ("unknown", "")


def test_missing_masks_follow_the_drivers() -> None:
    fleet = build_fleet(256, np.random.default_rng(2))
    m = missing_masks(fleet, np.random.default_rng(2))[Entity.NIC]
    bnxt = ~fleet.mlx5[fleet.nic_host]
    cnp = COL[Entity.NIC]["cnp_ignored"]
    assert (m[bnxt, cnp]).all() and not (m[~bnxt, cnp]).any()
    assert (m[~bnxt, COL[Entity.NIC]["fec_corrected_blocks"]]).all()


def test_rootcause_command_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "rootcause", "--nics", "64", "--duration", "2400", "--causes", "4",
            "--seed", "7", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    est = out["estimators"]
    for name in ("qpmesh", "static_thresholds", "mesh_only", "static_chain"):
        acc = est[name]["root_cause_accuracy"]
        assert acc is None or 0.0 <= acc <= 1.0
    assert 0.0 <= est["qpmesh"]["anomaly_precision"] <= 1.0
    assert est["mesh_only"]["anomaly_precision"] is None
    assert est["qpmesh"]["false_flags_per_100_host_hours"] >= 0
    assert out["fabric"]["nics"] == 64 and out["seeds"] == [7]
    assert set(out["per_kind"]) == set(KINDS)
    assert main(["sim", "rootcause", "--nics", "8"]) == 2  # one line, exit 2
    assert main(["sim", "rootcause", "--set", "no_such=1"]) == 2
