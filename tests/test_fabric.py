"""Fabric model: shapes, ids, ECMP paths (two and three tiers)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from mesh.fabric import FabricError, FabricShape, build_fabric, flow_path, flow_paths
from mesh.fabric.ecmp import spine_of_path
from qpmesh.cli import main


def test_default_shape_is_a_small_rack_row() -> None:
    f = build_fabric(FabricShape())
    assert len(f.nics) == 16 and len(f.leaves) == 4
    assert len(f.links) == 16 + 4 * 4
    assert f.groups["ecmp2"] == (8, 9, 10, 11)
    assert f.nic("nic5").leaf == "leaf1" and f.nic("nic5").address == "10.0.1.2"


def test_ids_and_indices_are_stable() -> None:
    a = build_fabric(FabricShape(leaves=3, spines=2)).to_dict()
    b = build_fabric(FabricShape(leaves=3, spines=2)).to_dict()
    assert a == b


@pytest.mark.parametrize(
    "kwargs",
    [
        {"leaves": 0},
        {"pods": 2},
        {"superspines": 3, "spines": 2, "pods": 2},
        {"hosts_per_leaf": 300},
    ],
)
def test_bad_shapes_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(FabricError):
        FabricShape(**kwargs)


def test_two_tier_path_crosses_one_spine_and_ports_spread() -> None:
    f = build_fabric(FabricShape())
    spines = Counter()
    for sport in range(49152, 49152 + 400):
        hops = flow_path(f, "nic0", "nic5", sport)
        names = [f.hop_name(h) for h in hops]
        assert names[0] == "nic0->leaf0" and names[-1] == "leaf1->nic5"
        assert len(hops) == 4
        spines[spine_of_path(f, hops)] += 1
    assert set(spines) == {f"spine{i}" for i in range(4)}
    assert min(spines.values()) > 60  # roughly even spread over 4 spines


def test_same_leaf_path_stays_on_leaf() -> None:
    f = build_fabric(FabricShape())
    assert [f.hop_name(h) for h in flow_path(f, "nic0", "nic1", 50000)] == [
        "nic0->leaf0",
        "leaf0->nic1",
    ]


def test_path_is_deterministic_and_vectorized_matches_scalar() -> None:
    f = build_fabric(FabricShape(leaves=6, spines=3))
    rng = np.random.default_rng(1)
    src = rng.integers(0, len(f.nics), 300)
    dst = (src + rng.integers(1, len(f.nics), 300)) % len(f.nics)
    sport = rng.integers(49152, 65536, 300)
    paths = flow_paths(f, src, dst, sport)
    for i in range(0, 300, 37):
        scalar = flow_path(f, f.nics[src[i]].id, f.nics[dst[i]].id, int(sport[i]))
        assert [h for h in paths[i] if h >= 0] == scalar


def test_three_tier_path_climbs_to_a_superspine_across_pods() -> None:
    f = build_fabric(FabricShape(leaves=2, spines=2, pods=2, superspines=4))
    names = [f.hop_name(h) for h in flow_path(f, "nic0", "nic12", 50001)]
    assert len(names) == 6
    assert names[2].split("->")[1].startswith("super")
    # inside a pod the path turns at a spine
    assert len(flow_path(f, "nic0", "nic5", 50001)) == 4


def test_flow_to_self_and_unknown_nic_are_refused() -> None:
    f = build_fabric(FabricShape())
    with pytest.raises(FabricError):
        flow_path(f, "nic1", "nic1", 50000)
    with pytest.raises(FabricError, match="unknown NIC"):
        flow_path(f, "nic1", "nic99", 50000)


def test_cli_topology_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "topology", "--leaves", "2", "--spines", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {n["id"] for n in doc["nodes"]} >= {"leaf0", "leaf1", "spine0", "spine1", "host0"}
    assert [n["id"] for n in doc["nics"]] == [f"nic{i}" for i in range(8)]
    assert "leaf0-spine1" in {lk["id"] for lk in doc["links"]}


def test_cli_bad_shape_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "topology", "--pods", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "super-spines" in err[0]


def test_sibling_links_are_the_other_uplinks_to_the_same_tier() -> None:
    f = build_fabric(FabricShape(pods=2, leaves=2, hosts_per_leaf=2, spines=2, superspines=4))
    ids = {lk.id: lk.index for lk in f.links}
    sib = {lk.id: sorted(f.links[i].id for i in f.sibling_links[lk.index]) for lk in f.links}
    assert sib["leaf0-spine0"] == ["leaf0-spine1"]  # a leaf's other spine uplink
    assert sib["spine1-super2"] == ["spine1-super3"]  # a spine's other uplink in its plane
    assert sib["nic0-leaf0"] == []  # a NIC has one link
    # symmetric, and never across tiers
    for lk in f.links:
        for s in f.sibling_links[lk.index]:
            assert lk.index in f.sibling_links[s]
            assert f.links[s].lower == lk.lower
    assert ids["leaf0-spine0"] not in f.sibling_links[ids["spine0-super0"]]
