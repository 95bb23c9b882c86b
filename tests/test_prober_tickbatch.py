"""One C call per tick for all NICs (`prober._fastpath.tick_all`, `CompiledDriver` with
``batch``) and the schedule's rows queued in one call (`prober._fastpath.queue_rows`): the same
probes, pair ids, times and records as the per-NIC path they replace, on the same traffic."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import pytest

from prober import compiled
from prober.agent import Agent
from prober.compiled import CompiledSession, CompiledUdpEndpoint
from prober.drive import CompiledDriver
from prober.events import ProbeResult
from tests.loopexchange import LO, events_of, exchange
from tests.test_prober_agent import FakeEndpoint, config

pytestmark = pytest.mark.skipif(not compiled.compiled_ok(), reason="compiled path not available")


class _Ep(FakeEndpoint):
    """A compiled NIC endpoint as the agent's queueing sees it (its session's engine; the
    source ports it was asked to open)."""

    def __init__(self, session: CompiledSession, offset: int) -> None:
        super().__init__(offset)
        self.session = self.csession = session
        self.engine = session.engine
        self.opened: list[int] = []
        self.closed = False

    def add_source_port(self, port: int) -> int:
        self.opened.append(port)
        return port


def _queued(session: CompiledSession) -> list[tuple[Any, ...]]:
    """The session's engine queue with peer indices as names (the two paths number peers in
    different orders: on first use vs. at the stream table's build)."""
    names = session._dsts_frozen
    return [(at, names[dst], *rest) for at, dst, *rest in session.engine.queued()]


def _old_and_new(coded: bool) -> tuple[dict[str, Agent], Any]:
    """Two agents ("old", "new") of one config, coded pairs or not, on the compiled hot path
    with fake endpoints (the NICs' clocks 5 s ahead of the plan's), and a stand-in driver of
    the new one's engines and endpoints."""
    cfg = config()
    cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, coded=coded))
    agents: dict[str, Agent] = {}
    for name in ("old", "new"):
        agent = Agent(cfg, now_ns=lambda: 0)
        assert agent.hot_path == "compiled"
        agent.sessions = {n: CompiledSession(n) for n in ("nic0", "nic1")}
        agent.endpoints = {n: _Ep(agent.sessions[n], 5 * 10**9)  # type: ignore[misc,arg-type]
                           for n in ("nic0", "nic1")}  # fmt: skip
        agents[name] = agent
    eps = list(agents["new"].endpoints.values())
    driver: Any = type("D", (), {"engines": tuple(e.engine for e in eps), "endpoints": eps})
    return agents, driver


def _clocks_at(agents: dict[str, Agent], plan_now: int) -> None:
    """Set every fake endpoint's clock to just after ``plan_now``."""
    for agent in agents.values():
        for ep in agent.endpoints.values():
            ep.t = plan_now + 1234  # type: ignore[attr-defined]


def test_queue_rows_queues_what_queue_pair_did() -> None:
    """`Agent._queue_rows_batched` (one `queue_rows` call per tick) against `Agent._queue_rows`
    (a `queue_pair` per coded pair): every engine holds the same probes (peer, address, source
    port, time in the NIC's clock, pair id, position, spacing) in the same order, coded pairs
    and single probes, NIC clock ahead of the plan's; the source ports without a socket are
    handed to their endpoint to open."""
    for coded in (True, False):
        agents, driver = _old_and_new(coded)
        for tick in range(1, 400):
            plan_now = tick * 10_000_000
            _clocks_at(agents, plan_now)
            lead = plan_now + 10_000_000
            agents["old"]._queue_rows(agents["old"].plan.due_rows(lead), plan_now)
            agents["new"]._queue_rows_batched(driver, agents["new"].plan.due_rows(lead), plan_now)
        for nic in ("nic0", "nic1"):
            old = _queued(agents["old"].sessions[nic])  # type: ignore[arg-type]
            new = _queued(agents["new"].sessions[nic])  # type: ignore[arg-type]
            assert len(old) > 100 and new == old
            assert {q[-1] >= 0 for q in new} == {coded}  # a spacing: a coded pair
            opened = agents["new"].endpoints[nic].opened  # type: ignore[attr-defined]
            assert set(opened) == {q[5] for q in new}  # no socket yet: opened
        assert agents["new"].stats.probes_queued == agents["old"].stats.probes_queued


def test_queue_plan_queues_what_queue_pair_did() -> None:
    """`Agent._queue_plan_batched` (the compiled plan pops its due rows into the engines,
    `prober._fastpath.queue_plan`) against `Agent._queue_rows` (the Python plan's rows, a
    `queue_pair` per coded pair): every engine holds the same probes in the same order, coded
    pairs and single probes, NIC clock ahead of the plan's, the plan compiled after a few ticks
    of the other path; source ports without a socket are handed to their endpoint to open;
    the same probes counted."""
    for coded in (True, False):
        agents, driver = _old_and_new(coded)
        new = agents["new"]
        for tick in range(1, 400):
            plan_now = tick * 10_000_000
            _clocks_at(agents, plan_now)
            lead = plan_now + 10_000_000
            agents["old"]._queue_rows(agents["old"].plan.due_rows(lead), plan_now)
            if tick < 7:  # the Python plan's rows, one call per tick
                new._queue_rows_batched(driver, new.plan.due_rows(lead), plan_now)
                continue
            assert new.plan.compile()
            new._queue_plan_batched(driver, lead, plan_now)
        assert new._core_targets is new.plan.core is not None
        for nic in ("nic0", "nic1"):
            old_q = _queued(agents["old"].sessions[nic])  # type: ignore[arg-type]
            new_q = _queued(new.sessions[nic])  # type: ignore[arg-type]
            assert len(old_q) > 100 and new_q == old_q
            opened = new.endpoints[nic].opened  # type: ignore[attr-defined]
            assert set(opened) == {q[5] for q in new_q}  # no socket yet: opened
        assert new.stats.probes_queued == agents["old"].stats.probes_queued


def test_queue_plan_skips_streams_without_target_and_rejects_bad_tables() -> None:
    """A stream with nowhere to probe is consumed and skipped (as `queue_rows` skips its
    rows); the table must have an entry per stream and valid entries; an engine index the
    engines do not have fails the call."""
    from prober.schedule import ProbePlan, ScheduleConfig

    s = CompiledSession("nicA")
    i, h = s.dst_entry("nicB")
    plan = ProbePlan({"nicA": ("nicB", "nicC")}, ScheduleConfig(coded=True), start_ns=0)
    ref = ProbePlan({"nicA": ("nicB", "nicC")}, ScheduleConfig(coded=True), start_ns=0)
    assert plan.compile()
    core = plan.core
    with pytest.raises(ValueError):
        core.set_targets([None])  # two streams
    with pytest.raises(ValueError):
        core.set_targets([(0, i, h, 2**40, 4791), None])  # not an IPv4 address
    with pytest.raises(TypeError):
        core.set_targets([(0, i), None])
    core.set_targets([(0, i, h, 0x7F000001, 4791), None])
    n, missing = compiled.queue_plan(core, (s.engine,), 10**9, 0, 100, 20, True)
    rows = [r for r in ref.due_rows(10**9) if r[1] == 0]
    assert n == 2 * len(rows) and len(rows) >= 9
    assert missing == [(0, sport) for _, _, sport in rows]  # no sockets: every port missing
    assert s.engine.queued() == [(at + 100, i, h, "127.0.0.1", 4791, sport, k, 0, 20)
                                 for k, (at, _, sport) in enumerate(rows)]  # fmt: skip
    core.set_targets([(1, i, h, 0x7F000001, 4791), None])
    with pytest.raises(IndexError):
        compiled.queue_plan(core, (s.engine,), 2 * 10**9, 0, 0, 20, True)  # no engine 1


def test_queue_rows_rejects_bad_rows_and_skips_streams_without_address() -> None:
    s = CompiledSession("nicA")
    i, h = s.dst_entry("nicB")
    table: list[Any] = [(0, i, h, 0x7F000001, 4791), None]
    n, missing = compiled.queue_rows((s.engine,), table, [(5, 0, 7), (6, 1, 8)], [100], 0, 20, True)
    assert n == 2 and missing == [(0, 7)]  # stream 1 has nowhere to probe: skipped
    assert s.engine.queued() == [(105, i, h, "127.0.0.1", 4791, 7, 0, 0, 20)]
    with pytest.raises(ValueError):
        compiled.queue_rows((s.engine,), table, [(5, 2, 7)], [0], 0, 20, True)  # no stream 2
    with pytest.raises(TypeError):
        compiled.queue_rows((s.engine,), table, [(5, 0)], [0], 0, 20, True)
    with pytest.raises(TypeError):
        compiled.queue_rows((object(),), table, [(5, 0, 7)], [0], 0, 20, True)


async def _driven_exchange(batch: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """Ten coded pairs nicA -> nicB over loopback, both NICs ticked by one driver."""
    if batch:  # the per-NIC wrapper must not run: fails if the batched path is silently off

        def no_tick(self: Any, now_ns: int) -> None:
            raise AssertionError("per-NIC tick called on the batched path")

        monkeypatch.setattr(CompiledUdpEndpoint, "tick", no_tick)
    got: list[Any] = []
    a = CompiledUdpEndpoint(CompiledSession("nicA", seq_start=77), LO, dport=0, want_hw=False)
    b = CompiledUdpEndpoint(CompiledSession("nicB"), LO, dport=0, want_hw=False)
    a.external_ticks = b.external_ticks = True
    await a.start()
    await b.start()
    drv = CompiledDriver([a, b], batch=batch)
    try:
        assert drv.batched is batch
        tasks = [asyncio.create_task(drv.run())]
        await exchange(a, b, got, tasks, drained=[a])
        got.extend(a.session.take_events())
    finally:
        a.close()
        b.close()
    monkeypatch.undo()
    return tuple(e for e in events_of(got) if isinstance(e, ProbeResult)), drv


async def test_tick_all_gives_the_records_of_the_per_nic_ticks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same ten coded pairs through the per-NIC driver and the batched one: the same
    records (sequence numbers, pair ids and positions, peer, nothing lost) with consistent
    kernel stamps (one host clock on loopback: t1 <= t2 <= t3 <= t4), and each pair's second
    probe left after its spacing (the busy wait `tick_all` does for all NICs)."""
    out = {}
    for batch in (False, True):
        results, drv = await _driven_exchange(batch, monkeypatch)
        assert drv.ticks > 0
        out[batch] = results
    keys = {b: sorted((r.seq, r.pair_id, r.pair_pos, r.dst) for r in rs) for b, rs in out.items()}
    assert len(keys[True]) == 20 and keys[True] == keys[False]
    for rs in out.values():
        for r in rs:
            assert r.t1 <= r.t2 <= r.t3 <= r.t4
        first = {r.pair_id: r.t1 for r in rs if r.pair_pos == 0}
        for r in rs:
            if r.pair_pos == 1:
                assert r.t1 - first[r.pair_id] >= 10_000  # spacing 20 us, never much earlier


async def _started(*nics: str) -> list[CompiledUdpEndpoint]:
    """Loopback endpoints of ``nics``, started, ticked by a driver (external ticks)."""
    eps = [CompiledUdpEndpoint(CompiledSession(n), LO, dport=0, want_hw=False) for n in nics]
    for ep in eps:
        ep.external_ticks = True
        await ep.start()
    return eps


async def test_tick_all_counts_an_engine_error_and_ticks_the_other_nics() -> None:
    """An engine whose epoll fails (its fd replaced by /dev/null: EINVAL) is counted
    ``tick_error_OSError`` and skipped; the other NIC's probes still complete."""
    got: list[Any] = []
    a, b, c = await _started("nicA", "nicB", "nicC")
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, c.engine.epoll_fd)  # c's epoll_wait now fails
        drv = CompiledDriver([c, a, b])
        assert drv.batched
        tasks = [asyncio.create_task(drv.run())]
        await exchange(a, b, got, tasks, drained=[a])
        got.extend(a.session.take_events())
    finally:
        os.close(null)
        for ep in (a, b, c):
            ep.close()
    assert c.counters["tick_error_OSError"] >= 1
    assert len([e for e in events_of(got) if isinstance(e, ProbeResult)]) == 20


def test_driver_takes_the_per_nic_path_off_the_host_clock() -> None:
    """`tick_all` reads the host clock itself: a NIC on a mapped clock keeps the driver on the
    per-NIC path (and ``batch=False`` asks for it)."""

    async def main() -> list[bool]:
        eps = [CompiledUdpEndpoint(CompiledSession(n), LO, dport=0, want_hw=False)
               for n in ("nicA", "nicB")]  # fmt: skip
        out = [CompiledDriver(eps).batched, CompiledDriver(eps, batch=False).batched]
        eps[1].clock = lambda ns: ns + 1
        out.append(CompiledDriver(eps).batched)
        return out

    assert asyncio.run(main()) == [True, False, False]


async def test_tick_all_skips_a_closed_nic() -> None:
    """A NIC closed while the others run is left alone, as the per-NIC tick left it: what it
    had queued is neither sent nor counted (no ``no_socket``), the others still complete."""
    got: list[Any] = []
    a, b, c = await _started("nicA", "nicB", "nicC")
    sport = c.add_source_port(0)
    c.session.queue_pair("nicB", (LO, b.dport), sport, c.now_ns())  # due at the first tick
    c.close()
    try:
        drv = CompiledDriver([c, a, b])
        tasks = [asyncio.create_task(drv.run())]
        await exchange(a, b, got, tasks, drained=[a])
        got.extend(a.session.take_events())
    finally:
        for ep in (a, b):
            ep.close()
    c.csession.sync_counters()  # the engine's counts into the endpoint's
    assert len(c.engine.queued()) == 1 and c.counters["no_socket"] == 0
    assert len([e for e in events_of(got) if isinstance(e, ProbeResult)]) == 20
