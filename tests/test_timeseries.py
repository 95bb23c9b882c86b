"""Time series, pure parts: line protocol, interval statistics, the schema (points), the
bounded buffer and retry policy, the writer with a fake transport, Prometheus metrics."""

from __future__ import annotations

import os
import threading
import urllib.request
import zlib

import numpy as np
import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from contract.documents import EventDoc
from controller.observations import Observations
from controller.timeseries.lineproto import Point, PointError, to_line_protocol
from controller.timeseries.metrics import ControllerMetrics, parse_listen, serve_metrics
from controller.timeseries.points import MeshState, PointBuilder, RemediationAction
from controller.timeseries.stats import IntervalStats
from controller.timeseries.writer import (
    COMPRESSED_BYTES_PER_INTERVAL_1024,
    DEFAULT_BUFFER_BYTES,
    DEFAULT_INTERVAL_S,
    LineBuffer,
    TsdbWriter,
)
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import routing_tables
from mesh.snapshot import GpuHealth, Health
from mqttlink.reconnect import Backoff


def _fabric():  # type: ignore[no-untyped-def]
    return build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, nics_per_host=1, spines=2))


def _obs(fab, src, dst, owd, lost=None, sport=None):  # type: ignore[no-untyped-def]
    """Observations between NIC indices with the model ECMP paths (fwd and reply)."""
    from mesh.fabric.ecmp import flow_paths

    n = len(src)
    src = np.asarray(src, np.int32)
    dst = np.asarray(dst, np.int32)
    sport = np.asarray(sport if sport is not None else np.arange(n) + 49152, np.int32)
    w = routing_tables(fab).max_hops
    hf = np.asarray(flow_paths(fab, src, dst, sport, np.full(n, 4791)), np.int32)
    hr = np.asarray(flow_paths(fab, dst, src, np.full(n, 4791), sport), np.int32)
    pad = lambda h: np.hstack([h, np.full((n, w - h.shape[1]), -1, np.int32)])  # noqa: E731
    lost = np.zeros(n, bool) if lost is None else np.asarray(lost, bool)
    owd = np.asarray(owd, np.float64)
    owd = np.where(lost, np.nan, owd)
    return Observations(
        np.zeros(n, np.int64), src, dst, sport, pad(hf), pad(hr), lost, owd, owd.copy(),
        2 * owd,
    )  # fmt: skip


# ---- line protocol ------------------------------------------------------------------------
def test_point_line_escapes_and_types() -> None:
    p = Point("m x", {"b": "v,1", "a": "p q=r"}, {"f": 1.5, "i": 3, "ok": True}, 42)
    assert p.line() == r"m\ x,a=p\ q\=r,b=v\,1 f=1.5,i=3i,ok=true 42"
    assert to_line_protocol([p, p]).count(b"\n") == 2
    assert to_line_protocol([]) == b""


@pytest.mark.parametrize(
    ("meas", "tags", "fields", "t"),
    [
        ("", {}, {"f": 1.0}, 0),
        ("m", {}, {}, 0),
        ("m", {}, {"f": float("nan")}, 0),
        ("m", {}, {"f": float("inf")}, 0),
        ("m", {"t": ""}, {"f": 1.0}, 0),
        ("m", {"t": "a\nb"}, {"f": 1.0}, 0),
        ("m", {}, {"f": "text"}, 0),
        ("m", {}, {"f": 1.0}, -1),
    ],
)
def test_point_rejects_bad_values(meas, tags, fields, t) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PointError):
        Point(meas, tags, fields, t)


# ---- interval statistics ------------------------------------------------------------------
def test_interval_percentiles_match_numpy_per_pair_and_path() -> None:
    fab = _fabric()
    rng = np.random.default_rng(3)
    st = IntervalStats(fab, routing_tables(fab).max_hops)
    n = 4000
    src = rng.integers(0, 4, n)
    dst = (src + rng.integers(1, 4, n)) % 4
    owd = rng.gamma(2.0, 500.0, n) + 1000
    st.observe(_obs(fab, src, dst, owd))
    s = st.close(10)
    assert s.end_ns == 10
    for a, b, p50, p99, c in zip(
        s.pair_src, s.pair_dst, s.pair_p50_ns, s.pair_p99_ns, s.pair_samples, strict=True
    ):
        # both directions are one-way samples of their directed pair
        v = np.concatenate([owd[(src == a) & (dst == b)], owd[(src == b) & (dst == a)]])
        v = np.sort(np.rint(v))  # kept to the whole ns
        assert c == len(v)
        assert p50 == v[int(np.floor(0.5 * (len(v) - 1) + 0.5))]
        assert p99 == v[int(np.floor(0.99 * (len(v) - 1) + 0.5))]
    assert len(s.pair_src) == 12
    # the first interval has no baseline yet; the next one has queueing >= 0
    st.observe(_obs(fab, src, dst, owd + 300))
    s2 = st.close(20)
    assert np.all(s2.pair_queue_p99_ns >= 250)
    # switch paths: same-leaf pairs cross one leaf; cross-leaf pairs leaf>spine>leaf
    assert set(s.path_label) <= {"leaf0", "leaf1"} | {
        f"leaf{a}>spine{k}>leaf{b}" for a in (0, 1) for b in (0, 1) for k in (0, 1) if a != b
    }
    assert int(s.path_probes.sum()) == n


def test_interval_loss_counts_links_of_forward_and_reply_paths() -> None:
    fab = _fabric()
    st = IntervalStats(fab, routing_tables(fab).max_hops)
    # nic0 (leaf0) -> nic2 (leaf1): 10 probes, 4 lost
    lost = [True] * 4 + [False] * 6
    st.observe(_obs(fab, [0] * 10, [2] * 10, [1000.0] * 10, lost=lost, sport=[50000] * 10))
    s = st.close(1)
    nic0 = fab.link_index["nic0-leaf0"]
    nic1 = fab.link_index["nic1-leaf0"]
    # forward and reply both cross nic0's link: 20 crossings, 8 lost
    assert (s.link_probes[nic0], s.link_lost[nic0]) == (20, 8)
    assert (s.link_probes[nic1], s.link_lost[nic1]) == (0, 0)
    cross = [i for i, p in enumerate(s.path_label) if ">" in p]
    assert sum(s.path_probes[i] for i in cross) == 10
    assert sum(s.path_lost[i] for i in cross) == 4


def test_interval_samples_are_bounded_by_halving() -> None:
    fab = _fabric()
    st = IntervalStats(fab, routing_tables(fab).max_hops, max_samples=1000)
    for _ in range(20):
        st.observe(_obs(fab, [0] * 200, [1] * 200, np.arange(200.0) + 1000))
    s = st.close(1)
    total = int(s.pair_samples.sum())
    assert 250 <= total <= 1000  # 8,000 samples offered, kept set halved to fit
    # uniform subsample: the median stays in the middle of the offered values
    assert 1080 <= float(s.pair_p50_ns[0]) <= 1120


# ---- the schema -------------------------------------------------------------------------
def _state(fab, t, alive, events=(), actions=()):  # type: ignore[no-untyped-def]
    n = len(fab.nics)
    return MeshState(
        t, (Health.UP,) * n, np.full(n, 5000.0), np.full(n, np.nan), np.arange(n) * 10.0,
        np.full(n, 2.0), {"leaf0-spine1": Health.FLAPPING}, {"leaf0-spine1": 3},
        {h.id: GpuHealth(True, ok=h.id != "host1") for h in fab.hosts}, alive,
        tuple(events), tuple(actions),
    )  # fmt: skip


def test_points_schema_has_no_high_cardinality_tags_and_parses() -> None:
    fab = _fabric()
    st = IntervalStats(fab, routing_tables(fab).max_hops)
    st.observe(_obs(fab, [0, 1, 2, 3] * 5, [2, 3, 0, 1] * 5, np.linspace(1e3, 2e3, 20)))
    summ = st.close(5_000)
    alive = {h.id: True for h in fab.hosts}
    ev = EventDoc(4_000, "link_flap", "leaf0-spine1", "flapped", "critical")
    act = RemediationAction.from_doc(
        {"t_ns": 4_500, "action": "exclude_nic", "target": "nic0", "job": "j1", "extra": [1]}
    )
    body = PointBuilder(fab).render(_state(fab, 5_000, alive, [ev], [act]), summ).decode()
    lines = body.splitlines()
    meas = {ln.split(",")[0] for ln in lines}
    assert meas == {
        "qpmesh_pair", "qpmesh_path", "qpmesh_link", "qpmesh_nic", "qpmesh_clock",
        "qpmesh_presence", "qpmesh_gpu", "qpmesh_event", "qpmesh_remediation",
    }  # fmt: skip
    for ln in lines:
        head, fields, t = ln.split(" ")
        tags = dict(kv.split("=") for kv in head.split(",")[1:])
        assert not {"sport", "flow_label", "qpn", "seq", "port"} & set(tags)
        assert int(t) >= 0 and fields
        assert '"' not in fields  # no string fields
    assert (
        "qpmesh_event,kind=link_flap,severity=critical,target=leaf0-spine1 count=1i 4000" in lines
    )
    assert any(
        ln.startswith("qpmesh_remediation,action=exclude_nic,status=issued,target=nic0")
        for ln in lines
    )
    assert any("link=leaf0-spine1," in ln and "state=4i,flaps=3i" in ln for ln in lines)
    assert "qpmesh_gpu,host=host1 ok=0i,present=1i 5000" in lines
    assert sum(ln.startswith("qpmesh_pair,") for ln in lines) == 4


def test_departed_nics_stop_and_presence_lingers_then_stops() -> None:
    fab = _fabric()
    b = PointBuilder(fab, gone_after_ns=100)
    st = IntervalStats(fab, routing_tables(fab).max_hops)
    alive = {h.id: True for h in fab.hosts}
    alive["host0"] = False  # nic0's prober left
    st.observe(_obs(fab, [0, 1, 2], [1, 2, 3], [1e3, 1e3, 1e3]))
    body = b.render(_state(fab, 1000, alive), st.close(1000)).decode()
    assert "nic=nic0," not in body and "src=nic0," not in body and "dst=nic0," not in body
    assert "link=nic0-leaf0," not in body
    assert "qpmesh_presence,host=host0 alive=0i 1000" in body
    assert "src=nic1," in body and "nic=nic1," in body
    later = b.render(_state(fab, 1200, alive), None).decode()
    assert "host=host0" not in later  # past gone_after_ns: the host's series stop too
    alive["host0"] = True
    back = b.render(_state(fab, 1300, alive), None).decode()
    assert "qpmesh_presence,host=host0 alive=1i 1300" in back and "nic=nic0," in back


def test_remediation_audit_records_of_the_policy_are_taken() -> None:
    from contract.remediation import ActionDoc

    act = ActionDoc("a1", "move_off_nic", "nic down", "nic_down", 5, 10, nic="nic3", job="j")
    doc = {"t_ns": 7, "kind": "remediation", "disposition": "send", **act.to_dict()}
    assert RemediationAction.from_doc(doc) == RemediationAction(7, "move_off_nic", "nic3", "send")


@pytest.mark.parametrize(
    "doc",
    [
        {"action": "x", "target": "nic0"},
        {"t_ns": "1", "action": "x", "target": "nic0"},
        {"t_ns": 1, "action": "", "target": "nic0"},
        {"t_ns": 1, "action": "x", "target": "nic0", "status": 3},
        {"t_ns": True, "action": "x", "target": "nic0"},
    ],
)
def test_remediation_action_document_is_validated(doc) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        RemediationAction.from_doc(doc)


# ---- buffer, backoff, writer ----------------------------------------------------------------
def test_buffer_drops_oldest_past_bound_and_counts() -> None:
    chunks = [(os.urandom(60).hex() + "\n").encode() * 2 for _ in range(3)]  # 2 lines each
    one = len(zlib.compress(chunks[0], 1))
    buf = LineBuffer(max_bytes=2 * one + 10)
    assert buf.offer(chunks[0]) == 0
    assert buf.offer(chunks[1]) == 0
    assert buf.offer(chunks[2]) == 2  # past the bound: the oldest chunk (2 lines) goes
    assert buf.dropped_lines == 2 and buf.dropped_bytes == len(chunks[0])
    got = buf.take(1 << 20)
    assert [zlib.decompress(c.data) for c in got] == chunks[1:]
    assert buf.size() == (0, 0)
    assert buf.putback(got) == 0 and buf.size()[1] == 4  # a failed batch goes back in front
    assert zlib.decompress(buf.take(1)[0].data) == chunks[1]  # one chunk at least


def test_writer_retries_until_the_server_takes_everything() -> None:
    got: list[bytes] = []
    fails = {"n": 5}
    lock = threading.Lock()

    def post(body: bytes) -> None:
        with lock:
            if fails["n"] > 0:
                fails["n"] -= 1
                raise ConnectionRefusedError("down")
            got.append(body)

    w = TsdbWriter("http://unused", post=post, backoff=Backoff(0.001, 0.01), batch_bytes=64)
    sent = [f"m,k=v f={i}i {i}\n".encode() for i in range(200)]
    try:
        for c in sent:
            assert w.offer(c) == 0
        assert w.flush(60.0)
    finally:
        w.close(1.0)
    assert b"".join(got) == b"".join(sent)  # all of it, in order
    st = w.stats()
    assert st.failures == 5 and st.dropped_lines == 0 and st.written_lines == 200
    assert w.backoff.attempt == 0  # the write that worked started the delays over
    assert st.fill == 0.0


def test_writer_offer_never_blocks_while_the_server_hangs() -> None:
    release = threading.Event()
    w = TsdbWriter(
        "http://unused", post=lambda body: release.wait(30), max_bytes=1000, batch_bytes=100
    )
    try:
        # 100 chunks of ~110 compressed bytes into a 1 kB buffer, the sender stuck
        dropped = sum(w.offer((os.urandom(99).hex() + "\n").encode()) for _ in range(100))
        st = w.stats()
        assert dropped == st.dropped_lines >= 80
        assert st.buffered_bytes <= 1000
    finally:
        release.set()
        w.close(5.0)


# ---- Prometheus metrics -----------------------------------------------------------------
def test_metrics_use_their_own_registry_and_serve() -> None:
    reg = CollectorRegistry()
    m = ControllerMetrics(reg)
    m.records.inc(100)
    m.decode_errors.labels("probes").inc()
    m.websocket_clients.set(3)
    m.solve_seconds.observe(0.2)
    assert REGISTRY.get_sample_value("qpmesh_ingest_records_total") is None
    assert reg.get_sample_value("qpmesh_ingest_records_total") == 100
    ControllerMetrics(CollectorRegistry())  # a second controller in one process is fine
    server = serve_metrics("127.0.0.1:0", reg)
    try:
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"qpmesh_websocket_clients 3.0" in text
        assert b'qpmesh_decode_errors_total{topic_kind="probes"} 1.0' in text
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError):
        parse_listen("nohost")


@pytest.mark.slow
def test_default_buffer_holds_five_minutes_at_1024_nics() -> None:
    """Measure one 10 s interval of the 1,024-NIC demo fabric (simulated, no faults) and check
    the default bound holds 5 minutes of them compressed as the buffer keeps them."""
    from dataclasses import replace

    from controller.timeseries.recorder import TimeseriesRecorder
    from testbed.sim.demo_runner import DemoRunner, demo_scenario

    runner = DemoRunner(replace(demo_scenario(None, nics=1024, seed=1), faults=()), step_s=1.0)
    bodies: list[bytes] = []
    rec = TimeseriesRecorder(runner.fabric, bodies.append, interval_ns=10_000_000_000)
    runner.controller.brain = rec.tee(runner.controller.brain)
    while len(bodies) < 2:  # the second interval has queueing (a baseline exists)
        runner.step()
        rec.tick(runner.now_ns, runner.controller.snapshot, runner.controller.alive)
    body = bodies[1]
    packed = len(zlib.compress(body, 1))
    lines = body.count(b"\n")
    print(f"1,024 NICs: {lines} lines, {len(body)} B, {packed} B compressed")
    assert lines > 70_000  # pairs, paths, links, NICs, clocks, hosts
    assert packed <= 1.2 * COMPRESSED_BYTES_PER_INTERVAL_1024  # the documented figure holds
    assert 300 / DEFAULT_INTERVAL_S * packed <= DEFAULT_BUFFER_BYTES


def test_path_detail_and_pairs_knobs_bound_the_series() -> None:
    fab = _fabric()
    obs = _obs(
        fab, [0, 1, 2, 3] * 20, [2, 3, 0, 1] * 20, np.full(80, 1e3), sport=np.arange(80) + 49152
    )
    alive = {h.id: True for h in fab.hosts}
    labels = {}
    for detail in ("full", "top", "off"):
        st = IntervalStats(fab, routing_tables(fab).max_hops, path_detail=detail)
        st.observe(obs)
        s = st.close(1)
        labels[detail] = set(s.path_label)
        assert int(s.link_probes.sum()) > 0  # link loss is counted whatever the detail
    assert labels["full"] == {f"leaf{a}>spine{k}>leaf{1 - a}" for a in (0, 1) for k in (0, 1)}
    assert labels["top"] == {"spine0", "spine1"}
    assert labels["off"] == set()
    with pytest.raises(ValueError):
        IntervalStats(fab, 4, path_detail="bogus")
    st = IntervalStats(fab, routing_tables(fab).max_hops, path_detail="top")
    st.observe(obs)
    body = PointBuilder(fab, pairs=False).render(_state(fab, 5, alive), st.close(5)).decode()
    assert "qpmesh_pair," not in body
    assert "qpmesh_path,path=spine0,spine=spine0 " in body  # no leaf tags for a top label


def test_dashboard_is_provisionable_against_its_datasource() -> None:
    import json
    from pathlib import Path

    root = Path(__file__).parent.parent / "docs" / "grafana"
    dash = json.loads((root / "qpmesh-dashboard.json").read_text())
    ds_yaml = (root / "provisioning" / "datasources" / "qpmesh.yaml").read_text()
    prov_yaml = (root / "provisioning" / "dashboards" / "qpmesh.yaml").read_text()
    assert "type: prometheus" in ds_yaml and "uid: qpmesh-vm" in ds_yaml
    assert "type: file" in prov_yaml and "apiVersion: 1" in ds_yaml and "apiVersion: 1" in prov_yaml
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    uids = {p["datasource"]["uid"] for p in dash["panels"]}
    uids |= {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]}
    uids |= {a["datasource"]["uid"] for a in dash["annotations"]["list"]}
    assert uids == {"qpmesh-vm"}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
    kinds = {p["type"] for p in dash["panels"]}
    assert {"heatmap", "timeseries", "state-timeline"} <= kinds


def test_a_fault_shorter_than_the_interval_is_written_as_worst_state_and_blamed_loss() -> None:
    """A NIC down at one tick of an interval that ends up shows in ``worst_state``; its
    link's loss is ``blamed_loss_ratio``, the other links its probes crossed get 0 there."""
    from controller.timeseries.recorder import TimeseriesRecorder

    fab = _fabric()
    bodies: list[bytes] = []
    rec = TimeseriesRecorder(fab, bodies.append, interval_ns=1000)
    alive = {h.id: True for h in fab.hosts}
    up_links = {lk.id: Health.UP for lk in fab.links}
    rec.tick(0, lambda: _snap(fab, 0), alive)  # opens the first interval
    rec.observe(_obs(fab, [0, 1, 2], [3, 3, 3], [1e3, 1e3, 1e3], lost=[True, True, True]))
    down = [Health.DOWN if i == 3 else Health.UP for i in range(len(fab.nics))]
    nic3_link = next(lk.id for lk in fab.links if lk.lower == "nic3")
    rec.states(down, {**up_links, nic3_link: Health.DOWN})  # one tick: down
    rec.states([Health.UP] * len(fab.nics), up_links)  # the next: up again
    assert rec.tick(1000, lambda: _snap(fab, 1000), alive) > 0
    lines = bodies[-1].decode().splitlines()
    nic3 = next(ln for ln in lines if ln.startswith("qpmesh_nic,nic=nic3,"))
    assert "state=0i" in nic3 and "worst_state=5i" in nic3
    links = {
        ln.split("link=")[1].split(",")[0]: ln for ln in lines if ln.startswith("qpmesh_link,")
    }
    assert "blamed_loss_ratio=1 " in links[nic3_link]
    crossed = [k for k, ln in links.items() if "lost=" in ln and ",lost=0i" not in ln]
    assert len(crossed) > 1  # the lost probes crossed other links too ...
    for k in crossed:
        if k != nic3_link:  # ... which are not blamed
            assert "blamed_loss_ratio=0," in links[k] or "blamed_loss_ratio=0 " in links[k]


def _snap(fab, t):  # type: ignore[no-untyped-def]
    from mesh.snapshot import MeshSnapshot

    snap = MeshSnapshot.blank(fab, t)
    return MeshSnapshot(t, fab, (Health.UP,) * len(fab.nics), snap.worst_in_ns,
                        snap.worst_out_ns, snap.owd_src, snap.owd_dst, snap.owd_ns,
                        snap.clock_offset_ns, snap.clock_uncertainty_ns,
                        link_health={lk.id: Health.UP for lk in fab.links})  # fmt: skip
