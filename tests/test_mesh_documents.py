"""The API's documents decode with the code beside their encoders (`mesh.documents`): a
snapshot, its delays, events and jobs go out and come back equal, a tenant's part of them
too; a malformed document is one `DocumentError` line and nothing else; and the OpenAPI
description says what the encoders write (the `Event` schema is `EventDoc.to_json` + seq)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from contract.documents import SEVERITIES, EventDoc
from contract.jsondoc import DocumentError
from controller.jobs import Job, screen_jobs
from mesh.documents import (
    clocks_doc,
    delays_doc,
    delays_from_doc,
    event_doc,
    event_from_doc,
    fabric_from_doc,
    fabric_key,
    job_doc,
    jobs_from_doc,
    links_doc,
    nic_doc,
    snapshot_doc,
    snapshot_from_doc,
)
from mesh.fabric import FabricShape, build_fabric
from mesh.snapshot import GpuHealth, Health, MeshSnapshot

OPENAPI = Path(__file__).parents[1] / "docs" / "openapi.yaml"


def _snapshot(shape: FabricShape | None = None) -> MeshSnapshot:
    fab = build_fabric(shape or FabricShape.for_nics(16, nics_per_leaf=8))
    n = len(fab.nics)
    rng = np.random.default_rng(3)
    health = [Health.UP] * n
    health[3], health[9], health[n - 1] = Health.DOWN, Health.CONTENDED, Health.UNKNOWN
    src = np.array([2, 2, 5, 11, 0], np.int32)
    dst = np.array([5, 11, 2, 2, 1], np.int32)
    owd = np.array([1500.0, 9000.0, 1400.0, 8000.0, np.nan])
    paths = {(2, 5): {"leaf0": 1500.0}, (2, 11): {"spine0": 7000.0, "spine1": 9000.0},
             (5, 2): {"leaf0": 1400.0}, (11, 2): {"spine1": 8000.0}}  # fmt: skip
    worst = rng.uniform(1e3, 1e4, (2, n))
    worst[0, 4] = worst[1, 7] = np.nan
    link = fab.links[-1].id
    return replace(
        MeshSnapshot.blank(fab, 100_000_000_000), nic_health=tuple(health),
        worst_in_ns=worst[0], worst_out_ns=worst[1], owd_src=src, owd_dst=dst, owd_ns=owd,
        path_owd=paths, clock_offset_ns=np.linspace(-100.0, 100.0, n),
        clock_uncertainty_ns=np.where(np.arange(n) == 6, np.nan, 7.0),
        link_health={link: Health.FLAPPING, fab.links[0].id: Health.UP}, flap_counts={link: 3},
        throughput_bps=2.5e11, gpu={fab.nics[2].host: GpuHealth(True, False, "Xid 79")},
    )  # fmt: skip


def _wire(doc: object) -> Any:
    """What a client reads: the document through JSON text."""
    return json.loads(json.dumps(doc))


def _same_nics(got: MeshSnapshot, want: MeshSnapshot, idx: list[int]) -> None:
    assert [n.id for n in got.fabric.nics] == [want.fabric.nics[i].id for i in idx]
    assert [(n.host, n.leaf, n.group, n.address) for n in got.fabric.nics] == [
        (n.host, n.leaf, n.group, n.address) for n in (want.fabric.nics[i] for i in idx)
    ]
    assert got.nic_health == tuple(want.nic_health[i] for i in idx)
    for key in ("worst_in_ns", "worst_out_ns", "clock_offset_ns", "clock_uncertainty_ns"):
        np.testing.assert_array_equal(getattr(got, key), getattr(want, key)[idx])


@pytest.mark.parametrize(
    "shape",
    [FabricShape.for_nics(16, nics_per_leaf=8),
     FabricShape(leaves=4, hosts_per_leaf=4, spines=2, pods=2, superspines=2)],
    ids=["two-tier", "three-tier"],
)  # fmt: skip
def test_the_fleet_snapshot_round_trips(shape: FabricShape) -> None:
    snap = _snapshot(shape)
    doc = _wire(snapshot_doc(snap, control=True, jobs=2))
    fab = fabric_from_doc(doc)
    assert fabric_key(doc) == fabric_key(_wire(snapshot_doc(snap, control=None, jobs=None)))
    assert [(s.id, s.kind) for s in fab.switches] == [(s.id, s.kind) for s in snap.fabric.switches]
    assert [(lk.id, lk.lower, lk.upper) for lk in fab.links] == [
        (lk.id, lk.lower, lk.upper) for lk in snap.fabric.links
    ]
    assert fab.groups == snap.fabric.groups
    jobs = ({"name": "j", "tenant": "t", "nics": ["nic0"]},)
    events = ((1, EventDoc(5, "link_flap", "leaf0-spine1")),)
    got = snapshot_from_doc(doc, fab, events=events, jobs=jobs)
    _same_nics(got, snap, list(range(len(snap.fabric.nics))))
    assert got.t_ns == snap.t_ns and got.events == (events[0][1],)
    assert got.link_health == snap.link_health and got.flap_counts == snap.flap_counts
    assert got.gpu == snap.gpu and got.throughput_bps == snap.throughput_bps
    assert got.control_enabled is True and got.jobs == jobs
    blank = snapshot_from_doc(_wire(snapshot_doc(replace(snap, throughput_bps=None),
                                                 control=None, jobs=None)), fab)  # fmt: skip
    assert blank.jobs is None and blank.control_enabled is None and blank.throughput_bps is None
    assert snapshot_from_doc(doc, fab).jobs == ()  # jobs counted, none read yet


def test_a_tenants_part_round_trips_with_dense_indices() -> None:
    snap = _snapshot()
    idx = [2, 5, 11]
    links = frozenset(lk.id for lk in snap.fabric.links if lk.lower in {"nic2", "nic5", "nic11"})
    doc = _wire(snapshot_doc(snap, nics=frozenset(idx), links=links, control=None, jobs=1))
    assert doc["scope"] == "tenant" and doc["nic_count"] == 3
    fab = fabric_from_doc(doc)
    got = snapshot_from_doc(doc, fab)
    _same_nics(got, snap, idx)
    assert {lk.id for lk in fab.links} == links
    dl = delays_from_doc(_wire(delays_doc(snap, nics=frozenset(idx))), fab)
    assert sorted(zip(dl.src.tolist(), dl.dst.tolist(), strict=True)) == [(0, 1), (0, 2), (1, 0),
                                                                          (2, 0)]  # fmt: skip
    assert dict(dl.paths[(0, 2)]) == {"spine0": 7000.0, "spine1": 9000.0}


def test_delays_round_trip_and_a_focus_keeps_its_row_and_column() -> None:
    snap = _snapshot()
    fab = fabric_from_doc(_wire(snapshot_doc(snap, control=None, jobs=None)))
    dl = delays_from_doc(_wire(delays_doc(snap)), fab)
    np.testing.assert_array_equal(dl.src, snap.owd_src)
    np.testing.assert_array_equal(dl.dst, snap.owd_dst)
    np.testing.assert_array_equal(dl.owd_ns, snap.owd_ns)  # NaN -> null -> NaN
    assert {k: dict(v) for k, v in dl.paths.items()} == snap.path_owd
    doc = _wire(delays_doc(snap, focus=5))
    assert doc["nic"] == "nic5"
    focused = delays_from_doc(doc, fab)
    assert sorted(zip(focused.src.tolist(), focused.dst.tolist(), strict=True)) == [(2, 5), (5, 2)]
    fewer = fabric_from_doc(_wire(snapshot_doc(snap, nics=frozenset({2, 11}), links=frozenset(),
                                               control=None, jobs=None)))  # fmt: skip
    assert len(delays_from_doc(doc, fewer).src) == 0  # NICs the fabric lost are skipped


def test_events_round_trip_and_legacy_triples_still_decode() -> None:
    ev = EventDoc(7, "contention", "leaf0->spine1", "q", "critical", (("nic0", "nic9", 49152),),
                  "leaf0-spine0")  # fmt: skip
    doc = _wire(event_doc(12, ev))
    assert list(doc) == ["seq", "t_ns", "kind", "target", "severity", "detail", "flows", "related"]
    assert doc["flows"] == [{"src": "nic0", "dst": "nic9", "sport": 49152}]
    assert event_from_doc(doc) == (12, ev)
    legacy = {**doc, "flows": [["nic0", "nic9", 49152]]}  # an older controller's MQTT payload
    assert event_from_doc(legacy) == (12, ev)
    assert EventDoc.decode(json.dumps(legacy).encode()) == ev
    with pytest.raises(DocumentError, match=r"^events\[3\]: seq: is required$"):
        event_from_doc(ev.to_json(), "events[3]")


def test_jobs_round_trip_as_the_screens_entries() -> None:
    jobs = (Job("train", "acme", (("nic0", "nic1"), ("nic4",))), Job("eval", "beta", (("nic9",),)))
    doc = _wire({"jobs": [job_doc(j.id, j.tenant, j.ranks) for j in jobs]})
    assert jobs_from_doc(doc) == screen_jobs(jobs)
    doc["jobs"][0]["ranks"].reverse()  # ranks are read in rank order
    assert jobs_from_doc(doc) == screen_jobs(jobs)


WRONG = (None, "x", 3, 2.5, True, [], {}, [1, 2], {"a": 1}, -1)
NOT_READ = (
    "scope",
    "nic_count",
    "healthy_nics",
    "unknown_nics",
    "unhealthy_nics",
    "hosts",
    "groups",
    "index",
)
"""Keys of the snapshot document the decoders do not read (derived, or the server's own)."""


def _paths(doc: Any, head: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Return the path of every value in ``doc`` (of lists, the first two elements only)."""
    if isinstance(doc, dict):
        items: list[tuple[Any, Any]] = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc[:2]))
    else:
        return []
    return [p for k, v in items for p in ((*head, k), *_paths(v, (*head, k)))]


def _with(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """Return a copy of ``doc`` with the value at ``path`` replaced (``...``: removed)."""
    bad = copy.deepcopy(doc)
    parent = bad
    for k in path[:-1]:
        parent = parent[k]
    if value is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return bad


def _retyped(v: object) -> object:
    """Return a value of another JSON type than ``v``."""
    return 3 if isinstance(v, str) else {} if isinstance(v, list) else [] if isinstance(v, dict) \
        else "x"  # fmt: skip


def _cases() -> list[tuple[str, Callable[[Any], object], Any, tuple[str, ...]]]:
    """(name, decoder, a good document, keys it does not read or reads leniently)."""
    snap = _snapshot()
    sdoc = _wire(snapshot_doc(snap, control=True, jobs=1))
    fab = fabric_from_doc(sdoc)
    ev = EventDoc(7, "contention", "leaf0->spine1", flows=(("nic0", "nic9", 1),))
    return [
        ("snapshot", lambda d: snapshot_from_doc(d, fabric_from_doc(d)), sdoc,
         (*NOT_READ, "state")),  # an unknown state reads as unknown
        ("delays", lambda d: delays_from_doc(d, fab), _wire(delays_doc(snap, focus=2)),
         ("t_ns", "nic")),
        ("event", event_from_doc, _wire(event_doc(1, ev)), ()),
        ("jobs", jobs_from_doc, _wire({"jobs": [job_doc("j", "t", (("nic0",), ("nic1",)))]}), ()),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(4), ids=["snapshot", "delays", "event", "jobs"])
def test_malformed_documents_are_one_line_document_errors_and_nothing_else(case: int) -> None:
    name, decode, doc, lenient = _cases()[case]
    for bad in WRONG:
        with pytest.raises(DocumentError):
            decode(bad)
    for path in _paths(doc):
        read = not any(k in lenient for k in path)
        old = copy.deepcopy(doc)
        for k in path:
            old = old[k]
        for value in (*WRONG, ...):  # whatever is wrong: a DocumentError or a value, no crash
            try:
                decode(_with(doc, path, value))
            except DocumentError as exc:
                assert "\n" not in str(exc) and str(exc).startswith(name), exc
        if read:  # a value of another type where a decoder reads it is refused
            with pytest.raises(DocumentError):
                decode(_with(doc, path, _retyped(old)))


def test_a_malformed_snapshot_names_the_nic_and_the_key() -> None:
    sdoc = _wire(snapshot_doc(_snapshot(), control=True, jobs=1))
    fab = fabric_from_doc(sdoc)
    with pytest.raises(DocumentError, match=r"^snapshot: nics\[0\]: worst_in_ns: must be a "):
        snapshot_from_doc({**sdoc, "nics": [{**sdoc["nics"][0], "worst_in_ns": "x"}] * 16}, fab)
    with pytest.raises(DocumentError, match="3 NICs for a fabric of 16"):
        snapshot_from_doc({**sdoc, "nics": sdoc["nics"][:3]}, fab)


# ---- the OpenAPI description says what the encoders write ----------------------------------------


def _schemas() -> dict[str, Any]:
    doc = yaml.safe_load(OPENAPI.read_text())
    schemas: dict[str, Any] = doc["components"]["schemas"]
    schemas["/events severity"] = next(
        p["schema"] for p in doc["paths"]["/api/v1/events"]["get"]["parameters"]
        if p["name"] == "severity"
    )  # fmt: skip
    return schemas


def test_the_event_schema_is_event_doc_to_json_plus_seq() -> None:
    schemas = _schemas()
    event = schemas["Event"]
    written = set(EventDoc(1, "k", "t", flows=(("a", "b", 1),)).to_json()) | {"seq"}
    assert set(event["properties"]) == written
    assert set(event["required"]) == written  # the API always writes every key
    assert tuple(event["properties"]["severity"]["enum"]) == SEVERITIES
    assert tuple(schemas["/events severity"]["enum"]) == SEVERITIES
    flow = event["properties"]["flows"]["items"]
    assert set(flow["properties"]) == set(flow["required"]) == {"src", "dst", "sport"}


def _ok_schema(path: str) -> dict[str, Any]:
    get = yaml.safe_load(OPENAPI.read_text())["paths"][path]["get"]
    schema: dict[str, Any] = get["responses"]["200"]["content"]["application/json"]["schema"]
    return schema


def test_the_other_schemas_have_the_keys_the_encoders_write() -> None:
    schemas = _schemas()
    snap = _snapshot()
    links, clocks = links_doc(snap), clocks_doc(snap)
    written: dict[str, tuple[dict[str, Any], Any]] = {
        "Snapshot": (schemas["Snapshot"], snapshot_doc(snap, control=None, jobs=None)),
        "Nic": (schemas["Nic"], nic_doc(snap, 2)),
        "Link": (schemas["Link"], links["links"][0]),  # type: ignore[index]
        "Delays": (schemas["Delays"], delays_doc(snap)),
        "Job": (schemas["Job"], {**job_doc("j", "t", (("nic0",),)), "perf": None}),
        "/links": (_ok_schema("/api/v1/links"), links),
        "/clocks": (_ok_schema("/api/v1/clocks"), clocks),
        "/clocks row": (
            _ok_schema("/api/v1/clocks")["properties"]["clocks"]["items"],
            clocks["clocks"][0],  # type: ignore[index]
        ),
    }
    for name, (schema, doc) in written.items():
        assert set(schema["properties"]) == set(doc), name
        assert set(schema["required"]) <= set(doc), name
    assert set(schemas["State"]["enum"]) == {str(h) for h in Health}
