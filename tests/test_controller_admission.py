"""The live controller's one admission door: a batch in (a payload and its topic's host, or
decoded), a frozen verdict out; bad input is a verdict, a bug raises."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from contract.jsondoc import DocumentError
from contract.origin import split_by_host
from contract.records import _HEADER, MAGIC, VERSION, ProbeBatch, encode_batch
from contract.topics import Topics
from controller.admission import (
    FUTURE_SLACK_MS,
    REPLAY_SLACK,
    Admission,
    Outcome,
    Verdict,
    nic_hosts,
)
from controller.brain import Brain
from controller.brainlike import TeeBrain
from controller.coalesce import ProbeQueue
from controller.dispatch import handle_message, outcome
from controller.live import LiveController
from controller.observations import Observations
from controller.pathmap import PathDocError, path_rows
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator

FAB = build_fabric(FabricShape.for_nics(16))
PFAB = build_fabric(FabricShape(leaves=2, hosts_per_leaf=4, spines=2))  # nic4 on leaf1
T = Topics()
ROUTERS = {"10.0.0.254": "leaf0", "172.16.0.9": "spine1", "10.0.1.254": "leaf1"}


def _host0(seq: int = 1000) -> ProbeBatch:
    """host0's part of one simulated step, as its prober publishes it."""
    full = Simulator(FAB, SimConfig(peers=4)).step(0.0, 0.5).batch
    return dataclasses.replace(split_by_host(full, nic_hosts(FAB))["host0"], batch_seq=seq)


def _nested_meta() -> bytes:
    """A batch header whose NIC table is JSON nested far deeper than the decoder recurses."""
    meta = b"[" * 200_000
    return _HEADER.pack(MAGIC, VERSION, 4791, 0, 1, len(meta)) + meta


def test_each_outcome_through_the_door_and_its_service_label() -> None:
    live = LiveController(FAB)
    b = _host0()
    payload = encode_batch(b)
    cases = [
        (payload, "host0", Verdict(Outcome.ACCEPTED, records=len(b)), "probes"),
        (payload, "host0", Verdict(Outcome.DUPLICATE), "duplicate"),
        (
            payload,
            "host1",
            Verdict(Outcome.UNTRUSTED, "untrusted: batch origin 'host0' published on the "
                    "topic of 'host1'"),
            "bad:untrusted: batch origin 'host0' published on the topic of 'host1'",
        ),
        (payload[:-3], "host0", None, "bad:length "),
        (_nested_meta(), "host0", None, "bad:bad batch metadata: nested too deeply"),
    ]  # fmt: skip
    for data, host, want, label in cases:
        got = live.admit(data, EPOCH_NS, host=host)
        if want is not None:
            assert got == want
        else:
            assert got.outcome is Outcome.MALFORMED and got.records == 0
        assert outcome(got).startswith(label)
    newer = encode_batch(dataclasses.replace(b, batch_seq=1000 + REPLAY_SLACK + 1))
    assert live.admit(newer, EPOCH_NS, host="host0").accepted
    replayed = live.admit(payload, EPOCH_NS, host="host0")
    assert replayed == Verdict(Outcome.REPLAYED, "replayed batch 1000 from host0")
    assert outcome(replayed) == "bad:replayed batch 1000 from host0"
    assert live.records == 2 * len(b)
    assert live.verdicts() == {
        Outcome.ACCEPTED: 2, Outcome.DUPLICATE: 1, Outcome.REPLAYED: 1, Outcome.UNTRUSTED: 1,
        Outcome.MALFORMED: 2,
    }  # fmt: skip
    # handle_message gives the same strings the service counted before the door
    again = dataclasses.replace(b, batch_seq=1000 + REPLAY_SLACK + 2)
    assert handle_message(live, T, T.probes("host0"), encode_batch(again), EPOCH_NS) == "probes"
    assert handle_message(live, T, T.probes("host0"), _nested_meta(), EPOCH_NS).startswith("bad:")


def test_a_decoded_batch_from_a_trusted_source_skips_the_origin_check_only() -> None:
    live = LiveController(FAB)
    b = dataclasses.replace(_host0(), origin="sim")  # not a host: no topic, no origin check
    assert live.admit(b, EPOCH_NS) == Verdict(Outcome.ACCEPTED, records=len(b))
    assert live.admit(b, EPOCH_NS).outcome is Outcome.DUPLICATE


def test_an_accepted_batch_without_known_records_is_probes_not_a_duplicate() -> None:
    live = LiveController(FAB)
    empty = dataclasses.replace(ProbeBatch.empty("host0", "hw"), batch_seq=5)
    assert live.admit(empty, EPOCH_NS) == Verdict(Outcome.ACCEPTED, records=0)
    payload = encode_batch(dataclasses.replace(empty, batch_seq=6))
    assert handle_message(live, T, T.probes("host0"), payload, EPOCH_NS) == "probes"


def test_queued_verdict_then_flush_ingests_what_was_accepted() -> None:
    live = LiveController(FAB)
    queue = ProbeQueue()
    b = _host0()
    v = live.admit(encode_batch(b), EPOCH_NS, host="host0", queue=queue)
    assert v == Verdict(Outcome.ACCEPTED, records=len(b))
    assert live.admit(encode_batch(b), EPOCH_NS, host="host0", queue=queue) == Verdict(
        Outcome.DUPLICATE
    )
    assert len(queue) == 1 and live.records == 0
    assert live.flush(queue, EPOCH_NS) == len(b) == live.records


def test_verdicts_are_frozen_and_consistent() -> None:
    v = Verdict(Outcome.ACCEPTED, records=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.records = 4  # type: ignore[misc]
    for bad in (
        lambda: Verdict(Outcome.MALFORMED),  # a refusal says why
        lambda: Verdict(Outcome.ACCEPTED, "why"),
        lambda: Verdict(Outcome.DUPLICATE, records=1),
        lambda: Verdict(Outcome.UNTRUSTED, "two\nlines"),
        lambda: Verdict(Outcome.DUPLICATE, "why"),
        lambda: Verdict(Outcome.ACCEPTED, records=-1),
    ):
        with pytest.raises(ValueError):
            bad()


def test_a_bug_behind_the_door_raises_instead_of_counting_as_bad_input() -> None:
    def broken(obs: Observations) -> None:
        raise ValueError("a bug, not bad input")

    live = LiveController(FAB, brain=TeeBrain(Brain(FAB), broken))
    with pytest.raises(ValueError, match="a bug"):
        handle_message(live, T, T.probes("host0"), encode_batch(_host0()), EPOCH_NS)


def test_duplicates_are_remembered_in_a_bounded_window_per_origin() -> None:
    adm = Admission(FAB, dedup_depth=8)
    for seq in (100, 102, 101, 107):  # in and out of order
        assert not adm.is_duplicate("h", seq)
    assert all(adm.is_duplicate("h", seq) for seq in (100, 101, 102, 107))
    assert not adm.is_duplicate("h", 103)  # a gap below the highest is still new
    assert adm.is_duplicate("h", 103)
    assert not adm.is_duplicate("other", 100)  # per origin
    assert not adm.is_duplicate("h", 120)  # the window slides: 100-112 are forgotten ...
    assert not adm.is_duplicate("h", 107)  # ... and taken as new (is_replay refuses them)
    assert adm.is_duplicate("h", 120)
    # the state per origin is two ints, whatever the depth and the traffic
    big = Admission(FAB)
    for seq in range(100_000):
        big.is_duplicate("h", seq)
    assert big.is_duplicate("h", 99_999 - 4095) and not big.is_duplicate("h", 99_999 - 4096)
    top, mask = big._seen["h"]
    assert top == 99_999 and mask.bit_length() <= 4096
    # a hostile jump (a batch_seq near 2^64) starts a fresh window at once, no 2^64-bit shift
    assert not big.is_duplicate("h", (1 << 64) - 1)
    top, mask = big._seen["h"]
    assert (top, mask) == ((1 << 64) - 1, 1)
    assert big.is_duplicate("h", (1 << 64) - 1) and not big.is_duplicate("h", (1 << 64) - 2)


def test_a_batch_seq_from_the_future_is_malformed_and_locks_nobody_out() -> None:
    """A prober numbers its batches from its start time in ms: one far ahead of the clock is
    corrupt or forged, refused, and the origin's real batches are still taken after it."""
    adm = Admission(FAB)
    now = EPOCH_NS
    ahead = dataclasses.replace(_host0(), batch_seq=now // 1_000_000 + FUTURE_SLACK_MS + 1)
    verdict, taken = adm.judge(encode_batch(ahead), "host0", now)
    assert verdict.outcome is Outcome.MALFORMED and taken is None
    assert "ahead of the clock" in verdict.reason
    assert adm.judge(encode_batch(_host0(1000)), "host0", now)[0].accepted
    start_ms = dataclasses.replace(_host0(), batch_seq=now // 1_000_000)  # a restarted prober
    assert adm.judge(encode_batch(start_ms), "host0", now)[0].accepted


def test_paths_documents_bad_as_a_whole_or_in_an_entry() -> None:
    live = LiveController(PFAB)
    good = {"src": "nic0", "dst": "nic4", "reached": True,
            "hops": ["10.0.0.254", "172.16.0.9", "10.0.1.254"]}  # fmt: skip
    # a port that is no port is left out like any entry of the wrong type; 10**30 used to
    # overflow the int64 columns and end the service
    for sport in (10**30, -5, 70_000, True, "1"):
        doc = json.dumps([{**good, "sport": sport}]).encode()
        assert handle_message(live, T, T.paths("host0"), doc, EPOCH_NS, ROUTERS) == "paths"
    assert len(path_rows(PFAB, ROUTERS, [{**good, "sport": 10**30}], live.max_hops).src) == 0
    assert len(path_rows(PFAB, ROUTERS, [{**good, "sport": 50000}], live.max_hops).src) == 1
    for doc, why in (({}, "payload must be a JSON list"), ([1], "entries must be objects")):
        with pytest.raises(PathDocError, match=why):
            path_rows(PFAB, ROUTERS, doc, live.max_hops)
        out = handle_message(live, T, T.paths("host0"), json.dumps(doc).encode(), 0, ROUTERS)
        assert out == f"bad:paths {why}"
    assert issubclass(PathDocError, DocumentError)
    src, dst, sport = np.array([0]), np.array([4]), np.array([50000])
    assert not (live.paths(src, dst, sport)[0] == -1).all()  # the model's path, read-only
