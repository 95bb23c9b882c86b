"""The controller service's live state while the fleet's solve runs in a worker thread (edge
owners: `controller.fleet.solverloop.SolverLoop.threaded`): a host fact that comes while a
solve is in flight is applied after it, in arrival order, on the loop, and the shared core
is never touched from two threads at once; without the gate (the one-process service) a
host fact is applied at once, as before. No broker: the solver's bucket is a stand-in."""

from __future__ import annotations

import asyncio
import io
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from contract.documents import EventDoc, PresenceDoc
from contract.topics import Topics
from controller.config import FleetShellConfig, ServiceConfig
from controller.dispatch import JsonLog
from controller.fleet.book import WindowBook
from controller.fleet.plane import Plane
from controller.fleet.solverloop import SolverLoop
from controller.service import Broker, Wiring, apply_message, live_state
from mesh.fabric import FabricShape, build_fabric
from natslink.lease import LeaseClock
from natslink.settings import NatsSettings

PLANE = Plane(partitions=2, window_ns=1_000_000_000, grace_ns=100_000_000,
              solver_wait_ns=100_000_000, max_bytes=1 << 20, duplicate_window_s=60)  # fmt: skip


@dataclass
class Result:
    clock: bytes = b""
    events: list[EventDoc] = field(default_factory=list)


@dataclass
class Calls:
    """Every call on the shared state: (what, thread id), and whether a solve is inside."""

    seen: list[tuple[str, int]] = field(default_factory=list)
    inside: int = 0
    overlaps: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, what: str) -> None:
        with self.lock:
            self.seen.append((what, threading.get_ident()))
            if self.inside:
                self.overlaps += 1
            self.inside += 1

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


class Core:
    """A solver core's stand-in: its solve waits in its thread until released."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.started, self.release = threading.Event(), threading.Event()

    def add(self, body: bytes) -> None:
        self.calls.enter("add")
        self.calls.leave()

    def solve(self, window: int, now_ns: int) -> Result:
        self.calls.enter(f"solve {window}")
        self.started.set()
        try:
            assert self.release.wait(60), "never released"
        finally:
            self.calls.leave()
        return Result()


class Bucket:
    async def put(self, key: str, value: bytes) -> int:
        return 1


class Clocks:
    def __init__(self) -> None:
        self.bucket = Bucket()

    async def put(self, key: str, value: bytes) -> int:
        return 1


def _wiring(calls: Calls, gate: asyncio.Lock | None, monkeypatch: pytest.MonkeyPatch) -> Wiring:
    fab = build_fabric(FabricShape.for_nics(8))
    settings = NatsSettings(servers=("nats://127.0.0.1:1",))
    config = ServiceConfig(fabric=fab, tick_s=0.1, nats=settings,
                           fleet=FleetShellConfig(PLANE, "solver-1"))  # fmt: skip
    live = live_state(config)
    presence = live.presence

    def recorded(host: str, alive: bool, now_ns: int, *, since_ns: int = 0) -> None:
        calls.enter(f"presence {host}")
        try:
            presence(host, alive, now_ns, since_ns=since_ns)
        finally:
            calls.leave()

    monkeypatch.setattr(live, "presence", recorded)
    log = JsonLog(io.StringIO())
    return Wiring(Broker("127.0.0.1", 1, Topics("qpmesh/gate")), config, live,
                  lambda: 5_000_000_000, log, gate=gate)  # fmt: skip


async def _solve_with_facts(w: Wiring, gate: asyncio.Lock | None, calls: Calls) -> list[str]:
    """Start a threaded solve, send two hosts' presence while it is in flight (as the
    message loop does: one after the other), then release the solve; return the outcomes."""
    core = Core(calls)
    loop = SolverLoop(PLANE, NatsSettings(servers=("nats://127.0.0.1:1",)), "solver-1",
                      lambda: core, lambda w, r: None, log=lambda *a, **k: None,
                      solve_in_thread=False, gate=gate)  # fmt: skip
    loop.solve_in_thread = True  # as with edge owners: the solve runs in a thread
    assert loop.threaded
    clocks: Any = Clocks()
    solving = asyncio.create_task(loop._solve(core, clocks, WindowBook(PLANE, None), 3))
    while not core.started.is_set():
        await asyncio.sleep(0.01)
    hosts = sorted({n.host for n in w.live.fabric.nics})[:2]
    alive = PresenceDoc(alive=True, t_ns=1).encode()

    async def facts() -> list[str]:
        return [await apply_message(w, w.broker.topics.presence(h), alive) for h in hosts]

    applying = asyncio.create_task(facts())
    for _ in range(20):  # the loop runs on meanwhile (the solve does not block it)
        await asyncio.sleep(0)
    held = [what for what, _ in calls.seen]
    core.release.set()
    await solving
    outcomes = await applying
    assert outcomes == ["presence", "presence"]
    return held


async def test_a_host_fact_during_a_threaded_solve_waits_for_it_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls()
    gate = asyncio.Lock()
    w = _wiring(calls, gate, monkeypatch)
    held = await _solve_with_facts(w, gate, calls)
    assert held == ["solve 3"]  # nothing applied while the solve was in flight
    hosts = sorted({n.host for n in w.live.fabric.nics})[:2]
    assert [what for what, _ in calls.seen] == ["solve 3", *(f"presence {h}" for h in hosts)]
    loop_thread = threading.get_ident()
    solve_thread = calls.seen[0][1]
    assert solve_thread != loop_thread  # the solve ran in a worker thread
    assert all(t == loop_thread for _, t in calls.seen[1:])  # host facts on the loop
    assert calls.overlaps == 0
    assert not gate.locked()


async def test_without_a_gate_a_host_fact_is_applied_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls()
    w = _wiring(calls, None, monkeypatch)
    held = await _solve_with_facts(w, None, calls)
    assert len(held) == 3 and calls.overlaps == 2  # the race the gate closes


class Lease:
    """The solver's lease's stand-in: counts renewals; lost after ``lose_after`` of them."""

    def __init__(self, renew_s: float, lose_after: int) -> None:
        self.clock = LeaseClock(renew_s * 3, renew_s)
        self.renewals, self.lose_after = 0, lose_after
        self.renewed = threading.Event()

    async def renew(self) -> list[str]:
        self.renewals += 1
        if self.renewals >= 2:
            self.renewed.set()
        return []

    def valid(self, key: str) -> bool:
        return self.renewals < self.lose_after


class PutCounter(Clocks):
    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    async def put(self, key: str, value: bytes) -> int:
        self.puts += 1
        return 1


@pytest.mark.parametrize("lose_after", [99, 2], ids=["kept", "lost"])
async def test_the_lease_is_renewed_while_a_threaded_solve_waits(lose_after: int) -> None:
    """A solve in a thread that outlasts the lease's renewal time (a stage call to an owner
    killed while it held the call waits ``edge_wait_s``) renews the lease meanwhile; one lost
    meanwhile publishes nothing."""
    lease = Lease(0.05, lose_after)

    class Slow(Core):
        def solve(self, window: int, now_ns: int) -> Result:
            assert lease.renewed.wait(60), "the lease was not renewed during the solve"
            return Result(clock=b"state")

    calls = Calls()
    core = Slow(calls)
    results: list[int] = []
    loop = SolverLoop(PLANE, NatsSettings(servers=("nats://127.0.0.1:1",)), "solver-1",
                      lambda: core, lambda w, r: results.append(w), log=lambda *a, **k: None,
                      gate=asyncio.Lock())  # fmt: skip
    loop.lease = lease  # type: ignore[assignment]
    clocks: Any = PutCounter()
    await loop._solve(core, clocks, WindowBook(PLANE, None), 3)
    assert lease.renewals >= 2
    assert (results, clocks.puts) == (([3], 1) if lose_after == 99 else ([], 0))
