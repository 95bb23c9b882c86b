"""Coalescing: the probe batches that arrive within a short interval, ingested as one.

A prober publishes one batch per host and period (~470 records at 1,024 NICs), and every
ingest stage costs a few dozen numpy calls per batch whatever its size; merged, the same
records cost a fraction of that (docs/benchmarks.md, "Controller ingest"). `ProbeQueue` holds
admitted batches (decode, origin, replay and duplicate checks already done, per batch, in
arrival order: `controller.live.LiveController.admit`) until the oldest has waited ``coalesce_ms`` or the queue
holds ``max_records`` records; `ProbeQueue.take` then returns them as merged groups
(`contract.records.merge_batches`), each with the (origin, records) of the batches it holds.
Pure: time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.records import MAX_NIC_IDS, ProbeBatch, merge_batches


@dataclass(frozen=True)
class CoalesceConfig:
    """``[ingest]``: how long a batch may wait to be merged (ms; 0 = ingest each batch as it
    comes) and the most records one merged ingest holds (it bounds how long one ingest keeps
    the service's event loop: ~1 µs per record)."""

    coalesce_ms: float = 20.0
    max_records: int = 65_536

    def __post_init__(self) -> None:
        if not 0 <= self.coalesce_ms <= 1000:
            raise ValueError(f"coalesce_ms must be in [0, 1000], got {self.coalesce_ms}")
        if not 1 <= self.max_records <= 1 << 22:
            raise ValueError(f"max_records must be in [1, 4194304], got {self.max_records}")


@dataclass(frozen=True, eq=False)
class Merged:
    """One merged group: the batch to ingest and, in order, (origin, records) of its parts."""

    batch: ProbeBatch
    parts: tuple[tuple[str, int], ...]


class ProbeQueue:
    """Admitted batches waiting to be merged; see the module docstring."""

    def __init__(self, config: CoalesceConfig | None = None) -> None:
        self.config = config or CoalesceConfig()
        self._pending: list[ProbeBatch] = []
        self._records = 0
        self._since_ns = 0  # arrival of the oldest pending batch

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def records(self) -> int:
        """Return the records waiting."""
        return self._records

    def add(self, batch: ProbeBatch, now_ns: int) -> None:
        """Queue an admitted batch that arrived at ``now_ns``."""
        if not self._pending:
            self._since_ns = now_ns
        self._pending.append(batch)
        self._records += len(batch)

    def due(self, now_ns: int) -> bool:
        """Return True if the queue should be taken now: it holds ``max_records`` or more, or
        its oldest batch has waited ``coalesce_ms``."""
        if not self._pending:
            return False
        cfg = self.config
        return self._records >= cfg.max_records or now_ns - self._since_ns >= cfg.coalesce_ms * 1e6

    def deadline_ns(self) -> int | None:
        """Return when the oldest pending batch has waited ``coalesce_ms`` (None: empty)."""
        if not self._pending:
            return None
        return self._since_ns + int(self.config.coalesce_ms * 1e6)

    def take(self) -> list[Merged]:
        """Empty the queue; return its batches merged in arrival order into groups of at
        most ``max_records`` records (a bigger single batch is a group of its own), one
        stamp kind and destination port, and a NIC table that fits one batch."""
        pending, self._pending, n = self._pending, [], self._records
        self._records = 0
        cap = self.config.max_records
        even = -(-n // max(1, -(-n // cap)))  # equal shares: no small tail group
        return [
            Merged(merge_batches(g), tuple((b.origin, len(b)) for b in g))
            for g in plan_groups(pending, cap, even)
        ]


def plan_groups(
    batches: list[ProbeBatch], max_records: int, target: int | None = None
) -> list[list[ProbeBatch]]:
    """Split ``batches`` (in order) into runs that `merge_batches` can merge: same stamp kind
    and destination port, at most ``max_records`` records (a bigger batch alone) and at most
    `MAX_NIC_IDS` NIC ids counted with repeats (a safe bound on the union); a run is also
    closed once it holds ``target`` records (default ``max_records``)."""
    groups: list[list[ProbeBatch]] = []
    cur: list[ProbeBatch] = []
    n = ids = 0
    goal = max_records if target is None else min(target, max_records)
    for b in batches:
        if cur and (
            b.stamp != cur[0].stamp
            or b.dport != cur[0].dport
            or n >= goal
            or n + len(b) > max_records
            or ids + len(b.nic_ids) > MAX_NIC_IDS
        ):
            groups.append(cur)
            cur, n, ids = [], 0, 0
        cur.append(b)
        n += len(b)
        ids += len(b.nic_ids)
    if cur:
        groups.append(cur)
    return groups
