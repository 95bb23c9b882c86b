"""The controller trusts no origin blindly: real payloads through `handle_message`."""

from __future__ import annotations

import json
from dataclasses import replace

from contract.documents import HealthDoc, PresenceDoc
from contract.origin import batch_origin_error, split_by_host
from contract.records import ProbeBatch, concat_batches, encode_batch
from contract.topics import Topics
from controller.dispatch import handle_message, nic_hosts
from controller.live import LiveController
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator

T = Topics()


def _setup() -> tuple[LiveController, dict[str, ProbeBatch]]:
    fab = build_fabric(FabricShape.for_nics(16))
    live = LiveController(fab)
    st = Simulator(fab, SimConfig(peers=4)).step(0.0, 0.5)
    return live, dict(split_by_host(st.batch, nic_hosts(fab)))


def test_each_hosts_own_batch_is_accepted() -> None:
    live, by_host = _setup()
    assert len(by_host) == len(live.fabric.hosts)
    for host, batch in by_host.items():
        out = handle_message(live, T, T.probes(host), encode_batch(batch), EPOCH_NS)
        assert out == "probes"
    assert live.records == sum(len(b) for b in by_host.values())


def test_batch_published_as_another_host_is_dropped() -> None:
    live, by_host = _setup()
    b1 = by_host["host1"]
    # host0's credentials, host1's batch unchanged: origin does not match the topic
    out = handle_message(live, T, T.probes("host0"), encode_batch(b1), EPOCH_NS)
    assert out == "bad:untrusted: batch origin 'host1' published on the topic of 'host0'"
    # ... and relabelled as host0's: its probing NICs are still host1's
    forged = replace(b1, origin="host0")
    out = handle_message(live, T, T.probes("host0"), encode_batch(forged), EPOCH_NS)
    nic = live.fabric.nics_of_host("host1")[0].id
    assert out == f"bad:untrusted: NIC {nic!r} is a NIC of 'host1', not of 'host0'"
    assert live.records == 0 and live.ingest_stats().batches == 0


def test_batch_mixing_own_and_foreign_nics_is_dropped_whole() -> None:
    live, by_host = _setup()
    b0, b1 = by_host["host0"], by_host["host1"]
    mixed = replace(concat_batches([b0, replace(b1, origin="host0")]), origin="host0")
    out = handle_message(live, T, T.probes("host0"), encode_batch(mixed), EPOCH_NS)
    assert out.startswith("bad:untrusted: NIC ") and "a NIC of 'host1'" in out
    assert live.records == 0
    # the genuine batch still goes through afterwards (nothing accepted is lost)
    assert handle_message(live, T, T.probes("host0"), encode_batch(b0), EPOCH_NS) == "probes"


def test_unknown_nics_and_hosts() -> None:
    live, by_host = _setup()
    b0 = by_host["host0"]
    renamed = replace(b0, nic_ids=tuple(f"x{n}" for n in b0.nic_ids))
    assert batch_origin_error(renamed, "host0", nic_hosts(live.fabric)) == (
        "untrusted: NIC 'xnic0' is not a NIC of the fabric, not of 'host0'"
    )
    ghost = replace(b0, origin="ghost")
    out = handle_message(live, T, T.probes("ghost"), encode_batch(ghost), EPOCH_NS)
    assert out.startswith("bad:untrusted: NIC 'nic0' is a NIC of 'host0', not of 'ghost'")
    alive = PresenceDoc(True, 1).encode()
    assert handle_message(live, T, T.presence("ghost"), alive, EPOCH_NS) == (
        "bad:untrusted: host 'ghost' is not in the fabric"
    )
    assert "ghost" not in live.alive


def test_presence_naming_another_hosts_queue_pairs_is_dropped() -> None:
    live, _ = _setup()
    mine = live.fabric.nics_of_host("host0")[0].id
    theirs = live.fabric.nics_of_host("host2")[0].id
    qp = {"qpn": 17, "gid": "::1", "qkey": 1, "port": 1}
    ok = PresenceDoc(True, 5, {mine: qp}).encode()
    assert handle_message(live, T, T.presence("host0"), ok, EPOCH_NS) == "presence"
    forged = PresenceDoc(True, 6, {mine: qp, theirs: qp}).encode()
    out = handle_message(live, T, T.presence("host0"), forged, EPOCH_NS)
    assert out == f"bad:untrusted: NIC {theirs!r} is a NIC of 'host2', not of 'host0'"
    assert handle_message(live, T, T.presence("host0"), b'{"alive": "x"}', 1).startswith("bad:")
    will = handle_message(live, T, T.presence("host0"), b"", EPOCH_NS)  # cleared retained
    assert will == "presence" and live.alive["host0"] is False


def test_health_of_another_host_is_dropped() -> None:
    live, _ = _setup()
    theirs = live.fabric.nics_of_host("host3")[0].id
    bad_gpu = HealthDoc(gpu_ok=False, detail="xid 79", host="host3").encode()
    out = handle_message(live, T, T.health("host0"), bad_gpu, EPOCH_NS)
    assert out == "bad:untrusted: health of 'host3' published on the topic of 'host0'"
    doc = json.loads(HealthDoc(host="host0").encode())
    doc["nics"] = {theirs: {"device": "eth0"}}
    out = handle_message(live, T, T.health("host0"), json.dumps(doc).encode(), EPOCH_NS)
    assert out == f"bad:untrusted: NIC {theirs!r} is a NIC of 'host3', not of 'host0'"
    assert "host0" not in live.gpu_state and "host3" not in live.gpu_state
    own = HealthDoc(gpu_ok=False, gpu_present=True, detail="xid 79", host="host3").encode()
    assert handle_message(live, T, T.health("host3"), own, EPOCH_NS) == "health"
    assert live.gpu_state["host3"].ok is False and live.gpu_state["host3"].detail == "xid 79"
