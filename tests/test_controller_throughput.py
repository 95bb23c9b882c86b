"""NIC throughput: byte counters in the probers' health documents -> per-NIC rates -> the
snapshot's ``throughput_bps`` (the API's and the TUI header's); unknown stays None."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from contract.topics import Topics
from controller.api.views import Scope, snapshot_view
from controller.brain import Brain
from controller.dispatch import handle_message
from controller.live import LiveController
from controller.throughput import NicRates, nic_byte_counters
from mesh.fabric import FabricShape, build_fabric
from mesh.snapshot import Health
from prober.agent import health_doc
from prober.telemetry.gpu import GpuReading
from prober.telemetry.nic import nic_status

S = 1_000_000_000


def test_counters_are_read_only_when_usable() -> None:
    nics = {
        "nic0": {"counters": {"rx_bytes": 10, "tx_bytes": 20}},
        "nic1": {"counters": {"rx_bytes": -1, "tx_bytes": 20}},  # unavailable
        "nic2": {"counters": {"rx_bytes": True, "tx_bytes": 20}},
        "nic3": {"device": "eth3", "error": "no such device"},
        "nic4": "odd",
    }
    assert nic_byte_counters(nics) == {"nic0": (10, 20)}


def test_rates_from_two_readings_restart_and_staleness() -> None:
    r = NicRates()
    assert r.update("nic0", 0, 0, 1 * S, 1 * S) is None  # first reading: no rate yet
    assert r.average_bps(1 * S, 60 * S) is None
    rate = r.update("nic0", 1_000_000, 4_000_000, 3 * S, 3 * S)
    assert rate is not None and rate.rx_bps == 4e6 and rate.tx_bps == 16e6
    r.update("nic1", 0, 0, 1 * S, 3 * S)
    r.update("nic1", 2_000_000, 0, 2 * S, 4 * S)
    assert r.average_bps(4 * S, 60 * S) == pytest.approx((16e6 + 16e6) / 2)
    assert r.update("nic1", 1_000_000, 0, 3 * S, 5 * S) is None  # counter went back: over
    assert r.average_bps(5 * S, 60 * S) == 16e6
    assert r.update("nic0", 2_000_000, 5_000_000, 3 * S, 6 * S) is None  # same stamp: ignored
    assert r.average_bps(70 * S, 60 * S) is None  # nothing fresh: unknown, not 0


def test_health_documents_fill_the_snapshots_throughput() -> None:
    fab = build_fabric(FabricShape.for_nics(8, nics_per_leaf=4))
    live = LiveController(fab)
    t = Topics()
    assert live.snapshot().throughput_bps is None  # no counters yet: unknown

    def doc(host: str, nic: str, rx: int, tx: int, at_s: int) -> bytes:
        raw = {"operstate": "up", "carrier": "1", "statistics/rx_bytes": str(rx),
               "statistics/tx_bytes": str(tx)}  # fmt: skip
        nics = {nic: nic_status("eth0", raw).to_json()}
        return json.dumps(health_doc(host, at_s * S, GpuReading(False), None, nics, {})).encode()

    for at, rx in ((10, 0), (12, 50_000_000_000)):  # 50 GB in 2 s = 200 Gb/s received
        out = handle_message(live, t, t.health("host0"), doc("host0", "nic0", rx, 0, at), at * S)
        assert out == "health"
        out = handle_message(live, t, t.health("host1"), doc("host1", "nic1", 0, at, at), at * S)
        assert out == "health"
    snap = live.snapshot()
    assert snap.throughput_bps == pytest.approx((200e9 + 8.0) / 2)  # nic1: 2 bytes in 2 s
    view = snapshot_view(snap, Scope.fleet(), control=None, jobs=None)
    assert view["throughput_bps"] == pytest.approx(snap.throughput_bps)


def test_health_documents_carry_the_nic_link_states_to_the_brain() -> None:
    """The prober's own reading of its NICs' carrier (``up``) reaches the brain (which then
    tells a NIC that lost its link from a silent prober, `tests/test_controller_detect.py`)."""
    fab = build_fabric(FabricShape.for_nics(8, nics_per_leaf=4))
    seen: list[tuple[str, dict[str, bool]]] = []

    class Recording(Brain):
        def nic_links(self, host: str, up: Mapping[str, bool], now_ns: int) -> None:
            seen.append((host, dict(up)))
            super().nic_links(host, up, now_ns)

    brain = Recording(fab)
    live = LiveController(fab, brain=brain)
    t = Topics()
    down = {"operstate": "down", "carrier": "0"}
    doc = health_doc(
        "host0", S, GpuReading(False), None, {"nic0": nic_status("eth0", down).to_json()}, {}
    )
    assert handle_message(live, t, t.health("host0"), json.dumps(doc).encode(), S) == "health"
    no_state = health_doc("host1", S, GpuReading(False), None, {"nic1": {"device": "eth1"}}, {})
    assert handle_message(live, t, t.health("host1"), json.dumps(no_state).encode(), S) == "health"
    assert seen == [("host0", {"nic0": False})]
    assert brain.nic_health()[0] == Health.UP  # judged from the next window on
    assert live.snapshot().nic_health[0] == Health.UNKNOWN  # no tick yet: nothing measured
    live.tick(2 * S)  # no probe yet, so no window judged: a reading counts from the next one
    assert live.snapshot().nic_health[0] == Health.UNKNOWN
    live.brain.judge(3 * S, [])  # the next window judged: host0's reading of nic0 measured it
    assert live.snapshot().nic_health[0] != Health.UNKNOWN
    assert live.snapshot().nic_health[1] == Health.UNKNOWN


def test_pair_paths_keep_the_worst_per_switch_and_build_dicts_on_access() -> None:
    import numpy as np

    from mesh.snapshot import PairPaths

    pp = PairPaths(
        4,
        np.array([1, 1, 1, 6, 6, 9], np.int64),  # pairs (0,1) x3, (1,2) x2, (2,1)
        np.array([0, 0, 1, -1, 1, 0], np.int64),
        np.array([5.0, 7.0, 3.0, 2.0, 4.0, 1.0]),
        ("spine0", "spine1"),
    )
    assert len(pp) == 3 and list(pp) == [(0, 1), (1, 2), (2, 1)]
    assert pp[(0, 1)] == {"spine0": 7.0, "spine1": 3.0}
    assert pp[(1, 2)] == {"?": 2.0, "spine1": 4.0}
    assert pp.get((3, 3)) is None and pp.get((9, 9)) is None
    keys, worst = pp.worst()
    assert keys.tolist() == [1, 6, 9] and worst.tolist() == [7.0, 4.0, 1.0]
    pp.DENSE_MAX = 0  # the sorting path (fabrics too large for a dense n x n array)
    keys, worst = pp.worst()
    assert keys.tolist() == [1, 6, 9] and worst.tolist() == [7.0, 4.0, 1.0]
    assert [k for k, _ in pp.touching(2)] == [(1, 2), (2, 1)]
