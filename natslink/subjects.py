"""The NATS subjects of qpmesh's data plane and the partition of a host, as pure functions.

Under a subject prefix (default ``qpmesh.v1``; NATS separates levels with dots):

- ``<prefix>.probes.<host>``: a prober publishes each probe batch (`contract.records` bytes)
  here, with the header ``Nats-Msg-Id: <host>:<batch_seq>``;
- ``<prefix>.probes.<p>.<host>``: where the servers' subject mapping
  (`natslink.serverconf.mapping`) puts it: partition ``p = fnv1a32(host) % partitions``
  (`partition_of`, the server's ``{{partition(n,1)}}``), so every batch of one host lands in
  one partition: host affinity without any client knowing the partition count;
- ``<prefix>.partials.<p>``: an ingest worker's partial of partition ``p`` for one window
  (headers name the window and the worker, `controller.fleet.workerloop`).

A host id becomes one subject token: it must not hold ``.``, ``*``, ``>`` or white space
(`check_token` raises `SubjectError`).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SUBJECT_PREFIX = "qpmesh.v1"
_BAD = frozenset(".*> \t\r\n\x00")


class SubjectError(ValueError):
    """A subject prefix, token or partition number is not valid."""


def check_token(value: str, what: str) -> str:
    """Return ``value`` if it is one subject token; raise `SubjectError` naming ``what``."""
    if not value or any(c in _BAD for c in value):
        raise SubjectError(
            f"invalid {what} {value!r}: needs one NATS subject token (no . * > or space)"
        )
    return value


def fnv1a32(data: bytes) -> int:
    """Return the 32-bit FNV-1a hash of ``data`` (what nats-server's ``partition`` uses)."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def partition_of(host: str, partitions: int) -> int:
    """Return the partition the servers' mapping gives ``host``'s batches (0-based).

    Raises `SubjectError` for a host that is not one token or ``partitions`` < 1.
    """
    if partitions < 1:
        raise SubjectError(f"partitions must be >= 1, got {partitions}")
    return fnv1a32(check_token(host, "host").encode()) % partitions


@dataclass(frozen=True, slots=True)
class Subjects:
    """The subjects under ``prefix``; raises `SubjectError` on a bad prefix."""

    prefix: str = DEFAULT_SUBJECT_PREFIX

    def __post_init__(self) -> None:
        for level in self.prefix.split("."):
            check_token(level, "subject prefix level")

    def probes(self, host: str) -> str:
        """Return the subject a prober on ``host`` publishes its batches to."""
        return f"{self.prefix}.probes.{check_token(host, 'host')}"

    def probes_mapped(self) -> str:
        """Return the filter of every partitioned probe subject (the probe stream's)."""
        return f"{self.prefix}.probes.*.*"

    def probes_partition(self, partition: int) -> str:
        """Return the filter of partition ``partition``'s probe batches (a worker's consumer)."""
        if partition < 0:
            raise SubjectError(f"partition must be >= 0, got {partition}")
        return f"{self.prefix}.probes.{partition}.*"

    def probes_tick(self, partition: int) -> str:
        """Return the subject of partition ``partition``'s tick: a message its owner stores
        when no batch comes, so windows close on stream time (``~tick`` is no host id)."""
        if partition < 0:
            raise SubjectError(f"partition must be >= 0, got {partition}")
        return f"{self.prefix}.probes.{partition}.~tick"

    def partials(self, partition: int) -> str:
        """Return the subject the partials of ``partition`` go to."""
        if partition < 0:
            raise SubjectError(f"partition must be >= 0, got {partition}")
        return f"{self.prefix}.partials.{partition}"

    def blocks(self, owner: int) -> str:
        """Return the subject edge owner ``owner``'s summary blocks go to: in the partial
        stream (``partials.e<owner>``), so the solver reads them in order with the
        partials."""
        if owner < 0:
            raise SubjectError(f"owner must be >= 0, got {owner}")
        return f"{self.prefix}.partials.e{owner}"

    def is_block(self, subject: str) -> bool:
        """Return True when ``subject`` is an edge owner's (`blocks`)."""
        return subject.startswith(f"{self.prefix}.partials.e")

    def partials_all(self) -> str:
        """Return the filter of every partition's partials and the owners' blocks (what the
        solver reads of the partial stream; not the owners' shares)."""
        return f"{self.prefix}.partials.*"

    def partial_stream(self) -> str:
        """Return the partial stream's subjects: partials, blocks and shares."""
        return f"{self.prefix}.partials.>"

    def shares(self, owner: int, partition: int) -> str:
        """Return the subject of edge owner ``owner``'s shares of ``partition``'s partials
        (``partials.c<owner>.<partition>``: `controller.fleet.ownershare`)."""
        if owner < 0 or partition < 0:
            raise SubjectError(f"owner and partition must be >= 0, got {owner}, {partition}")
        return f"{self.prefix}.partials.c{owner}.{partition}"

    def shares_of(self, owner: int) -> str:
        """Return the filter of edge owner ``owner``'s shares of every partition."""
        if owner < 0:
            raise SubjectError(f"owner must be >= 0, got {owner}")
        return f"{self.prefix}.partials.c{owner}.*"


def msg_id(host: str, batch_seq: int) -> str:
    """Return the ``Nats-Msg-Id`` of a probe batch: ``<host>:<batch_seq>``."""
    return f"{host}:{batch_seq}"
