"""A job's slowdown attributed to the fabric: the pure attribution (table), the agent's step
meter, the perf report document, and the controller runtime and API that serve the answer."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from contract.documents import EventDoc
from contract.remediation import DocumentError, PerfDoc, parse_perf_topic, perf_topic
from controller.api.app import PREFIX, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.attribution import AttributionConfig, JobPerf, attribute, ring_pairs
from controller.jobs import Job
from controller.live import LiveController
from controller.remediation.runtime import RemediationRuntime
from mesh.fabric import FabricShape, build_fabric
from recovery.perf import StepMeter

S = 1_000_000_000
# four ranks, one NIC each: the ring is nic0 -> nic4 -> nic8 -> nic12 -> nic0
JOB = Job("train", "acme", (("nic0",), ("nic4",), ("nic8",), ("nic12",)))


def _perf(*step_s: float, base: float = 1.0, timeouts: int = 0, seen: int = 0) -> JobPerf:
    ranks = {
        k: PerfDoc("train", k, 1, 10, s, timeouts if k == 0 else 0) for k, s in enumerate(step_s)
    }
    return JobPerf(ranks, base, seen)


def ev(
    t_s: float, kind: str, target: str, flows: tuple[tuple[str, str, int], ...] = ()
) -> EventDoc:
    return EventDoc(round(t_s * S), kind, target, flows=flows)


NOW = 100 * S
CASES: list[tuple[str, JobPerf, list[EventDoc], str | None, str]] = [
    ("fast job: nothing to say", _perf(1.1, 1.0, 1.0, 1.0), [ev(99, "contention", "leaf0->spine1")], None, ""),
    ("ring crosses contention", _perf(3.0, 1.0, 1.0, 1.0),
     [ev(95, "contention", "leaf1->spine0", (("nic4", "nic8", 4791), ("nic1", "nic9", 5000)))],
     "fabric", "step time 3.0x; its ring crosses contended link leaf1->spine0 on queue pairs nic4->nic8"),
    ("ring pairs beat other job pairs", _perf(2.0, 1.0),
     [ev(96, "contention", "leaf0->spine1", (("nic0", "nic8", 1),)),
      ev(97, "contention", "leaf2->spine1", (("nic12", "nic8", 2),))],
     "fabric", "step time 2.0x; its ring crosses contended link leaf2->spine1 on queue pairs nic12->nic8"),
    ("a non-ring pair of the job", _perf(2.0, 1.0),
     [ev(96, "contention", "leaf0->spine1", (("nic0", "nic8", 1),))],
     "fabric", "step time 2.0x; its traffic crosses contended link leaf0->spine1 on queue pairs nic0->nic8"),
    ("contention on a job NIC's own link", _perf(2.0, 1.0),
     [ev(96, "contention", "leaf1->nic4")], "fabric",
     "step time 2.0x; its traffic crosses contended link leaf1->nic4"),
    ("a flapping NIC link comes first", _perf(2.5, 1.0),
     [ev(90, "contention", "leaf1->spine0", (("nic4", "nic8", 1),)), ev(91, "link_flap", "nic8-leaf2")],
     "fabric", "step time 2.5x; rank 2's nic8 link nic8-leaf2 is flapping"),
    ("a NIC that came back no longer explains it", _perf(2.5, 1.0),
     [ev(90, "nic_down", "nic8"), ev(92, "clear", "nic8")], "unknown",
     "step time 2.5x; no fabric finding on its NICs or their paths (look at the hosts)"),
    ("old findings are ignored", _perf(2.0, 1.0),
     [ev(-30, "contention", "leaf1->spine0", (("nic4", "nic8", 1),))], "unknown",
     "step time 2.0x; no fabric finding on its NICs or their paths (look at the hosts)"),
    ("other jobs' contention is not ours", _perf(2.0, 1.0),
     [ev(99, "contention", "leaf0->spine0", (("nic1", "nic5", 1),))], "unknown",
     "step time 2.0x; no fabric finding on its NICs or their paths (look at the hosts)"),
    ("new timeouts without a slower median", _perf(1.0, 1.0, timeouts=2),
     [ev(99, "nic_down", "nic0")], "fabric",
     "step time 1.0x, 2 collective timeouts; rank 0's nic0 NIC is down"),
    ("timeouts already explained", _perf(1.0, 1.0, timeouts=2, seen=2), [], None, ""),
]  # fmt: skip


@pytest.mark.parametrize("name,perf,findings,cause,text", CASES, ids=[c[0] for c in CASES])
def test_attribution_table(
    name: str, perf: JobPerf, findings: list[EventDoc], cause: str | None, text: str
) -> None:
    a = attribute(JOB, perf, findings, NOW, AttributionConfig(window_ns=60 * S))
    if cause is None:
        assert a is None
        return
    assert a is not None and (a.cause, a.text) == (cause, text)
    assert a.to_dict()["slowdown"] == round(perf.step_s / perf.baseline_s, 2)  # type: ignore[operator]


def test_ring_and_job_perf() -> None:
    assert ("nic12", "nic0") in ring_pairs(JOB) and ("nic0", "nic8") not in ring_pairs(JOB)
    assert ring_pairs(Job("one", "t", (("nic0", "nic1"),))) == set()
    p = JobPerf()
    p = p.with_report(PerfDoc("train", 0, 1, 10, 1.0), 2)
    assert p.baseline_s is None  # one rank of two: not the job's pace yet
    p = p.with_report(PerfDoc("train", 1, 1, 10, 1.2), 2)
    assert p.step_s == 1.2 and p.baseline_s == 1.2  # the slowest rank sets the pace
    p = p.with_report(PerfDoc("train", 1, 2, 20, 3.0, timeouts=1), 2)
    assert p.step_s == 3.0 and p.baseline_s == 1.2 and p.timeouts == 1  # baseline never rises


def test_step_meter_reports_median_every_n_steps_and_at_once_after_a_timeout() -> None:
    m = StepMeter("train", 1, window=5, every_steps=3)
    m.step(0)
    assert m.report(0) is None
    for t_s in (1, 2, 3):
        m.step(t_s * S)
    r = m.report(3 * S, "nic4")
    assert r is not None and (r.steps, r.step_s, r.nic, r.window) == (3, 1.0, "nic4", 3)
    assert m.report(3 * S) is None  # nothing new
    m.step(13 * S)  # one slow step (a re-form): the median barely moves
    m.timed_out()
    r = m.report(13 * S)
    assert r is not None and r.timeouts == 1 and r.step_s == 1.0
    for t_s in (20, 27, 34):
        m.step(t_s * S)
    r = m.report(34 * S)
    assert r is not None and r.step_s == 7.0  # window of 5: 1, 1, 10, 7, 7 -> 7
    with pytest.raises(ValueError):
        StepMeter("x", 0, window=0)


def test_perf_doc_and_topic() -> None:
    d = PerfDoc("train", 2, 5, 40, 0.25, 3, "nic8", 20)
    assert PerfDoc.decode(d.encode()) == d
    assert perf_topic("p", "train", 2) == "p/jobs/train/rank2/perf"
    assert parse_perf_topic("p", "p/jobs/train/rank2/perf") == ("train", 2)
    assert parse_perf_topic("p", "p/jobs/train/rank2") is None
    for bad in (b'{"job": "t", "rank": 0, "t_ns": 1, "steps": 1, "step_s": 0}',
                b'{"job": "t", "rank": -1, "t_ns": 1, "steps": 1, "step_s": 1}',
                b'{"job": "t", "rank": 0, "t_ns": 1, "steps": 1}', b"[]"):  # fmt: skip
        with pytest.raises(DocumentError):
            PerfDoc.decode(bad)


TOK = "perf-operator-token"


async def test_runtime_attributes_and_the_jobs_route_says_so() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    rt = RemediationRuntime(prefix="p")
    rt.jobs.register(JOB)
    rep = {k: PerfDoc("train", k, 1, 10, 0.1) for k in range(4)}
    for k, d in rep.items():
        assert rt.handle(perf_topic("p", "train", k), d.encode()) == ("perf", None)
    assert rt.job_events(1 * S) == []  # at its baseline: nothing to say
    assert rt.handle(perf_topic("p", "ghost", 0), PerfDoc("ghost", 0, 1, 1, 1.0).encode()) == (
        "perf_unknown_job", None
    )  # fmt: skip
    assert rt.handle(perf_topic("p", "train", 1), rep[0].encode())[0].startswith("bad:")  # type: ignore[index]
    rt.handle(perf_topic("p", "train", 2), PerfDoc("train", 2, 2, 20, 0.3).encode())
    rt.observe([EventDoc(2 * S, "contention", "leaf1->spine0", flows=(("nic4", "nic8", 7),))])
    (e,) = rt.job_events(3 * S)
    assert (e.kind, e.target) == ("job_slowdown", "leaf1->spine0")
    assert e.detail == ("job train: step time 3.0x; its ring crosses contended link "
                        "leaf1->spine0 on queue pairs nic4->nic8")  # fmt: skip
    rt.observe([EventDoc(4 * S, "contention", "leaf1->spine0", flows=(("nic4", "nic8", 7),))])
    assert rt.job_events(5 * S) == []  # the same explanation is not repeated
    app = make_app(ApiHub(LiveController(fab).snapshot()),
                   TokenTable({TOK: Principal("operator", "ops")}), jobs=rt.jobs,
                   job_status=rt.job_status)  # fmt: skip
    async with TestClient(TestServer(app)) as c:
        r = await c.get(PREFIX + "/jobs", headers={"Authorization": f"Bearer {TOK}"})
        (job,) = (await r.json())["jobs"]
    perf: dict[str, Any] = job["perf"]
    assert (
        perf["cause"] == "fabric" and perf["slowdown"] == 3.0 and perf["links"] == ["leaf1->spine0"]
    )
    assert perf["flows"] == [{"src": "nic4", "dst": "nic8", "sport": 7}]
    assert "its ring crosses contended link leaf1->spine0" in perf["text"]


def test_a_tenant_sees_findings_on_the_hops_of_its_paths() -> None:
    from controller.api.views import tenant_scope

    fab = build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, spines=2))
    scope = tenant_scope(fab, ["nic0", "nic2"])  # two leaves: their uplinks are in scope
    assert scope.target_visible(fab, "leaf0->spine1") and scope.target_visible(fab, "spine1->leaf1")
    assert scope.target_visible(fab, "leaf0->nic0") and not scope.target_visible(fab, "leaf0->nic1")
    alone = tenant_scope(fab, ["nic0"])
    assert not alone.target_visible(fab, "leaf0->spine1")
