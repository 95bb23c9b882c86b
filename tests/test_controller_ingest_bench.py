"""`qpmesh sim ingest` runs end to end on a small fabric and reports its figures."""

from __future__ import annotations

import json
import subprocess
import sys


def test_sim_ingest_json_small() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "controller.cli", "sim", "ingest", "--nics", "16",
         "--seconds", "1.5", "--step", "0.5", "--repeats", "1", "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    res = json.loads(out.stdout)
    assert res["records_per_second"] > 0 and res["decode_only_records_per_second"] > 0
    assert res["records"] > 0 and res["clock_solves"] >= 1
    assert set(res["stage_us_per_record"]) == {
        "decode", "ingest", "sync_add", "sync_solve", "delays", "detect"
    }  # fmt: skip
    assert res["speedup_vs_naive"] == round(
        res["records_per_second"] / res["naive_python_records_per_second"], 1
    )
