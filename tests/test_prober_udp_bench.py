"""The prober benchmark runs briefly and reports its figures against a same-run baseline."""

from __future__ import annotations

import json

import pytest

from prober.bench import measure, measure_round_trips, run_bench
from prober.benchprofile import _name, profile_round_trips


def test_run_bench_prints_json_with_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_bench(0.6, json=True, repeats=1)
    printed = json.loads(capsys.readouterr().out)
    assert printed == result
    pps = result["probes_per_second"]
    base = result["baseline_probes_per_second"]
    assert isinstance(pps, int) and isinstance(base, int) and pps > 0 and base > 0
    assert result["timestamp_overhead_ratio"] == pytest.approx(base / pps, rel=1e-2)
    assert isinstance(result["session_probes_per_second"], int)
    assert result["session_probes_per_second"] > 0
    assert isinstance(result["endpoint_probes_per_second"], int)
    assert result["endpoint_probes_per_second"] > 0
    # full round trips per CPU second, batched path and per-datagram baseline in the same run
    batched = result["round_trips_per_core_second"]
    baseline = result["baseline_round_trips_per_core_second"]
    assert isinstance(batched, int) and isinstance(baseline, int)
    assert batched > 0 and baseline > 0
    assert result["round_trip_ratio"] == pytest.approx(batched / baseline, rel=1e-2)


def test_round_trips_one_path_and_bad_input() -> None:
    only = measure_round_trips(0.3, 1, ("per-datagram",))
    assert "round_trips_per_core_second" not in only and "round_trip_ratio" not in only
    assert isinstance(only["baseline_round_trips_per_core_second"], int)
    with pytest.raises(ValueError):
        measure_round_trips(0.3, 0)
    with pytest.raises(ValueError):
        measure_round_trips(0.3, 1, ("nope",))


def test_profile_stages_add_up_to_the_cpu_per_round_trip() -> None:
    prof = profile_round_trips(0.3, "batched")
    stages = prof["stages"]
    assert isinstance(stages, list) and len(stages) >= 5
    total = sum(row["us"] for row in stages)
    assert total == pytest.approx(prof["cpu_us_per_round_trip"], rel=0.02)
    assert sum(row["share"] for row in stages) == pytest.approx(1.0, abs=0.02)
    assert stages[0]["stage"].startswith("kernel")
    assert _name("<method 'recvmsg' of '_socket.socket' objects>") == "recvmsg"
    assert _name("<built-in method time.time_ns>") == "time_ns"
    assert _name("ProbeSession.receive") == "receive"


def test_measure_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        measure(0)


def test_round_trips_with_probe_hmac_compiled_against_per_datagram() -> None:
    from prober import compiled

    if not compiled.available():
        pytest.skip("prober._fastpath not built")
    res = measure_round_trips(0.3, 1, ("compiled", "compiled-auth", "per-datagram-auth"))
    auth = res["compiled_auth_round_trips_per_core_second"]
    base = res["per_datagram_auth_round_trips_per_core_second"]
    assert isinstance(auth, int) and isinstance(base, int) and auth > 0 and base > 0
    assert res["auth_round_trip_ratio"] == pytest.approx(auth / base, rel=1e-2)
    assert isinstance(res["auth_cost_compiled"], float)
