"""Path discovery: which routers a (src NIC, dst NIC, UDP source port) probe crosses.

Method: send TRACE probes (`ProbeSession.trace_probe`) on the *same* 5-tuple as the real probes
(same socket, so same source port and ECMP hash) with IP TTL 1..N. A router that drops a probe
for TTL answers ICMP time-exceeded, which the kernel queues on the socket's error queue
(IP_RECVERR) with the router's address (``SO_EE_OFFENDER``) and the quoted start of our
datagram (whose seq says which TTL it was). The destination answers with a REPLY (TRACE flag)
or, with no responder, ICMP port-unreachable. The hop list is the routers at TTL 1..r-1, where
r is the smallest TTL that reached the destination.

TTLs sent: 1..max_ttl for a flow nothing is known of; otherwise only up to one hop past the
known length (r + 1, r from the flow's last path, or from the last path to the same peer for a
flow not traced yet: ECMP paths to one peer are as long as each other in a Clos), so a path one
hop longer is found in the same round. A round that does not reach (its highest TTL expired at
a router, or it timed out) is extended to max_ttl before it finishes: a path that grew by more
still comes out whole, and an unreachable destination is still reported (a timeout later).

Pure core: `PathTracer` (assemble hop lists from responses, report `PathChange`). Thin adapter:
`PathDiscovery` (send with IP_TTL through `prober.udp.UdpEndpoint`, feed it ICMP errors and
`TraceReached` events). On loopback nothing expires (every TTL reaches the host at hop 1); the
namespace testbed exercises real hops. Limitation: a router quoting only the 8-byte UDP header
(RFC 792 minimum) gives no seq; such errors are counted ``unidentified``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from prober.events import Address, ProbeEvent, TraceReached
from prober.session import Session
from prober.timestamping import ICMP_DEST_UNREACH, ICMP_TIME_EXCEEDED, ExtendedErr
from prober.udp import UdpEndpoint
from prober.wire import MsgType, WireError, nic_hash


class PathKey(NamedTuple):
    """The flow a path belongs to: source NIC, destination NIC, UDP source port."""

    src: str
    dst: str
    sport: int


@dataclass(frozen=True, slots=True)
class DiscoveredPath:
    """Routers at TTL 1..len(hops) (None: no answer at that TTL) and whether dst was reached."""

    key: PathKey
    hops: tuple[str | None, ...]
    reached: bool
    at_ns: int

    def differs_from(self, other: DiscoveredPath) -> bool:
        """Return True if the paths disagree where both know the hop, or in length/reachability.

        Silent hops (None) match anything, so a router that rate-limits ICMP is not a change.
        """
        if self.reached != other.reached or (self.reached and len(self.hops) != len(other.hops)):
            return True
        return any(a is not None and b is not None and a != b
                   for a, b in zip(self.hops, other.hops, strict=False))  # fmt: skip


@dataclass(frozen=True, slots=True)
class PathChange:
    """The path of ``new.key`` changed from ``old`` (None: first discovery) to ``new``."""

    old: DiscoveredPath | None
    new: DiscoveredPath


@dataclass(frozen=True, slots=True)
class TraceExtension:
    """A capped trace round that did not reach its destination: send ``ttls`` on ``key``'s
    flow and hand their seqs to `PathTracer.extend` (``round_id`` names the round)."""

    key: PathKey
    ttls: range
    round_id: int


@dataclass(slots=True)
class _Round:
    key: PathKey
    ttl_of: dict[int, int]  # seq -> ttl
    started_ns: int
    rid: int = 0
    top: int = 0  # the highest TTL sent so far
    max_ttl: int = 0  # how far the round may be extended (<= top: never)
    extended: bool = False
    hops: dict[int, str] = field(default_factory=dict)
    reached_ttl: int | None = None

    def complete(self) -> bool:
        r = self.reached_ttl
        return r is not None and all(t in self.hops for t in range(1, r))

    def awaits_extension(self) -> bool:
        """A capped round that has not reached its destination (yet): not finished before it
        was extended to ``max_ttl``."""
        return self.top < self.max_ttl and not self.extended and self.reached_ttl is None


class PathTracer:
    """Pure bookkeeping of trace rounds for one source NIC; time is passed in.

    `begin` a round with the trace seqs sent for TTL 1..N, feed `on_time_exceeded` /
    `on_reached`, then `poll(now_ns)` returns a `DiscoveredPath` per finished round (complete,
    or ``timeout_ns`` old) and a `PathChange` when it differs from the last path of its key.

    Capped rounds (`ttl_limit`): a round begun with fewer TTLs than ``max_ttl`` that does not
    reach its destination (its highest TTL expired at a router, or ``timeout_ns`` passed) is
    not finished but handed out by `extensions` (send the missing TTLs, then `extend`); it
    then finishes like any round. `PathDiscovery.poll` does both.
    """

    def __init__(self, timeout_ns: int = 1_000_000_000) -> None:
        self.timeout_ns = timeout_ns
        self.paths: dict[PathKey, DiscoveredPath] = {}
        self.counters: Counter[str] = Counter()
        self._rounds: list[_Round] = []
        self._by_seq: dict[int, _Round] = {}
        self._reach_of_pair: dict[tuple[str, str], int] = {}  # (src, dst) -> last reached TTL
        self._next_rid = 0

    def ttl_limit(self, key: PathKey, max_ttl: int) -> int:
        """Return how many TTLs (1..n, at most ``max_ttl``) a new trace of ``key`` sends: one
        hop past the length of the flow's last path when that reached its destination (the
        TTL that reached it, plus one, so a path one hop longer is found in the same round);
        for a flow not traced yet, one past the last reached path from the same NIC to the
        same peer; ``max_ttl`` when neither is known or the flow's last trace did not reach.
        """
        known = self.paths.get(key)
        if known is not None:
            reach = len(known.hops) + 1 if known.reached else None
        else:
            reach = self._reach_of_pair.get((key.src, key.dst))
        return max_ttl if reach is None else max(1, min(max_ttl, reach + 1))

    def begin(self, key: PathKey, seqs: Sequence[int], now_ns: int, max_ttl: int = 0) -> None:
        """Start a round: ``seqs[i]`` is the trace probe sent with TTL i + 1. With ``max_ttl``
        above ``len(seqs)`` the round is capped and may be extended up to ``max_ttl``."""
        self._next_rid += 1
        rnd = _Round(key, {seq: i + 1 for i, seq in enumerate(seqs)}, now_ns,
                     rid=self._next_rid, top=len(seqs), max_ttl=max_ttl)  # fmt: skip
        self._rounds.append(rnd)
        for seq in seqs:
            self._by_seq[seq] = rnd

    def extensions(self, now_ns: int) -> list[TraceExtension]:
        """Return the capped rounds that must go on: no TTL reached the destination and the
        highest one sent expired at a router (the path grew by more than a hop) or the round
        timed out. Each is handed out once; send its ``ttls`` and call `extend`."""
        out: list[TraceExtension] = []
        for rnd in self._rounds:
            if rnd.awaits_extension() and (
                rnd.top in rnd.hops or now_ns - rnd.started_ns >= self.timeout_ns
            ):
                rnd.extended = True
                out.append(TraceExtension(rnd.key, range(rnd.top + 1, rnd.max_ttl + 1), rnd.rid))
        return out

    def extend(self, ext: TraceExtension, seqs: Sequence[int], now_ns: int) -> None:
        """Add the trace probes sent for ``ext`` (``seqs[i]``: TTL ``ext.ttls[i]``) to its
        round, which gets a fresh ``timeout_ns`` from ``now_ns``; unknown rounds are ignored."""
        for rnd in self._rounds:
            if rnd.rid == ext.round_id:
                for seq, ttl in zip(seqs, ext.ttls, strict=False):
                    rnd.ttl_of[seq] = ttl
                    self._by_seq[seq] = rnd
                rnd.top = max(rnd.top, ext.ttls[-1] if ext.ttls else rnd.top)
                rnd.started_ns = now_ns
                return

    def on_time_exceeded(self, seq: int, router: str) -> None:
        """Record that the probe ``seq`` expired at ``router``."""
        rnd = self._by_seq.get(seq)
        if rnd is None:
            self.counters["unmatched"] += 1
            return
        rnd.hops[rnd.ttl_of[seq]] = router

    def on_reached(self, seq: int, sender: int | None = None) -> None:
        """Record that the probe ``seq`` reached the destination (reply or port-unreachable).

        ``sender``: the replying NIC's wire hash, checked against the round's destination.
        """
        rnd = self._by_seq.get(seq)
        if rnd is None:
            self.counters["unmatched"] += 1
            return
        if sender is not None and sender != nic_hash(rnd.key.dst):
            self.counters["wrong_sender"] += 1
            return
        ttl = rnd.ttl_of[seq]
        if rnd.reached_ttl is None or ttl < rnd.reached_ttl:
            rnd.reached_ttl = ttl

    def poll(self, now_ns: int) -> list[DiscoveredPath | PathChange]:
        """Return finished rounds' paths (and changes against the previous path of each key).

        A capped round that has not reached its destination waits for its extension
        (`extensions`) instead of finishing at its timeout.
        """
        out: list[DiscoveredPath | PathChange] = []
        keep: list[_Round] = []
        for rnd in self._rounds:
            timed_out = now_ns - rnd.started_ns >= self.timeout_ns
            if not (rnd.complete() or (timed_out and not rnd.awaits_extension())):
                keep.append(rnd)
                continue
            for seq in rnd.ttl_of:
                self._by_seq.pop(seq, None)
            last = rnd.reached_ttl - 1 if rnd.reached_ttl else max(rnd.hops, default=0)
            hops = tuple(rnd.hops.get(t) for t in range(1, last + 1))
            path = DiscoveredPath(rnd.key, hops, rnd.reached_ttl is not None, now_ns)
            if rnd.reached_ttl is not None:
                self._reach_of_pair[rnd.key.src, rnd.key.dst] = rnd.reached_ttl
            old = self.paths.get(rnd.key)
            self.paths[rnd.key] = path
            out.append(path)
            if old is None or path.differs_from(old):
                out.append(PathChange(old, path))
        self._rounds = keep
        return out


class PathDiscovery:
    """Adapter: run trace rounds over a `UdpEndpoint` and feed the results to a `PathTracer`.

    Wire it in: ``UdpEndpoint(..., on_icmp=pd.handle_icmp)`` and pass endpoint events through
    `handle_events` (it consumes `TraceReached`, returns the other events).
    """

    def __init__(self, endpoint: UdpEndpoint, tracer: PathTracer, max_ttl: int = 8) -> None:
        if not 1 <= max_ttl <= 64:
            raise ValueError("max_ttl must be in 1..64")
        self.endpoint = endpoint
        self.tracer = tracer
        self.max_ttl = max_ttl
        self._dests: dict[str, Address] = {}  # peer NIC -> where its traces went

    def start(self, dst: str, dest: Address, sport: int) -> PathKey:
        """Send TRACE probes from ``sport`` to ``dest`` with TTL 1..n and return the flow's key:
        n = `PathTracer.ttl_limit` (one hop past the flow's known length, ``max_ttl`` when
        nothing is known); a round that does not reach is extended to ``max_ttl`` by `poll`."""
        key = PathKey(self.endpoint.session.nic_id, dst, sport)
        self._dests[dst] = dest
        top = self.tracer.ttl_limit(key, self.max_ttl)
        seqs = self._send(dst, dest, sport, range(1, top + 1))
        self.tracer.begin(key, seqs, self.endpoint.now_ns(), self.max_ttl)
        return key

    def _send(self, dst: str, dest: Address, sport: int, ttls: range) -> list[int]:
        """Send one TRACE probe per TTL of ``ttls``; return their seqs, one per TTL (a send the
        OS refused keeps its seq, never answered: the TTLs after it stay where they are)."""
        session = self.endpoint.session
        seqs = []
        for ttl in ttls:
            dgram = session.trace_probe(dst, dest, sport)
            if not self.endpoint.send(dgram, ttl=ttl):
                self.tracer.counters["send_refused"] += 1
            seqs.append(dgram.meta.seq)
        return seqs

    def poll(self) -> list[DiscoveredPath | PathChange]:
        """Extend the capped rounds that did not reach their destination (send their missing
        TTLs now) and return the finished rounds' paths and changes (`PathTracer.poll`)."""
        now = self.endpoint.now_ns()
        for ext in self.tracer.extensions(now):
            dest = self._dests.get(ext.key.dst)
            seqs = [] if dest is None else self._send(ext.key.dst, dest, ext.key.sport, ext.ttls)
            self.tracer.extend(ext, seqs, now)
        return self.tracer.poll(now)

    def handle_icmp(self, sport: int, err: ExtendedErr, quoted: bytes, now_ns: int) -> None:
        """`UdpEndpoint` ICMP hook: map the error to its trace probe and record it."""
        try:
            msg = self.endpoint.session.codec.decode(quoted)
        except WireError:
            self.tracer.counters["unidentified"] += 1
            return
        if msg.mtype is not MsgType.PROBE or not msg.trace or err.offender is None:
            self.tracer.counters["not_trace"] += 1
            return
        if err.icmp_type == ICMP_TIME_EXCEEDED:
            self.tracer.on_time_exceeded(msg.seq, err.offender)
        elif err.icmp_type == ICMP_DEST_UNREACH:
            self.tracer.on_reached(msg.seq)

    def handle_events(self, events: list[ProbeEvent]) -> list[ProbeEvent]:
        """Consume `TraceReached` events; return the rest unchanged."""
        rest: list[ProbeEvent] = []
        for ev in events:
            if isinstance(ev, TraceReached):
                self.tracer.on_reached(ev.seq, ev.sender)
            else:
                rest.append(ev)
        return rest

    async def discover(
        self, dst: str, dest: Address, sport: int, timeout_s: float = 1.0
    ) -> DiscoveredPath | None:
        """Trace one path and wait (up to ``timeout_s``) for it; return it, or None."""
        key = self.start(dst, dest, sport)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while True:
            done = [p for p in self.poll() if isinstance(p, DiscoveredPath)]
            for path in done:
                if path.key == key:
                    return path
            if loop.time() >= end:
                return None
            await asyncio.sleep(0.005)


class TracingEndpoint:
    """An endpoint with path discovery: wraps a transport endpoint that can trace (UDP).

    The inner endpoint's events and ICMP errors are routed through a `PathDiscovery`
    (``discovery``): trace results are consumed, every other event reaches ``sink`` unchanged.
    Everything else is the inner endpoint's: a `prober.endpoint.Endpoint` like it, made by
    `prober.endpoint.UdpEndpointFactory` when ``[paths]`` is on.
    """

    def __init__(
        self,
        inner: UdpEndpoint,
        tracer: PathTracer,
        max_ttl: int,
        sink: Callable[[list[ProbeEvent]], None],
    ) -> None:
        self.inner = inner
        self.discovery = PathDiscovery(inner, tracer, max_ttl)
        self._sink = sink
        inner.route(self._events, self.discovery.handle_icmp)

    def _events(self, events: list[ProbeEvent]) -> None:
        rest = self.discovery.handle_events(events)
        if rest:
            self._sink(rest)

    @property
    def session(self) -> Session:
        """The inner endpoint's probe session."""
        return self.inner.session

    @property
    def stamp_source(self) -> str:
        """The inner endpoint's stamp source."""
        return str(self.inner.stamp_source)

    async def start(self) -> None:
        """Start the inner endpoint."""
        await self.inner.start()

    def close(self) -> None:
        """Close the inner endpoint."""
        self.inner.close()

    async def run(self) -> None:
        """Run the inner endpoint."""
        await self.inner.run()

    def wake(self) -> None:
        """Wake the inner endpoint."""
        self.inner.wake()

    def now_ns(self) -> int:
        """The inner endpoint's clock."""
        return self.inner.now_ns()

    def resolve(self, nic_id: str, configured: Address) -> Address | None:
        """Where the inner endpoint probes ``nic_id``."""
        return self.inner.resolve(nic_id, configured)
