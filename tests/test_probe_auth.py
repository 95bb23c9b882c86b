"""Probe authentication: key files, the prober's [auth] config, rotation without loss, wrong keys.

Real UDP on loopback (two agents, each with its own key file); no broker is needed (the
publisher spools what it cannot send).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from contract.keys import (
    ED25519_PUBLIC,
    HMAC,
    KeyFileError,
    format_key_file,
    load_key_file,
    parse_key_file,
)
from prober import compiled
from prober.agent import Agent
from prober.config import ConfigError, load_config, parse_config
from prober.session import ProbeSession
from prober.wire import Codec, Message, MsgType, codec_for
from qpmesh.cli import main

# a fresh seed per test run: the schedule's source ports (bound on 127.0.0.1) then differ
# from those of another run of these tests on the same machine at the same time
SEED = secrets.randbelow(1 << 30)

OLD = bytes(range(32))
NEW = bytes(range(100, 132))
OTHER = b"\xee" * 32


def write_keys(
    path: Path, keys: list[tuple[str, bytes]], send: str = "", mode: int = 0o600
) -> Path:
    path.write_text(format_key_file([(k, HMAC, m) for k, m in keys], send))
    path.chmod(mode)
    return path


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- key files --------------------------------------------------------------------------------


def test_key_file_two_keys_send_defaults_to_the_last(tmp_path: Path) -> None:
    ks = load_key_file(write_keys(tmp_path / "k", [("old", OLD), ("new", NEW)]), HMAC)
    assert ks.send_id == "new" and ks.send.material == NEW
    assert [k.material for k in ks.others()] == [OLD]
    ks = load_key_file(write_keys(tmp_path / "k2", [("old", OLD), ("new", NEW)], "old"), HMAC)
    assert ks.send.material == OLD
    assert OLD.hex() not in repr(ks) and NEW.hex() not in repr(ks) and "old" in repr(ks)
    assert ks.describe() == {"type": HMAC, "send": "old", "ids": ["old", "new"]}
    b64 = parse_key_file('[[keys]]\nid = "a"\ntype = "hmac-sha256"\n'
                         'base64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="\n', "b")  # fmt: skip
    assert b64.send.material == OLD


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '[[keys]]\nid = "a"\ntype = "hmac-sha256"\nhex = "zz' + OLD.hex()[2:] + '"\n',
            "keys[0].hex: is not valid hex",
        ),
        (
            '[[keys]]\nid = "a"\ntype = "hmac-sha256"\nhex = "' + OLD.hex()[:20] + '"\n',
            "has 16..64 bytes, this one has 10",
        ),
        ('[[keys]]\nid = "a"\ntype = "hmac-sha256"\n', "set exactly one of hex or base64"),
        ('[[keys]]\nid = "a"\ntype = "rot13"\nhex = "' + OLD.hex() + '"\n', "keys[0].type"),
        (
            '[[keys]]\nid = "a"\ntype = "ed25519-public"\nhex = "' + OLD.hex() + '"\n',
            "must be hmac-sha256 here",
        ),
        (
            'send = "b"\n[[keys]]\nid = "a"\ntype = "hmac-sha256"\nhex = "' + OLD.hex() + '"\n',
            "send: no key with id 'b'",
        ),
        (
            '[[keys]]\nid = "a"\ntype = "hmac-sha256"\nhex = "' + OLD.hex() + '"\nsecret = 1\n',
            "keys[0].secret: unknown key",
        ),
        ("this is = = not toml " + OLD.hex(), "not valid TOML"),
        ("", "at least one [[keys]] entry"),
    ],
)
def test_garbled_key_files_give_one_line_without_material(
    tmp_path: Path, text: str, needle: str
) -> None:
    p = tmp_path / "probe.keys"
    p.write_text(text)
    p.chmod(0o600)
    with pytest.raises(KeyFileError) as ei:
        load_key_file(p, HMAC)
    msg = str(ei.value)
    assert needle in msg and str(p) in msg and "\n" not in msg
    assert OLD.hex()[4:] not in msg and OLD.hex()[2:20] not in msg


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_key_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    p = write_keys(tmp_path / "probe.keys", [("k", OLD)], mode=mode)
    with pytest.raises(KeyFileError) as ei:
        load_key_file(p, HMAC)
    assert str(ei.value) == (
        f"{p}: key file has mode {mode:04o}; a secret key file must not be readable or "
        f"writable by group or others (chmod 600 {p})"
    )


def test_public_key_file_may_be_world_readable(tmp_path: Path) -> None:
    p = tmp_path / "verify.keys"
    p.write_text(format_key_file([("c1", ED25519_PUBLIC, OLD)]))
    p.chmod(0o644)
    assert load_key_file(p, ED25519_PUBLIC).send_id == "c1"


def test_missing_key_file_one_line(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=r"nope\.keys: key file not found$"):
        load_key_file(tmp_path / "nope.keys", HMAC)


# ---- prober config -----------------------------------------------------------------------------


def _doc(**auth: Any) -> dict[str, Any]:
    return {"prober": {"host": "h"}, "nics": [{"id": "n0", "address": "127.0.0.1"}],
            **({"auth": auth} if auth else {})}  # fmt: skip


def test_config_auth_key_file_validated_and_relative_to_the_config(tmp_path: Path) -> None:
    assert parse_config(_doc()).auth_key_file == ""
    assert parse_config(_doc(key_file="/k")).auth_key_file == "/k"
    with pytest.raises(ConfigError, match=r"p.toml: auth.key_file: must be a key file path"):
        parse_config(_doc(key_file=3), "p.toml")
    with pytest.raises(ConfigError, match=r"p.toml: auth.key_file: must be"):
        parse_config(_doc(key_file=""), "p.toml")
    with pytest.raises(ConfigError, match=r"p.toml: auth.keyfile: unknown key"):
        parse_config(_doc(keyfile="k"), "p.toml")
    (tmp_path / "etc").mkdir()
    cfg_path = tmp_path / "etc" / "prober.toml"
    cfg_path.write_text('[prober]\nhost = "h"\n[auth]\nkey_file = "probe.keys"\n'
                        '[[nics]]\nid = "n0"\naddress = "127.0.0.1"\n')  # fmt: skip
    assert load_config(cfg_path).auth_key_file == str(tmp_path / "etc" / "probe.keys")


def _cli_config(tmp_path: Path, key_file: Path) -> Path:
    p = tmp_path / "prober.toml"
    p.write_text(f'[prober]\nhost = "h"\n[auth]\nkey_file = "{key_file}"\n'
                 '[[nics]]\nid = "n0"\naddress = "127.0.0.1"\n'
                 '[[peers]]\nid = "n1"\naddress = "127.0.0.2"\n')  # fmt: skip
    return p


def test_cli_refuses_world_readable_key_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = write_keys(tmp_path / "probe.keys", [("k", OLD)], mode=0o644)
    assert main(["prober", "--config", str(_cli_config(tmp_path, keys)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"qpmesh prober: error: {keys}: key file has mode 0644; a secret key file must not be "
        f"readable or writable by group or others (chmod 600 {keys})\n"
    )


def test_cli_dry_run_names_key_ids_never_material(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = write_keys(tmp_path / "probe.keys", [("2026-10", OLD), ("2026-11", NEW)])
    cfg = _cli_config(tmp_path, keys)
    assert main(["prober", "--config", str(cfg), "--dry-run", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["auth"] == {"key_file": str(keys), "type": HMAC, "send": "2026-11",
                           "ids": ["2026-10", "2026-11"]}  # fmt: skip
    assert main(["prober", "--config", str(cfg), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "sending with key 2026-11" in text
    for secret in (OLD, NEW):
        assert secret.hex() not in out + text and secret.hex()[:16] not in out + text


# ---- the codec and sessions ------------------------------------------------------------------


def test_codec_for_sends_with_the_send_key_and_accepts_both(tmp_path: Path) -> None:
    both_new = codec_for(parse_key_file(format_key_file(
        [("o", HMAC, OLD), ("n", HMAC, NEW)]), "k"))  # fmt: skip
    msg = Message(MsgType.PROBE, 1, 2, 3)
    assert both_new.encode(msg) == Codec(NEW).encode(msg)
    assert both_new.decode(Codec(OLD).encode(msg)) == msg
    assert both_new.decode(Codec(NEW).encode(msg)) == msg
    assert codec_for(None).authenticated is False
    with pytest.raises(ValueError, match="probe keys must be hmac-sha256"):
        codec_for(parse_key_file(format_key_file([("p", ED25519_PUBLIC, OLD)]), "k"))


def test_session_counts_bad_auth_and_makes_no_record() -> None:
    a = ProbeSession("nicA", Codec(OLD))
    b = ProbeSession("nicB", Codec(OTHER), one_step=True)
    (probe,) = a.send_probe("nicB", ("127.0.0.2", 1), 50000, 1000)
    assert b.receive(probe.data, ("127.0.0.1", 50000), 2000, 2000) == []
    assert b.next_datagrams(3000) == [] and b.counters["bad_auth"] == 1
    # a reply forged with the wrong key never completes the probe either
    forged = Codec(OTHER).encode(Message(MsgType.REPLY, b.nic, a.nic, 0, ta=5, tb=6, t3_final=True))
    assert a.receive(forged, ("127.0.0.2", 1), 4000, 4000) == []
    assert a.counters["bad_auth"] == 1 and a.pending == 1


# ---- two real agents on loopback ---------------------------------------------------------------


def agent_config(host: str, nic: str, addr: str, peer: tuple[str, str], port: int,
                 key_file: Path) -> Any:  # fmt: skip
    cfg = parse_config(
        {
            "prober": {"host": host, "port": port, "timeout_ms": 1000, "batch_interval_ms": 100},
            "schedule": {"rate_hz": 50.0, "paths": 2, "cross_peers": 0, "seed": SEED},
            "mqtt": {"host": "127.0.0.1", "port": dead_port(), "timeout_s": 0.5,
                     "backoff_min_s": 0.05},
            "telemetry": {"interval_s": 0.2, "gpu": False},
            "paths": {"enabled": False},
            "nics": [{"id": nic, "address": addr}],
            "peers": [{"id": peer[0], "address": peer[1]}],
            "auth": {"key_file": str(key_file)},
        },
        f"{host}.toml",
    )  # fmt: skip
    return replace(cfg, mqtt=replace(cfg.mqtt, drain_on_stop_s=0.1))


async def _run_pair(keys_a: Path, keys_b: Path, swap: bool = False) -> tuple[Agent, Any, Agent]:
    """Start B (looping), run A for one round against it, stop B; return (A, A's stats, B).

    ``swap``: hostB's agent runs the round and hostA's loops (the other direction).
    """
    port = free_udp_port()
    a = Agent(agent_config("hostA", "nicA", "127.0.0.1", ("nicB", "127.0.0.2"), port, keys_a))
    b = Agent(agent_config("hostB", "nicB", "127.0.0.2", ("nicA", "127.0.0.1"), port, keys_b))
    if swap:
        a, b = b, a
    stop = asyncio.Event()
    task = asyncio.create_task(b.run(stop))
    try:
        for _ in range(3000):  # up to ~30 s on a busy machine
            if b.endpoints:
                break
            await asyncio.sleep(0.01)
        assert b.endpoints, "agent B did not start"
        stats = await asyncio.wait_for(a.run(asyncio.Event(), once=True), 30)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
    return a, stats, b


async def test_key_rotation_loses_no_probe(tmp_path: Path) -> None:
    """Mid-rotation: A already sends with the new key, B still with the old; both accept both."""
    ka = write_keys(tmp_path / "a.keys", [("old", OLD), ("new", NEW)], send="new")
    kb = write_keys(tmp_path / "b.keys", [("old", OLD), ("new", NEW)], send="old")
    for swap in (False, True):  # A's probes (new key) to B, then B's probes (old key) to A
        a, stats, b = await _run_pair(ka, kb, swap)
        assert stats.probes_queued == 2  # one coded pair to the other NIC
        assert stats.results == 2 and stats.lost == 0 and stats.batches == 1
        for agent in (a, b):
            (session,) = agent.sessions.values()
            assert session.codec.authenticated and session.counters["bad_auth"] == 0
            # authenticated probers run the compiled engine when it is built
            assert agent.hot_path == ("compiled" if compiled.available() else "per-datagram")


async def test_wrong_key_is_counted_bad_auth_and_never_a_record(tmp_path: Path) -> None:
    ka = write_keys(tmp_path / "a.keys", [("x", OTHER)])
    kb = write_keys(tmp_path / "b.keys", [("old", OLD), ("new", NEW)])
    _a, stats, b = await _run_pair(ka, kb)
    assert b.hot_path == ("compiled" if compiled.available() else "per-datagram")
    assert stats.probes_queued == 2 and stats.results == 0 and stats.lost == 2
    assert b.sessions["nicB"].counters["bad_auth"] >= 2  # A's two probes, never answered
    b.publish_health()
    health = json.loads(b.publisher._health or b"{}")
    assert health["counters"]["bad_auth"] >= 2 and health["counters"]["auth_key"] == "new"
    assert OLD.hex() not in json.dumps(health) and NEW.hex() not in json.dumps(health)


def test_agent_refuses_an_open_key_file(tmp_path: Path) -> None:
    kb = write_keys(tmp_path / "b.keys", [("old", OLD)], mode=0o640)
    cfg = agent_config("hostB", "nicB", "127.0.0.2", ("nicA", "127.0.0.1"), 4791, kb)
    with pytest.raises(KeyFileError, match="mode 0640"):
        Agent(cfg)
    assert oct(os.stat(kb).st_mode & 0o777) == "0o640"


def test_tagged_probe_with_max_padding_fits_the_rdma_receive_slot() -> None:
    from prober.rdma.packet import build_grh_ipv4, split_grh
    from prober.rdma.transport import SLOT
    from prober.wire import MAX_PAD

    codec = codec_for(parse_key_file(format_key_file([("o", HMAC, OLD), ("n", HMAC, NEW)]), "k"))
    msg = Message(MsgType.REPLY, 1, 2, 3, ta=4, t3_final=True, tb=5, pad=MAX_PAD)
    wire = Codec(OLD).encode(msg)  # a peer still sending with the old key
    buf = bytearray(SLOT)
    data = build_grh_ipv4("10.0.0.2", "10.0.0.1") + wire
    buf[: len(data)] = data
    _grh, payload = split_grh(buf, len(data))
    assert codec.decode(payload) == msg
