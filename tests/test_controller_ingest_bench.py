"""`qpmesh sim ingest` runs end to end on a small fabric and reports its figures."""

from __future__ import annotations

import json
import subprocess
import sys


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
        "decode", "ingest", "sync_add", "sync_solve", "delays", "detect"
    }  # fmt: skip
    assert res["speedup_vs_naive"] == round(
        res["records_per_second"] / res["naive_python_records_per_second"], 1
    )


def test_host_batches_are_what_each_prober_publishes() -> None:
    import numpy as np

    from contract.records import decode_batch
    from controller.fabric import FabricShape, build_fabric
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
