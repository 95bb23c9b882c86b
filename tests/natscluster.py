"""A private NATS cluster for tests: N nats-servers with routes and JetStream on free loopback
ports, each with its own temp store, stopped by PID (also on failure).

``nats_cluster`` (fixture): 3 servers, partitions 8, yields a `Cluster` (``Cluster(root, 1,
max_payload="64KB")``: one server taking messages up to 64 KB); `Cluster.kill(i)`
sends SIGKILL to server i, `Cluster.start(i)` starts it again on its ports and store.
Skipped when nats-server is not installed. `read_stored` reads every message a stream holds
on a subject now (waiting through slow fetches, never stopping at the first empty one).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from natslink.link import Link
from natslink.serverconf import ServerSpec, server_conf
from natslink.streams import Delivery, open_reader
from natslink.subjects import Subjects
from tests.servers import free_ports

NATS_SERVER = "/usr/sbin/nats-server"


def binary() -> str | None:
    """Return the nats-server binary, None if not installed."""
    return NATS_SERVER if os.path.exists(NATS_SERVER) else shutil.which("nats-server")


class Cluster:
    """``n`` servers under ``root``; `urls` are their client URLs."""

    def __init__(
        self, root: Path, n: int = 3, partitions: int = 8, prefix: str = "qpmesh.v1",
        max_payload: str | None = None,
    ) -> None:  # fmt: skip
        exe = binary()
        if exe is None:
            pytest.skip("nats-server not installed")
        self.exe, self.root, self.partitions = exe, root, partitions
        self.max_payload = max_payload  # None: natslink.serverconf's
        ports = free_ports(3 * n)
        tag = f"t{os.getpid()}x{ports[0]}"
        self.specs = [
            ServerSpec(f"{tag}n{i}", "127.0.0.1", ports[3 * i], ports[3 * i + 1],
                       str(root / f"n{i}" / "js"), ports[3 * i + 2])
            for i in range(n)
        ]  # fmt: skip
        self.subjects = Subjects(prefix)
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.logs: list[Path] = [root / f"n{i}.log" for i in range(n)]

    @property
    def urls(self) -> tuple[str, ...]:
        """Return every server's client URL."""
        return tuple(f"nats://{s.host}:{s.port}" for s in self.specs)

    def start(self, i: int) -> None:
        """Start server ``i`` (its config written from `natslink.serverconf.server_conf`)."""
        spec = self.specs[i]
        Path(spec.store_dir).mkdir(parents=True, exist_ok=True)
        conf = self.root / f"n{i}.conf"
        extra = {"max_payload": self.max_payload} if self.max_payload else {}
        conf.write_text(server_conf(spec, self.specs, subjects=self.subjects,
                                    partitions=self.partitions, max_file="1G", **extra))  # fmt: skip
        with self.logs[i].open("ab") as log:
            self.procs[i] = subprocess.Popen([self.exe, "-c", str(conf)], stdout=log,
                                             stderr=subprocess.STDOUT)  # fmt: skip

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` and reap it."""
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
        self.procs[i] = None

    def stop(self) -> None:
        """Stop every server by its PID (TERM, then KILL)."""
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill(i)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until every running server reports healthy JetStream (its /healthz)."""
        import urllib.request

        deadline = time.monotonic() + timeout_s
        for i, spec in enumerate(self.specs):
            p = self.procs[i]
            if p is None:
                continue
            url = f"http://{spec.host}:{spec.monitor_port}/healthz"
            while True:
                if p.poll() is not None:
                    raise RuntimeError(
                        f"nats-server {i} exited: {self.logs[i].read_text()[-2000:]}"
                    )
                try:
                    with urllib.request.urlopen(url, timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server {i} not healthy in {timeout_s}s")
                time.sleep(0.1)


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three nats-servers with routes and JetStream on free loopback ports (partitions 8)."""
    cluster = Cluster(tmp_path / "nats")
    try:
        for i in range(len(cluster.specs)):
            cluster.start(i)
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


async def read_stored(
    link: Link, stream: str, subject: str, bound_s: float = 60.0
) -> list[Delivery]:
    """Return every message ``stream`` holds on ``subject`` now, in order. The count comes
    from the server when the reader starts; an empty fetch (a busy machine, a leader still
    answering) is waited through, up to ``bound_s`` monotonic seconds, then AssertionError."""
    reader = await open_reader(link, stream, subject, 1)
    try:
        want, got = await reader.pending(), list[Delivery]()
        deadline = time.monotonic() + bound_s
        while len(got) < want:
            assert time.monotonic() < deadline, f"read {len(got)} of {want} on {subject}"
            got += await reader.fetch(min(500, want - len(got)), 1.0)
        return got
    finally:
        await reader.close()
