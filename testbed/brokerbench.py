"""``python -m testbed.brokerbench``: the data plane's candidates measured on this machine.

Each engine runs on loopback from its Debian binary with its own temp directory, and is
stopped by PID: NATS JetStream (``nats-server``; a file stream of 1 server with R1, and of a
3-server cluster with R3), Redis Streams (``redis-server``, XADD, no persistence beyond its
defaults) and partitioned mosquitto (``--partitions`` independent brokers, QoS 1). One
publisher process per partition (NATS, Redis: one; mosquitto: one per broker), each keeping
``--inflight`` messages unacknowledged (JetStream PubAck of ``publish_async``, Redis reply,
MQTT PUBACK), sends
``--messages`` messages of ``--size`` bytes. Reported per engine: messages per second, the
servers' CPU seconds per message (``/proc/<pid>/stat`` utime + stime, all servers of the engine
summed) and the publishers' likewise. Clients are Python for every engine (nats-py, a
minimal RESP client, paho-mqtt), so publisher CPU is comparable across engines and the
servers' CPU per message is the figure to size brokers with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str) -> float:
    """Return utime + stime (s) of a ``/proc/<pid>/stat`` line (fields 14 and 15)."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def _cpu(pid: int) -> float:
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


@dataclass(frozen=True)
class Result:
    """One engine's figures."""

    engine: str
    messages: int
    size: int
    seconds: float
    msg_per_s: float
    server_cpu_us_per_msg: float
    client_cpu_us_per_msg: float
    servers: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Servers:
    """Server processes of one engine, stopped by PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            p = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def cpu(self) -> float:
        return sum(_cpu(p.pid) for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


# ---- publishers (each runs in its own process; returns its CPU seconds) ----------------------


def _nats_pub(urls: list[str], replicas: int, n: int, size: int, inflight: int) -> float:
    import nats
    from nats.js.api import StorageType, StreamConfig

    async def main() -> None:
        nc = await nats.connect(urls)
        js = nc.jetstream(timeout=30, publish_async_max_pending=inflight)
        for _ in range(100):
            try:
                await js.add_stream(StreamConfig(name="BENCH", subjects=["bench.>"],
                                                 num_replicas=replicas, storage=StorageType.FILE,
                                                 duplicate_window=120))  # fmt: skip
                break
            except Exception:
                await asyncio.sleep(0.2)
        payload = os.urandom(size)
        acks = [await js.publish_async(f"bench.h{i % 64}", payload,
                                       headers={"Nats-Msg-Id": f"m{i}"}) for i in range(n)]  # fmt: skip
        await asyncio.gather(*acks)
        await nc.close()

    asyncio.run(main())
    return time.process_time()


def _redis_pub(port: int, n: int, size: int, inflight: int) -> float:
    payload = os.urandom(size)
    cmd = (
        (b"*5\r\n$4\r\nXADD\r\n$5\r\nbench\r\n$1\r\n*\r\n$1\r\np\r\n$%d\r\n" % size)
        + payload
        + b"\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as s:
        f = s.makefile("rb")
        sent = got = 0
        while got < n:
            while sent < n and sent - got < inflight:
                s.sendall(cmd)
                sent += 1
            line = f.readline()
            if not line.startswith(b"$"):
                raise RuntimeError(f"redis said {line!r}")
            f.readline()  # the entry id
            got += 1
    return time.process_time()


def _mqtt_pub(port: int, n: int, size: int, inflight: int) -> float:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(CallbackAPIVersion.VERSION2)
    c.max_inflight_messages_set(inflight)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port)
    c.loop_start()
    payload = os.urandom(size)
    infos = [c.publish(f"bench/h{i % 64}", payload, qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(60)
    c.loop_stop()
    c.disconnect()
    return time.process_time()


def _run_clients(jobs: list[tuple[Callable[..., float], tuple[Any, ...]]]) -> tuple[float, float]:
    """Run each (function, args) in its own process; return (wall s, their CPU s summed)."""
    ctx = mp.get_context("fork")
    with ctx.Pool(len(jobs)) as pool:
        t0 = time.perf_counter()
        cpus = [r.get(600) for r in [pool.apply_async(fn, args) for fn, args in jobs]]
        return time.perf_counter() - t0, sum(cpus)


# ---- engines ---------------------------------------------------------------------------------


def bench_nats(root: Path, replicas: int, n: int, size: int, inflight: int) -> Result:
    """JetStream file stream with ``replicas`` (1: one server; 3: a 3-server cluster)."""
    from natslink.serverconf import ServerSpec, server_conf
    from natslink.subjects import Subjects

    exe = shutil.which("nats-server") or "/usr/sbin/nats-server"
    count = 1 if replicas == 1 else 3
    specs = [ServerSpec(f"b{i}", "127.0.0.1", _free_port(), _free_port(), str(root / f"n{i}"))
             for i in range(count)]  # fmt: skip
    servers = Servers()
    try:
        for s in specs:
            conf = root / f"{s.name}.conf"
            peers = specs if count > 1 else [s]
            conf.write_text(server_conf(s, peers, subjects=Subjects(), partitions=8))
            _wait_port(s.port, servers.start([exe, "-c", str(conf)], root / f"{s.name}.log"))
        urls = [f"nats://127.0.0.1:{s.port}" for s in specs]
        time.sleep(2.0 if count > 1 else 0.2)  # routes and the meta leader
        c0 = servers.cpu()
        wall, client = _run_clients([(_nats_pub, (urls, replicas, n, size, inflight))])
        return _result(f"nats-jetstream-R{replicas}", n, size, wall, servers.cpu() - c0, client,
                       count)  # fmt: skip
    finally:
        servers.stop()


def bench_redis(root: Path, n: int, size: int, inflight: int) -> Result:
    """Redis Streams: XADD to one stream (default persistence: none beyond RDB snapshots)."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = _free_port()
    servers = Servers()
    try:
        argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root),
                "--save", "", "--appendonly", "no"]  # fmt: skip
        _wait_port(port, servers.start(argv, root / "redis.log"))
        c0 = servers.cpu()
        wall, client = _run_clients([(_redis_pub, (port, n, size, inflight))])
        return _result("redis-streams", n, size, wall, servers.cpu() - c0, client, 1)
    finally:
        servers.stop()


def bench_mosquitto(root: Path, partitions: int, n: int, size: int, inflight: int) -> Result:
    """``partitions`` independent mosquitto brokers (QoS 1, no persistence), one publisher
    each, ``n`` messages in all."""
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    servers = Servers()
    try:
        ports = []
        for i in range(partitions):
            port = _free_port()
            conf = root / f"m{i}.conf"
            conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                            "persistence false\nmax_inflight_messages 0\n")  # fmt: skip
            _wait_port(port, servers.start([exe, "-c", str(conf)], root / f"m{i}.log"))
            ports.append(port)
        c0 = servers.cpu()
        per = n // partitions
        jobs = [(_mqtt_pub, (p, per, size, inflight)) for p in ports]
        wall, client = _run_clients(jobs)  # type: ignore[arg-type]
        return _result(f"mosquitto-x{partitions}", per * partitions, size, wall,
                       servers.cpu() - c0, client, partitions)  # fmt: skip
    finally:
        servers.stop()


def _result(engine: str, n: int, size: int, wall: float, server: float, client: float,
            count: int) -> Result:  # fmt: skip
    return Result(engine, n, size, round(wall, 3), round(n / wall, 1),
                  round(server / n * 1e6, 1), round(client / n * 1e6, 1), count)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print a table or JSON."""
    ap = argparse.ArgumentParser(prog="python -m testbed.brokerbench", description=__doc__)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--size", type=int, default=32 << 10)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--partitions", type=int, default=2, help="mosquitto brokers")
    ap.add_argument("--engines", default="nats-r1,nats-r3,redis,mosquitto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = []
    with tempfile.TemporaryDirectory(prefix="qpmesh-brokerbench-") as tmp:
        for i, engine in enumerate(args.engines.split(",")):
            root = Path(tmp) / f"{i}-{engine}"
            root.mkdir()
            n, size, infl = args.messages, args.size, args.inflight
            if engine == "nats-r1":
                out.append(bench_nats(root, 1, n, size, infl))
            elif engine == "nats-r3":
                out.append(bench_nats(root, 3, n, size, infl))
            elif engine == "redis":
                out.append(bench_redis(root, n, size, infl))
            elif engine == "mosquitto":
                out.append(bench_mosquitto(root, args.partitions, n, size, infl))
            else:
                print(f"unknown engine {engine!r}", file=sys.stderr)
                return 2
    if args.json:
        print(json.dumps({"load_avg": os.getloadavg()[0], "results": [asdict(r) for r in out]}))
    else:
        for r in out:
            print(f"{r.engine:22} {r.msg_per_s:9.0f} msg/s  server {r.server_cpu_us_per_msg:6.1f}"
                  f" us/msg  client {r.client_cpu_us_per_msg:6.1f} us/msg")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
