"""Admission: may a probe batch enter the controller? One check, a frozen verdict (pure).

A batch comes as the payload of an MQTT message on its host's topic (``probes/<host>``), or
already decoded from a source the caller trusts (the simulator, a benchmark). `Admission.judge`
checks it on its own, in arrival order, before anything is merged or ingested:

1. decode (`contract.records.decode_batch`): ``malformed``, with the decoder's one-line reason;
2. origin, when the topic's host is given (`contract.origin.batch_origin_error`: its origin
   and every NIC that probed in it are that host's): ``untrusted``;
3. replay: ``replayed`` when its batch_seq lies more than `REPLAY_SLACK` below the newest
   batch taken from its origin (an old batch published again);
4. duplicate: ``duplicate`` when (origin, batch_seq) was taken before (a QoS 1 redelivery,
   a prober's spool sent again);

and otherwise ``accepted``: remembered as taken. The verdict is a small frozen value (outcome,
one-line reason, records) that an ingest worker can hand on beside the batch;
`controller.live.LiveController.admit` is the door that judges and then ingests or queues.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from contract.origin import batch_origin_error
from contract.records import ProbeBatch, RecordError, decode_batch
from mesh.fabric import Fabric

REPLAY_SLACK = 16
"""Batches an origin's batch_seq may lie below its newest before it counts as a replay."""


class Outcome(enum.Enum):
    """What admission made of one batch."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REPLAYED = "replayed"
    UNTRUSTED = "untrusted"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One batch's verdict: its `Outcome`, a one-line ``reason`` (replayed, untrusted and
    malformed only) and ``records``: those taken (accepted only: ingested, or queued to be
    ingested merged when the caller queued it). Raises ValueError when the fields disagree
    (checked on every batch: the accepted case first, and cheaply)."""

    outcome: Outcome
    reason: str = ""
    records: int = 0

    def __post_init__(self) -> None:
        if self.outcome is Outcome.ACCEPTED:
            if self.reason or self.records < 0:
                raise ValueError("accepted: no reason, records >= 0")
        elif (
            self.records
            or "\n" in self.reason
            or ((self.outcome is Outcome.DUPLICATE) == bool(self.reason))
        ):
            raise ValueError(
                f"{self.outcome.value}: no records; a one-line reason for replayed, untrusted "
                "and malformed batches, none for a duplicate"
            )

    @property
    def accepted(self) -> bool:
        """Return True if the batch was taken."""
        return self.outcome is Outcome.ACCEPTED


FUTURE_SLACK_MS = 86_400_000
"""How far (ms) a batch_seq may lie ahead of the controller's clock in ms: a day, for hosts
whose clocks are far off (`Admission.judge`)."""


@functools.lru_cache(maxsize=8)
def nic_hosts(fabric: Fabric) -> Mapping[str, str]:
    """Return NIC id -> owning host id of ``fabric`` (cached: a fabric never changes)."""
    return MappingProxyType({n.id: n.host for n in fabric.nics})


class Admission:
    """What was taken, per origin, and the checks of the module docstring.

    Remembered per origin: its newest batch_seq taken (for replays) and a bit mask of the
    ``dedup_depth`` numbers below its highest seen (bit k: highest - k was seen), a few
    hundred bytes per origin instead of a set and a queue of ints (gigabytes at 10,000
    hosts). ``counts``: the verdicts given, per outcome.

    ``owners``: NIC id -> host for the origin check, read at every batch (a learned fabric's
    claimed NICs, which change as neighbours documents come); None: ``fabric``'s, and the
    new fabric's after `fabric_changed`."""

    def __init__(
        self, fabric: Fabric, *, dedup_depth: int = 4096, owners: Mapping[str, str] | None = None
    ) -> None:
        self._owners = owners
        self._nic_host = nic_hosts(fabric) if owners is None else owners
        self._dedup_depth = dedup_depth
        self._seen: dict[str, tuple[int, int]] = {}  # origin -> (highest seq, seen mask)
        self._newest: dict[str, int] = {}  # origin -> highest batch_seq taken
        self.counts = dict.fromkeys(Outcome, 0)

    def fabric_changed(self, fabric: Fabric) -> None:
        """Judge origins by ``fabric`` from now on (unless ``owners`` were given); what was
        taken per origin is kept: batch numbers do not depend on the fabric."""
        if self._owners is None:
            self._nic_host = nic_hosts(fabric)

    def judge(
        self, data: ProbeBatch | bytes, host: str | None = None, now_ns: int | None = None
    ) -> tuple[Verdict, ProbeBatch | None]:
        """Return the verdict on ``data`` (a payload, or a decoded batch) and the batch when
        it is accepted (else None); ``host``: the host of the topic it came on (None: a
        source the caller trusts, no origin check); ``now_ns``: the controller's UNIX time,
        when given a batch_seq more than `FUTURE_SLACK_MS` ahead of it in ms is malformed (a
        prober numbers its batches from its start time in ms, one per batch: a number from
        the future is corrupt or forged, and taken it would make the origin's real batches
        look replayed). Raises nothing for bad input."""
        if isinstance(data, ProbeBatch):
            batch = data
        else:
            try:
                batch = decode_batch(data)
            except RecordError as exc:
                return self._count(Verdict(Outcome.MALFORMED, str(exc))), None
        if host is not None:
            why = batch_origin_error(batch, host, self._nic_host)
            if why:
                return self._count(Verdict(Outcome.UNTRUSTED, why)), None
        if now_ns is not None and batch.batch_seq > now_ns // 1_000_000 + FUTURE_SLACK_MS:
            why = f"batch_seq {batch.batch_seq} from {batch.origin} is ahead of the clock"
            return self._count(Verdict(Outcome.MALFORMED, why)), None
        if self.is_replay(batch.origin, batch.batch_seq):
            why = f"replayed batch {batch.batch_seq} from {batch.origin}"
            return self._count(Verdict(Outcome.REPLAYED, why)), None
        if self.is_duplicate(batch.origin, batch.batch_seq):
            return self._count(Verdict(Outcome.DUPLICATE)), None
        newest = self._newest.get(batch.origin, batch.batch_seq)
        self._newest[batch.origin] = max(newest, batch.batch_seq)
        return self._count(Verdict(Outcome.ACCEPTED, records=len(batch))), batch

    def _count(self, verdict: Verdict) -> Verdict:
        self.counts[verdict.outcome] += 1
        return verdict

    def is_replay(self, origin: str, batch_seq: int) -> bool:
        """Return True if ``batch_seq`` lies more than `REPLAY_SLACK` batches below the newest
        batch taken from ``origin``: an old batch published again.

        A prober publishes its batches in order with one in flight, so only a QoS 1
        redelivery of its last few batches arrives late (those are duplicates, not
        replays); a restarted prober continues above its predecessor (batch_seq starts at
        its start time in ms). Not caught: a replay before the controller saw anything newer
        from that origin (e.g. just after a controller restart), see docs/mqtt-security.md.
        """
        newest = self._newest.get(origin)
        return newest is not None and batch_seq < newest - REPLAY_SLACK

    def is_duplicate(self, origin: str, batch_seq: int) -> bool:
        """Return True if (origin, batch_seq) was seen; otherwise remember it, return False.
        A number more than ``dedup_depth`` below the highest is no longer known (taken as
        new; `is_replay` refuses it first)."""
        prev = self._seen.get(origin)
        if prev is None:
            self._seen[origin] = (batch_seq, 1)
            return False
        top, mask = prev
        back = top - batch_seq
        if back < 0:  # a new highest: slide the window up (a jump past it: a fresh window,
            # never a shift by the jump, which a hostile batch_seq makes 2^64 bits long)
            keep = (1 << self._dedup_depth) - 1
            slid = (mask << -back) & keep if -back < self._dedup_depth else 0
            self._seen[origin] = (batch_seq, slid | 1)
            return False
        if back >= self._dedup_depth:
            return False
        if mask >> back & 1:
            return True
        self._seen[origin] = (top, mask | 1 << back)
        return False
