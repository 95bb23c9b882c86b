"""Probers in separate network namespaces exchange real UDP probes through a real mosquitto.

Topology (made here, unique names, torn down in ``finally``): a bridge in the root namespace
holding the broker's address ``10.213.<k>.1``; each prober namespace hangs off it by a veth
pair with address ``10.213.<k>.<10+i>``. Each prober runs as
``ip netns exec NS .venv/bin/qpmesh prober --config ...`` and is stopped by its PID.

The broker keeps a persistent session for the test's subscriber (``persistence true``,
``clean_session=False``) so that messages published while the subscriber reconnects after the
outage are queued for it, as a production controller would set up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from contract.records import MISSING, ProbeBatch, decode_batch
from prober.agent import plan_peers
from prober.config import load_config
from prober.schedule import ProbePlan

REPO = Path(__file__).resolve().parents[1]
QPMESH = REPO / ".venv" / "bin" / "qpmesh"
MOSQUITTO = "/usr/sbin/mosquitto"

pytestmark = [pytest.mark.netns, pytest.mark.broker, pytest.mark.slow]


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


def _can_netns() -> str:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 'ip' not installed"
    if not os.path.exists(MOSQUITTO):
        return "mosquitto not installed"
    name = f"qpmchk{os.getpid() % 100000}"
    try:
        _sh("ip", "netns", "add", name)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create network namespaces: {exc}"
    _sh("ip", "netns", "del", name)
    return ""


@dataclass
class Mesh:
    uid: str
    subnet: str  # "10.213.K"
    tmp: Path
    namespaces: list[str] = field(default_factory=list)
    broker_port: int = 0
    broker: subprocess.Popen[bytes] | None = None
    probers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def broker_addr(self) -> str:
        return f"{self.subnet}.1"

    def start_broker(self) -> None:
        conf = self.tmp / "mosquitto.conf"
        (self.tmp / "mdb").mkdir(exist_ok=True)
        conf.write_text(
            f"listener {self.broker_port} {self.broker_addr}\nallow_anonymous true\n"
            f"persistence true\npersistence_location {self.tmp / 'mdb'}/\n"
            "max_queued_messages 100000\nlog_dest stderr\nlog_type error\nlog_type warning\n"
        )
        log = (self.tmp / "mosquitto.log").open("ab")
        self.broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.broker.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {(self.tmp / 'mosquitto.log').read_text()}")
            with contextlib.suppress(OSError):
                socket.create_connection((self.broker_addr, self.broker_port), 0.2).close()
                return
            time.sleep(0.05)
        raise RuntimeError("mosquitto did not start listening")

    def stop_broker(self) -> None:
        if self.broker is not None and self.broker.poll() is None:
            self.broker.send_signal(signal.SIGTERM)
            try:
                self.broker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.broker.kill()
                self.broker.wait(timeout=5)
        self.broker = None

    def config(self, i: int, n: int) -> Path:
        peers = "".join(
            f'[[peers]]\nid = "nic{j}"\naddress = "{self.subnet}.{10 + j}"\n'
            for j in range(n)
            if j != i
        )
        path = self.tmp / f"prober{i}.toml"
        path.write_text(
            f'[prober]\nhost = "host{i}"\nport = 4791\ntimeout_ms = 500\nbatch_interval_ms = 250\n'
            f"[schedule]\nrate_hz = 10.0\npaths = 4\nseed = 7\n"
            f'[mqtt]\nhost = "{self.broker_addr}"\nport = {self.broker_port}\ntimeout_s = 2.0\n'
            f"backoff_min_s = 0.1\nbackoff_max_s = 1.0\nkeepalive_s = 5\n"
            f"[telemetry]\ninterval_s = 1.0\n"
            f'[[nics]]\nid = "nic{i}"\naddress = "{self.subnet}.{10 + i}"\n'
            f'device = "qpp{self.uid}{i}"\n' + peers
        )
        return path

    def start_prober(self, i: int, n: int) -> None:
        ns = self.namespaces[i]
        log = (self.tmp / f"prober{i}.log").open("ab")
        cmd = ["ip", "netns", "exec", ns, str(QPMESH), "prober", "--config", str(self.config(i, n))]
        self.probers[f"host{i}"] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log)

    def stop_probers(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for proc in self.probers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for host, proc in self.probers.items():
            try:
                codes[host] = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[host] = proc.wait(timeout=5)
        return codes

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.tmp.glob("*.log"))
        )


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    """Three namespaces on a bridge, a broker on the bridge address; all cleaned up."""
    reason = _can_netns()
    if reason:
        pytest.skip(reason)
    uid = f"{os.getpid() % 1000:03d}{random.randrange(100):02d}"
    m = Mesh(uid, f"10.213.{random.randrange(1, 250)}", tmp_path)
    bridge = f"qpb{uid}"
    try:
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{m.broker_addr}/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        for i in range(3):
            ns = f"qpm{uid}n{i}"
            _sh("ip", "netns", "add", ns)
            m.namespaces.append(ns)
            host_end, ns_end = f"qpv{uid}{i}", f"qpp{uid}{i}"
            _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end, "netns", ns)
            _sh("ip", "link", "set", host_end, "master", bridge, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{m.subnet}.{10 + i}/24", "dev", ns_end)
            _sh("ip", "-n", ns, "link", "set", ns_end, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        with socket.socket() as s:
            s.bind((m.broker_addr, 0))
            m.broker_port = s.getsockname()[1]
        m.start_broker()
        yield m
    finally:
        for proc in m.probers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        m.stop_broker()
        for ns in m.namespaces:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], check=False, capture_output=True)


class Subscriber:
    """Persistent-session subscriber that reconnects across broker restarts."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.batches: list[ProbeBatch] = []
        self.raw_count = 0
        self.connected = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                async with aiomqtt.Client(self.mesh.broker_addr, self.mesh.broker_port,
                                          identifier=f"qpm-test-{self.mesh.uid}",
                                          clean_session=False, timeout=3) as c:  # fmt: skip
                    await c.subscribe("qpmesh/v1/probes/#", qos=1, timeout=3)
                    self.connected.set()
                    async for msg in c.messages:
                        self.raw_count += 1
                        self.batches.append(decode_batch(bytes(msg.payload)))  # type: ignore[arg-type]
            except aiomqtt.MqttError:
                self.connected.clear()
                await asyncio.sleep(0.1)


def dedupe(batches: list[ProbeBatch]) -> list[ProbeBatch]:
    """Drop repeated (origin, batch_seq), as the controller's ingest does."""
    seen: set[tuple[str, int]] = set()
    out = []
    for b in batches:
        key = (b.origin, b.batch_seq)
        if key not in seen:
            seen.add(key)
            out.append(b)
    return out


def expected_ports(mesh: Mesh, i: int) -> set[int]:
    cfg = load_config(mesh.tmp / f"prober{i}.toml")
    return set(ProbePlan(plan_peers(cfg), cfg.schedule, start_ns=0).ports[f"nic{i}"])


async def _wait_for(cond: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)


async def test_probers_in_namespaces_exchange_probes(mesh: Mesh) -> None:
    sub = Subscriber(mesh)
    task = asyncio.create_task(sub.run())
    try:
        await asyncio.wait_for(sub.connected.wait(), 10)
        for i in range(3):
            mesh.start_prober(i, 3)
        await _wait_for(lambda: {b.origin for b in sub.batches if (~b.lost).sum()} >= {"host0", "host1", "host2"}
                        and sum(int((~b.lost).sum()) for b in sub.batches) >= 60, 20)  # fmt: skip
        codes = mesh.stop_probers()
        await asyncio.sleep(0.5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert all(c == 0 for c in codes.values()), (codes, mesh.logs())
    batches = dedupe(sub.batches)
    assert {b.origin for b in batches} == {"host0", "host1", "host2"}, mesh.logs()
    for b in batches:
        i = int(b.origin[-1])
        ok = b.select(~b.lost)
        if not len(ok):
            continue
        src = {ok.nic_ids[s] for s in ok.src}
        dst = {ok.nic_ids[d] for d in ok.dst}
        assert src == {f"nic{i}"} and dst <= {f"nic{j}" for j in range(3)} - {f"nic{i}"}
        assert set(ok.sport.tolist()) <= expected_ports(mesh, i)
        for t in (ok.t1, ok.t2, ok.t3, ok.t4):
            assert (t != MISSING).all()
        # one host clock for all namespaces: each leg is a small positive delay
        fwd, rev = ok.t2 - ok.t1, ok.t4 - ok.t3
        rtt = (ok.t4 - ok.t1) - (ok.t3 - ok.t2)
        assert ((fwd > 0) & (fwd < 20_000_000)).all(), fwd
        assert ((rev > 0) & (rev < 20_000_000)).all(), rev
        assert ((rtt > 0) & (rtt < 20_000_000)).all()
        assert ok.stamp == "sw" and ok.dport == 4791
    sports = {(b.origin, int(s)) for b in batches for s in b.select(~b.lost).sport.tolist()}
    assert len(sports) >= 6  # the ECMP sweep really varies the source port
    coded = [b for b in batches if (b.pair >= 0).any()]
    assert coded  # coded pairs are recorded with their pair id


async def test_broker_outage_loses_and_repeats_nothing(mesh: Mesh) -> None:
    sub = Subscriber(mesh)
    task = asyncio.create_task(sub.run())
    try:
        await asyncio.wait_for(sub.connected.wait(), 10)
        for i in range(2):
            mesh.start_prober(i, 2)
        await _wait_for(lambda: {b.origin for b in sub.batches} >= {"host0", "host1"}, 15)
        await asyncio.sleep(1.0)
        outage_start = time.time_ns()
        mesh.stop_broker()  # by PID
        await asyncio.sleep(10.0)
        outage_end = time.time_ns()
        mesh.start_broker()  # same port, same persistence
        await asyncio.sleep(4.0)  # probers reconnect (backoff <= 1 s) and drain their spools
        codes = mesh.stop_probers()
        await _wait_for(lambda: False, 2.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert all(c == 0 for c in codes.values()), (codes, mesh.logs())
    batches = dedupe(sub.batches)
    print(f"raw messages {sub.raw_count}, distinct batches {len(batches)}")
    for origin in ("host0", "host1"):
        mine = [b for b in batches if b.origin == origin]
        arrival = [b.batch_seq for b in sub.batches if b.origin == origin]
        assert arrival == sorted(arrival), f"{origin} batches out of order"
        seq = np.concatenate([b.seq for b in mine]).astype(np.int64)
        t1 = np.concatenate([b.t1 for b in mine])
        counts = Counter(seq.tolist())
        dup = [s for s, c in counts.items() if c > 1]
        assert not dup, f"{origin}: records delivered twice: {dup[:10]}"
        assert sorted(counts) == list(range(int(seq.max()) + 1)), (
            f"{origin}: missing seqs {sorted(set(range(int(seq.max()) + 1)) - set(counts))[:20]}"
        )
        during = (t1 > outage_start) & (t1 < outage_end)
        # 10 s at 10 coded pairs/s to one peer: ~200 probes sent while the broker was down
        assert during.sum() >= 150, (origin, int(during.sum()), mesh.logs())
        assert (t1 > outage_end).any()
