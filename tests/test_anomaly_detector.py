"""The anomaly detector driven directly: windows of a few NICs, GPUs and hosts with known
changes (a fault on one entity, a job-wide change, bursts, missing values, a misconfigured
MTU, job changes), checked against what the detector's docstring promises."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from contract.signals import Entity, SignalGroup, SignalsDoc, names_of
from controller.anomaly.detector import (
    Anomaly,
    AnomalyDetector,
    DetectorConfig,
    WindowResult,
    fmt_value,
    nan_median,
)
from controller.anomaly.fleet import FleetDetector
from controller.anomaly.frame import SignalFrame, frame_from_docs

NIC = names_of(Entity.NIC)
COL = {n: j for j, n in enumerate(NIC)}
CFG = DetectorConfig(warmup=10, persist=3, clear=3, half_life=60)


def nic_window(rng: np.random.Generator, n: int = 12) -> np.ndarray:
    """A window of ``n`` healthy NICs: traffic, a few pauses and marks, MTU 9000."""
    v = np.full((n, len(NIC)), np.nan)
    noise = np.exp(0.1 * rng.standard_normal((n, len(NIC))))
    v[:, COL["rdma_tx_bytes"]] = 1e10 * noise[:, 0]
    v[:, COL["rdma_rx_bytes"]] = 1e10 * noise[:, 1]
    v[:, COL["pfc_rx_p3"]] = 50 * noise[:, 2]
    v[:, COL["pause_rx"]] = 50 * noise[:, 3]
    v[:, COL["ecn_marked"]] = 300 * noise[:, 4]
    v[:, COL["symbol_errors"]] = 0.0
    v[:, COL["mtu"]] = 9000.0
    return v


def ids(n: int) -> tuple[str, ...]:
    return tuple(f"nic{i}" for i in range(n))


def run(
    det: AnomalyDetector, windows: list[np.ndarray], groups: list[str] | None = None
) -> list[WindowResult]:
    out = []
    for w, v in enumerate(windows):
        frame = SignalFrame(Entity.NIC, ids(len(v)), NIC, v)
        out.append(det.step(frame, groups or ["job:a"] * len(v), w * 10**10))
    return out


def test_a_fault_on_one_nic_is_an_anomaly_naming_its_signal() -> None:
    rng = np.random.default_rng(1)
    ws = [nic_window(rng) for _ in range(30)]
    for v in ws[20:26]:
        v[3, COL["pfc_rx_p3"]] = 40_000.0
        v[3, COL["pause_rx"]] = 40_000.0
    res = run(AnomalyDetector(Entity.NIC, CFG), ws)
    started = [(w, a.entity) for w, r in enumerate(res) for a in r.new]
    assert started == [(22, "nic3")]  # third window in a row: persistence
    a = res[22].new[0]
    assert set(a.signals[:2]) == {"pfc_rx_p3", "pause_rx"}
    top = a.top[0]
    assert top.value == 40_000.0 and top.normal == pytest.approx(50, rel=0.3)
    ev = a.event()
    assert (ev.kind, ev.target) == ("anomaly", "nic3")
    assert "40 k" in ev.detail and "normal" in ev.detail
    ended = [(w, e) for w, r in enumerate(res) for e in r.ended]
    assert ended == [(28, "nic3")]  # three quiet windows end the episode
    assert all(not r.active for r in res[28:])


def test_two_windows_are_a_burst_not_an_anomaly() -> None:
    rng = np.random.default_rng(2)
    ws = [nic_window(rng) for _ in range(25)]
    for v in ws[20:22]:
        v[5, COL["pfc_rx_p3"]] = 40_000.0
    assert not any(r.new for r in run(AnomalyDetector(Entity.NIC, CFG), ws))


def test_a_job_wide_change_is_no_entity_anomaly_but_a_group_move() -> None:
    rng = np.random.default_rng(3)
    ws = [nic_window(rng) for _ in range(30)]
    for v in ws[20:]:
        v[:, COL["ecn_marked"]] *= 1000  # the leaf marks every NIC of the job
    res = run(AnomalyDetector(Entity.NIC, CFG), ws)
    assert not any(r.new for r in res)
    moved = res[25].moves["job:a"]
    assert moved[0].signal == "ecn_marked" and moved[0].value > 1e5
    assert moved[0].normal == pytest.approx(300, rel=0.3)
    # a whole-group move is not learned as normal: still there ten windows later
    assert res[29].moves["job:a"][0].signal == "ecn_marked"


def test_missing_values_and_bad_direction_do_not_flag() -> None:
    rng = np.random.default_rng(4)
    ws = [nic_window(rng) for _ in range(30)]
    for v in ws[20:]:
        v[2, :] = np.nan  # a read that keeps failing
        v[4, COL["pfc_rx_p3"]] = 0.0  # fewer pauses: not trouble
        v[6, COL["rdma_tx_bytes"]] *= 50  # more throughput: not trouble ("down" is bad)
    assert not any(r.new for r in run(AnomalyDetector(Entity.NIC, CFG), ws))


def test_a_config_signal_is_judged_against_peers_from_the_first_window() -> None:
    rng = np.random.default_rng(5)
    ws = [nic_window(rng) for _ in range(4)]
    for v in ws:
        v[7, COL["mtu"]] = 1500.0
    res = run(AnomalyDetector(Entity.NIC, CFG), ws)
    assert [(w, a.entity, a.signals[0]) for w, r in enumerate(res) for a in r.new] == [
        (2, "nic7", "mtu")
    ]


def test_an_entity_without_a_normal_yet_is_not_scored() -> None:
    rng = np.random.default_rng(6)
    ws = [nic_window(rng) for _ in range(8)]  # under the warm-up
    for v in ws:
        v[1, COL["pfc_rx_p3"]] = 40_000.0
    assert not any(r.new for r in run(AnomalyDetector(Entity.NIC, CFG), ws))


def test_a_new_job_is_a_new_normal() -> None:
    rng = np.random.default_rng(7)
    ws = [nic_window(rng) for _ in range(40)]
    groups = [["job:a"] * 6 + ["job:b"] * 6 for _ in ws]
    for w in range(20, 40):  # nic0..5 go to job c, whose traffic is ten times less
        ws[w][:6, COL["rdma_tx_bytes"]] /= 10
        ws[w][:6, COL["rdma_rx_bytes"]] /= 10
        groups[w] = ["job:c"] * 6 + ["job:b"] * 6
    det = AnomalyDetector(Entity.NIC, CFG)
    res = [
        det.step(SignalFrame(Entity.NIC, ids(12), NIC, v), g, w * 10**10)
        for w, (v, g) in enumerate(zip(ws, groups, strict=True))
    ]
    assert not any(r.new for r in res)


def _host_frames(n_hosts: int, io: float, gpu_util: float) -> dict[Entity, SignalFrame]:
    hv = np.full((n_hosts, len(names_of(Entity.HOST))), np.nan)
    hc = {n: j for j, n in enumerate(names_of(Entity.HOST))}
    hv[:, hc["psi_io_some"]] = 0.01
    hv[0, hc["psi_io_some"]] = io
    gv = np.full((8, len(names_of(Entity.GPU))), np.nan)
    gv[:, names_of(Entity.GPU).index("gpu_util")] = gpu_util
    hosts = tuple(f"h{i}" for i in range(n_hosts))
    return {
        Entity.HOST: SignalFrame(Entity.HOST, hosts, names_of(Entity.HOST), hv),
        Entity.GPU: SignalFrame(Entity.GPU, tuple(f"h0.gpu{k}" for k in range(8)),
                                names_of(Entity.GPU), gv),
    }  # fmt: skip


def test_a_solo_host_is_not_flagged_for_its_jobs_phase() -> None:
    fleet = FleetDetector(CFG)
    groups = {Entity.HOST: ["job:solo", "", ""], Entity.GPU: ["job:solo"] * 8}
    flags = []
    for w in range(30):
        ckpt = w >= 20  # a checkpoint: the GPUs idle, the host writes
        frames = _host_frames(3, 0.4 if ckpt else 0.01, 5.0 if ckpt else 90.0)
        flags += [a.entity for a in fleet.step(frames, groups, w * 10**10).new]
    assert flags == []
    fleet = FleetDetector(CFG)  # the same I/O stall while the GPUs keep working: flagged
    for w in range(30):
        frames = _host_frames(3, 0.4 if w >= 20 else 0.01, 90.0)
        flags += [a.entity for a in fleet.step(frames, groups, w * 10**10).new]
    assert flags == ["h0"]


def test_detector_rejects_what_it_cannot_read() -> None:
    det = AnomalyDetector(Entity.NIC, CFG)
    v = nic_window(np.random.default_rng(8))
    with pytest.raises(ValueError, match="catalogue"):
        det.step(SignalFrame(Entity.NIC, ids(12), NIC[:-1], v[:, :-1]), ["g"] * 12, 0)
    with pytest.raises(ValueError, match="one peer group"):
        det.step(SignalFrame(Entity.NIC, ids(12), NIC, v), ["g"], 0)
    with pytest.raises(ValueError, match="shape"):
        SignalFrame(Entity.NIC, ids(3), NIC, v)
    with pytest.raises(ValueError):
        DetectorConfig(persist=0)


def test_frame_from_documents() -> None:
    d1 = SignalsDoc("h1", 1, 3.0, {"nic": SignalGroup(("rx_bytes", "mtu"), {"nic1": (5.0, None)})})
    d2 = SignalsDoc("h2", 1, 3.0, {"nic": SignalGroup(("mtu",), {"nic2": (9000.0,)}),
                                   "host": SignalGroup(("load1",), {"h2": (1.0,)})})  # fmt: skip
    f = frame_from_docs([d1, d2], "nic")
    assert f.entities == ("nic1", "nic2") and f.signals == NIC
    assert f.values[0, COL["rx_bytes"]] == 5.0 and np.isnan(f.values[0, COL["mtu"]])
    assert f.values[1, COL["mtu"]] == 9000.0 and np.isnan(f.values[1, COL["rx_bytes"]])
    assert frame_from_docs([d1], "gpu").values.shape == (0, len(names_of(Entity.GPU)))


def test_nan_median_matches_numpy() -> None:
    rng = np.random.default_rng(9)
    for _ in range(300):
        x = rng.normal(size=(int(rng.integers(0, 9)), int(rng.integers(1, 5))))
        x[rng.random(x.shape) < 0.3] = np.nan
        got, cnt = nan_median(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmedian(x, axis=0) if len(x) else np.full(x.shape[1], np.nan)
        assert np.allclose(got, want, equal_nan=True)
        assert (cnt == np.sum(~np.isnan(x), axis=0)).all()


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [(41_000.0, "frames/s", "41 k/s"), (1.2e9, "B/s", "1.2 GB/s"), (88.0, "degC", "88 degC"),
     (9000.0, "bytes", "9000 bytes"), (0.25, "fraction", "0.25"), (3.9, "events/s", "3.9 /s")],
)  # fmt: skip
def test_values_read_like_an_operator_writes_them(value: float, unit: str, text: str) -> None:
    assert fmt_value(value, unit) == text


def test_a_whole_group_move_is_not_learned_as_normal() -> None:
    rng = np.random.default_rng(10)
    ws = [nic_window(rng) for _ in range(80)]
    for v in ws[20:]:
        v[:, COL["ecn_marked"]] *= 1000
    fast = DetectorConfig(warmup=10, half_life=10)  # a normal that would follow in ~30 windows
    res = run(AnomalyDetector(Entity.NIC, fast), ws)
    assert res[79].moves["job:a"][0].signal == "ecn_marked"


def test_the_nics_of_one_host_are_not_one_anothers_peers() -> None:
    """Only host a's four NICs report cnp_ignored (host b's driver does not): when it jumps
    on all four, the peers that report it are all one host's, so it is judged against its
    own normal; without the hosts it would cancel."""
    rng = np.random.default_rng(11)
    ws = [nic_window(rng, 8) for _ in range(30)]
    for w, v in enumerate(ws):
        v[:4, COL["cnp_ignored"]] = 3000.0 if w >= 20 else 0.0  # b's stay NaN
    hosts = ["a"] * 4 + ["b"] * 4
    flagged: dict[bool, list[str]] = {}
    for with_hosts in (True, False):
        det = AnomalyDetector(Entity.NIC, CFG)
        got = []
        for w, v in enumerate(ws):
            frame = SignalFrame(Entity.NIC, ids(8), NIC, v)
            r = det.step(frame, ["job:a"] * 8, w * 10**10, hosts=hosts if with_hosts else None)
            got += [a.entity for a in r.new]
        flagged[with_hosts] = got
    assert sorted(flagged[True]) == ["nic0", "nic1", "nic2", "nic3"]
    assert flagged[False] == []


def test_configuration_is_compared_across_the_leaf() -> None:
    """A job of one host whose four NICs all run MTU 1500: unlike the other NICs of its leaf
    (other jobs), so flagged, though its job's peers all agree."""
    rng = np.random.default_rng(12)
    v = nic_window(rng, 12)
    v[:4, COL["mtu"]] = 1500.0
    groups = ["job:solo"] * 4 + ["job:b"] * 8
    hosts = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    det = AnomalyDetector(Entity.NIC, CFG)
    new: list[Anomaly] = []
    for w in range(3):
        frame = SignalFrame(Entity.NIC, ids(12), NIC, v)
        new += det.step(frame, groups, w * 10**10, sites=["leaf0"] * 12, hosts=hosts).new
    assert sorted(a.entity for a in new) == ["nic0", "nic1", "nic2", "nic3"]
    assert new[0].signals == ("mtu",)
