"""Config: valid files load; every bad input gives ONE ConfigError line naming file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prober.config import ConfigError, DiscoverConfig, load_config, parse_config

GOOD = """
[prober]
host = "host0"
port = 4791
timeout_ms = 250

[schedule]
rate_hz = 5
paths = 8
confidence = 0.95
coded = true

[mqtt]
host = "10.0.0.1"
port = 1883
prefix = "lab/qpmesh/v1"

[spool]
max_batches = 100
dir = "/tmp/x"

[telemetry]
interval_s = 2

[[nics]]
id = "nic0"
address = "10.0.0.10"
group = "leaf0"
device = "eth0"

[[peers]]
id = "nic1"
address = "10.0.0.11"
group = "leaf0"
port = 5000
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prober.toml"
    p.write_text(text)
    return p


def test_good_config(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.host == "host0" and cfg.timeout_ms == 250
    assert cfg.schedule.rate_hz == 5.0 and cfg.schedule.paths == 8
    assert cfg.mqtt.host == "10.0.0.1" and cfg.mqtt.prefix == "lab/qpmesh/v1"
    assert cfg.spool_max_batches == 100 and cfg.spool_dir == "/tmp/x"
    assert cfg.nics[0].device == "eth0"
    assert cfg.peer_address() == {"nic0": ("10.0.0.10", 4791), "nic1": ("10.0.0.11", 5000)}
    assert cfg.group_of() == {"nic0": "leaf0", "nic1": "leaf0"}


def base() -> dict[str, Any]:
    return {"prober": {"host": "h"}, "nics": [{"id": "nic0", "address": "10.0.0.1"}]}


def test_defaults_from_minimal() -> None:
    cfg = parse_config(base(), "f.toml")
    assert cfg.transport == "udp" and cfg.port == 4791 and cfg.mqtt.port == 1883
    assert cfg.mqtt.prefix == "qpmesh/v1" and cfg.peers == ()
    assert cfg.hot_path == "compiled"
    fast = parse_config({**base(), "prober": {"host": "h", "hot_path": "batched"}}, "f")
    assert fast.hot_path == "batched"
    assert cfg.tick_ms == 10
    assert parse_config({**base(), "prober": {"host": "h", "tick_ms": 5}}, "f").tick_ms == 5
    assert cfg.defer_follow_ups and cfg.follow_up_hold_ms == 250
    short = parse_config({**base(), "prober": {"host": "h", "timeout_ms": 400}}, "f")
    assert short.follow_up_hold_ms == 100  # the default hold stays under a short timeout
    off = parse_config({**base(), "prober": {"host": "h", "defer_follow_ups": False}}, "f")
    assert not off.defer_follow_ups
    assert cfg.tick_batch  # one C call per tick for all NICs (prober.drive)
    pernic = parse_config({**base(), "prober": {"host": "h", "tick_batch": False}}, "f")
    assert not pernic.tick_batch


@pytest.mark.parametrize(
    ("patch", "expect"),
    [
        ({"prober": {"host": "h", "prot": 1}}, "f.toml: prober.prot: unknown key"),
        ({"prober": {"host": ""}}, "f.toml: prober.host: must be a host id"),
        ({"prober": {"host": "a b"}}, "f.toml: prober.host: must be a host id"),
        ({"prober": {"host": "h", "transport": "tcp"}}, "f.toml: prober.transport: must be one of"),
        ({"prober": {"host": "h", "hot_path": "fast"}}, "f.toml: prober.hot_path: must be one of"),
        ({"prober": {"host": "h", "tick_ms": 0}}, "f.toml: prober.tick_ms: must be 1..100"),
        (
            {"prober": {"host": "h", "follow_up_hold_ms": 600}},
            "f.toml: prober.follow_up_hold_ms: must be 0..500 (half of timeout_ms",
        ),
        (
            {"prober": {"host": "h", "defer_follow_ups": 1}},
            "f.toml: prober.defer_follow_ups: must be",
        ),
        ({"prober": {"host": "h", "tick_batch": "no"}}, "f.toml: prober.tick_batch: must be"),
        (
            {"prober": {"host": "h", "port": 0}},
            "f.toml: prober.port: must be an integer in 1..65535, got 0",
        ),
        ({"prober": {"host": "h", "port": "80"}}, "f.toml: prober.port: must be an integer"),
        ({"prober": {"host": "h", "port": True}}, "f.toml: prober.port: must be"),
        ({"mqtt": {"port": 70000}}, "f.toml: mqtt.port: must be an integer in 1..65535"),
        ({"mqtt": {"prefix": "a/#"}}, "f.toml: mqtt: invalid"),
        ({"mqtt": {"timeout_s": -1}}, "f.toml: mqtt.timeout_s"),
        ({"mqtt": {"backoff_min_s": 10.0, "backoff_max_s": 1.0}}, "f.toml: mqtt: backoff"),
        ({"schedule": {"rate_hz": 0}}, "f.toml: schedule.rate_hz"),
        ({"schedule": {"confidence": 1.0}}, "f.toml: schedule.confidence"),
        ({"spool": {"max_batches": 0}}, "f.toml: spool.max_batches"),
        ({"telemetry": {"gpu": "yes"}}, "f.toml: telemetry.gpu: must be true or false"),
        ({"discover": {"nics": "eth*"}}, "f.toml: discover.nics: must be a list of interface"),
        ({"discover": {"nics": [""]}}, "f.toml: discover.nics: must be a list of interface"),
        ({"discover": {"nic_id": "{nic}"}}, "f.toml: discover.nic_id: NIC id template"),
        ({"discover": {"nic_id": "{host} {ifname}"}}, "f.toml: discover.nic_id: NIC id 'h eth0'"),
        ({"discover": {"lldp_interval_s": 0}}, "f.toml: discover.lldp_interval_s: must be"),
        ({"discover": {"peer": True}}, "f.toml: discover.peer: unknown key"),
        ({"nics": {"id": "x"}}, "f.toml: nics: must be an array of tables"),
        ({"nics": [{"id": "nic0"}]}, "f.toml: nics[0].address: is required"),
        (
            {"nics": [{"id": "nic0", "address": "10.0.0.300"}]},
            "f.toml: nics[0].address: must be an IP",
        ),
        (
            {"peers": [{"id": "nic0", "address": "10.0.0.2"}]},
            "f.toml: peers[0].id: duplicate NIC id",
        ),
        (
            {"peers": [{"id": "nic1", "address": "10.0.0.2", "colour": 1}]},
            "f.toml: peers[0].colour: unknown key",
        ),
        ({"extra": {}}, "f.toml: extra: unknown section"),
        ({"prober": 3}, "f.toml: prober: must be a table"),
    ],
)
def test_bad_values_name_file_and_key(patch: dict[str, Any], expect: str) -> None:
    doc = {**base(), **patch}
    with pytest.raises(ConfigError) as info:
        parse_config(doc, "f.toml")
    msg = str(info.value)
    assert msg.startswith(expect), msg
    assert "\n" not in msg


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"prober.toml: not valid TOML"):
        load_config(write(tmp_path, "[prober\nhost="))
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(OSError):
        load_config(tmp_path / "absent.toml")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qpmesh.cli", "prober", *args],
        check=False, capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).parents[1],
    )  # fmt: skip


def test_cli_bad_config_one_line_exit_2(tmp_path: Path) -> None:
    p = write(tmp_path, '[prober]\nhost = "h"\nport = 0\n[[nics]]\nid="n"\naddress="10.0.0.1"\n')
    r = run_cli("--config", str(p), "--dry-run")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "prober.port" in r.stderr and str(p) in r.stderr


def test_cli_missing_file_exit_1(tmp_path: Path) -> None:
    r = run_cli("--config", str(tmp_path / "nope.toml"), "--dry-run")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0


def test_cli_dry_run_prints_plan(tmp_path: Path) -> None:
    r = run_cli("--config", str(write(tmp_path, GOOD)), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["nics"]["nic0"]["peers"] == ["nic1"]
    assert doc["ports_per_nic"] == len(doc["nics"]["nic0"]["sports"])
    assert {p["dst"] for p in doc["first_probes"]} == {"nic1"}
    assert all(49152 <= p["sport"] <= 65535 for p in doc["first_probes"])


def test_cli_bench_bad_seconds_and_json() -> None:
    r = run_cli("bench", "--seconds", "0")
    assert r.returncode == 2 and "--seconds must be positive" in r.stderr
    pytest.importorskip("prober.bench", reason="prober.bench not landed yet")
    r = run_cli("bench", "--seconds", "0.3", "--json")
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["probes_per_second"] > 0 and doc["baseline_probes_per_second"] > 0


def test_discovery_needs_only_the_broker() -> None:
    """No ``[[nics]]``: discovery is on with its defaults, the host is the host name."""
    cfg = parse_config({"mqtt": {"host": "broker"}}, "f.toml", hostname=lambda: "gpu07")
    assert cfg.host == "gpu07" and cfg.nics == () and cfg.peers == ()
    assert cfg.discover == DiscoverConfig()
    assert cfg.discover.nic_id == "{host}.{ifname}" and cfg.discover.peers
    # listed NICs without [discover]: nothing is found (the configs of before)
    assert parse_config(base(), "f.toml").discover is None
    # both: found NICs, the listed ones over them
    doc = {**base(), "discover": {"nics": ["ens*"], "exclude": ["ens9"], "nic_id": "{ifname}",
                                  "lldp_socket": "/run/x.sock", "lldp_interval_s": 2,
                                  "peers": False}}  # fmt: skip
    d = parse_config(doc, "f.toml").discover
    assert d == DiscoverConfig(("ens*",), ("ens9",), "{ifname}", "/run/x.sock", 2.0, False)
    with pytest.raises(ConfigError, match=r"prober\.host: is not set and the host name 'a b'"):
        parse_config({}, "f.toml", hostname=lambda: "a b")
