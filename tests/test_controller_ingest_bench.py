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
