"""``qpmesh controller`` service: MQTT in, `LiveController`, events out (the thin asyncio shell).

The parts live beside it: `controller.config` (TOML -> `ServiceConfig`), `controller.dispatch`
(one message onto the live state, event payloads, the JSON-lines log), `controller.pathmap`
(discovered paths -> hops, pure). Here: `run_service(broker, config, ...)` wires the
components from their config values once (the live state, time series and metrics, remediation,
the API process, the probe queue) into a `Wiring`, and runs `serve_once(wiring)`, one
connection's lifetime (subscribe, pump messages, tick, publish events as JSON on
``<prefix>/events/<kind>``, run clock solves in a worker thread: a solve that raises is logged
and counted, never fatal), under the shared reconnect loop (`mqttlink.reconnect`), whose
backoff starts over after every good connection. Every awaited broker request has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from contract.actionsig import ActionSigner
from contract.documents import EventDoc, PathsDoc
from contract.jsondoc import DocumentError
from contract.topics import Topics
from controller.admission import nic_hosts
from controller.api.runtime import ApiRuntime
from controller.brain import Brain
from controller.brainlike import BrainLike
from controller.clocksolve import timed_solve
from controller.coalesce import ProbeQueue
from controller.config import ServiceConfig
from controller.control import ControlChange
from controller.crosslayer import CrossLayer, slowdowns, with_root_cause
from controller.dispatch import JsonLog, apply_paths, handle_message, message_kind
from controller.fleet.cores import FleetCore, SolveResultLike
from controller.fleet.solverloop import SolverLoop
from controller.jobs import JobRegistry
from controller.keptpaths import MAX_AGE_NS, KeptPaths
from controller.keptpaths import load as load_paths
from controller.keptpaths import write as write_paths
from controller.live import LiveController
from controller.openfindings import OpenFindings
from controller.openfindings import load as load_findings
from controller.openfindings import save as save_findings
from controller.pathmap import PathRows, path_rows
from controller.remediation.runtime import RemediationRuntime, action_event
from controller.timeseries.lineproto import Point
from controller.timeseries.runtime import Observability
from controller.topology import TopologyLearner, relearn_live
from mesh.fabric import Fabric
from mqttlink.reconnect import Backoff, reconnect_loop, stop_tasks
from mqttlink.settings import CredentialError, client_kwargs

REQUEST_TIMEOUT_S = 10.0
LOGGED = 50
"""At most this many changes, plan differences and problems in a ``topology`` log line."""


@dataclass(frozen=True, slots=True)
class Broker:
    """Where the service connects: the broker's address and the topic tree under its prefix.
    TLS and credentials are the config's (``[mqtt]``). (Splitting probe batches across
    controllers with a shared subscription made half-meshes with their own findings; the
    fleet is `controller.fleet` on NATS, docs/scale.md.)"""

    host: str
    port: int
    topics: Topics = field(default_factory=Topics)


class EventSource(Protocol):
    """Where each tick's new findings come from: the live state's detection
    (`LiveController.tick`), or the fleet solver's solved windows (`FleetFeed`)."""

    def tick(self, now_ns: int) -> list[EventDoc]: ...


class FleetFeed:
    """The fleet solver's results as an `EventSource`: `add` (the solver loop's
    ``on_result``) queues a solved window's events, `tick` hands them out once."""

    def __init__(self) -> None:
        self._events: list[EventDoc] = []
        self.windows = 0

    def add(self, window: int, result: SolveResultLike) -> None:
        """Queue ``result``'s events."""
        self._events.extend(result.events)
        self.windows += 1

    def tick(self, now_ns: int) -> list[EventDoc]:
        """Return the events queued since the last tick."""
        out, self._events = self._events, []
        return out


def _ignore(_: object) -> None:
    return None


def _ignore_fabric(_: Fabric, __: int) -> None:
    return None


def _same(brain: BrainLike) -> BrainLike:
    return brain


@dataclass(frozen=True)
class Wiring:
    """What one connection's lifetime works with, built once by `run_service` and kept
    across reconnects: the broker, the config (``tick_s``, ``router_nodes``,
    ``mqtt_security``), the live state, the clock and the log, the message ``counters``
    (mutated), the components that are on (remediation, the API process, the probe queue)
    and the observers: ``on_solve`` (a clock solve's wall time, s), ``on_action`` (an audit
    record of the remediation policy), ``on_tick`` (the time of a tick whose events are out),
    ``on_points`` (the cross-layer room's time-series points);
    ``topology``: the learner of a learned fabric (None: the fabric is declared), with
    ``on_fabric(fabric, now)`` called before a learned change is applied and ``tee`` wrapping
    the new brain after it (the time series: `Observability.refabric` and `.brain`);
    ``events``: where each tick's findings come from (None: ``live``'s detection; the fleet
    solver's `FleetFeed` with ``[fleet]``, probe batches then come from NATS, not MQTT);
    ``crosslayer``: hardware signals -> anomalies -> slow jobs' causes (`controller.crosslayer`);
    ``findings``: the findings open to consumers, kept in ``state_dir`` across restarts
    (`controller.openfindings`; None: not kept); ``kept``: the traced paths learned, kept
    there too (`controller.keptpaths`; None: not kept); ``gate``: with the fleet's solves in a
    worker thread (edge owners), the lock the solver loop holds while one is in flight: host
    facts wait for it in arrival order, and the ticker and the time series read the live
    state only between solves (None: the live state is the loop's alone).
    """

    broker: Broker
    config: ServiceConfig
    live: LiveController
    clock: Callable[[], int]
    log: JsonLog
    counters: dict[str, int] = field(default_factory=dict)
    remediation: RemediationRuntime | None = None
    api: ApiRuntime | None = None
    queue: ProbeQueue | None = None
    on_solve: Callable[[float], None] = _ignore
    on_action: Callable[[dict[str, object]], None] = _ignore
    on_tick: Callable[[int], None] = _ignore
    on_points: Callable[[list[Point]], object] = _ignore
    topology: TopologyLearner | None = None
    on_fabric: Callable[[Fabric, int], None] = _ignore_fabric
    tee: Callable[[BrainLike], BrainLike] = _same
    crosslayer: CrossLayer | None = None
    events: EventSource | None = None
    findings: OpenFindings | None = None
    state_dir: Path | None = None
    kept: KeptPaths | None = None
    gate: asyncio.Lock | None = None


def _held(gate: asyncio.Lock | None) -> contextlib.AbstractAsyncContextManager[object]:
    """Return ``gate`` to hold (nothing when None: the one-process service)."""
    return gate if gate is not None else contextlib.nullcontext()


def relearn(w: Wiring, now_ns: int) -> list[EventDoc]:
    """With a learned fabric: learn it again when due and apply a change to the live state
    (`controller.topology.relearn_live`, with a fresh brain of the configured thresholds) and
    to the remediation's leaf map and the time series (``on_fabric`` before, ``tee`` after),
    log a ``topology`` line (NICs, links, what changed, how it
    compares with the plan, what could not be placed: `LOGGED` of each, and their counts);
    return the ``topology`` event (empty:
    no change)."""
    if w.topology is None:
        return []
    done = relearn_live(w.live, w.topology, now_ns, lambda f: Brain(f, w.config.brain),
                        before=lambda f: w.on_fabric(f, now_ns))  # fmt: skip
    if done is None:
        return []
    w.live.brain = w.tee(w.live.brain)
    change, event = done
    fab = change.learned.fabric
    if w.remediation is not None:
        w.remediation.leaf_of = {n.id: n.leaf for n in fab.nics}
    plan = change.plan
    diffs = () if plan is None else plan.differences
    w.log(now_ns, "topology", nics=len(fab.nics), links=len(fab.links),
          changes=list(change.changes[:LOGGED]), n_changes=len(change.changes),
          problems=list(change.learned.problems[:LOGGED]),
          matches_plan=None if plan is None else plan.matches_plan,
          plan_differences=list(diffs[:LOGGED]), n_plan_differences=len(diffs))  # fmt: skip
    return [event]


async def _ticker(client: aiomqtt.Client, w: Wiring) -> None:
    """Every ``tick_s``: detection (``w.events``: `LiveController.tick`, or the fleet
    solver's windows), the remediation policy, the API's snapshot, then actions and events
    out; ``on_tick(now)`` once they are. The coalescing queue is ingested first (a window
    waits for what is queued otherwise), and how late the tick ran and what judging cost go
    to the controller's own lateness (`LiveController.loop_lag`, `tick_cost`)."""
    live, topics, clock, log = w.live, w.broker.topics, w.clock, w.log
    source: EventSource = w.events if w.events is not None else live
    api, remediation, on_action = w.api, w.remediation, w.on_action
    last_hooks: dict[str, object] = {}
    period_ns = round(w.config.tick_s * 1e9)
    planned = clock() + period_ns
    while True:
        await asyncio.sleep(max(0.0, (planned - clock()) / 1e9))
        async with _held(w.gate):  # the live state only between threaded solves
            now = clock()
            live.loop_lag(planned, now)
            planned += period_ns
            if planned <= now:  # a late tick does not bunch up the next ones
                planned = now + period_ns
            if w.queue is not None and len(w.queue):
                _flush(live, w.queue, clock, log, w.counters)
            new = relearn(w, now)
            new += source.tick(now)
            live.tick_cost(clock() - now, now)
            if w.findings is not None:
                new = _kept_open(w, w.findings, new, now)
            actions: list[tuple[str, bytes]] = []
            if remediation is not None:
                remediation.observe(new)
                actions, docs = remediation.tick(now)
                for doc in docs:
                    log(now, "action", id=doc["id"], kind=doc["kind"], status=doc["status"],
                        nic=doc["nic"], link=doc["link"], job=doc["job"], reason=doc["reason"])  # fmt: skip
                    on_action(doc)
                new += [action_event(doc) for doc in docs]
                new += remediation.job_events(now)  # slowdowns attributed to the fabric
                if w.crosslayer is not None:  # anomalies, and slow jobs' causes from both layers
                    xl = w.crosslayer
                    xl.follow(live.fabric)
                    if xl.due(now):
                        jobs = remediation.jobs.jobs()
                        found = xl.step(now, jobs, slowdowns(jobs, remediation.job_status),
                                        live.snapshot().events)  # fmt: skip
                        live.record_events(found)
                        new += found
                        w.on_points(xl.take_points())  # the cross-layer dashboard's series
                hooks = remediation.sender.stats.to_dict()
                if hooks != last_hooks:  # webhook/Alertmanager deliveries, retries, failures
                    log(now, "remediation hooks", **hooks, pending=remediation.sender.pending)
                    last_hooks = hooks
            if api is not None:
                api.publish(live.snapshot(), tuple(new))
        for topic, payload in actions:  # the actions first: a job waits on them
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await client.publish(topic, payload, qos=1)
        for ev in new:
            if ev.kind != "remediation":  # the line is the event's JSON plus "msg"
                log(ev.t_ns, "event", **{k: v for k, v in ev.to_json().items() if k != "t_ns"})
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await client.publish(topics.events(ev.kind), ev.encode(), qos=1)
        w.on_tick(now)


def session_kwargs(config: ServiceConfig) -> dict[str, Any]:
    """Return the `aiomqtt.Client` arguments of the controller's MQTT session: with
    ``[mqtt] session`` a persistent one (that client id, ``clean_start`` false, the session
    kept ``session_expiry_s`` after a disconnect: the broker queues the QoS 1 batches of its
    subscriptions meanwhile, so a controller that restarts, or reconnects after the broker
    did, judges them; issue 32); else none (a clean session per connect)."""
    if not config.mqtt_session:
        return {}
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = config.mqtt_session_expiry_s
    return {"identifier": config.mqtt_session, "clean_start": False, "properties": props}


def _kept_open(w: Wiring, findings: OpenFindings, new: list[EventDoc], now: int) -> list[EventDoc]:
    """``new`` as `OpenFindings.apply` leaves it, the open set saved in ``w.state_dir``
    when it changed (a failed write is logged, never fatal: the next change writes again)."""
    out = findings.apply(new, now)
    if findings.changed and w.state_dir is not None:
        try:
            save_findings(w.state_dir, findings)
        except OSError as exc:
            w.log(now, "open findings not saved", error=str(exc))
    return out


def _keep_paths(w: Wiring, outcome: str, topic: str, payload: bytes, now_ns: int) -> None:
    """With ``w.kept``: keep the complete paths of a ``paths/<host>`` document the live state
    took (``outcome`` "paths"; those whose source NICs its host owns: the learner's owners,
    else the declared fabric's)."""
    kept = w.kept
    if kept is None or outcome != "paths":
        return
    try:
        doc = PathsDoc.decode(payload)
    except DocumentError:  # the declared fabric's ingest takes what it can of a bad one
        return
    host = w.broker.topics.parse(topic)[1]
    owners = w.topology.owners if w.topology is not None else nic_hosts(w.live.fabric)
    kept.add(host, doc.paths, owners, now_ns)


def restore_paths(
    live: LiveController,
    topology: TopologyLearner | None,
    router_nodes: Mapping[str, str],
    kept: KeptPaths,
) -> int:
    """Install the paths a predecessor kept (``kept``, before the first message: what comes
    afterwards replaces them): into the learner of a learned fabric (its next relearn fills
    the live state's path tables), else into the live state's path tables through
    ``router_nodes``. Return how many were taken."""
    if topology is not None:
        return topology.restore(kept.restored())
    return apply_paths(live, router_nodes, kept.entries())


def _beside(client: aiomqtt.Client, w: Wiring) -> list[Coroutine[Any, Any, None]]:
    """Return what runs beside a connection's message loop: the ticker, the clock solver
    (not in the fleet, whose solver solves them), the coalescing queue's flusher, the kept
    paths' writer."""
    out = [_ticker(client, w)]
    if w.events is None:  # the fleet's clocks are solved by its solver (controller.fleet)
        out.append(_solver(w))
    if w.queue is not None:
        out.append(_flusher(w.live, w.queue, w.clock, w.log, w.counters))
    if w.kept is not None and w.state_dir is not None:
        out.append(_path_keeper(w, w.kept, w.state_dir))
    return out


async def _path_keeper(w: Wiring, kept: KeptPaths, state_dir: Path) -> None:
    """Every ``tick_s``: when the kept paths are due (`KeptPaths.due`), write them to
    ``state_dir`` in a worker thread (encoding tens of thousands of paths takes a second of
    CPU: not on the loop that ticks). A failed write is logged, never fatal; the paths are
    written again when next due."""
    while True:
        await asyncio.sleep(w.config.tick_s)
        now = w.clock()
        if not kept.due(now):
            continue
        try:
            await asyncio.to_thread(write_paths, state_dir, kept.take(now))
        except OSError as exc:
            kept.changed = True
            w.log(now, "learned paths not saved", error=str(exc))


async def _solver(w: Wiring) -> None:
    """Run due clock solves in a worker thread so ingest goes on meanwhile; ``on_solve``
    gets each solve's wall time in s. The cadence (`ClockSync.solve_period_ns`) is set by the
    solve's own CPU time (`timed_solve`): the budget is a share of a core, and wall time also
    counts the waits for the GIL (ingest runs meanwhile) and for CPUs that other processes
    hold, so on a busy machine it made solves rarer and the clocks staler.

    A solve that raises is logged and counted (``solve_failed``); the controller keeps the
    last good clock state and tries again at the next due solve.
    """
    while True:
        await asyncio.sleep(w.config.tick_s)
        now = w.clock()
        job = w.live.start_solve(now)
        if job is None:
            continue
        t0 = time.perf_counter()
        try:
            state, cpu_s = await asyncio.to_thread(timed_solve, job)
            w.on_solve(time.perf_counter() - t0)
        except Exception as exc:
            w.counters["solve_failed"] = w.counters.get("solve_failed", 0) + 1
            w.log(now, "clock solve failed", error=f"{type(exc).__name__}: {exc}")
            continue
        w.live.install_clock(state, cpu_s)  # its CPU time sets the cadence (solve_budget)


async def serve_once(w: Wiring, *, connected: Callable[[], None] = lambda: None) -> None:
    """One connection's lifetime: subscribe, pump messages, tick; raises `aiomqtt.MqttError`.

    With ``w.queue`` probe batches are ingested merged (`controller.coalesce`): when the
    queue is due (checked on every message and by a timer at its deadline) and, so that
    nothing admitted is lost, when the connection ends.

    ``connected()`` is called once the subscriptions are in place (it resets the backoff);
    the log says ``connected`` just before. With ``w.remediation`` the policy runs every tick
    (`controller.remediation.runtime`): its actions go out on ``<prefix>/remediation/<target>``,
    its audit records to ``w.on_action``, the log, the API's events and
    ``<prefix>/events/remediation``; acks and rank registrations are read from their topics.
    TLS and credentials: ``w.config.mqtt_security`` (`mqttlink.settings.client_kwargs`).
    With a learned fabric (``w.topology``) it also reads every host's neighbours document
    (subscribed first: the retained ones then arrive before the presence they vouch for) and
    learns the fabric again on the ticker (`relearn`).
    """
    live, topics, clock, log, counters = w.live, w.broker.topics, w.clock, w.log, w.counters
    remediation, queue = w.remediation, w.queue
    host, port = w.broker.host, w.broker.port
    async with aiomqtt.Client(
        host, port, protocol=aiomqtt.ProtocolVersion.V5, timeout=REQUEST_TIMEOUT_S,
        **client_kwargs(w.config.mqtt_security), **session_kwargs(w.config),
    ) as client:  # fmt: skip
        learned = (topics.subscription("neighbors"),) if w.topology is not None else ()
        probes = () if w.events is not None else (topics.subscription("probes"),)
        for flt in (
            *learned,
            *probes,
            topics.subscription("presence"),
            topics.subscription("health"),
            topics.subscription("paths"),
            *((topics.subscription("signals"),) if w.crosslayer is not None else ()),
            *(remediation.subscriptions if remediation is not None else ()),
        ):
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await client.subscribe(flt, qos=1)
        log(clock(), "connected", broker=f"{host}:{port}")
        connected()
        tasks = [asyncio.create_task(c) for c in _beside(client, w)]
        try:
            async for msg in client.messages:
                for task in tasks:
                    if task.done():
                        task.result()  # re-raise the ticker's, solver's or flusher's error
                if queue is not None and queue.due(clock()):
                    _flush(live, queue, clock, log, counters)
                payload = msg.payload if isinstance(msg.payload, bytes) else b""
                mine = None if remediation is None else remediation.handle(str(msg.topic), payload)
                sig = (
                    None
                    if w.crosslayer is None
                    else w.crosslayer.handle(topics, str(msg.topic), payload, clock())
                )
                if sig is not None:
                    out = sig
                elif mine is not None:
                    out, ev = mine
                    if ev is not None:
                        await _publish_event(client, topics, w.api, ev)
                else:
                    out = await apply_message(w, str(msg.topic), payload)
                key = "bad" if out.startswith("bad:") else out
                counters[key] = counters.get(key, 0) + 1
                if key == "bad":
                    kind = f"bad:{_topic_kind(topics, str(msg.topic))}"
                    counters[kind] = counters.get(kind, 0) + 1
                    log(clock(), "bad message", topic=str(msg.topic), reason=out[4:])
        finally:
            await stop_tasks(tasks)
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError, TimeoutError):
                    task.result()
            if queue is not None and len(queue):
                _flush(live, queue, clock, log, counters)  # admitted batches are not dropped


async def apply_message(w: Wiring, topic: str, payload: bytes) -> str:
    """Apply one message to the live state (`controller.dispatch.handle_message`, its paths
    kept: `_keep_paths`) and return its outcome; with ``w.gate`` (the fleet's solves in a
    worker thread) only once no solve is in flight: the message loop awaits this, so the host
    facts that came meanwhile follow in arrival order, none lost."""
    async with _held(w.gate):
        out = handle_message(w.live, w.broker.topics, topic, payload, w.clock(),
                             w.config.router_nodes, w.queue, w.topology)  # fmt: skip
        _keep_paths(w, out, topic, payload, w.clock())
    return out


def _flush(
    live: LiveController,
    queue: ProbeQueue,
    clock: Callable[[], int],
    log: JsonLog,
    counters: dict[str, int],
) -> None:
    """Ingest the queued batches merged; an ingest that raises (a bug, not bad input: every
    batch was decoded and checked on arrival) is logged and counted (``ingest_failed``),
    never fatal."""
    n = queue.records
    try:
        live.flush(queue, clock())
    except (ValueError, IndexError) as exc:
        counters["ingest_failed"] = counters.get("ingest_failed", 0) + 1
        log(clock(), "ingest failed", records=n, error=f"{type(exc).__name__}: {exc}")


async def _flusher(
    live: LiveController,
    queue: ProbeQueue,
    clock: Callable[[], int],
    log: JsonLog,
    counters: dict[str, int],
) -> None:
    """Ingest the queued probe batches at the queue's deadline when no message comes to do it
    (the message loop flushes a due queue itself)."""
    idle_s = max(queue.config.coalesce_ms / 1e3, 1e-3)
    while True:
        deadline = queue.deadline_ns()
        wait_s = idle_s if deadline is None else (deadline - clock()) / 1e9
        await asyncio.sleep(min(max(wait_s, 0.0), idle_s))
        if queue.due(clock()):
            _flush(live, queue, clock, log, counters)


async def _publish_event(
    client: aiomqtt.Client, topics: Topics, api: ApiRuntime | None, ev: EventDoc
) -> None:
    if api is not None:
        api.publish(None, (ev,))
    async with asyncio.timeout(REQUEST_TIMEOUT_S):
        await client.publish(topics.events(ev.kind), ev.encode(), qos=1)


def _topic_kind(topics: Topics, topic: str) -> str:
    return message_kind(topics, topic)  # knows the jobs and remediation-ack topics too


def live_state(config: ServiceConfig, topology: TopologyLearner | None = None) -> LiveController:
    """Return the live state `run_service` builds for ``config``: its fabric, live settings
    (clock solves left to the service's worker thread; with ``[fleet]`` solved with each
    window, by the fleet's solver loop) and detection thresholds (with ``[fleet]`` its
    lateness is the workers' grace), with the fabric model's paths trusted or not
    (``config.model_paths``; never for a learned fabric, whose ECMP model is no one's). With
    ``topology`` (a learned fabric) probe batches are judged by the NICs hosts claim
    (`TopologyLearner.owners`)."""
    brain_cfg = config.brain
    if config.fleet is not None:
        brain_cfg = dataclasses.replace(brain_cfg, lateness_ns=config.fleet.plane.grace_ns)
    live = LiveController(
        config.fabric,
        dataclasses.replace(config.live, solve_inline=config.fleet is not None),
        brain=Brain(config.fabric, brain_cfg),
        owners=topology.owners if topology is not None else None,
    )
    # before any ingest: no flow has a path yet
    live.use_model_paths(config.model_paths and config.learn is None)
    return live


def _remediation(
    config: ServiceConfig, prefix: str, log: JsonLog, clock: Callable[[], int]
) -> RemediationRuntime:
    """Return the remediation runtime of ``config`` (its actions signed with
    ``config.action_keys`` if set), having logged what it restored and how it signs."""

    def control_changed(change: ControlChange) -> None:
        log(change.t_ns, "control", enabled=change.enabled, actor=change.actor)

    signer = ActionSigner(config.action_keys) if config.action_keys is not None else None
    rem = RemediationRuntime(
        config.remediation, prefix, on_control=control_changed,
        jobs=JobRegistry(grants=config.grants),  # [api.tenants] binds every job, API or MQTT
        leaf_of={n.id: n.leaf for n in config.fabric.nics},
        sign=signer.sign if signer is not None else None,
    )  # fmt: skip
    if rem.restored:
        log(clock(), "remediation state restored", ids=rem.restored, records=len(rem.log.records()))
    if signer is not None:
        log(clock(), "remediation actions signed", key=signer.key_id)
    elif rem.remediator.sign is None:
        log(clock(), "warning: remediation actions are unsigned (no [auth] action_key_file); "
            "agents with a verify key will ignore them")  # fmt: skip
    return rem


async def _start_api(
    config: ServiceConfig,
    live: LiveController,
    rem: RemediationRuntime,
    obs: Observability,
    log: JsonLog,
    clock: Callable[[], int],
    xl: CrossLayer,
) -> ApiRuntime | None:
    """Start the API process of ``config.api`` (None: no API) on the remediation's jobs,
    Control and action log; raises OSError if its address is taken or it does not start."""
    if config.api is None:
        return None
    api = ApiRuntime(
        config.api, live.snapshot(), jobs=rem.jobs, control=rem.control, actions=rem.log,
        ask=rem.ask, job_status=lambda j: with_root_cause(rem.job_status(j), xl.cause(j)),
        on_clients=obs.websocket_clients,
        log=lambda msg: log(clock(), "api process", detail=msg),
    )  # fmt: skip
    log(clock(), "api serving", url=await api.start())
    return api


async def _observe(
    obs: Observability,
    live: LiveController,
    counters: Mapping[str, int],
    tick_s: float,
    clock: Callable[[], int],
    gate: asyncio.Lock | None,
) -> None:
    """Run the time series and metrics (`Observability.run`); with ``gate`` (the fleet's
    solves in a thread) each step reads the live state while holding it."""
    if gate is None:
        await obs.run(live, counters, tick_s, clock)
        return
    while True:
        await asyncio.sleep(tick_s)
        async with gate:
            await obs.step(live, counters, clock())


def _traced_on(
    topology: TopologyLearner | None, live: LiveController
) -> Callable[[Fabric], PathRows] | None:
    """Return what maps the learner's traced paths onto a learned fabric (the fleet's
    solver publishes them with it: `controller.fleet.fabricwire`); None without one."""
    if topology is None:
        return None
    learner = topology

    def traced_on(fabric: Fabric) -> PathRows:
        return path_rows(fabric, learner.router_nodes, learner.traced(), live.max_hops)

    return traced_on


async def run_service(
    broker: Broker,
    config: ServiceConfig,
    *,
    log: JsonLog,
    clock: Callable[[], int] = time.time_ns,
    live: LiveController | None = None,
    observability: Observability | None = None,
    max_attempts: int | None = None,
    on_tick: Callable[[int], None] = _ignore,
    fleet_core: Callable[[LiveController], FleetCore] | None = None,
    crosslayer: CrossLayer | None = None,
) -> LiveController:
    """Run until cancelled, reconnecting with exponential backoff on broker errors.

    The backoff (``config.backoff_s``) starts again from its minimum after every connection
    that worked (`mqttlink.reconnect`). The log says ``connected`` once the subscriptions of a
    connection are in place.

    ``live``: the live state to run (default `live_state(config)`; pass one only with a
    declared fabric: a learned fabric's live state judges origins by the learner this
    function makes, `live_state(config, topology)`); ``max_attempts`` bounds
    the connection attempts (tests); returns the live state then. ``on_tick(now)`` is called
    after every tick, once its events are out (tests wait on it instead of the wall clock).
    With ``config.timeseries`` every interval is written there (the brain is wrapped so the
    recorder sees its input and events); with ``config.metrics_listen`` the controller's own
    metrics are served for Prometheus (`controller.timeseries.runtime.Observability`; pass
    ``observability`` to share it, e.g. with the API for its websocket gauge and health).
    With ``config.api`` the HTTP API (`controller.api`) serves from the start (also while the
    broker is away) from its own process (`controller.api.runtime`), fed after every tick;
    raises OSError if its address is taken or that process does not start.
    Remediation (``config.remediation``) runs every tick; its job registry and Control are the
    API's, so ``PUT /api/v1/control`` switches real remediation and jobs registered through
    the API feed the policy. The registry holds every job, from the API or MQTT, to
    ``config.grants`` (the operator's ``[api.tenants]``). The probers' signals documents go to
    ``crosslayer`` (default: a `controller.crosslayer.CrossLayer` on the live fabric), whose
    ``anomaly`` and ``root_cause`` events join the tick's and whose causes ``/api/v1/jobs``
    shows.

    With ``config.fleet`` this is the fleet's solver (docs/scale.md): probe batches are not
    read from MQTT; `controller.fleet.solverloop.SolverLoop` (on ``config.nats``, lease id
    ``config.fleet.member``) solves the windows with the core ``fleet_core(live)`` (the live
    state's own `FleetSolver`, so host facts, the snapshot and the time series are the live
    state's; with a learned fabric a core that follows ``live.solver``, which a change
    replaces), and their events go out through the same ticker, remediation, API and log;
    with a learned fabric the solver publishes each version to the workers
    (`controller.fleet.fabricwire`).
    Raises ValueError if ``config.fleet`` is set without ``fleet_core`` or ``config.nats``.
    """
    topology = TopologyLearner(config.learn) if config.learn is not None else None
    if live is None:
        live = live_state(config, topology)
    obs = observability or Observability(
        config.fabric, config.timeseries, config.metrics_listen, log
    )
    live.brain = obs.brain(live.brain)
    rem = _remediation(config, broker.topics.prefix, log, clock)

    def on_action(doc: dict[str, object]) -> None:
        try:  # the status as a tag value: sent, would_have, suppressed
            obs.action({**doc, "status": str(doc["status"]).replace(" ", "_")})
        except ValueError as exc:
            log(clock(), "action not recorded", error=str(exc))

    feed: FleetFeed | None = None
    gate = asyncio.Lock() if config.fleet is not None and config.fleet.plane.edge_owners else None
    sides: list[Callable[[], Coroutine[Any, Any, object]]] = [
        lambda: _observe(obs, live, w.counters, config.tick_s, clock, gate)
    ]
    if config.fleet is not None:
        if fleet_core is None or config.nats is None:
            raise ValueError("[fleet] needs [nats] and a solver core")
        feed = FleetFeed()
        core = fleet_core(live)
        member = config.fleet.member or f"{socket.gethostname().split('.')[0]}-{os.getpid()}"
        learned = (lambda: live.fabric) if topology is not None else None
        solver = SolverLoop(config.fleet.plane, config.nats, member, lambda: core, feed.add,
                            log=log, clock_ns=clock, solve_in_thread=False, fabric_of=learned,
                            paths_of=_traced_on(topology, live), blocks=core,
                            gate=gate)  # fmt: skip
        sides.append(solver.run)
    xl = crosslayer or CrossLayer(live.fabric)  # signals in; anomaly, root_cause events out
    api = await _start_api(config, live, rem, obs, log, clock, xl)
    state_dir = config.remediation.state_dir if config.remediation is not None else None
    findings = OpenFindings(load_findings(state_dir)) if state_dir is not None else None
    if findings is not None and findings.inherited:
        log(clock(), "open findings restored", n=len(findings.inherited))
    kept: KeptPaths | None = None
    if state_dir is not None:
        max_age = config.learn.path_max_age_ns if config.learn is not None else MAX_AGE_NS
        kept = KeptPaths(load_paths(state_dir, clock(), max_age))
        if kept.paths:
            n = restore_paths(live, topology, config.router_nodes, kept)
            log(clock(), "learned paths restored", n=len(kept.paths), taken=n)
    w = Wiring(
        broker, config, live, clock, log, remediation=rem, api=api,
        queue=ProbeQueue(config.ingest) if config.ingest.coalesce_ms > 0 else None,
        on_solve=obs.solve, on_action=on_action, on_tick=on_tick, topology=topology,
        on_fabric=lambda f, t: obs.refabric(f, live, t), tee=obs.brain, events=feed,
        crosslayer=xl, on_points=obs.points, findings=findings, state_dir=state_dir,
        kept=kept, gate=gate,
    )  # fmt: skip

    async def session(connected: Callable[[], None]) -> None:
        await serve_once(w, connected=connected)

    def on_error(exc: BaseException, retry_in_s: float) -> None:
        log(clock(), "broker error", error=str(exc), retry_in_s=retry_in_s, counters=w.counters)

    async with obs:
        if (addr := obs.metrics_address) is not None:
            log(clock(), "metrics", listen=f"{addr[0]}:{addr[1]}")
        side = [asyncio.create_task(run()) for run in sides]
        try:
            await reconnect_loop(
                session, Backoff(*config.backoff_s), on_error=on_error,
                max_attempts=max_attempts,
                errors=(aiomqtt.MqttError, TimeoutError, CredentialError),
            )  # fmt: skip
        finally:
            await stop_tasks(side)
            for task in side:
                with contextlib.suppress(asyncio.CancelledError):
                    task.result()
            if api is not None:
                await api.stop()
            await rem.sender.drain(2.0)  # give queued webhook deliveries a moment
            await rem.sender.stop()
    return live
