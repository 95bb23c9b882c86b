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
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiomqtt
import numpy as np

from controller.clocksync import ClockSyncConfig, compute_state
from controller.fabric import Fabric, FabricError, FabricShape, build_fabric
from controller.fabric.model import Link, Nic, Node, NodeKind
from controller.live import LiveConfig, LiveController, brain_config, default_brain
from controller.mqtt_topics import TopicError, Topics
from controller.snapshot import MeshEvent
from prober.records import RecordError, decode_batch

REQUEST_TIMEOUT_S = 10.0


class ConfigError(ValueError):
    """The controller configuration is invalid (one-line message)."""


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the service needs, validated."""

    fabric: Fabric
    live: LiveConfig = field(default_factory=LiveConfig)
    thresholds: Mapping[str, Any] = field(default_factory=dict)
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
        ing = live.ingestor
        if ids is None or len(ids) > ing.max_hops:
            continue
        rows.append((f.nic_index[src], f.nic_index[dst], sport, ids))
    if not rows:
        return 0
    ing = live.ingestor
    n = len(rows)
    fwd = np.full((n, ing.max_hops), -1, np.int32)
    rev = fwd.copy()
    for i, (_, _, _, ids) in enumerate(rows):
        fwd[i, : len(ids)] = ids
        rev[i, : len(ids)] = [h ^ 1 for h in reversed(ids)]
    src_a = np.array([r[0] for r in rows], np.int64)
    dst_a = np.array([r[1] for r in rows], np.int64)
    sp_a = np.array([r[2] for r in rows], np.int64)
    ing.paths.update(src_a, dst_a, sp_a, fwd)
    ing.reply_paths.update(src_a, dst_a, sp_a, rev)
    return n


def fabric_from_dict(doc: Mapping[str, Any]) -> Fabric:
    """Rebuild a `Fabric` from `Fabric.to_dict()` output; raises `ConfigError`."""
    try:
        nodes = tuple(
            Node(n["id"], NodeKind(n["kind"]), int(n["index"]), int(n.get("pod", 0)))
            for n in doc["nodes"]
        )
        nics = tuple(
            Nic(n["id"], int(n["index"]), n["host"], n["leaf"], n["address"], n["group"],
                int(n.get("port", 0)))
            for n in doc["nics"]
        )  # fmt: skip
        links = tuple(
            Link(k["id"], int(k["index"]), k["lower"], k["upper"], float(k["capacity_bps"]),
                 float(k["prop_delay_ns"]))
            for k in doc["links"]
        )  # fmt: skip
        return Fabric(nodes, nics, links, dict(doc.get("shape", {})))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad fabric description: {exc}") from None


def load_config(path: Path | None, base_dir: Path | None = None) -> ServiceConfig:
    """Read and validate a TOML config (None = defaults: a default-shaped fabric).

    Sections: ``[fabric]`` (shape keys of `FabricShape`, or ``file = "fabric.json"``),
    ``[sync]`` (``window_s``, ``solve_every_s``, ``coded_tol_ns``, ``use_uncoded``),
    ``[controller]`` (``tick_s``, ``stale_s``, ``max_events``), ``[thresholds]`` (passed to
    the detection `BrainConfig`), ``[paths]`` (``routers``: router address -> fabric node id,
    to map the probers' discovered paths onto fabric links; ``model = false``: the fabric model's
    ECMP hash is not authoritative, so flows without a discovered path get unknown hops). Raises `ConfigError` (one line) on anything invalid.
    """
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {path}: {exc}") from None
        base_dir = base_dir or path.parent
    known = {"fabric", "sync", "controller", "thresholds", "paths"}
    if extra := set(doc) - known:
        raise ConfigError(f"unknown config section(s): {', '.join(sorted(extra))}")
    fab_doc = dict(doc.get("fabric", {}))
    try:
        if "file" in fab_doc:
            fpath = Path(fab_doc.pop("file"))
            if not fpath.is_absolute() and base_dir is not None:
                fpath = base_dir / fpath
            if fab_doc:
                raise ConfigError("[fabric] takes either file or shape keys, not both")
            try:
                fabric = fabric_from_dict(json.loads(fpath.read_text()))
            except OSError as exc:
                raise ConfigError(f"cannot read fabric file {fpath}: {exc.strerror}") from None
            except json.JSONDecodeError as exc:
                raise ConfigError(f"fabric file {fpath}: bad JSON: {exc}") from None
        else:
            fabric = build_fabric(FabricShape(**fab_doc))
        s, c = dict(doc.get("sync", {})), dict(doc.get("controller", {}))
        d = ClockSyncConfig()  # unset keys keep the pipeline's defaults (one solve per window)
        sync = ClockSyncConfig(
            window_ns=int(float(s.pop("window_s", d.window_ns / 1e9)) * 1e9),
            solve_every_ns=int(float(s.pop("solve_every_s", d.solve_every_ns / 1e9)) * 1e9),
            coded_tol_ns=int(s.pop("coded_tol_ns", d.coded_tol_ns)),
            use_uncoded=bool(s.pop("use_uncoded", d.use_uncoded)),
        )
        live = LiveConfig(
            sync=sync,
            stale_ns=int(float(c.pop("stale_s", 10.0)) * 1e9),
            max_events=int(c.pop("max_events", 200)),
        )
        tick_s = float(c.pop("tick_s", 1.0))
        if leftover := sorted(s) + sorted(c):
            raise ConfigError(f"unknown config key(s): {', '.join(leftover)}")
        if not tick_s > 0:
            raise ConfigError("controller.tick_s must be > 0")
    except TypeError as exc:
        raise ConfigError(f"bad config: {exc}") from None
    except (FabricError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"bad config: {exc}") from None
    pdoc = dict(doc.get("paths", {}))
    routers = pdoc.pop("routers", {})
    model_paths = pdoc.pop("model", True)
    if not isinstance(model_paths, bool):
        raise ConfigError("[paths] model must be true or false")
    if pdoc:
        raise ConfigError(f"unknown config key(s): {', '.join(sorted(pdoc))}")
    if not isinstance(routers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v in fabric.node_by_id
        for k, v in routers.items()
    ):
        raise ConfigError("[paths] routers must map router addresses to fabric node ids")
    thresholds = dict(doc.get("thresholds", {}))
    try:
        brain_config(thresholds)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("\n", " ")) from None
    return ServiceConfig(
        fabric=fabric,
        live=live,
        thresholds=thresholds,
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


async def _solver(live: LiveController, tick_s: float, clock: Callable[[], int]) -> None:
    """Run due clock solves in a worker thread so ingest goes on meanwhile."""
    while True:
        await asyncio.sleep(tick_s)
        now = clock()
        window = live.clock.start_solve(now)
        if window is not None:
            state = await asyncio.to_thread(
                compute_state, window, live.clock.n_nics, live.clock.config, now
            )
            live.clock.install(state)


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
) -> None:
    """One connection's lifetime: subscribe, pump messages, tick; raises `aiomqtt.MqttError`."""
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
        tick = asyncio.create_task(_ticker(client, live, topics, tick_s, clock, log))
        solver = asyncio.create_task(_solver(live, tick_s, clock))
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

    ``max_attempts`` bounds the connection attempts (tests); returns the live state then.
    """
    if live is None:
        live = LiveController(
            config.fabric,
            dataclasses.replace(config.live, solve_inline=False),
            brain=default_brain(config.fabric, config.thresholds),
        )
        # before any ingest, so no flow has a model path yet
        live.ingestor.use_model_paths = config.model_paths
    counters: dict[str, int] = {}
    delay, cap = config.backoff_s
    attempts = 0
    while max_attempts is None or attempts < max_attempts:
        attempts += 1
        try:
            await serve_once(
                host, port, live, topics,
                share=share, tick_s=config.tick_s, clock=clock, log=log, counters=counters,
                router_nodes=config.router_nodes,
            )  # fmt: skip
        except (aiomqtt.MqttError, TimeoutError) as exc:
            log(clock(), "broker error", error=str(exc), retry_in_s=delay, counters=counters)
            await asyncio.sleep(delay)
            delay = min(cap, delay * 2)
            continue
        delay = config.backoff_s[0]
    return live
