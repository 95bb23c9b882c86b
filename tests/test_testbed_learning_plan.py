"""The testbed's pure parts for fabric learning: router ids in the plan, the lldpd command lines,
and the trace answers -> hop list (the namespace runs are in tests/test_testbed_lldp.py)."""

from __future__ import annotations

from pathlib import Path

from mesh.fabric import FabricShape, build_fabric
from prober.timestamping import ICMP_DEST_UNREACH, ICMP_TIME_EXCEEDED
from testbed.netns.lldp import lldpd_specs
from testbed.netns.plan import make_plan
from testbed.netns.trace import hops_from_answers

FABRIC = build_fabric(FabricShape(leaves=2, hosts_per_leaf=1, spines=2))


def test_router_ids_are_the_routes_source_and_the_icmp_source() -> None:
    plan = make_plan(FABRIC, "qpm-", router_ids=True)
    assert plan.router_ids == {"leaf0": "100.64.0.1", "leaf1": "100.64.0.2",
                               "spine0": "100.64.0.3", "spine1": "100.64.0.4"}  # fmt: skip
    leaf = plan.ns_ip["qpm-leaf0"]
    assert leaf[1] == "addr add 100.64.0.1/32 dev lo"  # before any route names it as source
    assert "route add 10.0.0.1/32 dev nic0 src 100.64.0.1" in leaf
    assert any(line.startswith("route add 10.0.0.0/8 src 100.64.0.1 nexthop") for line in leaf)
    assert (
        "route add 10.0.1.0/24 via 172.16.0.10 dev leaf1 src 100.64.0.4" in plan.ns_ip["qpm-spine1"]
    )
    assert "net.ipv4.icmp_errors_use_inbound_ifaddr=0" in plan.ns_sysctl["qpm-spine0"]
    plain = make_plan(FABRIC, "qpm-")  # the default keeps interface-addressed answers
    assert plain.router_ids == {} and not any("dev lo" in x for x in plain.ns_ip["qpm-leaf0"])
    assert "net.ipv4.icmp_errors_use_inbound_ifaddr=1" in plain.ns_sysctl["qpm-spine0"]
    assert "route add 10.0.0.1/32 dev nic0 src 10.0.0.254" in plain.ns_ip["qpm-leaf0"]


def test_one_lldpd_per_namespace_with_its_own_socket(tmp_path: Path) -> None:
    plan = make_plan(FABRIC, "qpm-", lldp=True)
    specs = {s.node: s for s in lldpd_specs(plan, tmp_path)}
    assert set(specs) == {"host0", "host1", "leaf0", "leaf1", "spine0", "spine1"}
    assert len({s.socket for s in specs.values()}) == 6
    h = specs["host0"]
    assert h.argv[:5] == ("ip", "netns", "exec", "qpm-host0", "lldpd")
    assert h.argv[5:] == ("-d", "-u", str(tmp_path / "host0.sock"), "-O", str(tmp_path / "host0.conf"),
                          "-I", "nic*")  # fmt: skip
    assert "-I" not in specs["leaf0"].argv  # switches speak LLDP on every port
    assert specs["spine1"].config_text.startswith("configure system hostname spine1\n")


def test_trace_answers_become_a_hop_list() -> None:
    te, du = ICMP_TIME_EXCEEDED, ICMP_DEST_UNREACH
    assert hops_from_answers({1: (te, "a"), 2: (te, "b"), 3: (te, "c"), 4: (du, "d")}, 4) == (
        ("a", "b", "c"), True)  # fmt: skip
    assert hops_from_answers({1: (te, "a"), 3: (te, "c"), 4: (du, "d")}, 4) == (
        ("a", None, "c"),
        True,
    )
    assert hops_from_answers({1: (te, "a")}, 3) == (("a", None, None), False)
