"""Pure parts of the namespace testbed: plan layout, fault plans, timeline, virtual clocks."""

from __future__ import annotations

import numpy as np
import pytest

from mesh.fabric import FabricShape, build_fabric
from testbed import faults
from testbed.netns.blast import packets_due
from testbed.netns.plan import PlanError, check_prefix, make_plan, names_pattern
from testbed.scenario import TESTBED_CONGEST, Fault, FaultKind, ScenarioError, random_faults
from testbed.schedule import parse_duration, timeline
from testbed.vclock import ClockError, VirtualClock, assign_clocks


def _plan(prefix: str = "qpm-"):  # type: ignore[no-untyped-def]
    fabric = build_fabric(FabricShape())
    return fabric, make_plan(fabric, prefix)


def test_default_plan_names_addresses_and_ecmp() -> None:
    fabric, plan = _plan()
    assert len(plan.namespaces) == 16 + 4 + 4
    assert all(ns.startswith("qpm-") for ns in plan.namespaces)
    assert all(len(n) <= 15 for n in plan.root_links)
    ifnames = [e.ifname for lp in plan.links.values() for e in (lp.lower, lp.upper)]
    assert all(len(n) <= 15 for n in ifnames)
    addrs = [lp.lower.addr for lp in plan.links.values() if not lp.link_id.startswith("nic")]
    addrs += [lp.upper.addr for lp in plan.links.values() if not lp.link_id.startswith("nic")]
    assert len(set(addrs)) == len(addrs)
    for n in fabric.nics:
        assert plan.links[f"{n.id}-{n.leaf}"].lower.addr == f"{n.address}/32"
    multipath = [ln for ln in plan.ns_ip["qpm-leaf0"] if "nexthop" in ln]
    assert len(multipath) == 1 and multipath[0].count("nexthop via") == 4
    assert "net.ipv4.fib_multipath_hash_policy=1" in plan.ns_sysctl["qpm-leaf0"]
    assert all(any("tbf rate" in c for c in plan.ns_tc[ns]) for ns in plan.namespaces)


def test_two_nics_of_a_host_talk_through_their_leaf() -> None:
    fabric = build_fabric(FabricShape(leaves=2, hosts_per_leaf=1, nics_per_host=3, spines=2))
    plan = make_plan(fabric, "qpm-")
    ip = plan.ns_ip["qpm-host0"]
    pairs = [ln for ln in ip if " iif lo lookup " in ln]
    assert len(pairs) == 6  # one per ordered pair of its 3 NICs, before the local table
    a, b = fabric.nics[0], fabric.nics[1]
    assert any(ln.startswith(f"rule add from {a.address} to {b.address} iif lo") for ln in pairs)
    assert "rule add lookup local pref 999" in ip and "rule del lookup local pref 0" in ip
    assert "net.ipv4.conf.all.accept_local=1" in plan.ns_sysctl["qpm-host0"]
    one = make_plan(build_fabric(FabricShape()), "qpm-")  # one NIC per host: nothing to add
    assert not any("lookup local" in ln for ln in one.ns_ip["qpm-host0"])


def test_prefix_rules_and_pattern() -> None:
    for bad in ("", "Qpm-", "toolongprefix-", "a/b"):
        with pytest.raises(PlanError):
            check_prefix(bad)
    pat = names_pattern("qpm-")
    assert pat.match("qpm-host3") and pat.match("qpm-br") and pat.match("qpm-h12")
    assert not pat.match("qpm-t1-host0") and not pat.match("qpm-hostx")


def test_superspines_and_unknown_ids_are_refused() -> None:
    with pytest.raises(PlanError):
        make_plan(build_fabric(FabricShape(pods=2, superspines=4)), "qpm-")
    _, plan = _plan()
    with pytest.raises(PlanError, match="unknown link"):
        faults.loss_plan(plan, "leaf9-spine0", 10)
    with pytest.raises(PlanError, match="unknown NIC"):
        faults.nic_plan(plan, "nic99", up=False)
    with pytest.raises(PlanError, match="unknown host"):
        plan.host_ns("host99")


def test_loss_plan_covers_both_ends_and_clears() -> None:
    _, plan = _plan()
    steps = faults.loss_plan(plan, "leaf1-spine2", 30)
    assert [s.argv[3] for s in steps] == ["qpm-leaf1", "qpm-spine2"]
    assert 'oifname "spine2" numgen random mod 100 < 30' in (steps[0].stdin or "")
    assert 'oifname "leaf1"' in (steps[1].stdin or "")
    down = faults.loss_plan(plan, "leaf1-spine2", 100)[0].stdin or ""
    assert "numgen" not in down and "drop" in down
    clear = faults.loss_plan(plan, "leaf1-spine2", 0)[0].stdin or ""
    assert "drop" not in clear and "delete table" in clear


def test_congest_targets_and_flap_schedule() -> None:
    _, plan = _plan()
    ((s, r),) = faults.congest_targets(plan, "leaf0-spine1", "up")
    assert (s.ns, r.ns) == ("qpm-leaf0", "qpm-spine1")
    assert len(faults.congest_targets(plan, "nic0-leaf0", "both")) == 2
    assert faults.flap_schedule(2, 3, 2) == [(0, False), (2, True), (5, False), (7, True)]
    with pytest.raises(PlanError):
        faults.flap_schedule(0, 1, 1)


def test_nic_up_restores_its_routes() -> None:
    _, plan = _plan()
    steps = faults.nic_plan(plan, "nic5", up=True)
    assert steps[0].argv[-1] == "up"
    assert "route replace 10.0.0.0/8 via" in (steps[1].stdin or "")


def test_timeline_and_durations() -> None:
    fl = Fault(FaultKind.FLAP, "leaf0-spine0", 1.0, 3.0, down_s=0.5, up_s=1.0)
    cg = Fault(FaultKind.CONGEST, "leaf1-spine0", 2.0, 1.0, magnitude=0.5)
    acts = timeline([fl, cg], fabric_rate_mbit=100)
    ops = [(a.t_s, a.op) for a in acts]
    assert ops[:2] == [(1.0, "link_down"), (1.5, "link_up")]
    assert (2.0, "congest") in ops and (3.0, "congest_stop") in ops
    assert next(a.value for a in acts if a.op == "congest") == pytest.approx(150)
    assert (
        parse_duration("500ms") == 0.5 and parse_duration("2s") == 2 and parse_duration("1m") == 60
    )
    with pytest.raises(ScenarioError):
        parse_duration("soon")


def test_virtual_clock_is_exact_and_seeded() -> None:
    c = VirtualClock(offset_ns=500_000.0, drift=20e-6, t0_ns=10**18)
    assert c.apply(10**18) == 10**18 + 500_000
    assert c.apply(10**18 + 10**9) == 10**18 + 10**9 + 520_000
    arr = c.apply_array(np.array([10**18, 10**18 + 10**9]))
    assert list(arr) == [c.apply(10**18), c.apply(10**18 + 10**9)]
    a = assign_clocks(["host0", "host1"], seed=4, t0_ns=0)
    assert a == assign_clocks(["host0", "host1"], seed=4, t0_ns=0)
    assert all(abs(v.offset_ns) <= 1e6 and abs(v.drift) <= 30e-6 for v in a.values())
    with pytest.raises(ClockError):
        VirtualClock(0.0, 0.01, 0)


def test_generator_pacing() -> None:
    assert packets_due(8e6, 1000, 1.0, 0) == 1000
    assert packets_due(8e6, 1000, 1.0, 1000) == 0


def test_stop_processes_terminates_then_kills_what_ignores_sigterm() -> None:
    import subprocess
    import sys

    from testbed.netns.nsutil import stop_processes

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    stop_processes([polite, stubborn, done], timeout_s=0.5)
    stubborn.wait(timeout=30)
    assert polite.returncode == -15  # SIGTERM was enough
    assert stubborn.returncode == -9  # ignored SIGTERM: killed
    assert done.returncode == 0  # already gone: fine


def test_random_congestion_on_the_testbed_runs_above_the_shaped_rate() -> None:
    """Random faults in testbed units: every congest fault's generator outruns the shaped link
    (the simulator's 20 µs read as 20 Mbit/s under a 100 Mbit/s shaper built no queue)."""
    fabric = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, nics_per_host=1, spines=2))
    congests = []
    for seed in range(1, 30):
        fs = random_faults(fabric, 2, seed=seed, duration_s=40, congest_magnitude=TESTBED_CONGEST)
        congests += [a for a in timeline(fs, fabric_rate_mbit=100) if a.op == "congest"]
    assert congests
    assert all(a.value == pytest.approx(160.0) for a in congests)
    sim = random_faults(fabric, 2, seed=3, duration_s=40)
    assert {f.magnitude for f in sim if f.kind == FaultKind.CONGEST} <= {20.0}


def test_wait_port_sees_a_listener_and_gives_up_on_none() -> None:
    import socket

    from testbed.netns.nsutil import wait_port

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert wait_port("127.0.0.1", port, timeout_s=30) is True
    assert wait_port("127.0.0.1", port, timeout_s=0.2) is False  # closed: nobody listens


def test_random_host_faults_go_on_hosts_and_leave_the_other_draws_alone() -> None:
    """`sim localize --kinds prober_down` drew a link as the prober's host (and failed);
    host faults now draw hosts, from a stream of their own, so a seed's other faults are
    the ones it always gave."""
    fabric = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, nics_per_host=1, spines=2))
    hosts = {h.id for h in fabric.hosts}
    for kind in (FaultKind.PROBER_DOWN, FaultKind.GPU_FAULT):
        fs = random_faults(fabric, 3, seed=5, duration_s=30, kinds=(kind,))
        assert {f.kind for f in fs} == {kind} and {f.target for f in fs} <= hosts
        assert len({f.target for f in fs}) == 3
    assert random_faults(fabric, 2, seed=3, duration_s=40)[0].target == "leaf0-spine0"  # as before
    two_hosts = build_fabric(FabricShape(leaves=2, hosts_per_leaf=1, spines=4))
    with pytest.raises(ScenarioError, match="not enough distinct targets"):
        random_faults(two_hosts, 3, seed=1, duration_s=30, kinds=(FaultKind.PROBER_DOWN,))


def test_a_run_starts_its_fault_clock_once_the_mesh_measures() -> None:
    """On a busy machine the probers and the controller took seconds to start, and a fault at
    5 s fell before anything measured (seed 5 of the random faults, load 5-6): the run waits
    for every prober's first batch and the controller's connection (`mesh_missing`)."""
    from testbed.runner import mesh_missing

    hosts = ["host0", "host1"]
    up = '{"t_ns": 1, "msg": "warning: unsigned"}\n{"t_ns": 2, "msg": "connected", "broker": "b"}\n'
    assert mesh_missing(frozenset(), hosts, "") == ["host0", "host1", "controller"]
    assert mesh_missing(frozenset({"host1"}), hosts, "not json\n") == ["host0", "controller"]
    assert mesh_missing(frozenset({"host0", "host1"}), hosts, up) == []
