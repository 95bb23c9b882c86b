"""Probe schedule: who probes whom, when, and from which UDP source port. Pure and seeded.

Peers (`choose_peers`): full mesh inside an ECMP group (a leaf: all NICs under it), plus ``K``
random NICs from other groups (Huygens needs ~10-20 peers per node to anchor clock sync across
the fabric; the cross-group probes also exercise the spine paths).

Timing (`ProbePlan`): every (src, dst) stream fires at ``rate_hz`` on a nominal grid with a
random phase and a uniform jitter of +-``jitter`` periods around each grid point, so probers
started together do not synchronise, and yet rates stay exact over time (no drift of the grid).

Paths: each source NIC owns ``ports_needed_exact(paths, confidence)`` random source ports (see
`prober.ports` for why that many); every stream walks them in a shuffled order, reshuffled each
sweep. Sharing one port set across a NIC's peers keeps the transport's socket pool at n sockets
per NIC; the ECMP hash includes the destination address, so the same ports still land on
independent random paths per destination.

The plan never reads a clock: `ProbePlan.due(now_ns)` returns what is due at ``now_ns``.
"""

from __future__ import annotations

import functools
import heapq
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prober.events import Address
from prober.ports import ROCE_SPORT_RANGE, pick_source_ports, ports_needed_exact
from prober.session import ProbeSession


class ScheduleError(ValueError):
    """Bad schedule input (unknown NIC, bad rate, bad port range...)."""


@dataclass(frozen=True, slots=True)
class ScheduleConfig:
    """Schedule parameters; validated on construction (raises `ScheduleError`)."""

    rate_hz: float = 10.0
    cross_peers: int = 16
    paths: int = 16
    confidence: float = 0.9
    jitter: float = 0.25
    coded: bool = True
    pair_spacing_ns: int = 20_000
    port_range: tuple[int, int] = ROCE_SPORT_RANGE
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.rate_hz <= 1e6:
            raise ScheduleError(f"rate_hz must be in (0, 1e6], got {self.rate_hz}")
        if self.cross_peers < 0 or self.paths < 1 or not 0 < self.confidence < 1:
            raise ScheduleError("cross_peers >= 0, paths >= 1, 0 < confidence < 1 required")
        if not 0 <= self.jitter < 0.5:
            raise ScheduleError("jitter must be in [0, 0.5) periods")
        if self.pair_spacing_ns < 0:
            raise ScheduleError("pair_spacing_ns must be >= 0")
        lo, hi = self.port_range
        if not 1 <= lo <= hi <= 0xFFFF:
            raise ScheduleError(f"bad port range {self.port_range}")

    @property
    def ports_per_nic(self) -> int:
        """Return how many source ports each NIC sweeps (capped by the port range size)."""
        lo, hi = self.port_range
        return min(ports_needed_exact(self.paths, self.confidence), hi - lo + 1)


@dataclass(frozen=True, slots=True)
class ScheduledProbe:
    """One probe to send: at ``at_ns``, from NIC ``src`` to NIC ``dst``, from UDP ``sport``.

    ``coded``: send it as a coded pair (`ProbeSession.queue_pair`, spacing from the config).
    """

    at_ns: int
    src: str
    dst: str
    sport: int
    coded: bool


def choose_peers(
    local_nics: Sequence[str], group_of: Mapping[str, str], cross_peers: int, seed: int = 0
) -> dict[str, tuple[str, ...]]:
    """Return, for each local NIC, its peers: its group mates plus K random NICs elsewhere.

    ``group_of`` maps every NIC id of the fabric to its ECMP group (leaf) id. The choice is
    deterministic in ``seed`` and the NIC id. Raises `ScheduleError` for an unknown local NIC.
    """
    by_group: dict[str, list[str]] = {}
    for nic in sorted(group_of):
        by_group.setdefault(group_of[nic], []).append(nic)
    peers: dict[str, tuple[str, ...]] = {}
    for src in local_nics:
        if src not in group_of:
            raise ScheduleError(f"local NIC {src!r} not in the group map")
        group = group_of[src]
        mates = [n for n in by_group[group] if n != src]
        others = [n for g, nics in sorted(by_group.items()) if g != group for n in nics]
        rng = random.Random(f"peers:{seed}:{src}")
        cross = rng.sample(others, min(cross_peers, len(others)))
        peers[src] = tuple(mates) + tuple(sorted(cross))
    return peers


@dataclass(slots=True)
class _Stream:
    src: str
    dst: str
    rng: random.Random
    order: list[int]
    anchor: int = 0
    k: int = 0


class ProbePlan:
    """A deterministic, endless probe schedule starting at ``start_ns``.

    ``peers`` maps each local NIC to its peer NIC ids (e.g. from `choose_peers`). Iterate it
    (`__iter__`, time-ordered) or call `due(now_ns)`. ``ports[src]`` is the source-port set of
    NIC ``src``: the transport should pre-open one socket per (NIC, port).
    """

    def __init__(
        self,
        peers: Mapping[str, Sequence[str]],
        config: ScheduleConfig,
        start_ns: int,
        *,
        port_usable: Callable[[str, int], bool] | None = None,
        ports: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        """``port_usable(nic, port)`` False skips a port (`prober.ports.pick_source_ports`);
        ``ports`` reuses another plan's source ports (a restarted schedule keeps its sockets)."""
        self.config = config
        self.period_ns = round(1e9 / config.rate_hz)
        self.ports: dict[str, tuple[int, ...]] = {}
        self._streams: list[_Stream] = []
        self._heap: list[tuple[int, int]] = []
        for src in sorted(peers):
            if ports is not None and src in ports:
                self.ports[src] = ports[src]
            else:
                ok = None if port_usable is None else functools.partial(port_usable, src)
                self.ports[src] = pick_source_ports(
                    config.ports_per_nic, random.Random(f"ports:{config.seed}:{src}"),
                    config.port_range, ok,
                )  # fmt: skip
            for dst in peers[src]:
                if dst == src:
                    raise ScheduleError(f"NIC {src!r} cannot probe itself")
                rng = random.Random(f"stream:{config.seed}:{src}:{dst}")
                anchor = start_ns + int(rng.random() * self.period_ns)  # random phase
                self._streams.append(_Stream(src, dst, rng, [], anchor))
                heapq.heappush(self._heap, (anchor, len(self._streams) - 1))
        self._core: Any = None  # `compile`: the C plan that holds the state from then on

    def compile(self) -> bool:
        """Move the plan's state (each stream's generator, anchor, probe count and sweep; the
        heap) into the compiled extension (``prober._fastpath.Plan``): from then on `due_rows`,
        `due`, `next_at_ns` and iteration draw there, the same probes at the same times from
        the same ports, without a Python object per probe; `core` is it (the agent's driver
        queues its rows straight into the engines, `prober._fastpath.queue_plan`). Return
        whether the plan is compiled: False without the extension, or when its generator does
        not draw what this Python's `random` draws (`_c_draws_match`); the Python plan then
        goes on as before. Idempotent."""
        if self._core is not None:
            return True
        fast = _fastpath()
        if fast is None or not _c_draws_match():
            return False
        srcs = sorted(self.ports)
        index = {src: k for k, src in enumerate(srcs)}
        streams = [(index[st.src], st.anchor, st.k, st.rng.getstate()[1], list(st.order))
                   for st in self._streams]  # fmt: skip
        self._core = fast.Plan(self.period_ns, self.config.jitter,
                               [self.ports[src] for src in srcs], streams, list(self._heap))  # fmt: skip
        self._heap = []  # the C plan holds the state now; the Python copy would go stale
        for st in self._streams:
            st.order = []
        return True

    @property
    def core(self) -> Any:
        """Return the compiled plan (``prober._fastpath.Plan``) after `compile`, else None."""
        return self._core

    def __len__(self) -> int:
        """Return the number of (src, dst) streams."""
        return len(self._streams)

    @property
    def probes_per_second(self) -> float:
        """Return the total scheduled probe rate (coded pairs count as one)."""
        return len(self._streams) * self.config.rate_hz

    def next_at_ns(self) -> int | None:
        """Return the time of the next probe, or None when there are no streams."""
        if self._core is not None:
            nxt: int | None = self._core.next_at()
            return nxt
        return self._heap[0][0] if self._heap else None

    def stream(self, i: int) -> tuple[str, str]:
        """Return (src, dst) of stream ``i`` (the ``stream`` of a `due_rows` row); raises
        `IndexError` for no such stream."""
        st = self._streams[i]
        return st.src, st.dst

    def due_rows(self, now_ns: int) -> list[tuple[int, int, int]]:
        """Return every probe scheduled at or before ``now_ns`` as an ``(at_ns, stream, sport)``
        row (`stream` names its NICs), in time order, and consume them.

        The probes `due` returns, without an object per probe: the same draws in the same
        order (one jitter draw per probe, one shuffle per sweep of a stream's ports), so the
        same seed gives the same times and ports whichever of the two is called (and whether
        the plan is compiled or not, `compile`).
        """
        if self._core is not None:
            rows: list[tuple[int, int, int]] = self._core.due_rows(now_ns)
            return rows
        heap = self._heap
        out: list[tuple[int, int, int]] = []
        if not heap or heap[0][0] > now_ns:
            return out
        streams, ports = self._streams, self.ports
        period, jitter = self.period_ns, self.config.jitter
        replace = heapq.heapreplace
        while heap and heap[0][0] <= now_ns:
            at, i = heap[0]
            st = streams[i]
            order = st.order
            if not order:
                order = st.order = list(ports[st.src])
                st.rng.shuffle(order)
            out.append((at, i, order.pop()))
            k = st.k = st.k + 1
            nxt = st.anchor + k * period + int((st.rng.random() * 2.0 - 1.0) * jitter * period)
            # (time, stream) entries are unique: popping then pushing leaves the same order
            replace(heap, (nxt if nxt > at else at + 1, i))
        return out

    def due(self, now_ns: int) -> list[ScheduledProbe]:
        """Return every probe scheduled at or before ``now_ns``, in time order, and consume them."""
        coded, streams = self.config.coded, self._streams
        return [ScheduledProbe(at, streams[i].src, streams[i].dst, sport, coded)
                for at, i, sport in self.due_rows(now_ns)]  # fmt: skip

    def __iter__(self) -> Iterator[ScheduledProbe]:
        """Yield probes forever in time order (consuming the plan)."""
        while (nxt := self.next_at_ns()) is not None:
            yield from self.due(nxt)


def _fastpath() -> Any:
    """Return the compiled extension ``prober._fastpath``, or None when it was not built (or
    is a build from before the compiled plan: no ``Plan``)."""
    try:
        from prober import _fastpath
    except ImportError:
        return None
    return _fastpath if hasattr(_fastpath, "Plan") and hasattr(_fastpath, "draws") else None


@functools.cache
def _c_draws_match() -> bool:
    """Return whether the compiled plan's generator (CPython's MT19937, ``random()`` and
    ``shuffle`` as `random.Random` has them) draws exactly what this Python's `random` does,
    from states of a few seeds: floats, shuffles of sweep sizes, and the state after (checked
    once per process; a Python whose `random` draws otherwise keeps the Python plan)."""
    fast = _fastpath()
    if fast is None:
        return False
    for seed, floats, n in (("check:0", 700, 79), ("check:1", 3, 2), ("check:2", 1300, 1000)):
        rng = random.Random(seed)
        rng.random()
        got = fast.draws(rng.getstate()[1], floats, n)
        want = [rng.random() for _ in range(floats)]
        perm = list(range(n))
        rng.shuffle(perm)
        if got != (want, perm, rng.getstate()[1]):
            return False
    return True


def queue_due(
    plan: ProbePlan,
    now_ns: int,
    sessions: Mapping[str, ProbeSession],
    dest_of: Callable[[str], Address],
    session_now: Callable[[str], int] | None = None,
) -> int:
    """Queue every probe ``plan`` has due at ``now_ns`` into its source NIC's session.

    Probes are queued for "now" in the session's own clock (``session_now(src)``, default
    ``now_ns``): NIC clocks may differ from the clock that drives the plan. Coded probes become
    pairs with the plan's spacing. ``dest_of(dst)`` gives the transport address of NIC ``dst``.
    Returns how many entries were queued; raises `ScheduleError` for a NIC with no session.
    """
    spacing = plan.config.pair_spacing_ns
    count = 0
    for probe in plan.due(now_ns):
        session = sessions.get(probe.src)
        if session is None:
            raise ScheduleError(f"no session for NIC {probe.src!r}")
        at = session_now(probe.src) if session_now is not None else now_ns
        if probe.coded:
            session.queue_pair(probe.dst, dest_of(probe.dst), probe.sport, at, spacing)
        else:
            session.queue_probe(probe.dst, dest_of(probe.dst), probe.sport, at)
        count += 1
    return count
