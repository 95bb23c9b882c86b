"""The chaos run's broker keeps its sessions across a SIGKILL (issue 32): with a store
(`testbed.runner.mosquitto_conf`) a restarted mosquitto still holds the controller's
persistent session (MQTT 5, ``[mqtt] session``) and the monitor's (MQTT 3.1.1, clean session
off), and queues for them what the probers publish before they are back; without one it
forgets both (the loss the chaos runs measured at the broker's kill)."""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from controller.config import load_config
from controller.service import session_kwargs
from testbed.runner import MOSQUITTO, mosquitto_conf

BINARY = MOSQUITTO if os.path.exists(MOSQUITTO) else shutil.which("mosquitto")
pytestmark = pytest.mark.skipif(BINARY is None, reason="mosquitto binary not installed")
V5 = aiomqtt.ProtocolVersion.V5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"mosquitto not listening on {port}")


class Broker:
    """A mosquitto on a free loopback port with the run's config, killed by pid."""

    def __init__(self, tmp: Path, store: Path | None) -> None:
        self.port = _free_port()
        self.conf = tmp / "mosquitto.conf"
        user = pwd.getpwuid(os.geteuid()).pw_name
        self.conf.write_text(mosquitto_conf(("127.0.0.1", self.port), store, user))
        self.log = tmp / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert BINARY is not None
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen([BINARY, "-c", str(self.conf)], stdout=fh,
                                         stderr=subprocess.STDOUT)  # fmt: skip
        _listening(self.port, self.proc)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[list[Broker]]:
    made: list[Broker] = []
    try:
        yield made
    finally:
        for b in made:
            b.kill()


def _saved_after(store: Path, t_ns: int, timeout_s: float = 20.0) -> None:
    """Wait until the broker has written its store after ``t_ns`` (its autosave)."""
    deadline = time.monotonic() + timeout_s
    db = store / "mosquitto.db"
    while time.monotonic() < deadline:
        if db.exists() and db.stat().st_mtime_ns > t_ns:
            return
        time.sleep(0.05)
    raise TimeoutError("the broker never saved its store")


async def _collect(client: aiomqtt.Client, n: int, timeout_s: float) -> list[bytes]:
    got: list[bytes] = []
    with_timeout = asyncio.timeout(timeout_s)
    try:
        async with with_timeout:
            async for msg in client.messages:
                got.append(bytes(msg.payload))  # type: ignore[arg-type]
                if len(got) == n:
                    break
    except TimeoutError:
        pass
    return got


async def _kill_restart_publish(
    broker: Broker, tmp_path: Path, store: Path | None
) -> tuple[list[bytes], list[bytes]]:
    """Subscribe the controller's and the monitor's sessions, SIGKILL and restart the
    broker, publish three batches before either is back; return what each then got."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[mqtt]\nsession = "ctl-{secrets.token_hex(4)}"\n')
    ctl_kw = session_kwargs(load_config(cfg))
    mon_kw = {"identifier": f"mon-{secrets.token_hex(4)}", "clean_session": False}
    topic = f"qpmesh-test-{secrets.token_hex(4)}/probes/host1"
    host, port = "127.0.0.1", broker.port
    broker.start()
    async with aiomqtt.Client(host, port, protocol=V5, **ctl_kw) as ctl:
        await ctl.subscribe(topic, qos=1)
    async with aiomqtt.Client(host, port, **mon_kw) as mon:
        await mon.subscribe(topic, qos=1)
    subscribed = time.time_ns()
    if store is not None:
        await asyncio.to_thread(_saved_after, store, subscribed)
    broker.kill()
    broker.start()
    async with aiomqtt.Client(host, port, protocol=V5) as prober:  # before they are back
        for i in range(3):
            await prober.publish(topic, f"batch{i}".encode(), qos=1)
    wait = 10.0 if store is not None else 1.0  # nothing comes without a store
    async with aiomqtt.Client(host, port, protocol=V5, **ctl_kw) as ctl:  # back: no subscribe
        got_ctl = await _collect(ctl, 3, wait)
    async with aiomqtt.Client(host, port, **mon_kw) as mon:
        got_mon = await _collect(mon, 3, wait)
    return got_ctl, got_mon


async def test_a_durable_broker_keeps_the_sessions_across_its_sigkill(
    tmp_path: Path, broker_factory: list[Broker]
) -> None:
    store = tmp_path / "store"
    conf = mosquitto_conf(("127.0.0.1", 1883), store)
    assert "persistence true" in conf and f"persistence_location {store}/" in conf
    assert store.is_dir()  # made for the broker
    broker = Broker(tmp_path, store)
    broker_factory.append(broker)
    got_ctl, got_mon = await _kill_restart_publish(broker, tmp_path, store)
    assert got_ctl == [b"batch0", b"batch1", b"batch2"]
    assert got_mon == [b"batch0", b"batch1", b"batch2"]


async def test_without_a_store_the_restarted_broker_forgets_the_sessions(
    tmp_path: Path, broker_factory: list[Broker]
) -> None:
    assert "persistence false" in mosquitto_conf(("127.0.0.1", 1883))
    broker = Broker(tmp_path, None)
    broker_factory.append(broker)
    got_ctl, got_mon = await _kill_restart_publish(broker, tmp_path, None)
    assert got_ctl == [] and got_mon == []
