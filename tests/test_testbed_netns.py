"""Acceptance tests on real namespaces: ECMP by source port, flap -> loss, congestion -> delay,
and a clean teardown. Needs root and ``ip netns``; every testbed uses a random prefix and is
removed in ``finally``."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest

from mesh.fabric import Fabric, FabricShape
from testbed import faults
from testbed.netns.counters import qdisc_backlog_bytes, rx_packets
from testbed.netns.lifecycle import up
from testbed.netns.plan import Plan
from testbed.netns.probe import Endpoint, round_trip
from testbed.netns.teardown import list_namespaces, list_root_links, tear_down


def _netns_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("nft") is None:
        return "needs iproute2 and nftables"
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode:
        return "ip netns unavailable"
    return None


pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_netns_reason() is not None, reason=str(_netns_reason())),
]

SPORTS = list(range(41000, 41016))


def _prefix() -> str:
    return "t" + secrets.token_hex(3) + "-"


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[Fabric, Plan]]:
    prefix = _prefix()
    try:
        yield up(FabricShape(leaves=2, hosts_per_leaf=2, spines=2), prefix)
    finally:
        tear_down(prefix)


class Mesh:
    """Endpoints of host0 (nic0, leaf0) -> host2 (nic2, leaf1) on several source ports."""

    def __init__(self, plan: Plan) -> None:
        a_ns, b_ns = plan.node_ns["host0"], plan.node_ns["host2"]
        self.plan = plan
        self.src = {sp: Endpoint.open(a_ns, plan.nic_addr["nic0"], sp) for sp in SPORTS}
        self.dst = Endpoint.open(b_ns, plan.nic_addr["nic2"], 4791)
        self.seq = 0

    def close(self) -> None:
        for ep in [*self.src.values(), self.dst]:
            ep.close()

    def probe(self, sport: int, n: int, timeout_s: float = 0.1) -> list[tuple[int, ...] | None]:
        out: list[tuple[int, ...] | None] = []
        for _ in range(n):
            self.seq += 1
            out.append(round_trip(self.src[sport], self.dst, self.seq, timeout_s))
        return out

    def spines(self, sport: int) -> tuple[str, str]:
        """(forward spine, reverse spine) of this source port, from spine RX counters."""
        before = {s: rx_packets(self.plan.node_ns[s]) for s in ("spine0", "spine1")}
        assert all(r is not None for r in self.probe(sport, 20))
        after = {s: rx_packets(self.plan.node_ns[s]) for s in ("spine0", "spine1")}
        fwd = [s for s in before if after[s]["leaf0"] - before[s]["leaf0"] >= 20]
        rev = [s for s in before if after[s]["leaf1"] - before[s]["leaf1"] >= 20]
        assert len(fwd) == 1, "a flow must stay on one spine"
        assert len(rev) == 1
        return fwd[0], rev[0]


@pytest.fixture(scope="module")
def mesh(bed: tuple[Fabric, Plan]) -> Iterator[tuple[Mesh, dict[int, tuple[str, str]]]]:
    m = Mesh(bed[1])
    try:
        yield m, {sp: m.spines(sp) for sp in SPORTS}
    finally:
        m.close()


def test_source_port_picks_the_spine(mesh: tuple[Mesh, dict[int, tuple[str, str]]]) -> None:
    _, paths = mesh
    fwd = {p[0] for p in paths.values()}
    rev = {p[1] for p in paths.values()}
    assert fwd == {"spine0", "spine1"}, paths
    assert rev == {"spine0", "spine1"}, paths


def test_flap_loses_exactly_the_probes_crossing_the_link(
    bed: tuple[Fabric, Plan], mesh: tuple[Mesh, dict[int, tuple[str, str]]]
) -> None:
    m, paths = mesh
    _, plan = bed
    faults.set_link(plan, "leaf0-spine1", up=False)
    try:
        results = {sp: m.probe(sp, 5, timeout_s=0.05) for sp in SPORTS}
    finally:
        faults.set_link(plan, "leaf0-spine1", up=True)
    for sp, res in results.items():
        crosses = paths[sp][0] == "spine1"  # leaf0 -> spine1 up; the reply returns to leaf0
        crosses |= paths[sp][1] == "spine1"  # reply spine1 -> leaf0 down
        lost = sum(r is None for r in res)
        assert lost == (5 if crosses else 0), (sp, paths[sp], lost)
    assert all(r is not None for r in m.probe(SPORTS[0], 3)), "link came back"


def test_congestion_delays_only_the_probes_sharing_the_link(
    bed: tuple[Fabric, Plan], mesh: tuple[Mesh, dict[int, tuple[str, str]]]
) -> None:
    m, paths = mesh
    _, plan = bed
    via = [sp for sp in SPORTS if paths[sp][0] == "spine0"][:3]
    other = [sp for sp in SPORTS if paths[sp][0] == "spine1"][:3]
    end = plan.link("leaf0-spine0").lower  # leaf0's egress towards spine0: where it queues
    rate_bps = plan.link("leaf0-spine0").rate_mbit * 1e6 / 8
    # the generator runs until killed below; 60 s only bounds it if the test process dies
    procs = faults.start_congestion(plan, "leaf0-spine0", rate_mbit=150, seconds=60, direction="up")
    try:
        # wait for the queue itself (>= 4 ms of backlog at the link's rate), not a fixed time:
        # a busy machine can take seconds to start the generator's interpreter
        assert _wait_backlog(end.ns, end.ifname, 0.004 * rate_bps, timeout_s=30.0), (
            "the generator never filled the leaf0 -> spine0 queue"
        )
        d_via = _fwd_delays(m, via)
        d_other = _fwd_delays(m, other)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert np.median(d_via) > 2e6, d_via  # > 2 ms of queueing
    assert np.median(d_other) < min(0.5e6, np.median(d_via) / 4), d_other


def _wait_backlog(ns: str, ifname: str, min_bytes: float, timeout_s: float) -> bool:
    """Return True once the root qdisc of ``ifname`` holds ``min_bytes``, False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if qdisc_backlog_bytes(ns, ifname) >= min_bytes:
            return True
        time.sleep(0.05)
    return False


def _fwd_delays(m: Mesh, sports: list[int]) -> list[float]:
    out = []
    for sp in sports:
        for r in m.probe(sp, 5, timeout_s=0.3):
            if r is not None:
                out.append(float(r[1] - r[0]))
    assert out, "all probes lost"
    return out


def test_two_nics_of_one_host_probe_each_other_through_the_leaf() -> None:
    prefix = _prefix()
    try:
        _, plan = up(FabricShape(leaves=1, hosts_per_leaf=1, nics_per_host=2, spines=1), prefix)
        ns, leaf = plan.node_ns["host0"], plan.node_ns["leaf0"]
        a = Endpoint.open(ns, plan.nic_addr["nic0"], 41000)
        b = Endpoint.open(ns, plan.nic_addr["nic1"], 4791)
        try:
            before = rx_packets(leaf)
            got = [round_trip(a, b, i + 1, 0.5) for i in range(10)]
            after = rx_packets(leaf)
        finally:
            a.close()
            b.close()
    finally:
        tear_down(prefix)
    assert all(r is not None for r in got)
    # every probe entered the leaf from nic0 and every reply from nic1 (not through `lo`)
    assert after["nic0"] - before["nic0"] >= 10 and after["nic1"] - before["nic1"] >= 10


def test_down_leaves_nothing_behind() -> None:
    prefix = _prefix()
    try:
        _, plan = up(FabricShape(leaves=1, hosts_per_leaf=2, spines=1), prefix)
        procs = faults.start_congestion(plan, "leaf0-spine0", rate_mbit=10, seconds=60)
        faults.set_loss(plan, "nic0-leaf0", 10)
        assert list_namespaces(prefix) and list_root_links(prefix)
    finally:
        counts = tear_down(prefix)
    assert counts["namespaces"] == 4
    assert list_namespaces(prefix) == []
    assert list_root_links(prefix) == []
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert prefix not in out
    for p in procs:
        assert p.wait(timeout=5) is not None
        assert not os.path.exists(f"/proc/{p.pid}")
    assert tear_down(prefix)["namespaces"] == 0  # idempotent
