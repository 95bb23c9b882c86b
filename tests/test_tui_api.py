"""``qpmesh tui --api``: the API's documents back into snapshots (pure), and `ApiSource`
against a real aiohttp API (`controller.api.make_app` served in a thread on a free port):
what the screen shows, Control, tenant refusals, disconnection and catching up after the
controller comes back (same instance: events since; a new instance: the new log)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from contract.documents import EventDoc
from contract.jsondoc import DocumentError
from controller.api.app import STATE, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.api.server import ApiThread
from controller.api.views import Scope, snapshot_view
from controller.control import Control
from controller.jobs import Job, JobRegistry
from controller.tenancy import Grants
from mesh.documents import event_from_doc, fabric_from_doc, snapshot_from_doc
from mesh.fabric import FabricShape, build_fabric
from mesh.snapshot import ControlUnavailable, GpuHealth, Health, MeshSnapshot
from tests.waiting import until_blocking
from tui.apiclient import ApiSource, ApiTokenRefused, ApiUnreachable, api_base
from tui.apimodel import HistoryRing, merge_events
from tui.panes import Connection, connection_text, pair_vectors, path_breakdown

OP, ACME = "operator-token-1", "acme-tenant-token"
TOKENS = TokenTable({OP: Principal("operator", "ops"), ACME: Principal("tenant", "acme")})


def _snapshot(t_s: float = 100.0) -> MeshSnapshot:
    fab = build_fabric(FabricShape.for_nics(16, nics_per_leaf=8))
    n = len(fab.nics)
    snap = MeshSnapshot.blank(fab, int(t_s * 1e9))
    health = [Health.UP] * n
    health[3], health[9] = Health.DOWN, Health.CONTENDED
    src = np.array([2, 2, 5, 11], np.int32)
    dst = np.array([5, 11, 2, 2], np.int32)
    owd = np.array([1500.0, 9000.0, 1400.0, 8000.0])
    paths = {(2, 5): {"leaf0": 1500.0}, (2, 11): {"spine0": 7000.0, "spine1": 9000.0},
             (5, 2): {"leaf0": 1400.0}, (11, 2): {"spine1": 8000.0}}  # fmt: skip
    win = np.full(n, np.nan)
    wout = np.full(n, np.nan)
    win[[5, 11, 2]] = [1500.0, 9000.0, 8000.0]
    wout[[2, 5, 11]] = [9000.0, 1400.0, 8000.0]
    return replace(
        snap, nic_health=tuple(health), worst_in_ns=win, worst_out_ns=wout,
        owd_src=src, owd_dst=dst, owd_ns=owd, path_owd=paths,
        clock_offset_ns=np.linspace(-100.0, 100.0, n), clock_uncertainty_ns=np.full(n, 7.0),
        link_health={"leaf1-spine1": Health.FLAPPING}, flap_counts={"leaf1-spine1": 3},
        throughput_bps=2.5e11, gpu={"host2": GpuHealth(True, False, "Xid 79")},
    )  # fmt: skip


def _event(t_s: float, kind: str = "link_flap", target: str = "leaf1-spine1") -> EventDoc:
    return EventDoc(int(t_s * 1e9), kind, target, "flaps=3", "critical")


# ---- pure: documents -> values ------------------------------------------------------------------


def test_fabric_and_snapshot_round_trip_through_the_documents() -> None:
    snap = _snapshot()
    doc = snapshot_view(snap, Scope.fleet(), control=False, jobs=1)
    fab = fabric_from_doc(doc)
    assert [n.id for n in fab.nics] == [n.id for n in snap.fabric.nics]
    assert fab.groups.keys() == snap.fabric.groups.keys()
    assert [(s.id, s.kind) for s in fab.switches] == [(s.id, s.kind) for s in snap.fabric.switches]
    got = snapshot_from_doc(doc, fab, jobs=({"name": "j", "nics": ["nic0"]},))
    assert got.nic_health == snap.nic_health
    np.testing.assert_array_equal(got.worst_in_ns, snap.worst_in_ns)
    np.testing.assert_array_equal(got.clock_offset_ns, snap.clock_offset_ns)
    assert got.link_health == {"leaf1-spine1": Health.FLAPPING}
    assert got.flap_counts == {"leaf1-spine1": 3}
    assert got.throughput_bps == 2.5e11 and got.control_enabled is False
    assert got.gpu == {"host2": GpuHealth(True, False, "Xid 79")}
    assert got.jobs is not None and len(got.jobs) == 1
    blank = snapshot_from_doc({**doc, "running_jobs": None, "control_enabled": None,
                            "throughput_bps": None}, fab)  # fmt: skip
    assert blank.jobs is None and blank.control_enabled is None and blank.throughput_bps is None


def test_three_tier_fabric_tiers_follow_the_links() -> None:
    shape = FabricShape(leaves=2, hosts_per_leaf=2, spines=2, pods=2, superspines=2)
    snap = MeshSnapshot.blank(build_fabric(shape))
    fab = fabric_from_doc(snapshot_view(snap, Scope.fleet(), control=None, jobs=None))
    want = sorted((s.id, s.kind) for s in snap.fabric.switches)
    assert sorted((s.id, s.kind) for s in fab.switches) == want


def test_malformed_documents_are_document_errors() -> None:
    doc = snapshot_view(_snapshot(), Scope.fleet(), control=None, jobs=None)
    fab = fabric_from_doc(doc)
    for bad_fabric in ({}, {"nics": 3, "links": []}, {"nics": [{"id": "x"}], "links": []}):
        with pytest.raises(DocumentError):
            fabric_from_doc(bad_fabric)
    nics: list[dict[str, object]] = doc["nics"]  # type: ignore[assignment]
    for bad in ({**doc, "t_ns": "soon"}, {**doc, "nics": nics[:3]},
                {**doc, "nics": [{**nics[0], "worst_in_ns": "x"}] * 16}):  # fmt: skip
        with pytest.raises(DocumentError):
            snapshot_from_doc(bad, fab)
    with pytest.raises(DocumentError):
        event_from_doc({"seq": 1, "t_ns": 5, "kind": "x", "target": "y", "severity": "awful"})
    moved = {"seq": 2, "t_ns": 6, "kind": "contention", "target": "y", "related": "z"}
    assert event_from_doc(moved)[1].related == "z"
    assert event_from_doc({**moved, "related": ""})[1].related == ""


def test_merge_events_keeps_order_and_replaces_after_a_restart() -> None:
    a, b, c = (1, _event(1)), (2, _event(2)), (3, _event(3))
    assert merge_events((a,), (a, b, c)) == (a, b, c)
    assert merge_events((a, b), (b, a)) == (a, b)  # seen ones are not repeated
    assert merge_events((a, b, c), ((1, _event(9)),), restarted=True) == ((1, _event(9)),)
    assert merge_events((), (c, a, b), limit=2) == (b, c)


def test_history_ring_spacing_capacity_and_restart() -> None:
    h = HistoryRing(2, capacity=3, min_spacing_s=1.0)
    for k, t in enumerate((0.0, 0.5, 1.0, 2.0, 3.0)):
        h.add(int(t * 1e9), np.array([k, 1.0]), np.array([0.0, 2.0]))
    t, v = h.window(0, 60)
    assert t.tolist() == [-2.0, -1.0, 0.0] and v.tolist() == [2.0, 3.0, 4.0]
    assert h.window(1, 1.5)[1].tolist() == [2.0, 2.0]
    h.add(0, np.array([7.0, 7.0]), np.array([0.0, 0.0]))  # time went back: starts over
    assert h.window(0, 60)[1].tolist() == [7.0]
    with pytest.raises(IndexError):
        h.window(2, 60)


def test_api_base_and_connection_text() -> None:
    assert api_base("http://127.0.0.1:8080") == "http://127.0.0.1:8080/api/v1/"
    assert api_base("https://h:1/api/v1/") == "https://h:1/api/v1/"
    for bad in ("127.0.0.1:8080", "ftp://h:1", "http://h:x", "http://h:1/other", "http://:1"):
        with pytest.raises(ValueError):
            api_base(bad)
    down = Connection("http://h:1/api/v1/", False, "refused", retry_at_s=12.0, since_s=3.0)
    text = connection_text(down, 10.0).plain
    assert "DISCONNECTED, retrying in 2 s" in text and "refused" in text and "7 s old" in text
    assert connection_text(Connection("u", True), 0.0).plain == "● live u"


# ---- ApiSource against a real API ---------------------------------------------------------------


@dataclass
class Server:
    """A real API on a free port, restartable on the same port (same app or a new one)."""

    hub: ApiHub
    control: Control = field(default_factory=lambda: Control(False))
    jobs: JobRegistry = field(default_factory=lambda: JobRegistry((Job("train-1", "acme",
                                                                       (("nic2",), ("nic5",))),)))  # fmt: skip
    port: int = 0
    thread: ApiThread | None = None

    def __post_init__(self) -> None:
        self.app = self.new_app()

    def new_app(self) -> object:
        grants = Grants(dict.fromkeys(("nic2", "nic5"), "acme"))  # the operator's grant
        return make_app(self.hub, TOKENS, jobs=self.jobs, control=self.control, grants=grants)

    def start(self) -> str:
        self.thread = ApiThread(self.app, "127.0.0.1", self.port)  # type: ignore[arg-type]
        self.port = self.thread.start()
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.stop()
            self.thread = None


@pytest.fixture
def server() -> Iterator[Server]:
    hub = ApiHub(_snapshot())
    hub.publish(None, (_event(90.0),))
    srv = Server(hub)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def sources() -> Iterator[list[ApiSource]]:
    made: list[ApiSource] = []
    try:
        yield made
    finally:
        for s in made:
            s.close()


def _source(made: list[ApiSource], srv: Server, token: str = OP) -> ApiSource:
    s = ApiSource(f"http://127.0.0.1:{srv.port}", token, backoff_s=(0.05, 0.2), refresh_s=0.1)
    made.append(s)
    s.start()
    return s


def test_source_shows_what_the_controller_has(server: Server, sources: list[ApiSource]) -> None:
    src = _source(sources, server)
    orig = server.hub.snapshot()
    snap = src.snapshot()
    assert [n.id for n in snap.fabric.nics] == [n.id for n in orig.fabric.nics]
    assert snap.nic_health == orig.nic_health and snap.flap_counts == {"leaf1-spine1": 3}
    assert snap.throughput_bps == 2.5e11 and snap.control_enabled is False
    assert snap.jobs == ({"name": "train-1", "tenant": "acme", "nics": ["nic2", "nic5"]},)
    assert [(e.kind, e.target) for e in snap.events] == [("link_flap", "leaf1-spine1")]
    assert src.connection().connected
    # the selected NIC's delay row/column and per-spine breakdown come from /delays?nic=
    src.focus(2)
    until_blocking(lambda: len(src.snapshot().owd_ns) == 4)
    got = src.snapshot()
    for a, b in zip(pair_vectors(got, 2), pair_vectors(orig, 2), strict=True):
        np.testing.assert_array_equal(a, b)
    assert path_breakdown(got, 2) == path_breakdown(orig, 2)
    # websocket: a new snapshot and a new event arrive without asking
    server.hub.publish(replace(orig, t_ns=orig.t_ns + 2_000_000_000,
                               nic_health=(Health.DOWN,) * 16), (_event(101, "nic_down", "nic0"),))  # fmt: skip
    until_blocking(lambda: src.snapshot().healthy_count == 0 and len(src.snapshot().events) == 2)
    t, v = src.history(11, 120.0)
    assert t.tolist() == [-2.0, 0.0] and v.tolist() == [9000.0, 9000.0]


def test_control_by_operator_and_refused_for_a_tenant(
    server: Server, sources: list[ApiSource]
) -> None:
    op = _source(sources, server)
    op.set_control(True)
    assert server.control.enabled and op.snapshot().control_enabled is True
    tenant = _source(sources, server, ACME)
    assert [n.id for n in tenant.snapshot().fabric.nics] == ["nic2", "nic5"]
    with pytest.raises(ControlUnavailable, match="needs an operator token"):
        tenant.set_control(False)
    assert server.control.enabled
    server.control = None  # type: ignore[assignment]
    bare = Server(server.hub, control=None)  # type: ignore[arg-type]
    bare.start()
    try:
        with pytest.raises(ControlUnavailable, match="not available"):
            _source(sources, bare).set_control(True)
    finally:
        bare.stop()


def test_reconnects_and_catches_up_on_the_same_controller(
    server: Server, sources: list[ApiSource]
) -> None:
    src = _source(sources, server)
    server.stop()
    until_blocking(lambda: not src.connection().connected)
    down = src.connection()
    assert down.reason and down.retry_at_s is not None
    assert len(src.snapshot().events) == 1  # the last data stays on screen
    with pytest.raises(ControlUnavailable, match="not connected"):
        src.set_control(True)
    # while it was away (same app, same instance): a newer snapshot and two more events
    snap = server.hub.snapshot()
    server.hub.publish(replace(snap, t_ns=snap.t_ns + 5_000_000_000),
                       (_event(102, "contention", "leaf2-spine0"), _event(103)))  # fmt: skip
    instance = server.app[STATE].instance  # type: ignore[index]
    server.app = server.new_app()  # an aiohttp app is bound to its first loop
    server.app[STATE].instance = instance  # type: ignore[index]
    server.start()
    until_blocking(lambda: src.connection().connected and len(src.snapshot().events) == 3)
    kinds = [e.kind for e in src.snapshot().events]
    assert kinds == ["link_flap", "contention", "link_flap"]  # nothing repeated, nothing lost
    assert src.snapshot().t_ns == snap.t_ns + 5_000_000_000


def test_a_restarted_controller_replaces_the_event_log(
    server: Server, sources: list[ApiSource]
) -> None:
    src = _source(sources, server)
    server.stop()
    until_blocking(lambda: not src.connection().connected)
    # a new controller process: new hub (sequence numbers from 1 again), new instance id
    server.hub = ApiHub(_snapshot(t_s=5.0))
    server.hub.publish(None, (_event(4.0, "nic_down", "nic7"),))
    server.app = server.new_app()
    server.start()
    until_blocking(lambda: src.connection().connected and src.snapshot().t_ns == 5_000_000_000)
    until_blocking(lambda: [e.target for e in src.snapshot().events] == ["nic7"])


def test_bad_token_unreachable_and_bad_url(server: Server) -> None:
    with pytest.raises(ApiTokenRefused):
        ApiSource(f"http://127.0.0.1:{server.port}", "wrong-token-123").start()
    port = server.port
    server.stop()
    with pytest.raises(ApiUnreachable):
        ApiSource(f"http://127.0.0.1:{port}", OP).start(timeout_s=10.0)
    with pytest.raises(ValueError):
        ApiSource("127.0.0.1:80", OP)


def test_cli_errors_are_one_line_with_exit_codes(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    from qpmesh.cli import main

    url = f"http://127.0.0.1:{server.port}"
    assert main(["tui", "--api", "not a url", "--token", OP]) == 2
    assert main(["tui", "--api", url]) == 2  # no token
    assert main(["tui", "--api", url, "--token", "wrong-token-123"]) == 2
    assert main(["tui"]) == 2
    server.stop()
    assert main(["tui", "--api", url, "--token", OP]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(e.startswith("qpmesh tui: error: ") for e in err), err


def test_remediation_verdict_follows_the_controllers_status() -> None:
    from tui.panes import remediation_verdict

    def ev(detail: str) -> EventDoc:
        return EventDoc(1, "remediation", "nic3", detail, "info")

    assert remediation_verdict(ev("sent: move_off_nic (a1): nic3 down"), False) == "Control ran it"
    assert remediation_verdict(ev("would have: move_off_nic (a1)"), True).startswith("advice")
    assert remediation_verdict(ev("suppressed: move_off_nic (a1)"), True).startswith("suppressed")
    assert remediation_verdict(ev("exclude from NCCL_IB_HCA"), True) == "Control ran it"
