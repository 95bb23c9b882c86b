"""Probe schedule and ECMP source-port coverage."""

from __future__ import annotations

import heapq
import random
from collections import Counter
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from prober.ports import (
    coverage_probability,
    pick_source_ports,
    ports_needed,
    ports_needed_exact,
)
from prober.schedule import (
    ProbePlan,
    ScheduleConfig,
    ScheduledProbe,
    ScheduleError,
    _c_draws_match,
    _fastpath,
    choose_peers,
    queue_due,
)
from prober.session import ProbeSession

S = 1_000_000_000


def _groups(n_groups: int = 4, per: int = 4) -> dict[str, str]:
    return {f"g{g}n{i}": f"leaf{g}" for g in range(n_groups) for i in range(per)}


def _splitmix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: npt.NDArray[np.uint64] = x ^ (x >> np.uint64(31))
    return out


def test_ports_needed_formula() -> None:
    assert ports_needed(16, 0.9) == 78  # "about 80"
    assert ports_needed_exact(16, 0.9) == 79
    assert ports_needed(1, 0.99) == 1
    assert ports_needed(2, 0.9) < ports_needed(2, 0.99) < ports_needed(4, 0.99)
    with pytest.raises(ValueError):
        ports_needed(0, 0.9)
    with pytest.raises(ValueError):
        ports_needed(4, 1.0)


def test_exact_coverage_matches_inclusion_exclusion() -> None:
    import math

    for n, m in [(10, 4), (40, 8), (79, 16)]:
        ie = sum((-1) ** k * math.comb(m, k) * ((m - k) / m) ** n for k in range(m + 1))
        assert coverage_probability(n, m) == pytest.approx(ie, abs=1e-12)


@pytest.mark.parametrize(("m", "p"), [(16, 0.9), (8, 0.99), (32, 0.95)])
def test_coverage_claim_empirically_with_random_hash(m: int, p: float) -> None:
    """Map each port to a path with a random hash (per NIC pair); count full coverage."""
    cfg = ScheduleConfig(paths=m, confidence=p, seed=7)
    n = cfg.ports_per_nic
    rng = np.random.default_rng(1)
    trials = 20_000
    ports = np.array(pick_source_ports(n, random.Random(3)), dtype=np.uint64)
    # ECMP hash model: splitmix64 of (per-NIC-pair/switch key, source port), modulo m paths
    keys = rng.integers(0, 2**63, size=(trials, 1), dtype=np.int64).astype(np.uint64)
    paths = _splitmix(keys ^ (ports[None, :] * np.uint64(0x9E3779B97F4A7C15))) % np.uint64(m)
    covered = np.array([len(set(row.tolist())) == m for row in paths])
    rate = covered.mean()
    sigma = (p * (1 - p) / trials) ** 0.5
    assert rate >= p - 3 * sigma
    # and a quarter fewer ports is measurably worse than asked for
    fewer = np.array([len(set(row[: n - n // 4].tolist())) == m for row in paths]).mean()
    assert fewer < p - 3 * sigma


def test_choose_peers_full_mesh_in_group_and_k_across() -> None:
    groups = _groups()
    local = ["g0n0", "g0n1"]
    peers = choose_peers(local, groups, cross_peers=5, seed=1)
    for src in local:
        mates = {n for n in groups if groups[n] == "leaf0" and n != src}
        assert mates <= set(peers[src]) and src not in peers[src]
        cross = [n for n in peers[src] if groups[n] != "leaf0"]
        assert len(cross) == 5 and len(set(cross)) == 5
    assert peers == choose_peers(local, groups, cross_peers=5, seed=1)
    assert peers != choose_peers(local, groups, cross_peers=5, seed=2)
    assert len(choose_peers(["g0n0"], groups, cross_peers=99)["g0n0"]) == 15
    with pytest.raises(ScheduleError):
        choose_peers(["nope"], groups, 1)


def test_plan_rate_jitter_determinism_and_port_sweep() -> None:
    groups = _groups()
    peers = choose_peers(["g0n0", "g1n2"], groups, cross_peers=3, seed=0)
    cfg = ScheduleConfig(rate_hz=100.0, jitter=0.25, seed=5)
    start = 10 * S
    plan = ProbePlan(peers, cfg, start)
    probes = plan.due(start + 10 * S)
    assert [p.at_ns for p in probes] == sorted(p.at_ns for p in probes)
    per_stream = Counter((p.src, p.dst) for p in probes)
    assert len(per_stream) == len(plan) == 12
    assert all(999 <= c <= 1001 for c in per_stream.values())  # 100/s for 10 s, no grid drift
    # jitter: intervals vary around the period, within +-2 * jitter periods
    times = np.array([p.at_ns for p in probes if (p.src, p.dst) == ("g0n0", "g0n1")])
    gaps = np.diff(times) / plan.period_ns
    assert gaps.std() > 0.05 and gaps.min() >= 0.5 - 1e-6 and gaps.max() <= 1.5 + 1e-6
    # every stream sweeps all ports of its source NIC once per n probes
    n = cfg.ports_per_nic
    stream = [p.sport for p in probes if (p.src, p.dst) == ("g0n0", "g0n1")]
    assert set(stream[:n]) == set(plan.ports["g0n0"]) and len(set(stream[:n])) == n
    assert set(stream[n : 2 * n]) == set(plan.ports["g0n0"])
    # seeded: same plan twice, a different seed differs
    again = ProbePlan(peers, cfg, start).due(start + 10 * S)
    assert again == probes
    other = ProbePlan(peers, ScheduleConfig(rate_hz=100.0, seed=6), start).due(start + 10 * S)
    assert [p.at_ns for p in other] != [p.at_ns for p in probes]
    assert plan.due(start + 10 * S) == []  # consumed


def test_plan_due_and_iter_agree_and_validate() -> None:
    peers = {"a": ["b", "c"]}
    cfg = ScheduleConfig(rate_hz=1000.0, coded=False)
    it = iter(ProbePlan(peers, cfg, 0))
    first = [next(it) for _ in range(50)]
    plan = ProbePlan(peers, cfg, 0)
    stepped: list[ScheduledProbe] = []
    now = 0
    while len(stepped) < 50:
        now += 100_000
        stepped += plan.due(now)
    assert stepped[:50] == first and not first[0].coded
    with pytest.raises(ScheduleError):
        ProbePlan({"a": ["a"]}, cfg, 0)
    with pytest.raises(ScheduleError):
        ScheduleConfig(rate_hz=0)
    with pytest.raises(ScheduleError):
        ScheduleConfig(port_range=(10, 5))
    assert ScheduleConfig(port_range=(50000, 50009)).ports_per_nic == 10


def test_queue_due_feeds_sessions_in_their_own_clock() -> None:
    peers = {"a": ["b"], "c": ["b"]}
    plan = ProbePlan(peers, ScheduleConfig(rate_hz=1000.0, pair_spacing_ns=20_000), 0)
    sessions = {"a": ProbeSession("a"), "c": ProbeSession("c")}
    offsets = {"a": 0, "c": 5 * S}  # c's NIC clock reads 5 s ahead
    n = queue_due(plan, 10_000_000, sessions, lambda nic: ("10.0.0.9", 4791),
                  lambda nic: 10_000_000 + offsets[nic])  # fmt: skip
    assert n == 20  # 2 streams x 1000/s x 10 ms
    sent_a = sessions["a"].next_datagrams(10_000_000)
    assert len(sent_a) == 10  # first probe of each pair now; second 20 µs later
    assert len(sessions["a"].next_datagrams(10_020_000)) == 10
    assert sessions["c"].next_datagrams(10_000_000) == []  # not yet in c's clock
    assert len(sessions["c"].next_datagrams(5 * S + 10_000_000)) == 10
    assert {d.meta.pair_pos for d in sent_a} == {0}
    with pytest.raises(ScheduleError):
        queue_due(plan, 20_000_000, {}, lambda nic: ("x", 1))


class _OldPlan:
    """The plan as it was before `ProbePlan.due_rows` (a heap pop and push, a `ScheduledProbe`
    and a jitter draw per probe), kept here as the reference the new code must reproduce."""

    def __init__(self, peers: dict[str, list[str]], config: ScheduleConfig, start_ns: int):
        self.config = config
        self.period_ns = round(1e9 / config.rate_hz)
        self.ports: dict[str, tuple[int, ...]] = {}
        self.streams: list[list[Any]] = []  # src, dst, rng, order, anchor, k
        self.heap: list[tuple[int, int]] = []
        for src in sorted(peers):
            self.ports[src] = pick_source_ports(
                config.ports_per_nic, random.Random(f"ports:{config.seed}:{src}"), config.port_range
            )
            for dst in peers[src]:
                rng = random.Random(f"stream:{config.seed}:{src}:{dst}")
                anchor = start_ns + int(rng.random() * self.period_ns)
                self.streams.append([src, dst, rng, [], anchor, 0])
                heapq.heappush(self.heap, (anchor, len(self.streams) - 1))

    def pop(self) -> ScheduledProbe:
        at, i = heapq.heappop(self.heap)
        st = self.streams[i]
        if not st[3]:
            st[3] = list(self.ports[st[0]])
            st[2].shuffle(st[3])
        probe = ScheduledProbe(at, st[0], st[1], st[3].pop(), self.config.coded)
        st[5] += 1
        jitter = (st[2].random() * 2.0 - 1.0) * self.config.jitter * self.period_ns
        heapq.heappush(self.heap, (max(at + 1, st[4] + st[5] * self.period_ns + int(jitter)), i))
        return probe

    def due(self, now_ns: int) -> list[ScheduledProbe]:
        out = []
        while self.heap and self.heap[0][0] <= now_ns:
            out.append(self.pop())
        return out


@pytest.mark.parametrize(
    ("seed", "rate_hz", "jitter", "coded", "port_range"),
    [(0, 10.0, 0.25, True, (49152, 65535)), (7, 10.0, 0.25, True, (49152, 65535)),
     (3, 333.0, 0.49, False, (50000, 50004)), (11, 1.0, 0.0, True, (49152, 65535))],
)  # fmt: skip
def test_due_rows_and_due_yield_exactly_the_old_sequence(
    seed: int, rate_hz: float, jitter: float, coded: bool, port_range: tuple[int, int]
) -> None:
    """Same seed, same probes at the same times from the same ports: `due_rows` (the agent's
    driven path), `due` and iteration against the old per-probe heap code, with ticks of
    varying length (10 ms, as the driver, and irregular ones), over several port sweeps."""
    peers = choose_peers([f"g{g}n0" for g in range(4)], _groups(4, 5), cross_peers=6, seed=seed)
    cfg = ScheduleConfig(rate_hz=rate_hz, jitter=jitter, coded=coded, port_range=port_range,
                         seed=seed)  # fmt: skip
    start = 123_456_789
    old, rows, new = _OldPlan(dict(peers), cfg, start), ProbePlan(peers, cfg, start), \
        ProbePlan(peers, cfg, start)  # fmt: skip
    ticks = random.Random(seed)
    now, want, got_rows, got = start, [], [], []
    sweeps_ns = 3 * cfg.ports_per_nic * round(1e9 / rate_hz)
    while now < start + min(max(sweeps_ns, 2 * S), 60 * S):
        now += 10_000_000 if ticks.random() < 0.5 else ticks.randrange(1, 80_000_000)
        want += old.due(now)
        got_rows += [(at, *rows.stream(i), sport) for at, i, sport in rows.due_rows(now)]
        got += new.due(now)
        assert rows.next_at_ns() == new.next_at_ns() == old.heap[0][0]
    assert len(want) > 1000 and got == want
    assert got_rows == [(p.at_ns, p.src, p.dst, p.sport) for p in want]
    it = iter(ProbePlan(peers, cfg, start))
    assert [next(it) for _ in range(len(want))] == want
    assert rows.due_rows(start) == [] and rows.due(start) == []


_compiled = pytest.mark.skipif(_fastpath() is None, reason="prober._fastpath not built")


@_compiled
def test_the_c_generator_draws_what_random_draws() -> None:
    """`prober._fastpath.draws` (the compiled plan's MT19937, ``random()`` and ``shuffle``)
    against `random.Random` from the same state: floats, a shuffle, the state after; and
    `_c_draws_match` (the once-per-process check `ProbePlan.compile` relies on) holds."""
    assert _fastpath is not None
    for seed in ("a", "stream:0:g0n0:g1n3", 12345):
        rng = random.Random(seed)
        for _ in range(700):  # past one regeneration of the 624 words
            rng.random()
        floats, perm, after = _fastpath().draws(rng.getstate()[1], 2000, 79)
        assert floats == [rng.random() for _ in range(2000)]
        want = list(range(79))
        rng.shuffle(want)
        assert perm == want and after == rng.getstate()[1]
    assert _c_draws_match()
    with pytest.raises(ValueError):
        _fastpath().draws((1, 2, 3), 1, 1)  # not a generator state


@_compiled
@pytest.mark.parametrize("compile_after", [0, 37])
@pytest.mark.parametrize(
    ("seed", "rate_hz", "jitter", "coded", "port_range"),
    [(0, 10.0, 0.25, True, (49152, 65535)), (3, 333.0, 0.49, False, (50000, 50004)),
     (11, 1.0, 0.0, True, (49152, 65535))],
)  # fmt: skip
def test_a_compiled_plan_draws_what_the_python_plan_draws(
    seed: int,
    rate_hz: float,
    jitter: float,
    coded: bool,
    port_range: tuple[int, int],
    compile_after: int,
) -> None:
    """`ProbePlan.compile` (the C plan: the driver queues its rows straight into the engines)
    against the Python plan with the same seed: the same rows at the same times from the same
    ports, tick after tick (10 ms and irregular ticks, several sweeps), `next_at_ns` equal,
    each stream's generator in the same state at the end; compiled at the start or after
    ``compile_after`` ticks of the Python plan (mid-sweep); `due` and iteration too."""
    peers = choose_peers([f"g{g}n0" for g in range(4)], _groups(4, 5), cross_peers=6, seed=seed)
    cfg = ScheduleConfig(rate_hz=rate_hz, jitter=jitter, coded=coded, port_range=port_range,
                         seed=seed)  # fmt: skip
    start = 123_456_789
    py, c = ProbePlan(peers, cfg, start), ProbePlan(peers, cfg, start)
    ticks = random.Random(seed)
    now, rows = start, 0
    sweeps_ns = 3 * cfg.ports_per_nic * round(1e9 / rate_hz)
    for tick in range(10**6):
        if tick == compile_after:
            assert c.core is None and c.compile() and c.core is not None and c.compile()
        now += 10_000_000 if ticks.random() < 0.5 else ticks.randrange(1, 80_000_000)
        want = py.due_rows(now)
        assert c.due_rows(now) == want
        assert c.next_at_ns() == py.next_at_ns()
        rows += len(want)
        if now >= start + min(max(sweeps_ns, 2 * S), 60 * S):
            break
    assert rows > 1000
    for i in range(len(py)):
        assert c.core.rng_state(i) == py._streams[i].rng.getstate()[1]
    assert c.due(now + S) == py.due(now + S)
    a, b = iter(c), iter(py)
    assert [next(a) for _ in range(500)] == [next(b) for _ in range(500)]


@_compiled
def test_a_compiled_plan_refuses_bad_state_and_a_nic_without_ports() -> None:
    fast = _fastpath()
    state = random.Random(1).getstate()[1]
    with pytest.raises(ValueError):
        fast.Plan(0, 0.25, [(7,)], [], [])  # period
    with pytest.raises(ValueError):
        fast.Plan(10, 0.25, [(7,)], [(1, 0, 0, state, [])], [(0, 0)])  # no source NIC 1
    with pytest.raises(ValueError):
        fast.Plan(10, 0.25, [(7,)], [(0, 0, 0, state, [7, 7])], [(0, 0)])  # order > ports
    with pytest.raises(ValueError):
        fast.Plan(10, 0.25, [(7,)], [(0, 0, 0, state, [])], [(0, 1)])  # heap: no stream 1
    with pytest.raises(ValueError):
        fast.Plan(10, 0.25, [(70000,)], [(0, 0, 0, state, [])], [(0, 0)])  # port
    empty = fast.Plan(10, 0.25, [()], [(0, 0, 0, state, [])], [(0, 0)])
    with pytest.raises(IndexError):  # as the Python plan's pop from an empty sweep
        empty.due_rows(5)
    one = fast.Plan(10, 0.0, [(7, 8)], [(0, 100, 0, state, [])], [(100, 0)])
    assert one.next_at() == 100 and one.due_rows(99) == []
    assert [r[0] for r in one.due_rows(130)] == [100, 110, 120, 130]
    with pytest.raises(ValueError):
        one.set_targets([])  # one entry per stream


def test_ports_another_socket_holds_are_replaced_by_further_draws() -> None:
    """The RoCE source-port range overlaps Linux's ephemeral ports: a planned port some other
    socket holds is replaced (the prober failed to start on it), the rest stay as drawn."""
    free = pick_source_ports(8, random.Random(3))
    held = {free[2], free[5]}
    got = pick_source_ports(8, random.Random(3), usable=lambda p: p not in held)
    assert len(set(got)) == 8 and not held & set(got)
    assert [p for p in free if p not in held] == list(got[:6])
    with pytest.raises(ValueError, match="usable"):
        pick_source_ports(
            3, random.Random(1), (50000, 50003), usable=lambda p: p not in {50001, 50002}
        )


def test_without_the_compiled_plan_the_python_plan_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """No extension (or one built before `Plan`): `compile` says so and changes nothing."""
    from prober import schedule

    peers = choose_peers([f"g{g}n0" for g in range(2)], _groups(2, 3), cross_peers=2)
    plan, ref = ProbePlan(peers, ScheduleConfig(), 0), ProbePlan(peers, ScheduleConfig(), 0)
    monkeypatch.setattr(schedule, "_fastpath", lambda: None)
    assert plan.compile() is False and plan.core is None
    want = ref.due_rows(3 * S)
    assert len(want) > 10 and plan.due_rows(3 * S) == want
