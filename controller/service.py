"""``qpmesh controller`` service: MQTT in, `LiveController`, events out (thin asyncio shell).

`load_config` validates a TOML config (fabric shape or fabric JSON file, sync knobs, detection
thresholds) and raises `ConfigError` with a one-line message. `handle_message` is the pure-ish
dispatch of one MQTT message onto the live state. `run_service` is the reconnect loop: connect
with aiomqtt (MQTT 5), subscribe, pump messages, tick periodically, publish events as JSON on
``<prefix>/events/<kind>``; on `aiomqtt.MqttError` it backs off and reconnects. Every awaited
broker request has a timeout. Logs are JSON lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiomqtt
import numpy as np

from contract.records import RecordError, decode_batch
from contract.tomlcheck import Table, parse_toml
from contract.topics import TopicError, Topics
from controller.brain import Brain, BrainConfig
from controller.clocksync import ClockSyncConfig
from controller.fabric import Fabric, FabricError, FabricShape, build_fabric
from controller.live import LiveConfig, LiveController
from controller.snapshot import MeshEvent
from mqttlink.reconnect import Backoff, reconnect_loop

REQUEST_TIMEOUT_S = 10.0


class ConfigError(ValueError):
    """The controller configuration is invalid (one-line message)."""


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the service needs, validated."""

    fabric: Fabric
    live: LiveConfig = field(default_factory=LiveConfig)
    brain: BrainConfig = field(default_factory=BrainConfig)
    tick_s: float = 1.0
    backoff_s: tuple[float, float] = (0.5, 30.0)
    router_nodes: Mapping[str, str] = field(default_factory=dict)
    model_paths: bool = True  # False: flows without a discovered path have unknown hops


def path_hops(
    fabric: Fabric, router_nodes: Mapping[str, str], src: str, dst: str, hops: list[Any]
) -> list[int] | None:
    """Return the directed hop ids of a discovered path, or None if it cannot be mapped.

    The node sequence is ``src`` NIC, the fabric node owning each router address (from
    ``router_nodes``, address -> node id), ``dst`` NIC; each consecutive pair must be a fabric
    link (up if the pair is (lower, upper), down if reversed). Silent hops, unknown addresses
    or NICs and non-adjacent nodes give None (the ingest then keeps the model path).
    """
    if src not in fabric.nic_index or dst not in fabric.nic_index:
        return None
    nodes = [src]
    for h in hops:
        node = router_nodes.get(h) if isinstance(h, str) else None
        if node is None:
            return None
        nodes.append(node)
    nodes.append(dst)
    pair = fabric.link_between
    out = []
    for u, v in itertools.pairwise(nodes):
        if (u, v) in pair:
            out.append(2 * pair[(u, v)])
        elif (v, u) in pair:
            out.append(2 * pair[(v, u)] + 1)
        else:
            return None
    return out


def apply_paths(live: LiveController, router_nodes: Mapping[str, str], doc: Any) -> int:
    """Feed a ``paths/<host>`` document into the ingest's path tables; return paths taken.

    Each reached, fully answered path sets the forward hops of its flow (src, dst, sport) and,
    as its mirror image (same links, opposite directions, reverse order), the hops of the
    replies to that flow: Linux's L4 multipath hash is symmetric in (address, port) pairs, so
    the reply (dst -> src, 4791 -> sport) takes the same spine as the probe. Raises ValueError
    if ``doc`` is not a list of objects.
    """
    if not isinstance(doc, list):
        raise ValueError("paths payload must be a JSON list")
    f = live.fabric
    rows: list[tuple[int, int, int, list[int]]] = []
    for e in doc:
        if not isinstance(e, dict):
            raise ValueError("paths entries must be objects")
        if not e.get("reached", True):
            continue
        src, dst, sport, hops = e.get("src"), e.get("dst"), e.get("sport"), e.get("hops")
        if not (isinstance(src, str) and isinstance(dst, str) and isinstance(sport, int)
                and isinstance(hops, list)):  # fmt: skip
            continue
        ids = path_hops(f, router_nodes, src, dst, hops)
        if ids is None or len(ids) > live.max_hops:
            continue
        rows.append((f.nic_index[src], f.nic_index[dst], sport, ids))
    if not rows:
        return 0
    fwd = np.full((len(rows), live.max_hops), -1, np.int32)
    for i, (_, _, _, ids) in enumerate(rows):
        fwd[i, : len(ids)] = ids
    live.learn_paths(
        np.array([r[0] for r in rows], np.int64),
        np.array([r[1] for r in rows], np.int64),
        np.array([r[2] for r in rows], np.int64),
        fwd,
    )
    return len(rows)


def load_config(path: Path | None, base_dir: Path | None = None) -> ServiceConfig:
    """Read and validate a TOML config (None = defaults: a default-shaped fabric).

    Sections: ``[fabric]`` (shape keys of `FabricShape`, or ``file = "fabric.json"``),
    ``[sync]`` (``window_s``, ``solve_every_s``, ``coded_tol_ns``, ``use_uncoded``),
    ``[controller]`` (``tick_s``, ``stale_s``, ``max_events``), ``[thresholds]`` (the
    detection `BrainConfig`, nested tables for its parameter groups), ``[paths]``
    (``routers``: router address -> fabric node id, to map the probers' discovered paths onto
    fabric links; ``model = false``: the fabric model's ECMP hash is not authoritative, so
    flows without a discovered path get unknown hops). Types are strict
    (`contract.tomlcheck`): ``use_uncoded = "false"`` is an error, not True. Raises
    `ConfigError` (one line naming the file and the key) on anything invalid.
    """
    src = str(path) if path is not None else "<defaults>"
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        doc = parse_toml(text, src, ConfigError)
        base_dir = base_dir or path.parent
    root = Table.root(doc, src, ConfigError)
    fab = root.table("fabric")
    if fab.has("file"):
        fpath = Path(fab.require("file", str))
        if not fpath.is_absolute() and base_dir is not None:
            fpath = base_dir / fpath
        if set(fab.values) - {"file"}:
            raise ConfigError(f"{src}: fabric: takes either file or shape keys, not both")
        try:
            fabric = Fabric.from_dict(json.loads(fpath.read_text()))
        except OSError as exc:
            raise ConfigError(f"cannot read fabric file {fpath}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"fabric file {fpath}: bad JSON: {exc}") from None
        except FabricError as exc:
            raise ConfigError(f"fabric file {fpath}: {exc}") from None
    else:
        try:
            fabric = build_fabric(fab.dataclass(FabricShape()))
        except FabricError as exc:
            raise ConfigError(f"{src}: fabric: {exc}") from None
    d = ClockSyncConfig()  # unset keys keep the pipeline's defaults (one solve per window)
    sy = root.table("sync")
    pos = "a number > 0"
    sync = ClockSyncConfig(
        window_ns=int(sy.get("window_s", float, d.window_ns / 1e9, lambda v: v > 0, pos) * 1e9),
        solve_every_ns=int(
            sy.get("solve_every_s", float, d.solve_every_ns / 1e9, lambda v: v > 0, pos) * 1e9
        ),
        coded_tol_ns=sy.get(
            "coded_tol_ns", int, d.coded_tol_ns, lambda v: v >= 0, "an integer >= 0"
        ),
        use_uncoded=sy.get("use_uncoded", bool, d.use_uncoded),
    )
    sy.finish()
    co = root.table("controller")
    live = LiveConfig(
        sync=sync,
        stale_ns=int(co.get("stale_s", float, 10.0, lambda v: v > 0, pos) * 1e9),
        max_events=co.get("max_events", int, 200, lambda v: v > 0, "an integer > 0"),
    )
    tick_s = co.get("tick_s", float, 1.0, lambda v: v > 0, pos)
    co.finish()
    pa = root.table("paths")
    model_paths = pa.get("model", bool, True)
    routers = pa.mapping("routers", str, "a fabric node id")
    for addr, node in routers.items():
        if node not in fabric.node_by_id:
            raise ConfigError(f"{src}: paths.routers.{addr}: unknown fabric node {node!r}")
    pa.finish()
    brain = root.table("thresholds").dataclass(BrainConfig())
    root.finish()
    return ServiceConfig(
        fabric=fabric,
        live=live,
        brain=brain,
        tick_s=tick_s,
        router_nodes=routers,
        model_paths=model_paths,
    )


def event_json(ev: MeshEvent) -> bytes:
    """Return the JSON payload of an event."""
    return json.dumps(
        {
            "t_ns": ev.t_ns,
            "kind": ev.kind,
            "target": ev.target,
            "detail": ev.detail,
            "severity": ev.severity,
            "flows": [list(f) for f in ev.flows],
        },
        separators=(",", ":"),
    ).encode()


class JsonLog:
    """Structured log: one JSON object per line on ``stream``; time passed in by the caller."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def __call__(self, t_ns: int, msg: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"t_ns": t_ns, "msg": msg, **fields}, default=str) + "\n")
        self.stream.flush()


def handle_message(
    live: LiveController,
    topics: Topics,
    topic: str,
    payload: bytes,
    now_ns: int,
    router_nodes: Mapping[str, str] | None = None,
) -> str:
    """Apply one MQTT message to ``live``; return a short outcome (for counters and logs).

    Outcomes: ``probes``, ``duplicate``, ``presence``, ``health``, ``paths``, ``ignored``;
    malformed payloads return ``bad:<reason>`` instead of raising. ``router_nodes`` maps
    router addresses of discovered paths to fabric nodes (no map: paths are ignored).
    """
    try:
        kind, host = topics.parse(topic)
    except TopicError:
        return "ignored"
    try:
        if kind == "probes":
            n = live.ingest_batch(decode_batch(payload), now_ns)
            return "probes" if n else "duplicate"
        if kind == "presence":
            doc = json.loads(payload) if payload else {"alive": False}
            alive = doc.get("alive")
            if not isinstance(alive, bool):
                return "bad:presence needs a boolean alive"
            live.presence(host, alive, now_ns)
            return "presence"
        if kind == "paths":
            if not router_nodes:
                return "ignored"
            apply_paths(live, router_nodes, json.loads(payload))
            return "paths"
        if kind == "health":
            doc = json.loads(payload)
            ok = doc.get("gpu_ok", True)
            present = doc.get("present", True)
            detail = str(doc.get("detail", ""))
            if not isinstance(ok, bool) or not isinstance(present, bool):
                return "bad:health needs boolean gpu_ok/present"
            live.gpu(host, ok, detail, now_ns, present=present)
            return "health"
    except RecordError as exc:
        return f"bad:{exc}"
    except (ValueError, AttributeError) as exc:
        return f"bad:{type(exc).__name__}: {exc}"
    return "ignored"


async def _ticker(
    client: aiomqtt.Client,
    live: LiveController,
    topics: Topics,
    tick_s: float,
    clock: Callable[[], int],
    log: JsonLog,
) -> None:
    while True:
        await asyncio.sleep(tick_s)
        now = clock()
        for ev in live.tick(now):
            log(now, "event", kind=ev.kind, target=ev.target, detail=ev.detail)
            await asyncio.wait_for(
                client.publish(topics.events(ev.kind), event_json(ev), qos=1),
                REQUEST_TIMEOUT_S,
            )


async def _solver(
    live: LiveController,
    tick_s: float,
    clock: Callable[[], int],
    log: JsonLog,
    counters: dict[str, int],
) -> None:
    """Run due clock solves in a worker thread so ingest goes on meanwhile.

    A solve that raises is logged and counted (``solve_failed``); the controller keeps the
    last good clock state and tries again at the next due solve.
    """
    while True:
        await asyncio.sleep(tick_s)
        now = clock()
        job = live.start_solve(now)
        if job is None:
            continue
        try:
            state = await asyncio.to_thread(job)
        except Exception as exc:
            counters["solve_failed"] = counters.get("solve_failed", 0) + 1
            log(now, "clock solve failed", error=f"{type(exc).__name__}: {exc}")
            continue
        live.install_clock(state)


async def serve_once(
    host: str,
    port: int,
    live: LiveController,
    topics: Topics,
    *,
    share: str | None,
    tick_s: float,
    clock: Callable[[], int],
    log: JsonLog,
    counters: dict[str, int],
    router_nodes: Mapping[str, str] | None = None,
    connected: Callable[[], None] = lambda: None,
) -> None:
    """One connection's lifetime: subscribe, pump messages, tick; raises `aiomqtt.MqttError`.

    ``connected()`` is called once the subscriptions are in place (it resets the backoff).
    """
    async with aiomqtt.Client(
        host, port, protocol=aiomqtt.ProtocolVersion.V5, timeout=REQUEST_TIMEOUT_S
    ) as client:
        for flt in (
            topics.subscription("probes", share),
            topics.subscription("presence"),
            topics.subscription("health"),
            topics.subscription("paths"),
        ):
            await asyncio.wait_for(client.subscribe(flt, qos=1), REQUEST_TIMEOUT_S)
        log(clock(), "connected", broker=f"{host}:{port}")
        connected()
        tick = asyncio.create_task(_ticker(client, live, topics, tick_s, clock, log))
        solver = asyncio.create_task(_solver(live, tick_s, clock, log, counters))
        try:
            async for msg in client.messages:
                for task in (tick, solver):
                    if task.done():
                        task.result()  # re-raise the ticker's or solver's error
                payload = msg.payload if isinstance(msg.payload, bytes) else b""
                out = handle_message(live, topics, str(msg.topic), payload, clock(), router_nodes)
                key = "bad" if out.startswith("bad:") else out
                counters[key] = counters.get(key, 0) + 1
                if key == "bad":
                    log(clock(), "bad message", topic=str(msg.topic), reason=out[4:])
        finally:
            for task in (tick, solver):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError, TimeoutError):
                    await task


async def run_service(
    host: str,
    port: int,
    config: ServiceConfig,
    topics: Topics,
    *,
    share: str | None = None,
    log: JsonLog,
    live: LiveController | None = None,
    clock: Callable[[], int] = time.time_ns,
    max_attempts: int | None = None,
) -> LiveController:
    """Run until cancelled, reconnecting with exponential backoff on broker errors.

    The backoff starts again from its minimum after every connection that worked
    (`mqttlink.reconnect`).

    ``max_attempts`` bounds the connection attempts (tests); returns the live state then.
    """
    if live is None:
        live = LiveController(
            config.fabric,
            dataclasses.replace(config.live, solve_inline=False),
            brain=Brain(config.fabric, config.brain),
        )
        # before any ingest, so no flow has a model path yet
        live.use_model_paths(config.model_paths)
    counters: dict[str, int] = {}

    async def session(connected: Callable[[], None]) -> None:
        await serve_once(
            host, port, live, topics,
            share=share, tick_s=config.tick_s, clock=clock, log=log, counters=counters,
            router_nodes=config.router_nodes, connected=connected,
        )  # fmt: skip

    def on_error(exc: BaseException, retry_in_s: float) -> None:
        log(clock(), "broker error", error=str(exc), retry_in_s=retry_in_s, counters=counters)

    await reconnect_loop(
        session, Backoff(*config.backoff_s), on_error=on_error, max_attempts=max_attempts,
        errors=(aiomqtt.MqttError, TimeoutError),
    )  # fmt: skip
    return live
