"""MQTT with TLS, credentials and an ACL against a real mosquitto (docs/mqtt-security.md).

The broker (`secure_broker`) listens with TLS on a free loopback port, takes no anonymous
clients, checks a password file and the ACL of `testbed.securebroker.acl_text`; certificates
and passwords are generated per test. "Not delivered" is shown without waiting for silence:
the refused message is published (QoS 1, acknowledged) before a marker that is allowed, and the
subscriber's first message must be the marker (mosquitto routes a publish before acking it).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from contract.remediation import ActionDoc, action_topic
from controller.config import ConfigError, load_config
from controller.dispatch import JsonLog
from mqttlink.settings import (
    BrokerSettings,
    CredentialError,
    MqttSecurity,
    client_kwargs,
    read_password,
)
from prober.config import ConfigError as ProberConfigError
from prober.config import load_config as load_prober_config
from prober.publish import Publisher
from prober.spool import Spool
from recovery.follow import Follower
from testbed.securebroker import Material, agent_user, broker_conf, make_material
from tests.conftest import MOSQUITTO, _wait_listening
from tests.servers import free_port, stop_process

P = "qpmesh/v1"
AGENT = agent_user("job1", 0)


@pytest.fixture
def secure_broker(tmp_path: Path) -> Iterator[tuple[int, Material]]:
    """A TLS-only mosquitto with a password file and the qpmesh ACL; yields (port, material).

    Users: host0, host1 (probers), controller, monitor (reads all), the agent of job1 rank 0
    (NIC nic0). Stopped by its PID, also when the test fails.
    """
    if not os.path.exists(MOSQUITTO):
        pytest.skip("mosquitto not installed")
    m = make_material(tmp_path / "pki", ["127.0.0.1"], ["host0", "host1"],
                      agents={AGENT: ("job1", ["nic0"])})  # fmt: skip
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(broker_conf("127.0.0.1", port, m))
    with (tmp_path / "mosquitto.log").open("wb") as log:
        proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=log, stderr=log)
    try:
        _wait_listening(port, proc, timeout_s=10.0)
        yield port, m
    finally:
        stop_process(proc)


def _client(port: int, sec: MqttSecurity, ident: str) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port, identifier=ident, timeout=10, **client_kwargs(sec))


async def _first(client: aiomqtt.Client, timeout_s: float = 20.0) -> tuple[str, bytes]:
    msg = await asyncio.wait_for(anext(aiter(client.messages)), timeout_s)
    assert isinstance(msg.payload, bytes)
    return str(msg.topic), msg.payload


# ---- settings (no broker) -----------------------------------------------------------------------


def test_security_settings_validate_and_never_show_the_password(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        MqttSecurity(tls=True, cert_file="c.pem")
    with pytest.raises(ValueError, match="need tls"):
        MqttSecurity(ca_file="ca.pem")
    with pytest.raises(ValueError, match="needs a username"):
        MqttSecurity(password_file="pw")
    pw = tmp_path / "pw"
    pw.write_text("s3cret-value\n")
    pw.chmod(0o644)
    with pytest.raises(CredentialError) as exc:
        read_password(str(pw))
    assert "readable by group or others" in str(exc.value) and "s3cret" not in str(exc.value)
    assert "\n" not in str(exc.value)
    pw.chmod(0o600)
    assert read_password(str(pw)) == "s3cret-value"
    with pytest.raises(CredentialError, match="cannot read"):
        read_password(str(tmp_path / "missing"))
    sec = MqttSecurity(tls=True, username="host0", password_file=str(pw))
    kw = client_kwargs(sec)
    assert kw["username"] == "host0" and kw["password"] == "s3cret-value"
    assert kw["tls_params"].ca_certs is None  # system CAs
    assert "s3cret" not in json.dumps(sec.describe()) and "s3cret" not in repr(sec)
    assert client_kwargs(MqttSecurity()) == {}


def _prober_toml(tmp_path: Path, mqtt_extra: str) -> Path:
    cfg = tmp_path / "prober.toml"
    cfg.write_text(
        '[prober]\nhost = "host0"\n[mqtt]\nhost = "127.0.0.1"\n' + mqtt_extra
        + '[[nics]]\nid = "nic0"\naddress = "10.0.0.1"\n'
    )  # fmt: skip
    return cfg


def test_prober_and_controller_configs_take_tls_and_credentials(tmp_path: Path) -> None:
    pw = tmp_path / "host0.password"
    pw.write_text("hunter2-secret\n")
    pw.chmod(0o600)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    keys = 'tls = true\nca_file = "ca.pem"\nusername = "host0"\npassword_file = "host0.password"\n'
    cfg = load_prober_config(_prober_toml(tmp_path, keys))
    assert cfg.mqtt.security == MqttSecurity(
        tls=True, ca_file=str(tmp_path / "ca.pem"), username="host0", password_file=str(pw)
    )  # relative names are taken from the config's folder
    ctl = tmp_path / "controller.toml"
    ctl.write_text("[mqtt]\n" + keys.replace("host0", "controller", 1))
    pw.rename(tmp_path / "c.pw")
    ctl.write_text(ctl.read_text().replace("host0.password", "c.pw"))
    assert load_config(ctl).mqtt_security.username == "controller"
    # a world-readable password file is one line naming file and key, never the secret
    (tmp_path / "c.pw").chmod(0o644)
    with pytest.raises(ConfigError) as exc:
        load_config(ctl)
    msg = str(exc.value)
    assert msg.startswith(f"{ctl}: mqtt: password file") and "readable by group or others" in msg
    assert "hunter2" not in msg and "\n" not in msg
    with pytest.raises(ProberConfigError, match=r"mqtt\.tls: must be true or false"):
        load_prober_config(_prober_toml(tmp_path, 'tls = "yes"\n'))
    with pytest.raises(ProberConfigError, match=r"mqtt: ca_file and cert_file need tls"):
        load_prober_config(_prober_toml(tmp_path, 'ca_file = "ca.pem"\n'))


# ---- ACL on a real broker -----------------------------------------------------------------------


@pytest.mark.broker
async def test_prober_publishes_under_its_own_host_only(
    secure_broker: tuple[int, Material],
) -> None:
    """The real `Publisher` of host0 delivers; host0's credentials under host1's topic do not."""
    port, m = secure_broker
    async with _client(port, m.security("monitor"), "t-monitor") as mon:
        await mon.subscribe(f"{P}/probes/#", qos=1, timeout=10)
        async with _client(port, m.security("host0"), "t-forger") as forger:
            await forger.publish(f"{P}/probes/host1", b"forged-as-host1", qos=1, timeout=10)
            await forger.publish(f"{P}/presence/host1", b'{"alive":false}', qos=1, timeout=10)
        settings = BrokerSettings(host="127.0.0.1", port=port, timeout_s=10,
                                  security=m.security("host0"))  # fmt: skip
        pub = Publisher(settings, "host0", Spool())
        pub.submit(1, b"batch-of-host0")
        stop = asyncio.Event()
        task = asyncio.create_task(pub.run(stop))
        try:
            assert await _first(mon) == (f"{P}/probes/host0", b"batch-of-host0")
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
        assert pub.errors == 0 and pub.connects == 1


@pytest.mark.broker
async def test_only_the_controller_publishes_events_and_remediation(
    secure_broker: tuple[int, Material],
) -> None:
    port, m = secure_broker
    async with _client(port, m.security("monitor"), "t-monitor") as mon:
        await mon.subscribe(f"{P}/events/#", qos=1, timeout=10)
        await mon.subscribe(f"{P}/remediation/#", qos=1, timeout=10)
        for user in ("host0", AGENT, "monitor"):
            async with _client(port, m.security(user), f"t-forger-{user}") as c:
                await c.publish(f"{P}/events/link_down", b"forged", qos=1, timeout=10)
                await c.publish(f"{P}/remediation/nic0", b"forged", qos=1, timeout=10)
        async with _client(port, m.security("controller"), "t-controller") as ctl:
            await ctl.publish(f"{P}/events/link_down", b"real-event", qos=1, timeout=10)
            await ctl.publish(f"{P}/remediation/nic0", b"real-action", qos=1, timeout=10)
        assert await _first(mon) == (f"{P}/events/link_down", b"real-event")
        assert await _first(mon) == (f"{P}/remediation/nic0", b"real-action")


def _action(nic: str, i: int) -> ActionDoc:
    return ActionDoc(id=f"act-{nic}-{i}", kind="move_off_nic", reason="test", finding="f",
                     issued_at_ns=1, expires_at_ns=2, nic=nic)  # fmt: skip


@pytest.mark.broker
async def test_recovery_agent_reads_only_its_jobs_nics(secure_broker: tuple[int, Material]) -> None:
    """The real paho `Follower` over TLS, told to follow nic0 and nic1: the ACL lets through
    only nic0's actions (its job's NIC); probe batches are not readable either."""
    port, m = secure_broker
    inbox: queue.Queue[Any] = queue.Queue()
    f = Follower("127.0.0.1", port, ("nic1", "nic0"), inbox, client_id="t-agent",
                 security=m.security(AGENT))  # fmt: skip
    f.start()
    try:
        async with _client(port, m.security(AGENT), "t-agent-raw") as raw:
            await raw.subscribe(f"{P}/probes/#", qos=1, timeout=10)
            await raw.subscribe(f"{P}/remediation/nic1", qos=1, timeout=10)
            await raw.subscribe(f"{P}/remediation/nic0", qos=1, timeout=10)
            async with _client(port, m.security("host0"), "t-host0") as h0:
                await h0.publish(f"{P}/probes/host0", b"batch", qos=1, timeout=10)
            async with _client(port, m.security("controller"), "t-controller") as ctl:
                for i in range(3):  # the follower subscribes on its own thread: retry a little
                    await ctl.publish(action_topic(P, "nic1"), _action("nic1", i).encode(), qos=1,
                                      timeout=10)  # fmt: skip
                    await ctl.publish(action_topic(P, "nic0"), _action("nic0", i).encode(), qos=1,
                                      timeout=10)  # fmt: skip
            assert await _first(raw) == (action_topic(P, "nic0"), _action("nic0", 0).encode())
        got = await asyncio.to_thread(inbox.get, True, 20.0)
        assert got.nic == "nic0"
        while not inbox.empty():
            assert inbox.get_nowait().nic == "nic0"
    finally:
        f.stop()


# ---- refused connections: one line, backoff, no crash --------------------------------------------


@pytest.mark.broker
@pytest.mark.parametrize("case", ["wrong_password", "untrusted_ca"])
async def test_refused_connection_backs_off_with_one_line(
    secure_broker: tuple[int, Material], case: str
) -> None:
    port, m = secure_broker
    sec = (
        m.wrong_password("host0")
        if case == "wrong_password"
        else m.security("host0", ca_file=m.rogue_ca_file)
    )
    delays: list[float] = []
    stop = asyncio.Event()

    async def fake_sleep(s: float) -> None:  # backoff without waiting on the wall clock
        delays.append(s)
        if len(delays) >= 3:
            stop.set()

    settings = BrokerSettings(host="127.0.0.1", port=port, timeout_s=10, backoff_min_s=0.5,
                              backoff_max_s=4.0, security=sec)  # fmt: skip
    pub = Publisher(settings, "host0", Spool(), sleep=fake_sleep)
    await asyncio.wait_for(pub.run(stop), 60)
    assert pub.connects == 0 and pub.errors == 3 and delays == [0.5, 1.0, 2.0]
    want = "Not authorized" if case == "wrong_password" else "CERTIFICATE_VERIFY_FAILED"
    assert want in pub.last_error and "\n" not in pub.last_error
    password = Path(sec.password_file).read_text().strip()
    assert password not in pub.last_error


@pytest.mark.broker
async def test_controller_with_a_wrong_password_logs_one_line_and_retries(
    secure_broker: tuple[int, Material], tmp_path: Path
) -> None:
    from contract.topics import Topics
    from controller.config import ServiceConfig
    from controller.service import Broker, run_service
    from mesh.fabric import FabricShape, build_fabric

    port, m = secure_broker
    sec = m.wrong_password("controller")
    cfg = ServiceConfig(build_fabric(FabricShape()), backoff_s=(0.01, 0.02), mqtt_security=sec)
    out = io.StringIO()
    await asyncio.wait_for(
        run_service(Broker("127.0.0.1", port, Topics(P)), cfg, log=JsonLog(out), max_attempts=2),
        60,
    )
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    errors = [x for x in lines if x["msg"] == "broker error"]
    assert len(errors) == 2 and all("Not authorized" in x["error"] for x in errors)
    assert Path(sec.password_file).read_text().strip() not in out.getvalue()


@pytest.mark.parametrize("as_json", [True, False])
def test_prober_dry_run_names_the_password_file_never_the_password(
    tmp_path: Path, as_json: bool
) -> None:
    pw = tmp_path / "host0.password"
    pw.write_text("dry-run-secret-42\n")
    pw.chmod(0o600)
    cfg = _prober_toml(
        tmp_path, 'tls = true\nusername = "host0"\npassword_file = "host0.password"\n'
    )
    argv = [sys.executable, "-m", "qpmesh.cli", "prober", "--config", str(cfg), "--dry-run"]
    out = subprocess.run(argv + (["--json"] if as_json else []), capture_output=True, text=True,
                         timeout=60, check=False, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "dry-run-secret" not in out.stdout + out.stderr
    if as_json:
        sec = json.loads(out.stdout)["mqtt_security"]
        assert sec == {"tls": True, "ca_file": "", "cert_file": "", "username": "host0",
                       "password": "from file"}  # fmt: skip
    else:
        assert "mqtt tls on, user host0, password from file" in out.stdout


def test_controller_options_refuse_an_unreadable_password_file_in_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "qpmesh.cli", "controller", "--broker", "mqtt://127.0.0.1:1",
            "--mqtt-user", "controller", "--mqtt-password-file", str(tmp_path / "missing")]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                         cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "password file" in lines[0] and "cannot read" in lines[0]
