"""The MQTT topic layout of qpmesh (v1), as pure functions.

Under a configurable prefix (default ``qpmesh/v1``):

- ``<prefix>/probes/<host>``: probe batches, payload = `contract.records.encode_batch` bytes;
- ``<prefix>/presence/<host>``: JSON ``{"alive": bool, "t_ns": int}``, retained; the prober's
  last-will publishes ``alive: false``;
- ``<prefix>/health/<host>``: JSON GPU/NIC telemetry, e.g. ``{"gpu_ok": bool, "detail": str,
  "t_ns": int}``;
- ``<prefix>/events/<kind>``: the controller's findings (JSON `EventDoc`);
- ``<prefix>/paths/<host>``: the prober's discovered paths, JSON list of
  ``{"src": nic, "dst": nic, "sport": int, "hops": [router address, ...], "reached": bool}``
  (TTL trace of the probe's own 5-tuple; unshared: every controller needs every path);
- ``<prefix>/neighbors/<host>``: the prober's NICs and their LLDP neighbours, retained JSON
  (`contract.neighbors.NeighborsDoc`; unshared, like presence).

Subscriptions for probes may be shared (``$share/<group>/<prefix>/probes/#``) so several
controllers split the load; presence stays unshared (retained messages are not delivered on
shared subscriptions, and every controller needs every prober's liveness).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "qpmesh/v1"
KINDS = ("probes", "presence", "health", "events", "paths", "neighbors")
_BAD = frozenset("+#\x00")


class TopicError(ValueError):
    """A topic, prefix, host id or share group is not valid."""


def _check_level(value: str, what: str) -> str:
    if not value or "/" in value or any(c in _BAD for c in value):
        raise TopicError(f"invalid {what} {value!r}: needs a non-empty level without / + #")
    return value


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names under ``prefix``; raises `TopicError` on a bad prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix or self.prefix.startswith(("/", "$")) or self.prefix.endswith("/"):
            raise TopicError(f"invalid topic prefix {self.prefix!r}")
        for level in self.prefix.split("/"):
            _check_level(level, "prefix level")

    def probes(self, host: str) -> str:
        """Return the topic a prober on ``host`` publishes its batches to."""
        return f"{self.prefix}/probes/{_check_level(host, 'host')}"

    def presence(self, host: str) -> str:
        """Return the retained presence (and last-will) topic of ``host``."""
        return f"{self.prefix}/presence/{_check_level(host, 'host')}"

    def health(self, host: str) -> str:
        """Return the GPU/NIC telemetry topic of ``host``."""
        return f"{self.prefix}/health/{_check_level(host, 'host')}"

    def paths(self, host: str) -> str:
        """Return the topic a prober on ``host`` publishes its discovered paths to (JSON)."""
        return f"{self.prefix}/paths/{_check_level(host, 'host')}"

    def neighbors(self, host: str) -> str:
        """Return the retained topic of ``host``'s NICs and their LLDP neighbours (JSON)."""
        return f"{self.prefix}/neighbors/{_check_level(host, 'host')}"

    def events(self, kind: str) -> str:
        """Return the topic the controller publishes ``kind`` events to."""
        return f"{self.prefix}/events/{_check_level(kind, 'event kind')}"

    def subscription(self, kind: str, share: str | None = None) -> str:
        """Return the wildcard filter for all hosts of ``kind``, shared by ``share`` if given."""
        if kind not in KINDS:
            raise TopicError(f"unknown topic kind {kind!r}")
        flt = f"{self.prefix}/{kind}/#"
        if share is not None:
            flt = f"$share/{_check_level(share, 'share group')}/{flt}"
        return flt

    def parse(self, topic: str) -> tuple[str, str]:
        """Return (kind, host-or-event-kind) of a concrete topic; raise `TopicError`."""
        head = self.prefix + "/"
        if not topic.startswith(head):
            raise TopicError(f"topic {topic!r} is not under {self.prefix!r}")
        rest = topic[len(head) :].split("/")
        if len(rest) != 2 or rest[0] not in KINDS or not rest[1]:
            raise TopicError(f"unexpected topic {topic!r}")
        return rest[0], rest[1]
