"""Replay protection: an old probe batch published again is dropped, counted and reported."""

from __future__ import annotations

import dataclasses

import numpy as np

from contract.records import encode_batch
from contract.topics import Topics
from controller.admission import REPLAY_SLACK, Outcome
from controller.dispatch import handle_message
from controller.live import LiveController
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator


def test_old_batch_replayed_is_dropped_recent_redelivery_is_a_duplicate() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    live = LiveController(fab)
    t = Topics()
    sim = Simulator(fab, SimConfig(peers=4))
    full = sim.step(0.0, 0.5).batch
    # a batch as host0's prober publishes it: its origin and only its NICs as sources
    origin = "host0"
    mine = {n.id for n in fab.nics if n.host == origin}
    keep = np.array([full.nic_ids[i] in mine for i in full.src])
    cols = {f.name: getattr(full, f.name)[keep] for f in dataclasses.fields(full)
            if isinstance(getattr(full, f.name), np.ndarray)}  # fmt: skip
    base = dataclasses.replace(full, origin=origin, **cols)
    assert len(base) > 0
    payloads = {
        seq: encode_batch(dataclasses.replace(base, batch_seq=seq))
        for seq in (1000, 1001, 1000 + REPLAY_SLACK + 1, 1000 + REPLAY_SLACK + 2)
    }
    topic = t.probes(origin)
    assert handle_message(live, t, topic, payloads[1000], EPOCH_NS) == "probes"
    assert handle_message(live, t, topic, payloads[1001], EPOCH_NS) == "probes"
    assert handle_message(live, t, topic, payloads[1000], EPOCH_NS) == "duplicate"  # QoS 1 again
    top = 1000 + REPLAY_SLACK + 1
    assert handle_message(live, t, topic, payloads[top], EPOCH_NS) == "probes"
    records = live.records
    # now batch 1000 lies more than REPLAY_SLACK below the newest: a replay, not a redelivery
    out = handle_message(live, t, topic, payloads[1000], EPOCH_NS)
    assert out == f"bad:replayed batch 1000 from {origin}"
    assert live.verdicts()[Outcome.REPLAYED] == 1 and live.records == records
    assert handle_message(live, t, topic, payloads[top + 1], EPOCH_NS) == "probes"
