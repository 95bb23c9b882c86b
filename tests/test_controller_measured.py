"""No measurement, no verdict: a NIC, link or host nothing measured lately is ``unknown``
(issue 33 item 2: a controller with a fabric and no prober said 16/16 healthy)."""

from __future__ import annotations

import numpy as np

from controller.api.views import Scope, snapshot_view
from controller.detect.delay import DelayParams
from controller.detect.paths import PathIndex
from controller.detect.window import DetectionWindow, WindowPart
from controller.live import LiveConfig, LiveController
from controller.measured import Measured
from controller.observations import Observations
from mesh.fabric import FabricShape, build_fabric, flow_paths
from mesh.fabric.ecmp import routing_tables
from mesh.snapshot import Health
from testbed.sim.demo_runner import DemoRunner, demo_scenario
from tests.brains import AllUp

S = 1_000_000_000
FAB = build_fabric(FabricShape.for_nics(16, nics_per_leaf=8))


def _probes(src: int, dst: int, t_ns: int, *, lost: bool = False) -> Observations:
    fwd = flow_paths(FAB, [src], [dst], [49152])
    rev = flow_paths(FAB, [dst], [src], [49152])
    owd = np.array([np.nan if lost else 2000.0])
    return Observations(np.array([t_ns], np.int64), np.array([src], np.int32),
                        np.array([dst], np.int32), np.array([49152], np.int32), fwd, rev,
                        np.array([lost]), owd, owd.copy(), 2 * owd)  # fmt: skip


def _part(obs: Observations) -> WindowPart:
    """The window part a worker makes of ``obs`` (`controller.fleet.worker.FleetWorker`)."""
    width = routing_tables(FAB).max_hops
    paths = PathIndex(width)
    win = DetectionWindow.empty(len(FAB.links), FAB.n_hops, len(FAB.nics), PathIndex(2 * width))
    win.fold(obs, paths, np.zeros(len(FAB.nics), bool), DelayParams())
    return win.export(paths)


def test_a_controller_with_a_fabric_and_no_prober_says_unknown_not_healthy() -> None:
    live = LiveController(FAB)  # the real brain: its table starts every link up
    for k in range(1, 30):
        live.tick(k * S)
    snap = live.snapshot()
    assert set(snap.nic_health) == {Health.UNKNOWN} and set(snap.link_health.values()) == {
        Health.UNKNOWN
    }
    assert (snap.healthy_count, snap.unknown_count, snap.unhealthy_count) == (0, 16, 0)
    doc = snapshot_view(snap, Scope.fleet(), control=None, jobs=None)
    assert (doc["healthy_nics"], doc["unknown_nics"], doc["unhealthy_nics"]) == (0, 16, 0)
    assert {h["state"] for h in doc["hosts"]} == {"unknown"}  # type: ignore[union-attr]
    assert {lk["state"] for lk in doc["links"]} == {"unknown"}  # type: ignore[union-attr]


def test_measured_entities_take_the_brains_verdict_until_stale() -> None:
    m = Measured(AllUp(FAB), FAB, stale_ns=10 * S)
    assert set(m.nic_health()) == {Health.UNKNOWN}  # before any window was judged
    m.judge(1 * S, [])
    assert set(m.nic_health()) == {Health.UNKNOWN}  # an empty window measures nothing
    m.judge(2 * S, [_part(_probes(0, 9, 1 * S, lost=True))])  # a lost probe is one too
    up = {i for i, h in enumerate(m.nic_health()) if h == Health.UP}
    assert up == {0, 9}
    links = {k for k, h in m.link_health().items() if h == Health.UP}
    hops = np.concatenate(
        [flow_paths(FAB, [0], [9], [49152])[0], flow_paths(FAB, [9], [0], [49152])[0]]
    )  # both ways of the probe
    path = {FAB.links[h >> 1].id for h in hops if h >= 0}
    assert links == path and {"nic0-leaf0", "nic9-leaf1"} <= path and len(path) < 8
    m.nic_links("host3", {"nic3": False}, 3 * S)  # a prober's reading of its NIC counts too
    m.judge(5 * S, [])
    assert m.nic_health()[3] == Health.UP and m.nic_health()[0] == Health.UP
    m.judge(12 * S + 1, [])  # 10 s after the probe's window: stale
    assert m.nic_health()[0] == Health.UNKNOWN and m.nic_health()[3] == Health.UP
    m.judge(16 * S, [])
    assert set(m.nic_health()) == {Health.UNKNOWN}


def test_a_demo_fabric_that_is_probed_is_measured() -> None:
    runner = DemoRunner(demo_scenario(None, nics=16, seed=1))
    for _ in range(4):
        runner.step()
    snap = runner.controller.snapshot()
    assert snap.unknown_count == 0 and Health.UNKNOWN not in snap.link_health.values()


def test_a_host_whose_prober_stops_goes_unknown_after_stale_s() -> None:
    runner = DemoRunner(demo_scenario(None, nics=16, seed=1))
    live = LiveController(runner.fabric, LiveConfig(stale_ns=3 * S))
    for _ in range(4):  # probed: measured
        st = runner.sim.step(runner.t_s, 0.5)
        runner.t_s = st.t1_s
        live.admit(st.batch, runner.now_ns)
        live.tick(runner.now_ns)
    assert live.snapshot().unknown_count == 0
    for k in range(1, 16):  # nothing arrives any more (the last windows wait for every
        live.tick(runner.now_ns + k * S // 2)  # prober's batches: `LiveConfig.wait_ns`, 5 s)
    assert live.snapshot().unknown_count == 16
