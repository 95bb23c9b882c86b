"""The signal collector on real devices: the namespace testbed's veth pairs and qdiscs.

A small testbed (2 hosts, 2 leaves, 1 spine, 100 Mbit/s tbf shaping on fabric links) is
built with a random prefix and removed in ``finally``. The collector runs inside a leaf's
namespace (`testbed.netns.nsutil.netns` switches the calling thread), the way a prober runs
on its host: a congested uplink shows in its counters (the egress rate pinned at the shaping
rate, the shaper's backlog and overlimits), an idle one does not, and the ethtool ioctls read the
veth driver's own counters by name.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mesh.fabric import Fabric, FabricShape
from prober.telemetry.collector import Collector, CollectorConfig, NicSource, Reading, window
from prober.telemetry.ethtool import EthtoolReader
from testbed import faults
from testbed.netns.lifecycle import up
from testbed.netns.nsutil import netns, stop_processes
from testbed.netns.plan import Plan
from testbed.netns.teardown import tear_down


def _reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("nft") is None:
        return "needs iproute2 and nftables"
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode:
        return "ip netns unavailable"
    return None


pytestmark = [pytest.mark.netns, pytest.mark.skipif(_reason() is not None, reason=str(_reason()))]


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[Fabric, Plan]]:
    prefix = "x" + secrets.token_hex(3) + "-"
    try:
        yield up(FabricShape(leaves=2, hosts_per_leaf=1, spines=1), prefix)
    finally:
        tear_down(prefix)


def _read(ns: str, c: Collector) -> Reading:
    with netns(ns):
        return c.read(time.monotonic_ns())


def test_a_congested_uplink_shows_in_the_collectors_counters(bed: tuple[Fabric, Plan]) -> None:
    _, plan = bed
    lp = plan.link("leaf0-spine0")
    down = plan.link("nic0-leaf0").upper  # leaf0's port towards host0: not congested
    assert down.ns == lp.lower.ns
    ns = lp.lower.ns
    cfg = CollectorConfig("leaf0", (NicSource("up", lp.lower.ifname), NicSource("down", down.ifname)),
                          gpus=False, host_signals=False)  # fmt: skip
    with netns(ns):
        col = Collector(cfg)  # its ethtool socket lives in leaf0's namespace
    procs = faults.start_congestion(plan, "leaf0-spine0", rate_mbit=150, seconds=60, direction="up")
    try:
        deadline = time.monotonic() + 40.0
        rate = lp.rate_mbit * 1e6 / 8
        while time.monotonic() < deadline:  # the queue itself, not a fixed time: a busy
            time.sleep(0.5)  # machine can take seconds to start the generator
            if _read(ns, col).values["nic"]["up"].get("tx_qdisc_backlog", 0) > 0.004 * rate:
                break
        a = _read(ns, col)
        time.sleep(2.0)
        b = _read(ns, col)
    finally:
        stop_processes(procs)
        col.close()
    doc = window(a, b, "leaf0")
    tx = doc.get("nic", "up", "tx_bytes")
    assert tx is not None and 0.6 * rate < tx < 1.3 * rate, (tx, rate)  # pinned at the shaping
    backlog = doc.get("nic", "up", "tx_qdisc_backlog")
    assert backlog is not None and backlog > 0.004 * rate  # >= 4 ms queued
    over = doc.get("nic", "up", "tx_qdisc_overlimits")
    assert over is not None and over > 100  # the shaper held packets back, every second
    assert doc.get("nic", "up", "tx_qdisc_drops") is not None  # read (a local sender waits)
    assert (doc.get("nic", "down", "tx_qdisc_backlog") or 0) == 0
    assert (doc.get("nic", "down", "tx_qdisc_overlimits") or 0) == 0
    assert (doc.get("nic", "down", "tx_bytes") or 0) < 0.05 * rate
    assert doc.get("nic", "up", "mtu") == 1500 and doc.get("nic", "up", "link_up") == 1.0
    assert doc.get("nic", "up", "pfc_rx_p3") is None  # a veth has no PFC: not available


def test_ethtool_statistics_of_a_veth_by_name(bed: tuple[Fabric, Plan]) -> None:
    _, plan = bed
    lp = plan.link("leaf0-spine0")
    with netns(lp.upper.ns):
        peer = socket.if_nametoindex(lp.upper.ifname)
    with netns(lp.lower.ns):
        r = EthtoolReader()
        try:
            stats = r.stats(lp.lower.ifname)
        finally:
            r.close()
    assert stats["peer_ifindex"] == peer  # the veth driver's own counter, read by name


def _forwarded(ns: str, col: Collector, seconds: float) -> tuple[float, float]:
    """Return (packets/s leaf0 received from host0, packets/s it sent up to spine0)."""
    a = _read(ns, col)
    time.sleep(seconds)
    doc = window(a, _read(ns, col), "leaf0")
    rx = doc.get("nic", "down", "rx_packets")
    tx = doc.get("nic", "up", "tx_packets")
    assert rx is not None and tx is not None
    return rx, tx


def test_a_lossy_uplink_shows_in_the_collectors_counters(bed: tuple[Fabric, Plan]) -> None:
    """nftables drops 40 % of what leaf0 forwards to spine0 (the testbed's loss fault): in
    leaf0's namespace the collector sees its uplink send ~60 % of the packets its port
    towards host0 receives, where the clean link sends them all."""
    _, plan = bed
    src, dst = plan.link("nic0-leaf0").lower, plan.link("nic1-leaf1").lower
    lp = plan.link("leaf0-spine0")
    down = plan.link("nic0-leaf0").upper
    ns = lp.lower.ns
    cfg = CollectorConfig("leaf0", (NicSource("up", lp.lower.ifname), NicSource("down", down.ifname)),
                          gpus=False, host_signals=False)  # fmt: skip
    with netns(ns):
        col = Collector(cfg)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    argv = faults.blast_argv(src, dst, rate_mbit=20, seconds=60)  # under the 100 Mbit/s shaping
    gen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                           start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:  # the generator running, not a fixed time
            rx, tx = _forwarded(ns, col, 1.0)
            if rx > 500:
                break
        rx, tx = _forwarded(ns, col, 3.0)
        assert rx > 500 and 0.9 * rx < tx < 1.1 * rx, (rx, tx)  # clean: all forwarded
        faults.set_loss(plan, "leaf0-spine0", 40)
        try:
            rx, tx = _forwarded(ns, col, 3.0)
        finally:
            faults.set_loss(plan, "leaf0-spine0", 0)
    finally:
        stop_processes([gen])
        col.close()
    assert rx > 500 and 0.45 * rx < tx < 0.75 * rx, (rx, tx)  # 40 % dropped before the uplink
