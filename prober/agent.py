"""The prober agent: schedule -> transport -> results -> ProbeBatch -> spool -> publisher.

One agent per host drives every local NIC:

- a `prober.schedule.ProbePlan` over the peers from the config (full mesh inside the NIC's
  ECMP group plus ``cross_peers`` elsewhere), sweeping each NIC's source-port set;
- one session + transport endpoint per NIC, made by the transport's `EndpointFactory`
  (`prober.endpoint`: UDP on the configured hot path, or `prober.rdma.transport`); the agent
  uses them through `prober.endpoint.Endpoint` and `prober.session.Session` only, and takes
  path discovery and the compiled endpoints its one `CompiledDriver` ticks from what the
  factory reports (`prober.endpoint.NicTransport`); results and losses are collected as they
  complete;
- every ``batch_interval_ms`` the collected events become one columnar `ProbeBatch` (NIC
  table = all configured NIC ids, so indices are stable) with an increasing ``batch_seq``,
  encoded and handed to the `Publisher` (which spools it until the broker has it);
- every ``telemetry.interval_s`` a health document (GPU, NIC counters, prober counters),
  and one at once when a NIC's link state changes (checked every `LINK_CHECK_S`);
- every ``signals.interval_s`` (10 s; 0 = off) a window of the host's hardware signals
  (`prober.telemetry.collector`: netdev, qdiscs, ethtool, RDMA counters, AER, NVML, procfs)
  as a `contract.signals.SignalsDoc` on ``<prefix>/signals/<host>`` (`prober.telemetry.feed`);
- path discovery (``[paths]``, UDP only): TTL traces of the probe flows themselves, a few per
  second per NIC (`prober.pathsweep`), published as JSON on ``<prefix>/paths/<host>``;
- with discovery (``[discover]``, `prober.discover.resolve.LocalNics`): the neighbours document
  (its NICs and their LLDP neighbours, retained on ``<prefix>/neighbors/<host>``), published
  on every connect and when LLDP (read every ``lldp_interval_s``) shows a change; a NIC whose
  leaf changed moves to that leaf's group. Its peers are learned from every other prober's
  neighbours document (`prober.discover.peers.PeerBook`, followed by
  `prober.discover.follow`), ``[[peers]]`` laid over them; a change of peers or groups plans
  the probes again (`replan`): same sockets and source ports, fresh phases, a new trace sweep.

Clocks: every stamp and every "now" is in the NIC's clock (`Endpoint.now_ns`); the schedule
runs on the host clock and each probe is queued at its NIC's "now".
`prober.endpoint.udp_endpoint_factory` takes the UDP endpoints' clock hook (kernel ns -> host ns; the testbed passes virtual clocks).

Pure helpers (`batch_seq_start`, `plan_round`, `health_doc`) are unit-tested; `Agent.run`
is the thin asyncio shell. Time sources are injectable.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from contract.records import encode_batch
from prober import compiled
from prober.config import PeerConfig, ProberConfig, load_probe_keys
from prober.discover.follow import follow_neighbors
from prober.discover.peers import PeerBook, merge_peers
from prober.discover.resolve import Lldp, LocalNics, read_lldp_or_none
from prober.drive import CompiledDriver
from prober.endpoint import Endpoint, EndpointFactory, udp_endpoint_factory
from prober.events import Address, ProbeEvent, ResultBlock, results_to_batch
from prober.jspublish import JetStreamBatches
from prober.pathdisc import DiscoveredPath, PathChange, PathDiscovery
from prober.pathsweep import TraceTimer, paths_payload, sweep_flows
from prober.publish import Publisher
from prober.schedule import ProbePlan, ScheduledProbe, choose_peers
from prober.session import Session
from prober.slip import SlipMeter
from prober.spool import Spool
from prober.telemetry.collector import Collector, CollectorConfig
from prober.telemetry.feed import SignalsFeed, signals_config
from prober.telemetry.gpu import GpuReading, gpu_health, read_gpus
from prober.telemetry.nic import NicTelemetryError, read_link_up, read_nic
from prober.wire import codec_for


def batch_seq_start(now_ns: int) -> int:
    """Return the first batch_seq of a prober started at ``now_ns`` (ms since the epoch).

    Batches are at least 10 ms apart, so a restarted prober starts above its predecessor's
    last batch_seq and the consumer's (origin, batch_seq) dedupe stays valid.
    """
    return max(0, now_ns // 1_000_000)


def plan_peers(cfg: ProberConfig) -> dict[str, tuple[str, ...]]:
    """Return local NIC id -> peer NIC ids (group mates + cross-group sample) for ``cfg``."""
    return choose_peers(
        [n.id for n in cfg.nics], cfg.group_of(), cfg.schedule.cross_peers, cfg.schedule.seed
    )


def plan_round(plan: ProbePlan, peers: dict[str, tuple[str, ...]], at_ns: int,
               stagger_ns: int = 1_000_000) -> list[ScheduledProbe]:  # fmt: skip
    """Return one probe per (src, dst) stream (a single round, for ``--once``).

    Each stream uses the first port of its NIC's sweep; probes are ``stagger_ns`` apart.
    """
    out: list[ScheduledProbe] = []
    k = 0
    for src in sorted(peers):
        ports = plan.ports[src]
        for j, dst in enumerate(peers[src]):
            sport = ports[j % len(ports)]
            out.append(ScheduledProbe(at_ns + k * stagger_ns, src, dst, sport, plan.config.coded))
            k += 1
    return out


def health_doc(
    host: str,
    t_ns: int,
    gpu: GpuReading,
    previous_gpu: GpuReading | None,
    nics: dict[str, dict[str, Any]],
    counters: dict[str, Any],
    send_slip_ns: int = 0,
) -> dict[str, Any]:
    """Return the JSON health document of ``host`` (pure); ``send_slip_ns``: the prober's
    worst lateness since its previous document (`prober.slip`)."""
    g = gpu_health(gpu, previous_gpu)
    return {
        "host": host,
        "t_ns": t_ns,
        "gpu_ok": g.ok,
        "gpu_present": g.present,
        "detail": g.detail,
        "gpu": g.to_json(),
        "nics": nics,
        "counters": counters,
        "send_slip_ns": send_slip_ns,
    }


LINK_CHECK_S = 1.0
"""How often the agent reads its NICs' link state (two sysfs reads per NIC)."""

DRIVEN_LEAD_NS = 10_000_000
"""With the compiled path the driver queues probes this far ahead of their planned time (the
engines send each at its time, on the driver's tick)."""


@dataclass(slots=True)
class AgentStats:
    """What the agent did (for --once output and tests)."""

    probes_queued: int = 0
    results: int = 0
    lost: int = 0
    batches: int = 0
    traces: int = 0
    paths: int = 0
    replans: int = 0


class Agent:
    """Run the prober of ``cfg.host`` until stopped (or for one round with ``once``).

    ``local``: what ``cfg``'s NICs were found from (`prober.discover.resolve.discover_config`;
    None: they were listed); ``lldp_reader(socket)`` reads the LLDP neighbours again."""

    def __init__(
        self,
        cfg: ProberConfig,
        *,
        endpoint_factory: EndpointFactory | None = None,
        publisher: Publisher | None = None,
        now_ns: Callable[[], int] = time.time_ns,
        gpu_reader: Callable[[], GpuReading] = read_gpus,
        link_reader: Callable[[str], bool | None] = read_link_up,
        local: LocalNics | None = None,
        lldp_reader: Callable[[str], Lldp] = read_lldp_or_none,
    ) -> None:
        self.cfg = cfg
        # the hardware-signal collector's opener (`_signals_loop`); a test may replace it
        self._collector_open: Callable[[CollectorConfig], Collector] = Collector.open
        self.signals: SignalsFeed | None = None
        self.local = local
        self._lldp_reader = lldp_reader
        self._explicit_peers = cfg.peers
        learn = cfg.discover is not None and cfg.discover.peers
        self.peer_book = PeerBook(cfg.host) if learn else None
        self._replanned = asyncio.Event()
        self._link_reader = link_reader
        self._links: dict[str, bool | None] = {}
        self._now_ns = now_ns
        self.slip = SlipMeter()  # the prober's own lateness, reported in its health
        self._factory = endpoint_factory or udp_endpoint_factory(cfg)
        if publisher is None:
            spool = Spool(
                cfg.spool_max_batches,
                cfg.spool_max_bytes,
                Path(cfg.spool_dir) if cfg.spool_dir else None,
            )
            js = None if cfg.nats is None else JetStreamBatches(cfg.nats, cfg.host, spool)
            publisher = Publisher(cfg.mqtt, cfg.host, spool, batches=js)
        self.publisher = publisher
        self._gpu_reader = gpu_reader
        self._gpu_prev: GpuReading | None = None
        self.peers = plan_peers(cfg)
        self.nic_table = tuple(sorted(cfg.group_of()))
        self.address = cfg.peer_address()
        self.plan = ProbePlan(self.peers, cfg.schedule, start_ns=now_ns(),
                              port_usable=self._factory.port_usable)  # fmt: skip
        # [auth] key_file: every session tags with the send key and verifies with every key;
        # untagged or badly tagged datagrams are counted as bad_auth and never become records.
        self.probe_keys = load_probe_keys(cfg)
        self.codec = codec_for(self.probe_keys)  # (stateless: one for every NIC's session)
        self.hot_path = self._factory.hot_path
        # one session and endpoint per NIC, made by the factory in `start`
        self.sessions: dict[str, Session] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self._ticked: dict[str, compiled.CompiledUdpEndpoint] = {}  # ticked by `_driver`
        self._events: list[ProbeEvent] = []
        self._batch_seq = batch_seq_start(now_ns())
        self.stats = AgentStats()
        self.discovery: dict[str, PathDiscovery] = {}
        self._driver: CompiledDriver | None = None
        self._traces: TraceTimer | None = None  # when the driver starts traces
        self._flows: list[tuple[str, str, int]] = []
        self._paths_out: deque[DiscoveredPath] = deque(maxlen=100_000)
        self._retrace: deque[Any] = deque(maxlen=10_000)
        self._targets: list[tuple[str, Session, str, Address | None]] | None = None
        self._stream_table: list[tuple[int, int, int, int, int] | None] | None = None
        self._core_targets: Any = None  # the compiled plan whose targets are this table's

    # ---- pieces -------------------------------------------------------------------------------

    def _collect(self, events: list[ProbeEvent]) -> None:
        self._events.extend(events)

    def _queue(self, probes: Sequence[ScheduledProbe], plan_now_ns: int) -> None:
        """Queue ``probes`` (scheduled on the host clock at ``plan_now_ns``) in each NIC's clock."""
        nic_now = {src: self.endpoints[src].now_ns() for src in {p.src for p in probes}}
        for p in probes:
            session = self.sessions[p.src]
            dest = self.endpoints[p.src].resolve(p.dst, self.address[p.dst])
            if dest is None:
                continue  # RDMA peer not known yet: skipped and counted by the endpoint, not lost
            at = nic_now[p.src] + max(0, p.at_ns - plan_now_ns)
            if p.coded:
                session.queue_pair(p.dst, dest, p.sport, at, self.cfg.schedule.pair_spacing_ns)
                self.stats.probes_queued += 2
            else:
                session.queue_probe(p.dst, dest, p.sport, at)
                self.stats.probes_queued += 1
        for src in {p.src for p in probes}:
            self.endpoints[src].wake()

    def _queue_rows(self, rows: Sequence[tuple[int, int, int]], plan_now_ns: int) -> None:
        """`_queue` for the driver's tick, from `ProbePlan.due_rows`: the same probes queued at
        the same times, without a `ScheduledProbe` per probe, and each stream's session and
        peer address looked up once (`_stream_targets`). No `wake`: the driver ticks the
        endpoints right after its hook."""
        targets = self._targets
        if targets is None:
            targets = self._targets = self._stream_targets()
        nic_now: dict[str, int] = {}
        spacing = self.cfg.schedule.pair_spacing_ns
        coded = self.plan.config.coded
        queued = 0
        for at, i, sport in rows:
            src, session, dst, dest = targets[i]
            if dest is None:
                continue
            now = nic_now.get(src)
            if now is None:
                now = nic_now[src] = self.endpoints[src].now_ns()
            at_nic = now + at - plan_now_ns if at > plan_now_ns else now
            if coded:
                session.queue_pair(dst, dest, sport, at_nic, spacing)
                queued += 2
            else:
                session.queue_probe(dst, dest, sport, at_nic)
                queued += 1
        self.stats.probes_queued += queued

    def _queue_rows_batched(
        self, driver: CompiledDriver, rows: list[tuple[int, int, int]], plan_now_ns: int
    ) -> None:
        """`_queue_rows` in one C call (`prober.compiled.queue_rows`) for a batched driver (its
        endpoints share the host clock, so one clock read gives every NIC's offset): the same
        probes at the same times and pair ids; source ports without a socket yet are opened
        after (before the tick that sends them), as `queue_pair` would before."""
        table = self._stream_table
        if table is None:
            table = self._stream_table = self._batched_stream_table(driver)
        off = driver.endpoints[0].now_ns() - plan_now_ns
        queued, missing = compiled.queue_rows(
            driver.engines, table, rows, [off] * len(driver.engines), plan_now_ns,
            self.cfg.schedule.pair_spacing_ns, self.plan.config.coded,
        )  # fmt: skip
        self._after_queueing(driver, queued, missing)

    def _after_queueing(
        self, driver: CompiledDriver, queued: int, missing: list[tuple[int, int]] | None
    ) -> None:
        """Count ``queued`` probes and open the source ports the engines had no socket for
        (``missing``: (slot, port) pairs), except on NICs already closed (shutting down)."""
        for slot, sport in missing or ():
            if not driver.endpoints[slot].closed:
                driver.endpoints[slot].add_source_port(sport)
        self.stats.probes_queued += queued

    def _queue_plan_batched(self, driver: CompiledDriver, until_ns: int, plan_now_ns: int) -> None:
        """`_queue_rows_batched` of ``self.plan.due_rows(until_ns)`` for a compiled plan
        (`prober.schedule.ProbePlan.compile`): the C plan pops its due rows straight into the
        engines (`prober.compiled.queue_plan`), the same probes at the same times and pair
        ids, without a Python tuple per row; source ports without a socket yet are opened
        after, as there."""
        core = self.plan.core
        if self._core_targets is not core:
            table = self._stream_table
            if table is None:
                table = self._stream_table = self._batched_stream_table(driver)
            core.set_targets(table)
            self._core_targets = core
        off = driver.endpoints[0].now_ns() - plan_now_ns
        queued, missing = compiled.queue_plan(
            core, driver.engines, until_ns, plan_now_ns, off,
            self.cfg.schedule.pair_spacing_ns, self.plan.config.coded,
        )  # fmt: skip
        self._after_queueing(driver, queued, missing)

    def _batched_stream_table(
        self, driver: CompiledDriver
    ) -> list[tuple[int, int, int, int, int] | None]:
        """Per stream of the plan: None (nowhere to probe) or (the driver's index of its NIC,
        the session's index and hash of the peer, the peer's IPv4 address as an int, port)."""
        slot_of = {ep.csession.nic_id: i for i, ep in enumerate(driver.endpoints)}
        table: list[tuple[int, int, int, int, int] | None] = []
        for src, _, dst, dest in self._stream_targets():
            slot = slot_of.get(src)
            if dest is None or slot is None:
                table.append(None)
                continue
            i, h = driver.endpoints[slot].csession.dst_entry(dst)
            ip = int.from_bytes(socket.inet_aton(dest[0]), "big")
            table.append((slot, i, h, ip, dest[1]))
        return table

    def _stream_targets(self) -> list[tuple[str, Session, str, Address | None]]:
        """Return, per stream of the plan, (src, its session, dst, where to probe dst): the
        driven endpoints are UDP, whose `resolve` is the configured address, always."""
        out = []
        for i in range(len(self.plan)):
            src, dst = self.plan.stream(i)
            dest = self.endpoints[src].resolve(dst, self.address[dst])
            out.append((src, self.sessions[src], dst, dest))
        return out

    def _stamp_kind(self) -> str:
        kinds = {str(ep.stamp_source) for ep in self.endpoints.values()}
        return "hw" if kinds == {"hw"} else "sw"

    def flush_batch(self) -> int:
        """Turn collected events into one batch and submit it; return the records in it."""
        for s in self.sessions.values():
            self._events += s.take_events()  # records a session holds (the compiled engine's)
        if not self._events:
            return 0
        events, self._events = self._events, []
        batch = results_to_batch(
            events,
            origin=self.cfg.host,
            stamp=self._stamp_kind(),
            nic_ids=self.nic_table,
            dport=self.cfg.port,
            batch_seq=self._batch_seq,
        )
        self._batch_seq += 1
        self.publisher.submit(batch.batch_seq, encode_batch(batch))
        self.stats.batches += 1
        self.stats.lost += int(batch.lost.sum())
        self.stats.results += len(batch) - int(batch.lost.sum())
        return len(batch)

    # ---- peers and groups that change while probing --------------------------------------------

    def set_peers(self, peers: Sequence[PeerConfig]) -> None:
        """Probe ``peers`` (and the NICs of the own groups) from now on (`replan`)."""
        self.cfg = replace(self.cfg, peers=tuple(peers))
        self.replan()

    def replan(self) -> None:
        """Plan the probes of ``self.cfg``'s peers and groups again: same source ports (and
        sockets), fresh phases, a new trace sweep at once. NIC ids and addresses seen before
        stay known (results of a peer that left may still be in flight)."""
        self.peers = plan_peers(self.cfg)
        self.nic_table = tuple(sorted(set(self.nic_table) | set(self.cfg.group_of())))
        self.address.update(self.cfg.peer_address())
        self.plan = ProbePlan(self.peers, self.cfg.schedule, start_ns=self._now_ns(),
                              ports=self.plan.ports)  # fmt: skip
        self._targets = None
        self._stream_table = None
        self._core_targets = None
        if self._driver is not None and self._driver.batched:
            self.plan.compile()
        if self._traces is not None:
            self._flows = sweep_flows(self.peers, self.plan.ports)
            self._traces = TraceTimer(len(self._flows), self._trace_gap_s(),
                                      self.cfg.paths_refresh_s, time.monotonic())  # fmt: skip
        self._replanned.set()
        self.stats.replans += 1

    def _learned_peers(self) -> None:
        """`PeerBook` said the peers changed: probe them (with ``[[peers]]`` over them)."""
        assert self.peer_book is not None
        local = [n.id for n in self.cfg.nics]
        self.set_peers(merge_peers(self._explicit_peers, self.peer_book.peers(), local))

    def publish_neighbors(self) -> None:
        """Hand the current neighbours document to the publisher (with discovery only)."""
        if self.local is not None:
            self.publisher.set_neighbors(self.local.document(self._now_ns()).encode())

    def check_lldp(self, reading: Lldp) -> bool:
        """Take a new LLDP reading: when a neighbour changed, publish the neighbours document
        again and, when a NIC's leaf (group) changed, plan the probes again. Return whether
        anything changed."""
        if self.local is None:
            return False
        fresh = self.local.with_lldp(reading)
        if fresh == self.local:
            return False
        self.local = fresh
        self.publish_neighbors()
        groups = {n.id: n.group for n in fresh.nics()}
        nics = tuple(replace(n, group=groups.get(n.id, n.group)) for n in self.cfg.nics)
        if nics != self.cfg.nics:
            self.cfg = replace(self.cfg, nics=nics)
            self.replan()
        return True

    # ---- telemetry: the one place health documents are made and published --------------------

    def publish_health(self) -> None:
        """Read GPU and NIC telemetry and queue a health message."""
        gpu = self._gpu_reader()
        nics: dict[str, dict[str, Any]] = {}
        for n in self.cfg.nics:
            if not n.device:
                continue
            try:
                nics[n.id] = read_nic(n.device).to_json()
            except NicTelemetryError as exc:
                nics[n.id] = {"device": n.device, "error": str(exc)}
        counters: dict[str, Any] = {
            "publisher": self.publisher.counters(),
            "sessions": {k: dict(s.counters) for k, s in self.sessions.items()},
            "bad_auth": sum(s.counters["bad_auth"] for s in self.sessions.values()),
            "auth_key": self.probe_keys.send_id if self.probe_keys else "",
            "hot_path": self.hot_path,
            "peers": len(self.cfg.peers),
            "replans": self.stats.replans,
        }
        if self.peer_book is not None:
            counters["neighbors"] = dict(self.peer_book.counters)
        doc = health_doc(self.cfg.host, self._now_ns(), gpu, self._gpu_prev, nics, counters,
                         self.slip.take())  # fmt: skip
        self._gpu_prev = gpu
        self.publisher.set_health(doc)

    def check_links(self) -> bool:
        """Read the link state of the NICs with a device; when one changed since the last
        check, publish a health document at once (the controller tells a NIC that lost its
        link from a dead prober by it, instead of waiting for ``telemetry.interval_s``).
        Return whether it published; the first check only takes the reading."""
        now = {n.id: self._link_reader(n.device) for n in self.cfg.nics if n.device}
        changed = bool(self._links) and now != self._links
        self._links = now
        if changed:
            self.publish_health()
        return changed

    # ---- the asyncio shell --------------------------------------------------------------------

    async def start(self) -> None:
        """Make and start the session and endpoint of every local NIC (the factory's
        `prober.endpoint.NicTransport`); raise the transport's OSError. Path discovery and the
        compiled endpoints the driver ticks are taken from what the factory reports."""
        self.sessions.clear()
        self._ticked.clear()
        self.discovery.clear()
        try:
            for n in self.cfg.nics:
                made = self._factory(n, self.codec, self.plan.ports[n.id], self._collect)
                ep = made.endpoint
                await ep.start()
                self.endpoints[n.id] = ep
                self.sessions[n.id] = ep.session
                if made.ticked is not None:
                    self._ticked[n.id] = made.ticked
                if made.discovery is not None:
                    self.discovery[n.id] = made.discovery
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close every endpoint."""
        for ep in self.endpoints.values():
            ep.close()
        self.endpoints.clear()

    async def run(self, stop: asyncio.Event, *, once: bool = False) -> AgentStats:
        """Probe, batch and publish until ``stop`` (or one round with ``once``); return stats.

        On the way out the last batch is flushed and the publisher drains its spool for up to
        ``mqtt.drain_on_stop_s`` before announcing ``alive=false``.
        """
        await self.start()
        # the schedule starts when the endpoints are up: opening ~80 sockets per NIC takes
        # seconds on a busy host, and a plan started before would hand out every probe of that
        # time at once (a burst that blocked the event loop past the MQTT keepalive with 8
        # NICs). Same peers and the source ports the endpoints opened, fresh phases.
        self.plan = ProbePlan(
            self.peers, self.cfg.schedule, start_ns=self._now_ns(), ports=self.plan.ports
        )
        driven = self.driven_endpoints()
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(ep.run())
                                          for nic, ep in self.endpoints.items()
                                          if nic not in self._ticked]  # fmt: skip
        if driven:
            self._driver = CompiledDriver(
                driven,
                before_tick=None if once else self._driver_hook,
                tick_ns=self.cfg.tick_ms * 1_000_000,
                batch=self.cfg.tick_batch,
            )
            if self._driver.batched:  # its rows go into the engines from C (`_driver_hook`)
                self.plan.compile()
            tasks.append(asyncio.create_task(self._driver.run()))
        tasks.extend(asyncio.create_task(c) for c in self._factory.agent_tasks(self))
        self.publish_neighbors()  # before the publisher's first connect: it goes out first
        if self.peer_book is not None and not once:
            tasks.append(asyncio.create_task(follow_neighbors(
                self.cfg.mqtt, f"qpmesh-neighbors-{self.cfg.host}", self.peer_book,
                self._learned_peers,
            )))  # fmt: skip
        if self.discovery and not once:
            if driven:  # traces start on the driver's tick: no timer of their own
                self._flows = sweep_flows(self.peers, self.plan.ports)
                self._traces = TraceTimer(len(self._flows), self._trace_gap_s(),
                                          self.cfg.paths_refresh_s, time.monotonic())  # fmt: skip
            else:
                tasks.append(asyncio.create_task(self._trace_loop()))
            tasks.append(asyncio.create_task(self._paths_publisher()))
        if self.cfg.signals_interval_s > 0 and not once:
            tasks.append(asyncio.create_task(self._signals_loop()))
        pub_stop = asyncio.Event()
        pub_task = asyncio.create_task(self.publisher.run(pub_stop))
        try:
            self.publish_health()
            if once:
                await self._one_round()
            else:
                await self._loop(stop)
        finally:
            self.flush_batch()
            for ep in self.endpoints.values():
                ep.close()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            pub_stop.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(
                    self.cfg.mqtt.drain_on_stop_s + 2 * self.cfg.mqtt.timeout_s
                ):
                    await asyncio.shield(pub_task)
            if not pub_task.done():
                pub_task.cancel()
                await asyncio.gather(pub_task, return_exceptions=True)
            self.endpoints.clear()
            self._driver = None
            self._traces = None
            self._targets = None
            self._stream_table = None
            self._core_targets = None
        return self.stats

    def _records(self) -> int:
        for s in self.sessions.values():
            self._events += s.take_events()
        return sum(len(e) if isinstance(e, ResultBlock) else 1 for e in self._events)

    def _any_now(self) -> int:
        ep = next(iter(self.endpoints.values()))
        return ep.now_ns()

    async def _one_round(self) -> None:
        now = self._now_ns()
        probes = plan_round(self.plan, self.peers, now)
        self._queue(probes, now)
        wait_s = self.cfg.timeout_ms / 1000.0 + 0.05 + len(probes) * 0.001
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self._records() < self.stats.probes_queued:
            await asyncio.sleep(0.01)
        for s in self.sessions.values():  # report what never completed as lost
            self._collect(s.poll(self._any_now() + s.timeout_ns + 1))

    @property
    def driver(self) -> CompiledDriver | None:
        """Return the timer that ticks the compiled endpoints while `run` runs (else None)."""
        return self._driver

    def driven_endpoints(self) -> list[compiled.CompiledUdpEndpoint]:
        """Return the compiled endpoints a `CompiledDriver` ticks (`NicTransport.ticked`; also
        behind a path-discovery wrapper), in the NICs' order."""
        return list(self._ticked.values())

    def _driver_hook(self) -> None:
        """The driver's hook, once per tick: queue the probes the plan has due within the lead
        (`DRIVEN_LEAD_NS`, at least a tick) and start the traces path discovery has due."""
        plan_now = self._now_ns()
        lead = max(DRIVEN_LEAD_NS, self.cfg.tick_ms * 1_000_000)
        nxt = self.plan.next_at_ns()
        self.slip.note(nxt, plan_now)
        if nxt is not None and nxt <= plan_now + lead:
            driver = self._driver
            if driver is not None and driver.batched and self.plan.core is not None:
                self._queue_plan_batched(driver, plan_now + lead, plan_now)
            elif driver is not None and driver.batched:
                self._queue_rows_batched(driver, self.plan.due_rows(plan_now + lead), plan_now)
            else:
                self._queue_rows(self.plan.due_rows(plan_now + lead), plan_now)
        if self._traces is not None:
            self._trace_step(time.monotonic())

    async def _loop(self, stop: asyncio.Event) -> None:
        batch_s = self.cfg.batch_interval_ms / 1000.0
        loop = asyncio.get_running_loop()
        next_batch = loop.time() + batch_s
        next_health = loop.time() + self.cfg.telemetry_interval_s
        next_links = loop.time()
        d = self.cfg.discover
        lldp_every = d.lldp_interval_s if d is not None and self.local is not None else None
        next_lldp = loop.time() + (lldp_every or 0.0)
        lldp_read: asyncio.Task[Lldp] | None = None
        # the batched hot path queues 10 ms ahead and wakes at most every 5 ms (its endpoints
        # send on their own tick); per-datagram: 2 ms ahead, woken for every probe; compiled:
        # the driver queues on its tick, this loop only batches and reports
        driven = self._driver is not None
        lead_ns, min_sleep_s = (
            (10_000_000, 0.005) if self.hot_path != "per-datagram" else (2_000_000, 0.0)
        )
        while not stop.is_set():
            if not driven:
                plan_now = self._now_ns()
                self.slip.note(self.plan.next_at_ns(), plan_now)
                self._queue(self.plan.due(plan_now + lead_ns), plan_now)
            now = loop.time()
            if now >= next_batch:
                self.slip.note(next_batch * 1e9, now * 1e9)
                self.flush_batch()
                next_batch += batch_s
                if next_batch < now:
                    next_batch = now + batch_s
            if now >= next_health:
                self.publish_health()
                next_health = now + self.cfg.telemetry_interval_s
            if now >= next_links:
                if self.check_links():
                    next_health = now + self.cfg.telemetry_interval_s
                next_links = now + LINK_CHECK_S
            if lldp_every is not None and d is not None:
                if lldp_read is not None and lldp_read.done():
                    self.check_lldp(lldp_read.result())
                    lldp_read = None
                if lldp_read is None and now >= next_lldp:  # lldpcli in a thread: not here
                    lldp_read = asyncio.create_task(
                        asyncio.to_thread(self._lldp_reader, d.lldp_socket)
                    )
                    next_lldp = now + lldp_every
            if driven:
                wait_s = max(0.0, min(next_batch, next_health, next_links) - loop.time())
            else:
                nxt = self.plan.next_at_ns()
                gap_s = (
                    0.05 if nxt is None else max(min_sleep_s, (nxt - self._now_ns()) / 1e9 - 0.001)
                )
                wait_s = min(gap_s, 0.05, max(0.0, next_batch - now))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await stop.wait()
        if lldp_read is not None:  # a reading still running: let its thread end
            await asyncio.gather(lldp_read, return_exceptions=True)

    # ---- path discovery -----------------------------------------------------------------------

    def poll_paths(self) -> int:
        """Collect finished traces into the outgoing paths queue; return how many finished.

        A changed path puts its flow first in line for the next trace (confirmation).
        """
        done = 0
        for pd in self.discovery.values():
            for item in pd.poll():
                if isinstance(item, DiscoveredPath):
                    self._paths_out.append(item)
                    done += 1
                elif isinstance(item, PathChange) and item.old is not None:
                    self._retrace.append(item.new.key)
        self.stats.paths += done
        return done

    def _trace_gap_s(self) -> float:
        return 1.0 / (self.cfg.paths_traces_per_s * max(1, len(self.discovery)))

    def _retrace_one(self) -> None:
        k = self._retrace.popleft()
        self.discovery[k.src].start(k.dst, self.address[k.dst], k.sport)

    def _trace_flow(self, src: str, dst: str, sport: int) -> None:
        """Start the sweep's trace of one flow, after any changed path waiting to be retraced."""
        while self._retrace:
            self._retrace_one()
        pd = self.discovery.get(src)
        if pd is not None:
            pd.start(dst, self.address[dst], sport)
            self.stats.traces += 1

    def _trace_step(self, now_s: float) -> None:
        """Start the traces `TraceTimer` has due (after any changed path waiting for its
        confirmation) and poll the finished ones: `_trace_loop`'s work, on the driver's tick."""
        assert self._traces is not None
        due, idle = self._traces.due(now_s)
        for i in due:
            self._trace_flow(*self._flows[i])
        if due or idle:
            self.poll_paths()
        if idle and self._retrace:
            self._retrace_one()

    async def _trace_loop(self) -> None:
        """Trace every probe flow, ``traces_per_s`` per NIC; a new sweep every ``refresh_s``,
        and at once when the probes were planned again (`replan`)."""
        gap_s = self._trace_gap_s()
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            self._replanned.clear()
            for flow in sweep_flows(self.peers, self.plan.ports):
                if self._replanned.is_set():
                    break
                self._trace_flow(*flow)
                await asyncio.sleep(gap_s)
                self.poll_paths()
            rest = self.cfg.paths_refresh_s - (loop.time() - began)
            end = loop.time() + max(0.0, rest)
            while loop.time() < end and not self._replanned.is_set():
                await asyncio.sleep(min(1.0, max(0.0, end - loop.time())))
                self.poll_paths()
                if self._retrace:
                    self._retrace_one()

    async def _signals_loop(self) -> None:
        """Every ``signals.interval_s``: read this host's hardware signals and hand the
        window since the last reading to the publisher (``<prefix>/signals/<host>``). The
        collector is opened here and closed when the task ends."""
        cfg = self.cfg
        collector = self._collector_open(signals_config(cfg.host, cfg.nics, cfg.telemetry_gpu))
        self.signals = feed = SignalsFeed(cfg.host)
        try:
            while True:
                doc = feed.offer(collector.read(self._now_ns()))
                if doc is not None:
                    self.publisher.set_signals(doc.encode())
                await asyncio.sleep(cfg.signals_interval_s)
        finally:
            collector.close()

    async def _paths_publisher(self) -> None:
        """Hand queued paths to the publisher once a second (``<prefix>/paths/<host>``, sent
        on the publisher's connection, at most 500 paths a document)."""
        while True:
            await asyncio.sleep(1.0)
            if not self._paths_out:
                continue
            out = list(self._paths_out)
            self._paths_out.clear()
            for k in range(0, len(out), 500):
                self.publisher.submit_paths(paths_payload(out[k : k + 500]))
