"""Remediation actions signed by the controller, verified by the agents: forgeries, replays,
unsigned actions, key files; end to end through a real mosquitto to the agent's follower."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from contract.actionsig import ActionAuthError, ActionSigner, public_from_private, verify_action
from contract.documents import EventDoc
from contract.keys import (
    ED25519_PRIVATE,
    ED25519_PUBLIC,
    KeySet,
    format_key_file,
    parse_key_file,
)
from contract.remediation import ActionDoc, action_topic
from controller.config import ConfigError, load_config
from controller.remediation.loop import Remediator
from controller.remediation.policy import SEC
from recovery.machine import Ack, ActionReceived, AgentConfig, handle, initial
from recovery.trust import ActionGate

SEED = bytes(range(32))
EVIL = bytes(range(1, 33))
NOW = 1_000 * SEC
P = "qpmesh/v1"


def private(seed: bytes = SEED, kid: str = "c1") -> KeySet:
    return parse_key_file(format_key_file([(kid, ED25519_PRIVATE, seed)]), "ctl.keys")


def public(*seeds: tuple[str, bytes]) -> KeySet:
    keys = [(kid, ED25519_PUBLIC, public_from_private(s)) for kid, s in seeds]
    return parse_key_file(format_key_file(keys), "agent.pub")


def action(aid: str = "move_off_nic-1", nic: str = "nic3", ttl_s: int = 120) -> ActionDoc:
    return ActionDoc(aid, "move_off_nic", "nic_down", "f1", NOW, NOW + ttl_s * SEC, nic=nic,
                     job="job1")  # fmt: skip


# ---- signatures ---------------------------------------------------------------------------------


def test_signed_action_verifies_and_still_decodes_as_a_plain_action() -> None:
    a = action()
    payload = ActionSigner(private()).sign(a)
    assert verify_action(payload, public(("c1", SEED))) == a
    assert ActionDoc.decode(payload) == a  # receivers that know no signatures still read it
    assert json.loads(payload)["sig"]["key"] == "c1"


@pytest.mark.parametrize("field", ["nic", "expires_at_ns", "id", "kind", "job"])
def test_any_changed_field_breaks_the_signature(field: str) -> None:
    doc = json.loads(ActionSigner(private()).sign(action()))
    doc[field] = {"nic": "nic4", "expires_at_ns": NOW + 10**15, "id": "move_off_nic-2",
                  "kind": "may_move_back", "job": "job2"}[field]  # fmt: skip
    with pytest.raises(ActionAuthError) as ei:
        verify_action(json.dumps(doc).encode(), public(("c1", SEED)))
    assert ei.value.reason == "bad_signature"


def test_forged_unsigned_and_unknown_key() -> None:
    keys = public(("c1", SEED))
    forged = ActionSigner(private(EVIL)).sign(action())  # same key id, another private key
    with pytest.raises(ActionAuthError, match="bad signature") as ei:
        verify_action(forged, keys)
    assert ei.value.reason == "bad_signature"
    with pytest.raises(ActionAuthError, match="is not signed") as ei:
        verify_action(action().encode(), keys)
    assert ei.value.reason == "unsigned"
    with pytest.raises(ActionAuthError) as ei:
        verify_action(ActionSigner(private(EVIL, "x9")).sign(action()), keys)
    assert ei.value.reason == "unknown_key"
    doc = json.loads(ActionSigner(private()).sign(action()))
    doc["sig"]["value"] = "!!notbase64"
    with pytest.raises(ActionAuthError, match="bad signature"):
        verify_action(json.dumps(doc).encode(), keys)


def test_an_agents_verify_key_cannot_sign() -> None:
    with pytest.raises(ValueError, match="a signing key must be ed25519-private"):
        ActionSigner(public(("c1", SEED)))


def test_rotation_agents_accept_both_controller_keys() -> None:
    keys = public(("c1", SEED), ("c2", EVIL))
    assert verify_action(ActionSigner(private(SEED, "c1")).sign(action()), keys) == action()
    assert verify_action(ActionSigner(private(EVIL, "c2")).sign(action()), keys) == action()


# ---- the agent's gate: replay, topic, expiry ----------------------------------------------------


def test_gate_refuses_replays_other_topics_forgeries_and_unsigned() -> None:
    gate = ActionGate(public(("c1", SEED)), P)
    sign = ActionSigner(private()).sign
    a = action()
    topic = action_topic(P, "nic3")
    assert gate.admit(topic, sign(a), NOW + SEC) == a
    assert gate.admit(topic, sign(a), NOW + 2 * SEC) is None  # replayed
    assert gate.last_reason.startswith("replayed: move_off_nic-1")
    assert gate.admit(action_topic(P, "nic4"), sign(action("move_off_nic-9")), NOW) is None
    assert gate.admit(topic, a.encode(), NOW) is None
    assert gate.admit(topic, ActionSigner(private(EVIL)).sign(action("m-2")), NOW) is None
    assert gate.admit(topic, b"{junk", NOW) is None
    assert dict(gate.counters) == {"admitted": 1, "replayed": 1, "wrong_topic": 1,
                                   "unsigned": 1, "bad_signature": 1, "malformed": 1}  # fmt: skip


def test_gate_remembers_ids_for_their_lifetime_and_passes_expired_ones_to_the_machine() -> None:
    gate = ActionGate(public(("c1", SEED)), P)
    sign = ActionSigner(private()).sign
    topic = action_topic(P, "nic3")
    short = action("m-short", ttl_s=10)
    assert gate.admit(topic, sign(short), NOW) == short
    assert gate.admit(topic, sign(short), NOW + 9 * SEC) is None  # still alive: a replay
    # past its signed expiry it is forgotten, and handed on: the machine acks "expired"
    assert gate.admit(topic, sign(short), NOW + 11 * SEC) == short
    assert gate.counters["expired"] == 1
    cfg = AgentConfig("job1", 0, ("nic3", "nic4"))
    _st, cmds = handle(cfg, initial(cfg), ActionReceived(short), NOW + 11 * SEC)
    assert [c.outcome for c in cmds if isinstance(c, Ack)] == ["expired"]


def test_gate_without_keys_believes_unsigned_actions_and_counts_them() -> None:
    gate = ActionGate(None, P)
    assert gate.admit(action_topic(P, "nic3"), action().encode(), NOW) == action()
    assert gate.counters["unverified"] == 1 and not gate.verifying


# ---- the controller signs what it publishes ----------------------------------------------------


def test_remediator_publishes_signed_actions_and_plain_ones_without_a_signer() -> None:
    from controller.remediation.policy import PolicyConfig

    for signer in (ActionSigner(private()), None):
        rem = Remediator(PolicyConfig(), P, sign=signer.sign if signer else None)
        rem.observe(EventDoc(NOW, "nic_down", "nic3", "test"))
        sent: list[tuple[str, bytes]] = []

        def publish(t: str, p: bytes, out: list[tuple[str, bytes]] = sent) -> None:
            out.append((t, p))

        rem.tick({"job1": ("nic3", "nic4")}, True, NOW + 5 * SEC, publish)
        assert [t for t, _ in sent] == [action_topic(P, "nic3")]
        payload = sent[0][1]
        if signer is not None:
            doc = verify_action(payload, public(("c1", SEED)))
            assert doc.kind == "move_off_nic" and doc.nic == "nic3"
        else:
            assert "sig" not in json.loads(payload)


# ---- the controller's key file -----------------------------------------------------------------


def test_controller_auth_action_key_file(tmp_path: Path) -> None:
    (tmp_path / "ctl.keys").write_text(format_key_file([("c1", ED25519_PRIVATE, SEED)]))
    (tmp_path / "ctl.keys").chmod(0o600)
    cfg = tmp_path / "controller.toml"
    cfg.write_text('[auth]\naction_key_file = "ctl.keys"\n')
    conf = load_config(cfg)
    assert conf.action_keys is not None and conf.action_keys.send_id == "c1"
    assert SEED.hex() not in repr(conf)
    (tmp_path / "ctl.keys").chmod(0o644)
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    key = tmp_path / "ctl.keys"
    assert str(ei.value) == (
        f"{key}: key file has mode 0644; a secret key file must not be readable or writable "
        f"by group or others (chmod 600 {key})"
    )
    cfg.write_text('[auth]\naction_key_file = "agent.pub"\n')
    (tmp_path / "agent.pub").write_text(format_key_file([("c1", ED25519_PUBLIC, SEED)]))
    (tmp_path / "agent.pub").chmod(0o600)
    with pytest.raises(ConfigError, match=r"keys\[0\].type: must be ed25519-private here"):
        load_config(cfg)
    cfg.write_text("[auth]\naction_key = 1\n")
    with pytest.raises(ConfigError, match=r"auth.action_key: unknown key"):
        load_config(cfg)


# ---- end to end: a real broker, the agent's follower ------------------------------------------


@pytest.mark.broker
def test_follower_acts_only_on_signed_fresh_actions(mosquitto: tuple[str, int]) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from recovery.follow import Follower

    host, port = mosquitto
    inbox: queue.Queue[Any] = queue.Queue()
    f = Follower(host, port, ("nic3",), inbox, client_id="t-signed",
                 verify_keys=public(("c1", SEED)))  # fmt: skip
    op = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="t-attacker")
    op.connect(host, port)
    op.loop_start()
    now = time.time_ns()
    topic = action_topic(P, "nic3")

    def act(aid: str) -> ActionDoc:
        return ActionDoc(aid, "move_off_nic", "nic_down", "f", now, now + 600 * SEC, nic="nic3")

    sign = ActionSigner(private()).sign
    try:
        f.start()
        deadline = time.monotonic() + 10
        while f.gate.counters["unsigned"] == 0 and time.monotonic() < deadline:
            op.publish(topic, act("probe-sub").encode(), qos=1)  # until subscribed
            time.sleep(0.2)
        assert f.gate.counters["unsigned"] >= 1 and inbox.empty()
        op.publish(topic, ActionSigner(private(EVIL)).sign(act("forged")), qos=1)
        genuine = act("genuine")
        op.publish(topic, sign(genuine), qos=1)
        assert inbox.get(timeout=10) == genuine
        op.publish(topic, sign(genuine), qos=1)  # replayed by someone who recorded it
        op.publish(topic, sign(act("last")), qos=1)
        assert inbox.get(timeout=10).id == "last"  # in order: the replay came before and died
        assert inbox.empty()
        assert f.gate.counters["bad_signature"] == 1 and f.gate.counters["replayed"] == 1
        assert f.received == 2
    finally:
        f.stop()
        op.loop_stop()
        op.disconnect()


# ---- qpmesh keys ------------------------------------------------------------------------------


def test_keys_gen_show_and_rotation_step_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from contract.keys import HMAC, load_key_file
    from qpmesh.cli import main

    old, new = tmp_path / "old.keys", tmp_path / "new.keys"
    assert main(["keys", "gen", "probe", "--out", str(old), "--id", "k1"]) == 0
    assert main(["keys", "gen", "probe", "--out", str(new), "--id", "k2", "--add-to", str(old),
                 "--json"]) == 0  # fmt: skip
    assert old.stat().st_mode & 0o777 == 0o600 and new.stat().st_mode & 0o777 == 0o600
    ks = load_key_file(new, HMAC)
    assert ks.send_id == "k1" and [k.id for k in ks.keys] == ["k1", "k2"]
    assert ks.by_id("k1") == load_key_file(old, HMAC).send
    priv, pub = tmp_path / "ctl.keys", tmp_path / "agent.pub"
    assert main(["keys", "gen", "action", "--out", str(priv), "--public", str(pub)]) == 0
    assert pub.stat().st_mode & 0o777 == 0o644
    signer = ActionSigner(load_key_file(priv, ED25519_PRIVATE))
    assert verify_action(signer.sign(action()), load_key_file(pub, ED25519_PUBLIC)) == action()
    assert main(["keys", "show", str(new)]) == 0
    out = capsys.readouterr().out
    assert f"{new}: hmac-sha256 keys k1, k2, sending with k1" in out
    for k in (*ks.keys, load_key_file(priv).send):
        assert k.material.hex() not in out
    assert main(["keys", "gen", "probe", "--out", str(old)]) == 2
    assert capsys.readouterr().err == (
        f"qpmesh keys: error: {old}: exists; not overwriting a key file\n"
    )


async def test_controller_logs_whether_its_actions_are_signed(tmp_path: Path) -> None:
    import asyncio
    import io
    import socket

    from controller.config import ServiceConfig
    from controller.dispatch import JsonLog
    from controller.service import Broker, run_service
    from mesh.fabric import FabricShape, build_fabric

    with socket.socket() as s:  # nothing listening: the service gives up after one attempt
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fab = build_fabric(FabricShape.for_nics(4))
    for keys, want in ((None, "warning: remediation actions are unsigned"),
                       (private(), "remediation actions signed")):  # fmt: skip
        out = io.StringIO()
        conf = ServiceConfig(fabric=fab, backoff_s=(0.01, 0.01), action_keys=keys)
        await asyncio.wait_for(
            run_service(Broker("127.0.0.1", port), conf, log=JsonLog(out), max_attempts=1), 30
        )
        lines = [json.loads(x) for x in out.getvalue().splitlines()]
        assert any(x["msg"].startswith(want) for x in lines), lines
        assert SEED.hex() not in out.getvalue()
