"""`qpmesh sim ingest` runs end to end on a small fabric and reports its figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_sim_ingest_json_small() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "qpmesh.cli", "sim", "ingest", "--nics", "16",
         "--seconds", "41", "--step", "0.5", "--repeats", "1", "--json", "--ideal"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    res = json.loads(out.stdout)
    assert res["model"]["ideal"] is True  # the delay-error bound below is the ideal model's
    assert res["records_per_second"] > 0 and res["decode_only_records_per_second"] > 0
    assert res["records"] > res["steady_records"] > 0
    # steady state (after the 10 s warm-up window) holds one solve per window: 18, 28, 38 s
    assert res["steady_clock_solves"] == 3 and res["clock_solves"] >= 5
    assert res["owd_error_ns_p50"] is not None and res["owd_error_ns_p50"] < 50
    assert set(res["stage_us_per_record"]) == {
        "decode", "merge", "ingest", "sync_add", "sync_solve", "delays", "detect"
    }  # fmt: skip
    # host batches coalesced as the service does, and the same run's per-batch baseline
    assert res["batching"] == "host" and res["merged_ingests"] > 0
    assert res["merged_records_median"] > res["batch_records_median"]
    base = res["per_host_baseline"]
    assert base["steps"] == 2 and base["records"] > 0
    assert res["speedup_vs_per_host"] == round(
        res["records_per_second"] / base["records_per_second"], 2
    )
    assert res["speedup_vs_naive"] == round(
        res["records_per_second"] / res["naive_python_records_per_second"], 1
    )


def test_host_batches_are_what_each_prober_publishes() -> None:
    import numpy as np

    from contract.records import decode_batch
    from mesh.fabric import FabricShape, build_fabric
    from testbed.sim.engine import SimConfig, Simulator
    from testbed.sim.ingest_bench import host_batches, traffic

    fab = build_fabric(FabricShape.for_nics(256))
    st = next(Simulator(fab, SimConfig(seed=1)).run(0.5, 0.5))
    payloads, order = host_batches(fab, st.batch, 7)
    got = [decode_batch(p) for p in payloads]
    assert len(got) == len(fab.hosts) and sum(len(b) for b in got) == len(st.batch)
    host_of = {n.id: n.host for n in fab.nics}
    for b in got:
        assert b.batch_seq == 7 and len(b.nic_ids) < len(fab.nics)  # its own NIC table
        assert {host_of[b.nic_ids[i]] for i in b.src} == {b.origin}
    src = np.concatenate([np.array(b.nic_ids)[b.src] for b in got])
    t1 = np.concatenate([b.t1 for b in got])
    assert (src == np.array(st.batch.nic_ids)[st.batch.src[order]]).all()
    assert (t1 == st.batch.t1[order]).all()
    small = build_fabric(FabricShape.for_nics(16))
    steps = list(traffic(small, SimConfig(seed=1), 1.0, 0.5, "host"))
    again = list(traffic(small, SimConfig(seed=1), 1.0, 0.5, "host"))
    assert len(steps) == 2 and steps[1][1] == again[1][1]  # regenerated identically per repeat


def test_replayed_traffic_moves_every_clock_on() -> None:
    import numpy as np

    from contract.records import MISSING, decode_batch
    from mesh.fabric import FabricShape, build_fabric
    from testbed.sim.engine import SimConfig, Simulator
    from testbed.sim.ingest_traffic import traffic

    fab = build_fabric(FabricShape.for_nics(16))
    cfg = SimConfig(seed=2)
    steps = list(traffic(fab, cfg, 2.0, 0.5, "host", replay_s=1.0))
    assert [t for t, _, _ in steps] == [0.5, 1.0, 1.5, 2.0]
    drift = Simulator(fab, cfg).drift
    idx = fab.nic_index
    for j in (0, 1):  # step j + 2 replays step j one second later
        a = [decode_batch(p) for p in steps[j][1]]
        b = [decode_batch(p) for p in steps[j + 2][1]]
        assert np.array_equal(steps[j][2], steps[j + 2][2], equal_nan=True)
        for x, y in zip(a, b, strict=True):
            assert y.origin == x.origin and y.batch_seq == x.batch_seq + 2
            d = drift[[idx[n] for n in x.nic_ids]]
            assert (y.t1 - x.t1 == np.rint(1e9 * (1 + d[x.src]))).all()
            arrived = x.t2 != MISSING
            assert ((y.t2 - x.t2)[arrived] == np.rint(1e9 * (1 + d[x.dst]))[arrived]).all()
            assert (y.t2[~arrived] == MISSING).all()
            coded = x.pair >= 0
            assert (y.pair[coded] != x.pair[coded]).all() and (y.pair[~coded] == -1).all()


def test_large_steps_are_simulated_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from contract.records import decode_batch
    from mesh.fabric import FabricShape, build_fabric
    from testbed.sim import ingest_traffic
    from testbed.sim.engine import SimConfig

    fab = build_fabric(FabricShape.for_nics(16))
    whole = list(ingest_traffic.traffic(fab, SimConfig(seed=1), 0.5, 0.5, "host"))
    monkeypatch.setattr(ingest_traffic, "CHUNK_RECORDS", 100)  # many chunks per step
    parts = list(ingest_traffic.traffic(fab, SimConfig(seed=1), 0.5, 0.5, "host"))
    (_, p1, _), (_, p2, t2) = whole[0], parts[0]
    b1 = [decode_batch(p) for p in p1]
    b2 = [decode_batch(p) for p in p2]
    assert [b.origin for b in b1] == [b.origin for b in b2]  # still one batch per host
    assert abs(sum(map(len, b1)) - sum(map(len, b2))) <= 2 * len(fab.nics)
    assert len(t2) == sum(map(len, b2))
    step = list(ingest_traffic.traffic(fab, SimConfig(seed=1), 0.5, 0.5, "step"))
    seqs = [decode_batch(p).batch_seq for p in step[0][1]]
    assert len(seqs) > 1 and len(set(seqs)) == len(seqs)  # chunks are distinct batches
