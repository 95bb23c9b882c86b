"""The cross-layer graph and the root-cause walk, table-tested on a small fabric: each case
gives anomalies and mesh findings and the cause the walk must name."""

from __future__ import annotations

import pytest

from contract.documents import EventDoc
from contract.signals import Entity
from controller.anomaly.detector import Anomaly, Contributor
from controller.jobs import Job
from controller.rootcause.chain import explain
from controller.rootcause.classes import UNMAPPED, root_class
from controller.rootcause.graph import build_graph
from mesh.fabric import FabricError, FabricShape, build_fabric

FABRIC = build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, nics_per_host=2, spines=2))
# nic0, nic1 on host0 and nic2, nic3 on host1 under leaf0; nic4..7 (host2, host3) under leaf1
JOB = Job("train", "t1", (("nic0",), ("nic4",), ("nic1",), ("nic5",)))
GRAPH = build_graph(FABRIC, JOB)
NOW = 1_000_000_000_000


def an(entity: str, *signals: tuple[str, float], score: float = 12.0) -> Anomaly:
    kind = (
        Entity.GPU if ".gpu" in entity else Entity.HOST if entity.startswith("host") else Entity.NIC
    )
    tops = tuple(Contributor(s, score, v, 1.0, 1.0) for s, v in signals)
    return Anomaly(NOW, kind, entity, score, NOW, tops)


def ev(kind: str, target: str, flows: tuple[tuple[str, str, int], ...] = ()) -> EventDoc:
    return EventDoc(NOW - 1_000_000_000, kind, target, flows=flows)


def test_graph_layers_and_lookups() -> None:
    g = GRAPH
    assert g.nics == ("nic0", "nic4", "nic1", "nic5")
    assert g.hosts() == ("host0", "host2") and g.gpus() == (
        "host0.gpu0",
        "host0.gpu1",
        "host2.gpu0",
        "host2.gpu1",
    )
    assert g.nic_gpu["nic1"] == "host0.gpu1" and g.nic_link["nic4"] == "nic4-leaf1"
    assert g.leaves == ("leaf0", "leaf1") and g.neighbours("leaf0") == ("nic2", "nic3")
    assert g.uplinks["leaf0"] == ("leaf0-spine0", "leaf0-spine1")
    assert g.link("leaf1->spine0") == "leaf1-spine0" and g.link("nic0-leaf0") == "nic0-leaf0"
    assert g.link("leaf0->nic2") == "nic2-leaf0" and g.link("spine0->super0") is None
    doc = g.to_dict()
    assert {"id": "train/rank1", "layer": "rank"} in doc["nodes"]  # type: ignore[operator]
    assert ["host0.gpu1", "nic1"] in doc["edges"]  # type: ignore[operator]
    with pytest.raises(FabricError):
        build_graph(FABRIC, Job("x", "t", (("nic99",),)))


CASES = [
    # (name, anomalies, findings, moved, cause, target)
    ("nothing", [], [], [], "unknown", ""),
    ("a hot GPU", [an("host0.gpu1", ("temperature_c", 91), ("sm_clock_mhz", 1300))], [], [],
     "gpu_throttle", "host0.gpu1"),
    ("a starved host", [an("host2", ("cpu_softirq", 0.5), ("runq_per_cpu", 3))],
     [ev("prober_down", "host2")], [], "host_starved", "host2"),
    ("a victim and its pause source next door",
     [an("nic1", ("pfc_rx_p3", 4e4)), an("nic3", ("pfc_tx_p3", 1.2e5), ("pause_tx", 1.2e5))],
     [ev("contention", "nic1->leaf0")], [], "pfc_storm", "nic3"),
    ("the source has PCIe replays",
     [an("nic1", ("pfc_rx_p3", 4e4)),
      an("nic3", ("pfc_tx_p3", 2e4), ("rx_out_of_buffer", 1e4), ("pcie_bad_tlp", 40))],
     [], [], "pcie", "nic3"),
    ("a victim, no source, a contended uplink",
     [an("nic4", ("pause_rx", 4e4))], [ev("contention", "leaf1->spine1")], [],
     "link_contention", "leaf1-spine1"),
    ("a victim, nothing else", [an("nic4", ("pause_rx", 4e4))], [], [], "pfc_storm", "leaf1"),
    ("contention on the ring",
     [], [ev("contention", "leaf0->spine0", (("nic0", "nic4", 50000),))], [],
     "link_contention", "leaf0-spine0"),
    ("contention between other tenants' NICs only",
     [], [ev("contention", "leaf0->spine0", (("nic2", "nic6", 50000),))], [], "unknown", ""),
    ("a flap of a job NIC's link", [], [ev("link_flap", "nic5-leaf1")], [],
     "link_flap", "nic5-leaf1"),
    ("FEC rising, then the flap",
     [an("nic5", ("fec_corrected_bits", 4e7), ("symbol_errors", 30))],
     [ev("link_flap", "nic5-leaf1")], [], "link_flap", "nic5-leaf1"),
    ("FEC rising alone", [an("nic5", ("fec_corrected_bits", 4e7))], [], [],
     "link_degraded", "nic5-leaf1"),
    ("two job NICs under one leaf see marks",
     [an("nic0", ("ecn_marked", 5e4)), an("nic1", ("ecn_marked", 5e4), ("cnp_sent", 2e4))],
     [], [], "cnp_storm", "leaf0"),
    ("one NIC with marks is not a leaf", [an("nic0", ("ecn_marked", 5e4))], [], [], "unknown", ""),
    ("marks, and a neighbour host that ignores CNPs",
     [an("nic0", ("ecn_marked", 5e4)), an("nic1", ("ecn_marked", 5e4)),
      an("nic2", ("cnp_ignored", 3e3))], [], [], "ecn_config", "host1"),
    ("an MTU unlike its peers'", [an("nic4", ("mtu", 1500)), an("nic5", ("mtu", 1500))], [], [],
     "mtu_config", "host2"),
    ("the whole job's NICs see pauses, the source is a neighbour",
     [an("nic3", ("pfc_tx_p3", 1e5))], [], {"": [Contributor("pfc_rx_p3", 8.0, 3e4, 40.0, None)]},
     "pfc_storm", "nic3"),
    ("the job's NICs under leaf1 see marks, its others do not",
     [], [], {"leaf1": [Contributor("ecn_marked", 8.0, 3e5, 300.0, None)]}, "cnp_storm", "leaf1"),
    ("all the job's NICs, under two leaves, see marks: which leaf is not known",
     [], [], {"": [Contributor("ecn_marked", 8.0, 3e5, 300.0, None)]}, "unknown", ""),
    ("throughput alone is a symptom", [an("nic0", ("rdma_tx_bytes", 1e8)),
                                       an("host0.gpu0", ("gpu_util", 30))], [], [], "unknown", ""),
    ("a weak anomaly is not enough", [an("host0", ("psi_io_some", 0.2), score=4.0)], [], [],
     "unknown", ""),
]  # fmt: skip


@pytest.mark.parametrize(("name", "anomalies", "findings", "moved", "cause", "target"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_the_walk_names_the_cause(
    name: str,
    anomalies: list[Anomaly],
    findings: list[EventDoc],
    moved: dict[str, list[Contributor]] | list[Contributor],
    cause: str,
    target: str,
) -> None:
    moves = moved if isinstance(moved, dict) else None  # [] in the table: no moves
    rc = explain(GRAPH, 2.4, {a.entity: a for a in anomalies}, findings, NOW, job=JOB, moved=moves)
    assert (rc.cause, rc.target) == (cause, target), rc.text
    assert rc.text.startswith("step time 2.4x; ")
    assert rc.event(NOW).kind == "root_cause"


def test_the_answer_reads_across_layers() -> None:
    rc = explain(GRAPH, 2.4, {"nic1": an("nic1", ("pfc_rx_p3", 40_000)),
                              "nic3": an("nic3", ("pause_tx", 120_000))},
                 [ev("contention", "nic1->leaf0")], NOW, job=JOB)  # fmt: skip
    assert "rank 2's nic1 receives pauses from leaf0 (pfc_rx_p3 40 k/s" in rc.text
    assert "nic3 (host1) under leaf0: pause_tx 120 k/s" in rc.text
    assert rc.to_dict()["cause"] == "pfc_storm" and rc.event(NOW).target == "nic3"


def test_old_findings_are_ignored() -> None:
    old = EventDoc(NOW - 10**12, "link_flap", "nic5-leaf1")
    assert explain(GRAPH, 2.0, {}, [old], NOW, job=JOB).cause == "unknown"


def test_every_scored_signal_has_a_role() -> None:
    assert not UNMAPPED, f"signals without a role: {UNMAPPED}"
    assert root_class(["pause_tx", "pcie_bad_tlp"]) == "pcie"  # PCIe explains the pauses
    assert root_class(["rdma_tx_bytes", "gpu_util"]) is None
