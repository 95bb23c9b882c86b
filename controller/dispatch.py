"""One MQTT message onto the live controller state, and events/logs out (no I/O of its own).

`handle_message` decodes a message by topic and applies it to a `LiveController`; it never
raises for a bad payload (it returns ``bad:<reason>``, which the service counts and logs).
`apply_paths` feeds a discovered-paths document (`controller.pathmap`). `event_json` is the
payload of an event on ``<prefix>/events/<kind>``; `JsonLog` writes one JSON object per line,
time passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from contract.records import RecordError, decode_batch
from contract.topics import TopicError, Topics
from controller.live import LiveController
from controller.pathmap import path_rows
from controller.snapshot import MeshEvent


def apply_paths(live: LiveController, router_nodes: Mapping[str, str], doc: Any) -> int:
    """Feed a ``paths/<host>`` document into the live state's path tables; return the paths
    taken (`controller.pathmap.path_rows`). Raises ValueError if ``doc`` is not a list of
    objects."""
    rows = path_rows(live.fabric, router_nodes, doc, live.max_hops)
    if len(rows.src):
        live.learn_paths(*rows)
    return len(rows.src)


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
    malformed payloads return ``bad:<reason>`` instead of raising, and so does an old batch
    published again (``bad:replayed batch <seq> from <origin>``, `Ingestor.is_replay`). ``router_nodes`` maps
    router addresses of discovered paths to fabric nodes (no map: paths are ignored).
    """
    try:
        kind, host = topics.parse(topic)
    except TopicError:
        return "ignored"
    try:
        if kind == "probes":
            batch = decode_batch(payload)
            if live.ingestor.is_replay(batch.origin, batch.batch_seq):
                return f"bad:replayed batch {batch.batch_seq} from {batch.origin}"
            n = live.ingest_batch(batch, now_ns)
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
