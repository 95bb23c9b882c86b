"""The cross-layer dashboard's queries against a real victoria-metrics.

Six hosts' signal windows (synthetic: a pause storm from nic3, a hot GPU, a starved host, a
NIC with MTU 1500, a GPU with a lower power limit, PCIe replays, a host ignoring CNPs, a
degrading optic) go through the detector and the root-cause walk; the
signals, anomalies and root cause are written as line protocol (`controller.anomaly.points`)
to a private victoria-metrics (`tests.test_timeseries_vm.vm`: a free loopback port, stopped
by PID). Every query of every panel of ``docs/grafana/qpmesh-crosslayer.json`` must return
data, and the panels that should show a fault show it on the right entity.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np

from contract.signals import Entity, SignalGroup, SignalsDoc, gpu_id
from controller.anomaly.detector import DetectorConfig
from controller.anomaly.fleet import FleetDetector
from controller.anomaly.frame import frame_from_docs
from controller.anomaly.points import anomaly_points, rootcause_point, signal_points
from controller.jobs import Job
from controller.rootcause.chain import explain
from controller.rootcause.graph import build_graph
from controller.timeseries.lineproto import Point, to_line_protocol
from mesh.fabric import FabricShape, build_fabric
from tests.test_timeseries_vm import VictoriaMetrics, vm  # noqa: F401  (the fixture)

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "qpmesh-crosslayer.json"
T0 = 1_700_000_000
FABRIC = build_fabric(FabricShape(leaves=2, hosts_per_leaf=3, nics_per_host=2, spines=2))
NIC_SIGNALS = ("rdma_tx_bytes", "rdma_rx_bytes", "pfc_rx_p3", "pause_rx", "pfc_tx_p3", "pause_tx",
               "ecn_marked", "cnp_sent", "cnp_ignored", "fec_corrected_bits", "symbol_errors",
               "fec_uncorrectable_blocks", "pcie_bad_tlp", "pcie_replay_rollover", "pcie_si_rx",
               "local_ack_timeout", "packet_seq_err", "out_of_sequence", "mtu")  # fmt: skip
GPU_SIGNALS = ("temperature_c", "throttle_thermal", "sm_clock_mhz", "power_limit_w", "gpu_util")
HOST_SIGNALS = ("cpu_softirq", "cpu_steal", "psi_cpu_some")


def _docs(w: int, rng: np.random.Generator) -> list[SignalsDoc]:
    fault = w >= 20
    docs = []
    for h in FABRIC.hosts:
        nics = {}
        for n in FABRIC.nics_of_host(h.id):
            noise = float(np.exp(0.1 * rng.standard_normal()))
            v = dict.fromkeys(NIC_SIGNALS, 0.0)
            v.update(rdma_tx_bytes=1e10 * noise, rdma_rx_bytes=1e10 * noise, pfc_rx_p3=40 * noise,
                     pause_rx=40 * noise, pfc_tx_p3=4.0, pause_tx=4.0, ecn_marked=300 * noise,
                     cnp_sent=150 * noise, fec_corrected_bits=3e3 * noise, out_of_sequence=1.0,
                     mtu=9000.0)  # fmt: skip
            if fault and n.id == "nic3":  # the pause source
                v.update(pfc_tx_p3=1.2e5, pause_tx=1.2e5, rdma_rx_bytes=1e9)
            elif fault and n.leaf == "leaf0":  # its leaf pauses the others
                v.update(pfc_rx_p3=4e4 * noise, pause_rx=4e4 * noise)
            if fault and n.id == "nic4":
                v.update(pcie_bad_tlp=40.0, pcie_replay_rollover=10.0, pcie_si_rx=2.0)
            if n.id == "nic5":
                v["mtu"] = 1500.0
            if fault and n.id == "nic8":  # DCQCN off on host4
                v["cnp_ignored"] = 2e3
            if fault and n.id == "nic10":  # a degrading optic
                v.update(fec_corrected_bits=3e7, symbol_errors=5.0, fec_uncorrectable_blocks=2.0,
                         local_ack_timeout=3.0, packet_seq_err=30.0)  # fmt: skip
            nics[n.id] = tuple(v[s] for s in NIC_SIGNALS)
        gpus = {}
        for n in FABRIC.nics_of_host(h.id):
            hot = fault and h.id == "host1" and n.port == 0
            limit = 500.0 if (h.id, n.port) == ("host5", 1) else 700.0
            gpus[gpu_id(h.id, n.port)] = (91.0 if hot else 65.0 + rng.normal(0, 0.5),
                                          1.0 if hot else 0.0, 1400.0 if hot else 1980.0,
                                          limit, 90.0)  # fmt: skip
        starved = fault and h.id == "host2"
        host = (0.5 if starved else 0.02, 0.0, 0.4 if starved else 0.02)
        docs.append(SignalsDoc(h.id, (T0 + 10 * w) * 10**9, 10.0, {
            "nic": SignalGroup(NIC_SIGNALS, nics), "gpu": SignalGroup(GPU_SIGNALS, gpus),
            "host": SignalGroup(HOST_SIGNALS, {h.id: host})}))  # fmt: skip
    return docs


def _write(server: VictoriaMetrics, points: list[Point]) -> None:
    body = to_line_protocol(points)
    req = urllib.request.Request(f"{server.url}/write", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status in (200, 204)


def test_dashboard_queries_show_the_faults(vm: VictoriaMetrics) -> None:  # noqa: F811
    rng = np.random.default_rng(1)
    det = FleetDetector(DetectorConfig(warmup=10, half_life=60))
    job = Job("train", "t1", tuple((n.id,) for n in FABRIC.nics))
    graph = build_graph(FABRIC, job)
    points: list[Point] = []
    answer = None
    for w in range(30):
        docs = _docs(w, rng)
        points += [p for d in docs for p in signal_points(d)]
        frames = {k: frame_from_docs(docs, k) for k in Entity}
        groups = {k: ["job:train"] * len(f.entities) for k, f in frames.items()}
        res = det.step(frames, groups, (T0 + 10 * w) * 10**9)
        points += anomaly_points(res.active.values())
        if w >= 25:
            answer = explain(graph, 2.4, res.active, [], (T0 + 10 * w) * 10**9, job=job)
            points.append(rootcause_point(answer, (T0 + 10 * w) * 10**9))
    assert answer is not None and (answer.cause, answer.target) == ("pfc_storm", "nic3"), answer
    _write(vm, points)
    vm.flush()
    dash = json.loads(DASHBOARD.read_text())
    seen: dict[str, set[str]] = {}
    for panel in dash["panels"]:
        for t in panel["targets"]:
            rows = vm.query_range(t["expr"], T0, T0 + 300, "10s")
            assert rows, f"panel {panel['title']!r}: {t['expr']} returned nothing"
            seen.setdefault(panel["title"], set()).update(
                str(r["metric"].get("entity", r["metric"].get("job", ""))) for r in rows
            )
    by = {p["id"]: p["title"] for p in dash["panels"]}
    assert {"nic3", "host1.gpu0", "host2", "nic5", "nic4"} <= seen[by[1]]  # anomalies
    assert seen[by[2]] == {"train"}  # root cause of the slow job
    assert "nic3" in seen[by[4]] and "nic4" in seen[by[7]] and "host1.gpu0" in seen[by[9]]
    assert "host2" in seen[by[10]] and seen[by[11]] == {"nic5", "host5.gpu1"}
    assert "nic8" in seen[by[5]] and "nic10" in seen[by[6]] and "nic10" in seen[by[8]]
