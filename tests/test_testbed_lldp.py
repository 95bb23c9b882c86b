"""Fabric learning on real namespaces: lldpd in every namespace (started and stopped by pid with
the fabric), switches answering TTL probes from their router ids, the learned fabric equal to
the plan, and ``qpmesh doctor`` inside a host namespace. Needs root, ``ip netns`` and lldpd."""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from contract.documents import TracedPath
from contract.neighbors import LldpNeighbor, NeighborsDoc, NicNeighbors
from mesh.fabric import Fabric, FabricShape, NodeKind
from mesh.fabric.learn import learn_fabric
from mesh.fabric.plancheck import check_plan
from prober.discover.lldp import read_lldp
from testbed.netns.lifecycle import up
from testbed.netns.lldp import lldp_dir, lldp_socket, lldpd_available
from testbed.netns.plan import Plan
from testbed.netns.state import alive, load_state, state_dir
from testbed.netns.teardown import tear_down
from testbed.netns.trace import trace


def _reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("nft") is None:
        return "needs iproute2 and nftables"
    if not lldpd_available():
        return "needs lldpd (.ci/setup installs it)"
    return None


pytestmark = [pytest.mark.netns, pytest.mark.skipif(_reason() is not None, reason=str(_reason()))]
SPORTS = range(49152, 49160)


def _prefix() -> str:
    return "l" + secrets.token_hex(3) + "-"


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[Fabric, Plan]]:
    prefix = _prefix()
    try:
        yield up(FabricShape(leaves=2, hosts_per_leaf=2, spines=2), prefix, router_ids=True,
                 lldp=True)  # fmt: skip
    finally:
        tear_down(prefix)


def _neighbours(
    fabric: Fabric, plan: Plan, timeout_s: float = 30.0
) -> dict[str, dict[str, tuple[LldpNeighbor, ...]]]:
    """Each host's LLDP neighbours, once every NIC sees one with a system name."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = {h.id: read_lldp(lldp_socket(lldp_dir(plan.prefix), h.id)) for h in fabric.hosts}
        named = all(
            len(got[n.host].get(n.id, ())) == 1 and got[n.host][n.id][0].chassis_name
            and not got[n.host][n.id][0].chassis_name.startswith("host")
            for n in fabric.nics
        )  # fmt: skip
        if named or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_lldpd_runs_in_every_namespace_by_pid(bed: tuple[Fabric, Plan]) -> None:
    fabric, plan = bed
    procs = [p for p in (load_state(plan.prefix) or {}).get("processes", [])
             if p["role"].startswith("lldpd:")]  # fmt: skip
    assert sorted(p["role"] for p in procs) == sorted(f"lldpd:{n.id}" for n in fabric.nodes)
    assert all(alive(p) for p in procs)
    # no socket in the state directory: `testbed run` copies it into its output
    assert not [p for p in state_dir(plan.prefix).rglob("*") if p.is_socket()]


def test_each_host_sees_its_leaf_by_name(bed: tuple[Fabric, Plan]) -> None:
    fabric, plan = bed
    got = _neighbours(fabric, plan)
    assert {
        (h, nic, tuple(n.name for n in seen)) for h, per in got.items() for nic, seen in per.items()
    } == {
        (n.host, n.id, (n.leaf,)) for n in fabric.nics
    }  # only the NICs: the management veth runs no LLDP


def test_learned_fabric_equals_the_plan(bed: tuple[Fabric, Plan]) -> None:
    fabric, plan = bed
    seen = _neighbours(fabric, plan)
    docs = [
        NeighborsDoc(h.id, 0, tuple(NicNeighbors(n.id, n.id, n.address, seen[h.id].get(n.id, ()))
                                    for n in fabric.nics_of_host(h.id)))
        for h in fabric.hosts
    ]  # fmt: skip
    paths: list[TracedPath] = []
    for a, b in itertools.permutations(fabric.nics, 2):
        for sport in SPORTS:
            paths.append(trace(plan.host_ns(a.host), a.id, a.address, b.id, b.address, sport))
    assert all(p.reached and None not in p.hops for p in paths)
    spines = {rid: sw for sw, rid in plan.router_ids.items() if sw.startswith("spine")}
    named = learn_fabric(docs, paths, names=spines)
    assert named.problems == ()
    assert dict(named.router_nodes) == {rid: sw for sw, rid in plan.router_ids.items()}
    check = check_plan(named.fabric, fabric)
    assert check.matches_plan, check.differences
    assert {(lk.lower, lk.upper) for lk in named.fabric.links} == {
        (lk.lower, lk.upper) for lk in fabric.links
    }
    # without the plan's names the spines are their router ids, and still pair with the plan
    bare = learn_fabric(docs, paths)
    assert {n.id for n in bare.fabric.switches if n.kind == NodeKind.SPINE} == set(spines)
    assert check_plan(bare.fabric, fabric).matches_plan


def test_doctor_in_a_host_namespace(bed: tuple[Fabric, Plan]) -> None:
    fabric, plan = bed
    _neighbours(fabric, plan)
    proc = subprocess.run(
        ["ip", "netns", "exec", plan.host_ns("host0"), sys.executable, "-m", "qpmesh.cli",
         "doctor", "--json", "--nics", "nic*", "--lldp-socket",
         lldp_socket(lldp_dir(plan.prefix), "host0")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["nics"]["detail"] == "nic0 (10.0.0.1)"
    assert checks["timestamping nic0"]["status"] == "warn"  # veth: software stamps
    assert checks["lldp nic0"]["detail"].startswith("cabled to leaf0 port ")
    assert checks["rdma nic0"]["status"] == "skip"
    nics = {n["ifname"]: n for n in doc["nics"]}
    assert set(nics) == {"lo", "mgmt", "nic0"} and not nics["mgmt"]["selected"]
    assert (nics["nic0"]["timestamping"], nics["nic0"]["virtual"]) == ("software", True)


def test_teardown_stops_every_lldpd() -> None:
    prefix = _prefix()
    try:
        _, plan = up(FabricShape(leaves=1, hosts_per_leaf=1, spines=1), prefix, lldp=True)
        pids = [p["pid"] for p in (load_state(prefix) or {}).get("processes", [])]
        assert len(pids) == 3 and not plan.router_ids
    finally:
        tear_down(prefix)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]  # gone, not even zombies
    assert not os.path.exists(lldp_dir(prefix))
