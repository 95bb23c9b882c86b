"""The fleet end to end with the real cores: a 3-server NATS cluster, a real mosquitto, two
``qpmesh controller worker`` processes (FleetWorker per partition) and the solver in the
controller service (its live state's FleetSolver): the simulator's batches, published as each
host's prober would over JetStream, are all taken, each once, and judged window by window."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from contract.origin import split_by_host
from contract.records import ProbeBatch, encode_batch
from contract.topics import Topics
from controller.config import ServiceConfig, load_config
from controller.dispatch import JsonLog, nic_hosts
from controller.fleet.compose import SolverCore
from controller.fleet.partial import Partial
from controller.fleet.partials import Assembler
from controller.fleet.plane import partition_key
from controller.fleet.solver import SolveResult
from controller.live import LiveController
from controller.service import Broker, run_service
from mesh.fabric import FabricShape, build_fabric
from mqttlink.reconnect import stop_tasks
from natslink.errors import NatsUnavailable
from natslink.link import Link, connect
from natslink.streams import ensure_bucket, open_reader
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from tests.natscluster import Cluster, nats_cluster

__all__ = ["nats_cluster"]
ROOT = Path(__file__).resolve().parent.parent


def _shifted(batch: ProbeBatch, shift: int) -> ProbeBatch:
    """Return ``batch`` with its stamps moved by ``shift`` ns (unstamped ones left 0)."""
    cols = {k: np.where(getattr(batch, k) != 0, getattr(batch, k) + shift, 0)
            for k in ("t1", "t2", "t3", "t4")}  # fmt: skip
    return dataclasses.replace(batch, **cols)


SHARE_S, PUBLISH_S, COMMIT_S = 90.0, 60.0, 60.0
"""Each phase's bound in monotonic seconds (a loaded machine is slow, never stuck): with the
cluster's start they stay under pytest's 300 s, so a stuck phase fails by its own name."""


async def _publish(link: Link, subject: str, payload: bytes, msg_id: str, deadline: float) -> None:
    while True:  # a new R3 stream may still elect its leader
        try:
            await link.publish(subject, payload, msg_id=msg_id)
            return
        except NatsUnavailable:
            if time.monotonic() > deadline:
                raise AssertionError(f"the stream never answered {msg_id}") from None
            await asyncio.sleep(0.2)


class Committed:
    """Reads the partial stream as it grows: the records of every committed partial."""

    def __init__(self) -> None:
        self.asm, self.records, self.reader = Assembler(keep_windows=10_000), 0, None
        self.newest: dict[int, int] = {}  # partition: its newest committed window

    async def read(self, link: Link, config: ServiceConfig, deadline: float) -> int:
        assert config.fleet is not None and config.nats is not None
        if self.reader is None:
            self.reader = await open_reader(link, config.fleet.plane.partial_stream,
                                            config.nats.subjects.partials_all(), 1)  # fmt: skip
        while got := await self.reader.fetch(500, 0.5):  # up to what is stored now
            for d in got:
                c = self.asm.feed(d.headers, d.data)
                if c is not None:
                    self.newest[c.partition] = max(self.newest.get(c.partition, -1), c.window)
                if c is not None and c.body:
                    self.records += Partial.decode(c.body).counts.records
            if got[-1].pending == 0 or time.monotonic() > deadline:
                break
        return self.records


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("kill", [False, True], ids=["steady", "worker-killed"])
async def test_workers_and_solver_take_every_record_once(
    nats_cluster: Cluster, mosquitto: tuple[str, int], tmp_path: Path, kill: bool
) -> None:
    """Every record once; with ``kill``, one worker is killed (SIGKILL) mid-run: counted
    over the committed partials (the solver may have judged a window without the killed
    worker's partition: its partial is then late), every batch once, give or take a few
    records at window boundaries (see the assertion)."""
    host, port = mosquitto
    fab = build_fabric(FabricShape.for_nics(16))
    (tmp_path / "fabric.json").write_text(json.dumps(fab.to_dict()))
    servers = ", ".join(f'"{u}"' for u in nats_cluster.urls)
    conf = tmp_path / "controller.toml"
    # grace 2 s (the default), so the stream gap (the grace, >= 1 s) is four tick periods: at
    # load ~12 an idle partition's ticks were stored up to 1.7 s apart, and with a gap of 1 s
    # each such step is an "outage" the StreamClock holds its windows a grace for
    conf.write_text(
        '[fabric]\nfile = "fabric.json"\n[controller]\ntick_s = 0.5\n'
        f"[nats]\nservers = [{servers}]\ntimeout_s = 2\nconnect_timeout_s = 1\n"
        "backoff_min_s = 0.1\nbackoff_max_s = 0.5\n"
        "[fleet]\npartitions = 8\ngrace_s = 2\nsolver_wait_s = 2\nmax_bytes = 67108864\n"
        "duplicate_window_s = 60\n"
    )
    config = load_config(conf)
    assert config.fleet is not None and config.nats is not None
    workers = []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for ident in ("w1", "w2"):
        log = (tmp_path / f"{ident}.out").open("wb")
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "qpmesh.cli", "controller", "worker", "--config", str(conf),
             "--id", ident, "--log", str(tmp_path / f"{ident}.log")],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        ))  # fmt: skip
        log.close()
    records: list[int] = []
    counts: list[object] = []
    cores: list[SolverCore] = []

    class Counting(SolverCore):
        def solve(self, window: int, now_ns: int) -> SolveResult:
            result = super().solve(window, now_ns)
            records.append(result.counts.records)
            counts.append(result.counts)
            return result

    def fleet_core(live: LiveController) -> SolverCore:
        cores.append(Counting(live.solver))
        return cores[0]

    log_path = tmp_path / "solver.jsonl"
    log_file = log_path.open("w")
    topics = Topics("qpmesh/e2e")
    svc = asyncio.create_task(run_service(Broker(host, port, topics), config,
                                          log=JsonLog(log_file), fleet_core=fleet_core))  # fmt: skip
    try:
        async with connect(config.nats, "e2e") as link:
            leases = await ensure_bucket(link, config.fleet.plane.lease_bucket_spec())
            t_end, names = time.monotonic() + SHARE_S, []
            while True:  # the solver active, the partitions shared 4 + 4
                owners = [(await leases.get(partition_key(p))) for p in range(8)]
                names = [e.value.decode() for e in owners if e is not None]
                if "solver active" in log_path.read_text() and sorted(
                    names.count(w) for w in ("w1", "w2")
                ) == [4, 4]:
                    break
                assert time.monotonic() < t_end, ("the workers never shared the partitions",
                                                  names)  # fmt: skip
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # the given-back partitions' new owners start
            sim = Simulator(fab, SimConfig(peers=4, seed=7))
            sent = 0
            shift = time.time_ns() - EPOCH_NS - 500_000_000  # the simulator's time: now
            t_end = time.monotonic() + PUBLISH_S
            for i, step in enumerate(sim.run(4.0, 0.5)):
                for h, b in split_by_host(_shifted(step.batch, shift), nic_hosts(fab)).items():
                    await _publish(link, config.nats.subjects.probes(h), encode_batch(b),
                                   f"{h}:{b.batch_seq}", t_end)  # fmt: skip
                    sent += len(b)
                if kill and i == 3:
                    workers[0].kill()  # SIGKILL mid-run: w2 takes its partitions over
                    await asyncio.to_thread(workers[0].wait, 10)
                await asyncio.sleep(0.5)
            if kill:
                committed, t_end = Committed(), time.monotonic() + COMMIT_S
                while await committed.read(link, config, t_end) < sent:
                    if time.monotonic() > t_end:
                        break
                    await asyncio.sleep(0.5)
                # Known gap (docs/scale.md "Not done yet"): the core puts a record in the
                # window of its clock-corrected time, corrected with the models installed
                # when it came; a new owner that replays it with other models can move a
                # record near a window boundary: a few records, never a batch (150 here).
                assert abs(committed.records - sent) <= 10, (
                    committed.records, sent, "newest window per partition", committed.newest,
                    (tmp_path / "w2.log").read_text()[-3000:],
                )  # fmt: skip
                return
        t_end = time.monotonic() + COMMIT_S
        while sum(records) < sent and time.monotonic() < t_end:
            await asyncio.sleep(0.1)
        assert sum(records) == sent, (sum(records), sent, counts)
        from controller.fleet.solver import Added

        assert cores[0].added[Added.TAKEN] > 0
        assert cores[0].added[Added.OVERLAP] == 0 and cores[0].added[Added.DUPLICATE] == 0
    finally:
        async with asyncio.timeout(30):  # bounded: a stuck service fails the test here
            await stop_tasks([svc])  # cancelled again if a library's wait lost the cancel
        for p in workers:
            if p.poll() is None:
                p.terminate()
        for p in workers:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        log_file.close()
