"""`qpmesh testbed prober-cpu`: the pure parts (plan, prober TOML, peers' spec, /proc parsing,
report) and one short real run with probe auth (namespaces, broker)."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from prober import compiled
from prober.agent import plan_peers
from prober.config import parse_config
from testbed import probercpu
from testbed.probercpu import (
    CROSS_PEERS,
    MOSQUITTO,
    cpu_plan,
    cpu_report,
    peers_spec,
    prober_toml,
    proc_cpu_seconds,
    run_prober_cpu,
    schedule_kept,
)


def test_plan_gives_every_nic_its_peers_and_the_default_schedule() -> None:
    import tomllib

    plan = cpu_plan("qcx", nics=8, peers_per_nic=32)
    assert plan.mates == 32 - CROSS_PEERS and plan.host_ns == "qcxh" and plan.peer_ns == "qcxp"
    for path in ("batched", "per-datagram"):
        cfg = parse_config(tomllib.loads(prober_toml(plan, path)), "cpu.toml")
        assert cfg.hot_path == path and len(cfg.nics) == 8 and len(cfg.peers) == 8 * 16
        assert cfg.schedule.rate_hz == 10.0 and cfg.schedule.cross_peers == CROSS_PEERS
        peers = plan_peers(cfg)
        assert {len(p) for p in peers.values()} == {32}  # 16 group mates + 16 cross-group
    assert {n.address for n in cfg.nics} == {f"10.77.{k}.1" for k in range(8)}


def test_peers_spec_shards_cover_every_peer_once_and_probe_back(tmp_path: Path) -> None:
    plan = cpu_plan("qcx", nics=3, peers_per_nic=20)
    specs = [peers_spec(plan, tmp_path / f"s{i}", shard=i, shards=4) for i in range(4)]
    ids = [p["id"] for s in specs for p in s["peers"]]
    assert len(ids) == len(set(ids)) == 3 * 4
    streams = [st for s in specs for st in s["streams"]]
    assert len(streams) == 2 * len(ids)  # each peer probes two of the host's NICs back
    assert {st["dst"] for st in streams} == {"h0", "h1", "h2"}
    assert [s["count_records"] for s in specs] == [True, False, False, False]


def test_proc_stat_and_bad_sizes() -> None:
    line = "1234 (qpmesh prober (x)) S 1 2 3 4 5 6 7 8 9 10 250 130 0 0 20 0 3 0"
    assert proc_cpu_seconds(line, 100) == pytest.approx(3.8)
    with pytest.raises(ValueError):
        proc_cpu_seconds("garbage", 100)
    with pytest.raises(ValueError):
        cpu_plan("qcx", nics=0)
    with pytest.raises(ValueError):
        cpu_plan("qcx", peers_per_nic=CROSS_PEERS)
    with pytest.raises(ValueError):
        cpu_plan("a-very-long-prefix")


def _run(cpu: float, records: float, answered: float, lost: float = 0.0) -> dict[str, Any]:
    return {"cpu_percent_of_one_core": cpu, "cpu_us_per_probe": 10.0, "records_per_s": records,
            "answered_per_s": answered, "lost_per_s": lost, "unanswered_per_s": 0.0,
            "scheduled_probes_per_s": 5120, "scheduled_answers_per_s": 5120}  # fmt: skip


def test_target_is_judged_only_at_size_and_when_the_schedule_was_kept(tmp_path: Path) -> None:
    plan = cpu_plan("qcx", nics=8, peers_per_nic=32)
    kept = cpu_report(plan, {"compiled": [_run(9.0, 5089, 5031)]}, 20, 6, 1, tmp_path)
    assert kept["target_met"] is True and kept["schedule_kept"] is True
    over = cpu_report(plan, {"compiled": [_run(12.0, 5089, 5031)]}, 20, 6, 1, tmp_path)
    assert over["target_met"] is False
    # a starved prober (a loaded machine) spends less CPU because it does less: not judged
    for starved in (_run(9.0, 143, 2847), _run(9.0, 5000, 5000, lost=2000)):
        rep = cpu_report(plan, {"compiled": [starved]}, 20, 6, 1, tmp_path)
        assert rep["target_met"] is None and rep["schedule_kept"] is False
        assert "not judged" in rep["target_note"]
    small = cpu_report(cpu_plan("qcx", nics=2), {"compiled": [_run(9.0, 1280, 1280)]}, 20, 6, 1,
                    tmp_path)  # fmt: skip
    assert small["target_met"] is None
    assert not schedule_kept(_run(5.0, 5120, 100)) and schedule_kept(_run(5.0, 4400, 4400))


def test_defer_ab_runs_the_compiled_path_without_deferred_follow_ups(tmp_path: Path) -> None:
    import tomllib

    plan = cpu_plan("qcx", nics=8, peers_per_nic=32)
    on = parse_config(tomllib.loads(prober_toml(plan, "compiled")), "cpu.toml")
    off = parse_config(tomllib.loads(prober_toml(plan, "compiled-nodefer")), "cpu.toml")
    assert on.hot_path == off.hot_path == "compiled"
    assert on.defer_follow_ups and not off.defer_follow_ups
    runs = {"compiled": [_run(15.0, 5089, 5031)], "compiled-nodefer": [_run(21.0, 5100, 5050)]}
    rep = cpu_report(plan, runs, 20, 6, 1, tmp_path)
    assert rep["prober_path"] == "compiled" and rep["prober_cpu_percent_of_one_core"] == 15.0
    assert rep["nodefer_cpu_percent_of_one_core"] == 21.0 and rep["nodefer_schedule_kept"]
    assert rep["cpu_ratio_nodefer_over_prober"] == 1.4


def test_batch_ab_runs_the_compiled_path_ticked_per_nic(tmp_path: Path) -> None:
    import tomllib

    plan = cpu_plan("qcx", nics=8, peers_per_nic=32)
    on = parse_config(tomllib.loads(prober_toml(plan, "compiled")), "cpu.toml")
    off = parse_config(tomllib.loads(prober_toml(plan, "compiled-pernic")), "cpu.toml")
    assert on.hot_path == off.hot_path == "compiled"
    assert on.tick_batch and not off.tick_batch and off.defer_follow_ups
    runs = {"compiled": [_run(14.0, 5089, 5031)], "compiled-pernic": [_run(14.7, 5100, 5050)]}
    rep = cpu_report(plan, runs, 20, 6, 1, tmp_path)
    assert rep["pernic_cpu_percent_of_one_core"] == 14.7 and rep["pernic_schedule_kept"]
    assert rep["cpu_ratio_pernic_over_prober"] == 1.05 and "nodefer_schedule_kept" not in rep


def test_peers_tick_on_one_timer_unless_asked_to_wake_per_datagram(tmp_path: Path) -> None:
    plan = cpu_plan("qcx", nics=2, peers_per_nic=20)
    assert peers_spec(plan, tmp_path / "s")["peer_ticks"] == "driver"
    assert peers_spec(plan, tmp_path / "s", peer_ticks="readiness")["peer_ticks"] == "readiness"
    with pytest.raises(ValueError, match="peer_ticks"):
        run_prober_cpu(nics=2, peer_ticks="sometimes")


def test_auth_puts_one_fresh_0600_key_in_the_prober_and_peers_config(tmp_path: Path) -> None:
    import stat
    import tomllib

    from contract.keys import HMAC, load_key_file
    from prober.config import load_probe_keys
    from testbed.probercpu import write_probe_key

    key = write_probe_key(tmp_path / "probe.keys")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (
        load_key_file(key, HMAC).send.material
        != load_key_file(write_probe_key(tmp_path / "other.keys"), HMAC).send.material
    )  # fresh per run
    with pytest.raises(FileExistsError):
        write_probe_key(key)  # never overwritten
    plan = cpu_plan("qcx", nics=2, peers_per_nic=20)
    cfg = parse_config(tomllib.loads(prober_toml(plan, "compiled", str(key))), "cpu.toml")
    assert cfg.auth_key_file == str(key) and load_probe_keys(cfg) is not None
    assert "[auth]" not in prober_toml(plan, "compiled")
    assert peers_spec(plan, tmp_path / "s", key_file=str(key))["key_file"] == str(key)
    assert peers_spec(plan, tmp_path / "s")["key_file"] == ""
    runs = {"compiled": [{**_run(9.0, 5089, 5031), "prober_bad_auth": 3, "peers_bad_auth": 4}]}
    rep = cpu_report(plan, runs, 20, 6, 1, tmp_path, auth=True)
    assert rep["auth"] is True and rep["bad_auth"] == 7


def _short_run(**kw: Any) -> dict[str, Any]:
    """A short run whose work directory (/var/tmp/qpmesh/PREFIX: configs, logs) is removed
    afterwards, also when the run fails."""
    prefix = f"qt{secrets.token_hex(3)}"
    try:
        return run_prober_cpu(nics=2, peers_per_nic=17, seconds=3.0, warmup_s=1.0, repeats=1,
                              paths=("compiled",), prefix=prefix, peer_procs=1,
                              **kw)  # fmt: skip
    finally:
        shutil.rmtree(Path("/var/tmp/qpmesh") / prefix, ignore_errors=True)


@pytest.mark.netns
@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")
@pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs mosquitto")
@pytest.mark.skipif(not compiled.available(), reason="prober._fastpath not built")
@pytest.mark.timeout(240)
def test_authenticated_run_flows_and_a_keyless_peer_shows_as_bad_auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rep = _short_run(auth=True)
    run = rep["runs"]["compiled"][0]
    assert rep["auth"] is True and rep["bad_auth"] == 0
    assert run["results_per_s"] > 0 and run["answered_per_s"] > 0
    assert run["prober_bad_auth"] == 0 and run["peers_bad_auth"] == 0
    # the peers without the key: what either side sends fails auth at the other, and shows
    real_spec = probercpu.peers_spec
    monkeypatch.setattr(probercpu, "peers_spec",
                        lambda *a, **k: {**real_spec(*a, **k), "key_file": ""})  # fmt: skip
    bad = _short_run(auth=True)
    run = bad["runs"]["compiled"][0]
    assert run["peers_bad_auth"] > 0 and run["prober_bad_auth"] > 0 and bad["bad_auth"] > 0
    # the prober's probes of the peers are lost, the peers' probes unanswered (only the
    # prober's two NICs, cross-group peers of each other, share the key and still complete)
    assert run["answered_per_s"] == 0 and run["unanswered_per_s"] > 0 and run["lost_per_s"] > 0
    assert not schedule_kept(run)
