"""Simulator: timestamps agree with the truth it reports; faults do what they say."""

from __future__ import annotations

import numpy as np
import pytest

from contract.records import MISSING, decode_batch, encode_batch
from mesh.fabric import FabricShape, build_fabric
from testbed.scenario import Fault, FaultKind, ScenarioError
from testbed.sim.engine import EPOCH_NS, SimConfig, SimError, Simulator
from testbed.sim.model import ModelKnobs

FABRIC = build_fabric(FabricShape())
IDEAL = ModelKnobs.ideal_model()  # these tests pin the original model exactly


def _offsets(sim: Simulator, t_ns: np.ndarray, nic: np.ndarray) -> np.ndarray:
    return sim.true_offset_ns(t_ns, nic)


@pytest.mark.parametrize("stamps,tol", [("hw", 400.0), ("sw", 40_000.0)])
def test_stamps_equal_truth_plus_clock_offsets(stamps: str, tol: float) -> None:
    sim = Simulator(FABRIC, SimConfig(model=IDEAL, timestamps=stamps, seed=3))
    st = sim.step(0.0, 0.5)
    b = st.batch
    assert len(b) > 0 and not b.lost.any()
    # forward: t2 - t1 = owd + offset(dst) - offset(src)
    theta = _offsets(sim, st.true_t_ns, b.dst) - _offsets(sim, st.true_t_ns, b.src)
    err = (b.t2 - b.t1) - st.true_fwd_ns - theta
    assert np.median(np.abs(err)) < tol / 4 and np.max(np.abs(err)) < tol
    # local send stamp = epoch + true time + offset of the initiator
    local = b.t1 - EPOCH_NS - st.true_t_ns - _offsets(sim, st.true_t_ns, b.src)
    assert np.max(np.abs(local)) < tol


def test_delays_grow_with_load() -> None:
    lo = Simulator(FABRIC, SimConfig(model=IDEAL, load=0.1, seed=1)).step(0, 2.0).true_fwd_ns
    hi = Simulator(FABRIC, SimConfig(model=IDEAL, load=0.9, seed=1)).step(0, 2.0).true_fwd_ns
    assert np.mean(hi) > np.mean(lo) + 200.0
    assert np.min(lo) > 300.0  # at least a switch traversal


def test_coded_pairs_share_path_and_spacing() -> None:
    st = Simulator(FABRIC, SimConfig(model=IDEAL, seed=2)).step(0, 0.3)
    b = st.batch
    first = np.flatnonzero(b.pos == 0)
    assert np.array_equal(b.pair[first], b.pair[first + 1])
    assert np.array_equal(b.sport[first], b.sport[first + 1])
    assert np.allclose(st.true_t_ns[first + 1] - st.true_t_ns[first], 20_000)


def test_flap_loses_exactly_the_probes_crossing_the_link_while_down() -> None:
    link = FABRIC.link("leaf1-spine2")
    hop_ids = (2 * link.index, 2 * link.index + 1)
    sim = Simulator(
        FABRIC,
        SimConfig(model=IDEAL, seed=4),
        [Fault(FaultKind.FLAP, link.id, 1.0, 4.0, down_s=1.0, up_s=1.0)],
    )
    down = sim.step(1.0, 1.0)
    crosses = np.isin(down.hops_fwd, hop_ids).any(axis=1) | np.isin(down.hops_rev, hop_ids).any(
        axis=1
    )
    assert crosses.any()
    assert np.array_equal(down.batch.lost, crosses)
    assert (down.batch.t4[crosses] == MISSING).all()
    up = sim.step(2.0, 1.0)  # the up period of the flap
    assert not up.batch.lost.any()


def test_congestion_adds_delay_only_on_crossing_probes() -> None:
    link = FABRIC.link("leaf0-spine1")
    hop_ids = (2 * link.index, 2 * link.index + 1)
    sim = Simulator(
        FABRIC,
        SimConfig(model=IDEAL, seed=5),
        [Fault(FaultKind.CONGEST, link.id, 0.0, 10.0, magnitude=20.0)],
    )
    st = sim.step(0.0, 2.0)
    crosses = np.isin(st.hops_fwd, hop_ids).any(axis=1)
    assert np.median(st.true_fwd_ns[crosses]) > np.median(st.true_fwd_ns[~crosses]) + 5_000


def test_prober_down_host_sends_nothing_and_answers_nothing() -> None:
    sim = Simulator(
        FABRIC, SimConfig(model=IDEAL, seed=6), [Fault(FaultKind.PROBER_DOWN, "host3", 0.0, 5.0)]
    )
    st = sim.step(0.0, 1.0)
    nic3 = FABRIC.nic_index["nic3"]
    assert not (st.batch.src == nic3).any()
    to3 = st.batch.dst == nic3
    assert to3.any() and st.batch.lost[to3].all()
    assert "host3" not in st.alive_hosts


def test_same_seed_same_batch_and_batches_roundtrip() -> None:
    a = Simulator(FABRIC, SimConfig(model=IDEAL, seed=9)).step(0, 0.2).batch
    b = Simulator(FABRIC, SimConfig(model=IDEAL, seed=9)).step(0, 0.2).batch
    assert np.array_equal(a.t2, b.t2) and np.array_equal(a.sport, b.sport)
    c = decode_batch(encode_batch(a))
    assert np.array_equal(c.t4, a.t4) and c.nic_ids == a.nic_ids


def test_bad_config_and_fault_targets_are_refused() -> None:
    with pytest.raises(SimError):
        SimConfig(load=1.5)
    with pytest.raises(ScenarioError, match="unknown link"):
        Simulator(FABRIC, SimConfig(), [Fault(FaultKind.FLAP, "leaf9-spine9", 0, 1)])


def test_probe_graph_has_group_mesh_and_cross_group_peers() -> None:
    f = build_fabric(FabricShape(leaves=8, hosts_per_leaf=4))
    sim = Simulator(f, SimConfig(model=IDEAL, peers=5, seed=1))
    g = f.nic_group_index
    same = g[sim.pairs_src] == g[sim.pairs_dst]
    assert same.sum() == 8 * 4 * 3  # full mesh inside each group
    cross = np.bincount(sim.pairs_src[~same], minlength=len(f.nics))
    assert cross.min() >= 4 and cross.max() <= 5
    assert len(set(zip(sim.pairs_src.tolist(), sim.pairs_dst.tolist(), strict=True))) == len(
        sim.pairs_src
    )


def test_scenario_files_are_read_strictly_with_file_and_key_named() -> None:
    from testbed.scenario import parse_scenario

    ok = {"fabric": {"leaves": 2, "spines": 2}, "faults": [
        {"kind": "flap", "target": "leaf0-spine1", "start_s": 1, "duration_s": 5.0}]}  # fmt: skip
    sc = parse_scenario(ok, source="s.toml")
    assert sc.faults[0].start_s == 1.0 and sc.shape.leaves == 2
    for doc, msg in (
        ({"seed": "3"}, r"s\.toml: seed: must be an integer, got '3'"),
        ({"load": True}, r"s\.toml: load: must be a number"),
        ({"fabric": {"leaves": 2.5}}, r"s\.toml: fabric\.leaves: must be an integer"),
        ({"nope": 1}, r"s\.toml: nope: unknown key"),
        ({"faults": [{"kind": "flap", "target": "leaf0-spine1", "start_s": "1", "duration_s": 5}]},
         r"s\.toml: faults\[0\]\.start_s: must be a number"),
        ({"faults": [{"kind": "melt", "target": "x", "start_s": 0, "duration_s": 1}]},
         r"s\.toml: faults\[0\]\.kind: must be one of"),
        ({"faults": [{"kind": "flap", "target": "x", "start_s": 0, "duration_s": 1, "x": 1}]},
         r"s\.toml: faults\[0\]\.x: unknown key"),
    ):  # fmt: skip
        with pytest.raises(ScenarioError, match=msg):
            parse_scenario(doc, source="s.toml")
