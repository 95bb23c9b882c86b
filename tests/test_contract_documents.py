"""The JSON documents of the contract read exactly what the producers write: a prober's
presence, health and discovered paths, and the controller's events (round trips through the
real producers), and a malformed document is one `DocumentError` line."""

from __future__ import annotations

import json

import pytest

from contract.documents import EventDoc, HealthDoc, PathsDoc, PresenceDoc
from contract.jsondoc import DocumentError
from prober.agent import health_doc
from prober.pathdisc import DiscoveredPath, PathKey
from prober.pathsweep import paths_payload
from prober.publish import presence_payload
from prober.telemetry.gpu import GpuReading


def test_presence_round_trip_from_the_prober() -> None:
    rdma = {"nic0": {"qpn": 17, "gid": "fe80::1", "qkey": 0x11111111, "port": 1}}
    doc = PresenceDoc.decode(presence_payload(True, 123, rdma))
    assert doc.alive and doc.t_ns == 123 and doc.rdma is not None
    assert dict(doc.rdma["nic0"]) == rdma["nic0"]
    assert PresenceDoc.decode(doc.encode()) == doc
    gone = PresenceDoc.decode(presence_payload(False, 5, rdma))  # a stopped prober: no QPs
    assert not gone.alive and gone.rdma is None
    assert not PresenceDoc.decode(b"").alive  # a cleared retained message


def test_health_round_trip_from_the_prober() -> None:
    payload = json.dumps(
        health_doc("h1", 9, GpuReading(False, reason="no GPU"), None, {"nic0": {"up": 1}}, {"x": 2})
    ).encode()
    doc = HealthDoc.decode(payload)
    assert (doc.host, doc.t_ns, doc.gpu_present) == ("h1", 9, False)
    assert dict(doc.nics) == {"nic0": {"up": 1}} and dict(doc.counters) == {"x": 2}
    assert HealthDoc.decode(doc.encode()) == doc
    assert dict(HealthDoc().gpu) == {}  # defaults are per instance, frozen
    assert doc.send_slip_ns == 0  # on time (and what an older prober's document means)
    late = HealthDoc(host="h1", send_slip_ns=2_500_000_000)
    assert HealthDoc.decode(late.encode()).send_slip_ns == 2_500_000_000


def test_paths_and_events_round_trip() -> None:
    path = DiscoveredPath(PathKey("nic0", "nic3", 49152), ("10.0.0.1", None), True, 7)
    doc = PathsDoc.decode(paths_payload([path]))
    (tp,) = doc.paths
    assert (tp.src, tp.dst, tp.sport, tp.hops, tp.reached) == ("nic0", "nic3", 49152,
                                                               ("10.0.0.1", None), True)  # fmt: skip
    assert PathsDoc.decode(doc.encode()) == doc
    ev = EventDoc(5, "link_flap", "leaf0-spine1", "down 1.0 s", "critical", (("a", "b", 7),))
    got = EventDoc.decode(ev.encode())
    assert (got.t_ns, got.kind, got.target, got.severity, got.flows, got.related) == (
        5, "link_flap", "leaf0-spine1", "critical", (("a", "b", 7),), "")  # fmt: skip
    moved = EventDoc(6, "contention", "leaf0->spine0", "q", related="leaf0-spine1")
    got = EventDoc.decode(moved.encode())
    assert got.related == "leaf0-spine1" and EventDoc.decode(got.encode()) == got
    assert EventDoc.decode(b'{"t_ns": 1, "kind": "k", "target": "x"}').related == ""  # older


def test_an_event_has_one_json_form_and_older_flow_triples_still_decode() -> None:
    ev = EventDoc(5, "contention", "leaf0->spine1", "q", "critical", (("a", "b", 7),), "x")
    want = {"t_ns": 5, "kind": "contention", "target": "leaf0->spine1", "severity": "critical",
            "detail": "q", "flows": [{"src": "a", "dst": "b", "sport": 7}], "related": "x"}  # fmt: skip
    assert ev.to_json() == want and json.loads(ev.encode()) == want  # MQTT carries to_json
    assert EventDoc.from_json(want) == ev == EventDoc.from_json({**want, "seq": 3, "msg": "e"})
    legacy = {**want, "flows": [["a", "b", 7]]}  # what older controllers published
    assert EventDoc.from_json(legacy) == ev == EventDoc.decode(json.dumps(legacy).encode())


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ([1], "must be a JSON object, got list"),
        ({"kind": "k", "target": "x"}, "t_ns: is required"),
        ({"t_ns": 1, "kind": "k", "target": ""}, "target: must be a non-empty string"),
        ({"t_ns": 1, "kind": "k", "target": "x", "flows": [["a", "b"]]}, r"flows\[0\]: must be"),
        ({"t_ns": 1, "kind": "k", "target": "x", "flows": [{"src": "a", "dst": "b"}]},
         r"flows\[0\]: sport: is required"),
        ({"t_ns": 1, "kind": "k", "target": "x", "flows": [["a", "b", "7"]]}, r"flows\[0\]"),
    ],
)  # fmt: skip
def test_from_json_names_what_it_read_in_one_line(obj: object, reason: str) -> None:
    with pytest.raises(DocumentError, match=rf"^events\[2\]: {reason}") as err:
        EventDoc.from_json(obj, "events[2]")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("decode", "payload", "where"),
    [
        (PresenceDoc.decode, b'{"alive": "yes"}', "presence"),
        (PresenceDoc.decode, b"[1]", "presence"),
        (HealthDoc.decode, b'{"gpu_ok": 1}', "health"),
        (HealthDoc.decode, b"not json", "health"),
        (HealthDoc.decode, b'{"send_slip_ns": -1}', "health"),
        (PathsDoc.decode, b'[{"src": "a", "dst": "b", "sport": 70000, "hops": []}]', r"paths\[0\]"),
        (PathsDoc.decode, b'{"src": "a"}', "paths"),
        (EventDoc.decode, b'{"t_ns": 1, "kind": "", "target": "x"}', "event"),
        (EventDoc.decode, b'{"t_ns": 1, "kind": "k", "target": "x", "severity": "bad"}', "event"),
        (EventDoc.decode, b'{"t_ns": 1, "kind": "k", "target": "x", "related": 3}', "event"),
    ],
)
def test_malformed_documents_are_one_line_errors(
    decode: object, payload: bytes, where: str
) -> None:
    with pytest.raises(DocumentError, match=where) as err:
        decode(payload)  # type: ignore[operator]
    assert "\n" not in str(err.value)
