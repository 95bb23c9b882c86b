"""The controller's cross-layer room driven directly: signals documents of a small fabric's
hosts (as probers publish them) through `CrossLayer.offer` and `step`, a fault on one job
NIC, the job slow: an ``anomaly`` event naming the NIC and its signal, a ``root_cause``
event and `cause` naming the fault; bad and foreign documents refused in one line."""

from __future__ import annotations

import numpy as np

from contract.documents import EventDoc
from contract.signals import Entity, SignalGroup, SignalsDoc
from controller.anomaly.detector import DetectorConfig
from controller.crosslayer import CrossLayer, CrossLayerConfig, with_root_cause
from controller.jobs import Job
from mesh.fabric import FabricShape, build_fabric

FABRIC = build_fabric(FabricShape(leaves=2, hosts_per_leaf=4, nics_per_host=2, spines=1))
CFG = CrossLayerConfig(interval_s=10.0, detector=DetectorConfig(warmup=10, half_life=60))
S = 10**9
SIGS = ("rdma_tx_bytes", "rdma_rx_bytes", "pfc_rx_p3", "pcie_replay_timeout", "mtu")


def host_doc(host: str, t_ns: int, rng: np.random.Generator, bad: str = "") -> SignalsDoc:
    """One window of ``host``'s NICs: traffic, a few pauses, no PCIe replays, MTU 9000;
    NIC ``bad`` with PCIe replay timeouts."""
    rows = {}
    for n in FABRIC.nics:
        if n.host != host:
            continue
        noise = np.exp(0.1 * rng.standard_normal(3))
        replay = 900.0 if n.id == bad else 0.0
        rows[n.id] = (1e10 * noise[0], 1e10 * noise[1], 50 * noise[2], replay, 9000.0)
    return SignalsDoc(host, t_ns, 10.0, {Entity.NIC: SignalGroup(SIGS, rows)})


def hosts() -> list[str]:
    return sorted({n.host for n in FABRIC.nics})


def job() -> Job:
    nics = sorted(n.id for n in FABRIC.nics if n.leaf == "leaf0")
    return Job("train", "default", tuple((n,) for n in nics))


def drive(
    windows: int, bad: str, fault_from: int, slow: float
) -> tuple[CrossLayer, list[list[EventDoc]]]:
    rng = np.random.default_rng(7)
    xl = CrossLayer(FABRIC, CFG)
    out = []
    for w in range(windows):
        now = (w + 1) * 10 * S
        for h in hosts():
            doc = host_doc(h, now, rng, bad if w >= fault_from else "")
            assert xl.offer(h, doc.encode(), now) == "signals"
        slowdown = {"train": slow if w >= fault_from else 1.0}
        out.append(xl.step(now, [job()], slowdown, []))
    return xl, out


def test_a_pcie_fault_on_a_job_nic_is_an_anomaly_and_the_slow_jobs_named_cause() -> None:
    bad = job().ranks[2][0]
    xl, out = drive(30, bad, 20, 1.6)
    assert all(not evs for evs in out[:20])  # healthy windows: nothing
    anomalies = [(w, e.target) for w, evs in enumerate(out) for e in evs if e.kind == "anomaly"]
    assert anomalies == [(22, bad)]  # three windows in a row
    ev = next(e for evs in out for e in evs if e.kind == "anomaly")
    assert "pcie_replay_timeout" in ev.detail
    causes = [e for evs in out for e in evs if e.kind == "root_cause"]
    assert len(causes) == 1 and causes[0].target == bad  # once: while the cause stays the same
    assert "job train" in causes[0].detail
    rc = xl.cause("train")
    assert rc is not None and (rc.cause, rc.target) == ("pcie", bad)
    assert any("pcie_replay_timeout" in line for line in rc.evidence) or "pcie" in rc.text
    status = with_root_cause({"slowdown": 1.6}, rc)
    assert status is not None and status["root_cause"] == rc.to_dict()
    assert with_root_cause({"slowdown": 1.0}, None) == {"slowdown": 1.0, "root_cause": None}
    assert with_root_cause(None, rc) is None


def test_a_job_that_is_not_slow_has_no_cause_and_no_walk() -> None:
    bad = job().ranks[2][0]
    xl, out = drive(30, bad, 20, 1.0)
    assert [e.kind for evs in out for e in evs] == ["anomaly"]
    assert xl.cause("train") is None


def test_windows_follow_the_interval_and_stale_hosts_drop_out() -> None:
    xl = CrossLayer(FABRIC, CFG)
    rng = np.random.default_rng(1)
    assert xl.step(0, [], {}, []) == [] and xl.windows == 0  # no documents: no window
    xl.offer("host0", host_doc("host0", S, rng).encode(), 5 * S)
    assert not xl.due(5 * S)  # the empty window above set the next one at 10 s
    xl.step(10 * S, [], {}, [])
    assert xl.windows == 1 and not xl.due(19 * S) and xl.due(20 * S)
    xl.step(40 * S, [], {}, [])  # host0's document is 35 s old: older than two intervals
    assert xl.windows == 1


def test_bad_and_foreign_documents_are_refused_in_one_line() -> None:
    xl = CrossLayer(FABRIC, CFG)
    rng = np.random.default_rng(2)
    assert xl.offer("host0", b"{", S).startswith("bad:")
    out = xl.offer("host1", host_doc("host0", S, rng).encode(), S)
    assert out.startswith("bad:untrusted") and "\n" not in out
    assert xl.docs == {}
