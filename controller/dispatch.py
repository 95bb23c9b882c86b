"""One MQTT message onto the live controller state, and events/logs out (no I/O of its own).

`handle_message` decodes a message by topic and applies it to a `LiveController`: a probe
batch through its one door (`LiveController.admit`), the other documents through `presence`,
`gpu`, `nic_links`, `nic_counters` and `learn_paths`; with a fabric being learned
(`controller.topology.TopologyLearner`), neighbours documents and traced paths also go to the
learner, and origins are judged by the NICs each host claims. It never raises for a bad payload (it
returns ``bad:<reason>``, which the service counts and logs); an exception is a bug.
`apply_paths` feeds a discovered-paths document (`controller.pathmap`). `JsonLog` writes one
JSON object per line, time passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from contract.documents import HealthDoc, PathsDoc, PresenceDoc
from contract.jsondoc import DocumentError, decode_json
from contract.neighbors import NeighborsDoc
from contract.origin import health_origin_error, presence_origin_error
from contract.remediation import JOBS, REMEDIATION_ACK
from contract.topics import TopicError, Topics
from controller.admission import Outcome, Verdict, nic_hosts
from controller.coalesce import ProbeQueue
from controller.live import LiveController
from controller.pathmap import path_rows
from controller.throughput import nic_byte_counters
from controller.topology import TopologyLearner


def apply_paths(live: LiveController, router_nodes: Mapping[str, str], doc: Any) -> int:
    """Feed a ``paths/<host>`` document into the live state's path tables; return the paths
    taken (`controller.pathmap.path_rows`). Raises `controller.pathmap.PathDocError` if
    ``doc`` is not a list of objects."""
    rows = path_rows(live.fabric, router_nodes, doc, live.max_hops)
    if len(rows.src):
        live.learn_paths(*rows)
    return len(rows.src)


class JsonLog:
    """Structured log: one JSON object per line on ``stream``; time passed in by the caller."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def __call__(self, t_ns: int, msg: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"t_ns": t_ns, "msg": msg, **fields}, default=str) + "\n")
        self.stream.flush()


def message_kind(topics: Topics, topic: str) -> str:
    """Return the kind a message's topic names, for per-kind counters: ``probes``,
    ``presence``, ``health``, ``paths``, ``neighbors``, ``events``, ``remediation-ack``,
    ``jobs``, or ``unknown``."""
    try:
        return topics.parse(topic)[0]
    except TopicError:
        pass
    rest = topic.removeprefix(topics.prefix + "/")
    if rest != topic:
        head = rest.split("/", 1)[0]
        if head in (REMEDIATION_ACK, JOBS):
            return head
    return "unknown"


def outcome(verdict: Verdict) -> str:
    """Return a probe batch's verdict as the outcome the service counts and logs:
    ``probes`` (accepted), ``duplicate``, or ``bad:<reason>``."""
    if verdict.outcome is Outcome.ACCEPTED:
        return "probes"
    if verdict.outcome is Outcome.DUPLICATE:
        return "duplicate"
    return f"bad:{verdict.reason}"


def handle_message(
    live: LiveController,
    topics: Topics,
    topic: str,
    payload: bytes,
    now_ns: int,
    router_nodes: Mapping[str, str] | None = None,
    queue: ProbeQueue | None = None,
    topology: TopologyLearner | None = None,
) -> str:
    """Apply one MQTT message to ``live``; return a short outcome (for counters and logs).

    A probe batch goes through `LiveController.admit` (decode, origin, replay, duplicate:
    each batch on its own, in arrival order); with ``queue`` an accepted one is queued to be
    ingested merged with others (`controller.coalesce`; the caller runs
    `LiveController.flush` when the queue is due) instead of at once.

    With ``topology`` (a fabric being learned) a neighbours document goes to the learner
    (`TopologyLearner.neighbors`, which judges its origin), a paths document to the learner
    too and onto the live state with the learned router map (``router_nodes`` is not read),
    and presence and health are judged by the NICs hosts claim (`TopologyLearner.owners`);
    the live state's admission reads the same owners (`controller.service.live_state`).
    Without it neighbours documents are ``ignored``.

    Outcomes: ``probes`` (accepted, even with no record the fabric knows), ``duplicate``,
    ``presence``, ``health``, ``paths``, ``neighbors``, ``ignored``; malformed payloads return
    ``bad:<reason>`` instead of raising, and so does an old batch published again
    (``bad:replayed batch <seq> from <origin>``) and a message that cannot come from the host
    of its topic (``bad:untrusted: ...``, `contract.origin`: a batch whose origin or probing
    NICs are another host's, presence or health of a host the fabric does not have or naming
    another host's NICs). ``router_nodes`` maps router addresses of discovered paths to
    fabric nodes (no map: paths are ignored). Raises only for a bug.
    """
    try:
        kind, host = topics.parse(topic)
    except TopicError:
        return "ignored"
    owners = nic_hosts(live.fabric) if topology is None else topology.owners
    try:
        if kind == "probes":
            return outcome(live.admit(payload, now_ns, host=host, queue=queue))
        if kind == "neighbors":
            if topology is None:
                return "ignored"
            why = topology.neighbors(host, NeighborsDoc.decode(payload))
            return f"bad:{why}" if why else "neighbors"
        if kind == "presence":
            presence = PresenceDoc.decode(payload)
            why = presence_origin_error(presence, host, owners)
            if why:
                return f"bad:{why}"
            live.presence(host, presence.alive, now_ns, since_ns=presence.t_ns)
            return "presence"
        if kind == "paths" and topology is not None:
            traced = PathsDoc.decode(payload).paths
            topology.paths(host, traced, now_ns)
            if topology.router_nodes:
                apply_paths(live, topology.router_nodes, [p.to_json() for p in traced])
            return "paths"
        if kind == "paths":
            if not router_nodes:
                return "ignored"
            # decode_json, not json.loads: a deeply nested payload is a DocumentError, not a
            # RecursionError that would end the service
            apply_paths(live, router_nodes, decode_json(payload, "paths"))
            return "paths"
        if kind == "health":
            health = HealthDoc.decode(payload)
            why = health_origin_error(health, host, owners)
            if why:
                return f"bad:{why}"
            live.gpu(host, health.gpu_ok, health.detail, now_ns, present=health.gpu_present)
            live.prober_slip(host, health.send_slip_ns, now_ns)
            if links := health.nic_links():
                live.nic_links(host, links, now_ns)
            counters = nic_byte_counters(health.nics)
            if counters:
                live.nic_counters(counters, health.t_ns or now_ns, now_ns)
            return "health"
    except DocumentError as exc:  # neighbours, presence, health, paths (`PathDocError` too)
        return f"bad:{exc}"
    return "ignored"
