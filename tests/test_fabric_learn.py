"""The fabric learned from LLDP neighbours and traced paths equals the plan it was cabled from,
and every way it can differ (a recabled NIC, a missing spine or link, a silent LLDP) is one
sentence. Observations are made from the fabric model itself (`flow_path`): each switch answers
from its router id, as `mesh.fabric.learn` assumes."""

from __future__ import annotations

import pytest

from contract.documents import TracedPath
from mesh.fabric import FabricShape, NodeKind, build_fabric
from mesh.fabric.learn import leaf_group, learn_fabric, switch_id
from mesh.fabric.plancheck import check_plan
from tests.fabricobs import by_router_id, neighbors, router_ids, traces

TWO_TIER = FabricShape(leaves=3, hosts_per_leaf=2, spines=3)
THREE_TIER = FabricShape(leaves=2, hosts_per_leaf=2, spines=2, pods=2, superspines=4)


@pytest.mark.parametrize("shape", [TWO_TIER, THREE_TIER], ids=["two-tier", "three-tier"])
def test_learned_fabric_equals_its_plan(shape: FabricShape) -> None:
    plan = build_fabric(shape)
    rid = router_ids(plan)
    names = {a: sw for sw, a in rid.items() if not sw.startswith("leaf")}
    got = learn_fabric(neighbors(plan), traces(plan, by_router_id(plan)), names=names)
    assert got.problems == ()
    f = got.fabric
    assert {(n.id, n.kind) for n in f.switches} == {(n.id, n.kind) for n in plan.switches}
    assert {(lk.lower, lk.upper) for lk in f.links} == {(lk.lower, lk.upper) for lk in plan.links}
    assert {(n.id, n.host, n.leaf, n.address) for n in f.nics} == {
        (n.id, n.host, n.leaf, n.address) for n in plan.nics
    }
    # ECMP groups follow: one per leaf, the same NICs as the plan's
    assert sorted(map(sorted, ({f.nics[i].id for i in g} for g in f.groups.values()))) == sorted(
        map(sorted, ({plan.nics[i].id for i in g} for g in plan.groups.values()))
    )
    assert f.nic("nic0").group == leaf_group("leaf0")
    assert got.router_nodes == {a: sw for sw, a in rid.items()}
    pods = {n.id: n.pod for n in f.switches if n.kind != NodeKind.SUPERSPINE}
    assert pods == {n.id: n.pod for n in plan.switches if n.kind != NodeKind.SUPERSPINE}
    check = check_plan(f, plan)
    assert check.matches_plan and check.differences == ()


def test_spines_are_named_by_router_id_and_still_match_the_plan() -> None:
    plan = build_fabric(TWO_TIER)
    got = learn_fabric(neighbors(plan), traces(plan, by_router_id(plan)))
    rid = router_ids(plan)
    spines = sorted(n.id for n in got.fabric.switches if n.kind == NodeKind.SPINE)
    assert spines == sorted(rid[f"spine{s}"] for s in range(3))
    check = check_plan(got.fabric, plan)
    assert check.matches_plan, check.differences
    assert sorted(check.paired[a] for a in spines) == ["spine0", "spine1", "spine2"]


def test_a_recabled_nic_is_one_sentence() -> None:
    plan = build_fabric(TWO_TIER)
    got = learn_fabric(
        neighbors(plan, lambda n: "leaf2" if n == "nic1" else None),
        traces(plan, by_router_id(plan)),
    )
    check = check_plan(got.fabric, plan)
    assert not check.matches_plan
    assert check.differences == ("nic1 (10.0.0.2) is cabled to leaf2, the plan says leaf0",)
    # the traces that contradict the LLDP of nic1 are counted, not placed
    assert any("disagree with LLDP" in p for p in got.problems)


def test_a_missing_spine_and_a_missing_link_are_named() -> None:
    plan = build_fabric(TWO_TIER)
    rid = router_ids(plan)
    names = {a: sw for sw, a in rid.items() if not sw.startswith("leaf")}
    gone = [lk.id for lk in plan.links if lk.upper == "spine2"] + ["leaf1-spine0"]
    got = learn_fabric(neighbors(plan), traces(plan, by_router_id(plan), gone), names=names)
    check = check_plan(got.fabric, plan)
    assert check.differences == (
        "spine spine2 was not seen: no traced path crossed it",
        "link leaf1-spine0 was not seen: no traced path crossed it",
    )


def test_unplanned_things_and_a_silent_lldp() -> None:
    plan = build_fabric(TWO_TIER)
    bigger = build_fabric(FabricShape(leaves=3, hosts_per_leaf=3, spines=3))
    got = learn_fabric(
        neighbors(bigger, lambda n: "" if n == "nic0" else None),
        traces(bigger, by_router_id(bigger)),
    )
    assert (
        got.problems[0]
        == "host0 nic0 (10.0.0.1): no LLDP neighbour (is lldpd running on the host and on its switch?)"
    )
    check = check_plan(got.fabric, plan)
    diffs = "\n".join(check.differences)
    assert (
        "nic0 (10.0.0.1, host0) was not seen: no prober reported it with an LLDP neighbour" in diffs
    )
    # the bigger fabric numbers hosts differently: host and unplanned NICs are named
    assert "is not in the plan" in diffs and "is on host" in diffs


def test_interface_addressed_icmp_breaks_the_assumption_loudly() -> None:
    """A switch answering from the inbound interface's address looks like several switches:
    the learner says so instead of guessing."""
    plan = build_fabric(TWO_TIER)
    got = learn_fabric(neighbors(plan), traces(plan, lambda node, prev: f"{node}:{prev}"))
    assert any("answers from several addresses" in p for p in got.problems)
    assert not check_plan(got.fabric, plan).matches_plan


def test_odd_paths_are_counted_not_placed() -> None:
    plan = build_fabric(TWO_TIER)
    paths = [
        TracedPath("nic0", "nic4", 1, ("a", "b"), True),
        TracedPath("nic0", "nic4", 2, ("a", "b", "c"), False),
        TracedPath("nic0", "nic99", 3, ("a", "b", "c"), True),
    ]
    got = learn_fabric(neighbors(plan), paths)
    assert set(got.problems) == {
        "1 traced path(s) left out: they cross an even number of routers (not an up-down path)",
        "1 traced path(s) left out: they did not reach their destination",
        "1 traced path(s) left out: they have a NIC that is not placed",
    }
    assert [n.kind for n in got.fabric.switches] == [NodeKind.LEAF] * 3  # nothing above


def test_silent_spine_hops_keep_what_the_leaves_say() -> None:
    plan = build_fabric(TWO_TIER)
    rid = router_ids(plan)
    got = learn_fabric(
        neighbors(plan),
        traces(plan, lambda node, _p: None if node.startswith("leaf") else rid[node]),
    )
    assert got.problems == ()
    assert check_plan(got.fabric, plan).matches_plan


def test_switch_names_become_valid_ids() -> None:
    assert switch_id(" rack 3/leaf#1 ") == "rack_3_leaf_1"
    plan = build_fabric(FabricShape(leaves=1, hosts_per_leaf=2, spines=1))
    got = learn_fabric(neighbors(plan, lambda n: "rack 3/leaf"), [])
    assert [n.id for n in got.fabric.leaves] == ["rack_3_leaf"]
