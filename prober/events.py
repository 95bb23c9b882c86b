"""Values the probe session exchanges with its transport and its consumers.

- `Datagram`: something to send (destination, bytes, `SendMeta` describing it).
- `ProbeResult`: a completed round trip with its four timestamps.
- `ProbeLost`: a probe with no complete reply before its timeout, with its path.
- `TraceReached`: a path-discovery probe got an answer from its destination.
- `ResultBlock`: many results and losses of one NIC as int64 rows (the compiled hot path's
  output, `prober.compiled`); `ResultBlock.events` turns it into the two values above.
- `results_to_batch`: many results/losses -> one columnar `contract.records.ProbeBatch`.

All are frozen and validated on construction (`ValueError` on bad values).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from contract.records import MISSING, ProbeBatch
from prober.wire import MsgType

Address = tuple[str, int]
"""Transport address: (IP, UDP port) for the UDP transport; opaque to the session."""

NO_TOKEN = -1


class SendMeta(NamedTuple):
    """What a datagram is: ``token`` is echoed to `ProbeSession.on_tx_stamp` (NO_TOKEN: none).

    ``sport`` is the UDP source port the transport must send from (0: any, e.g. replies go out
    of the socket the probe came in on). ``src``/``dst`` are NIC ids of sender and receiver
    (``dst`` is empty for replies: the session answers whoever asked). A NamedTuple: one is
    built per datagram on the hot path.
    """

    token: int
    kind: MsgType
    src: str
    dst: str
    sport: int
    seq: int
    pair_id: int = -1
    pair_pos: int = 0

    @property
    def wants_tx_stamp(self) -> bool:
        """Return True when the session needs this datagram's transmit stamp."""
        return self.token != NO_TOKEN


class Datagram(NamedTuple):
    """One datagram to send: to ``dest``, payload ``data``, described by ``meta``."""

    dest: Address
    data: bytes
    meta: SendMeta


def _check_path(src: str, dst: str, sport: int, seq: int, pair_id: int, pair_pos: int) -> None:
    if not src or not dst:
        raise ValueError("src and dst NIC ids must be non-empty")
    if not 0 <= sport <= 0xFFFF:
        raise ValueError(f"sport {sport} out of range")
    if not 0 <= seq < (1 << 32):
        raise ValueError(f"seq {seq} out of range")
    if pair_id < -1 or pair_pos not in (0, 1) or (pair_id == -1 and pair_pos):
        raise ValueError(f"bad coded pair ({pair_id}, {pair_pos})")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """A completed probe: t1/t4 initiator clock, t2/t3 responder clock, all int64 ns.

    Invariants (checked): t1 <= t4 and t2 <= t3 (each pair is from one clock).
    """

    seq: int
    src: str
    dst: str
    sport: int
    pair_id: int
    pair_pos: int
    t1: int
    t2: int
    t3: int
    t4: int

    def __post_init__(self) -> None:
        _check_path(self.src, self.dst, self.sport, self.seq, self.pair_id, self.pair_pos)
        if not (self.t1 <= self.t4 and self.t2 <= self.t3):
            raise ValueError(f"inconsistent stamps t1..t4={self.t1},{self.t2},{self.t3},{self.t4}")

    @property
    def rtt_ns(self) -> int:
        """Return the round-trip time minus the responder's residence time, in ns."""
        return (self.t4 - self.t1) - (self.t3 - self.t2)


@dataclass(frozen=True, slots=True)
class ProbeLost:
    """A probe that got no complete reply before its timeout: loss on path (src, dst, sport).

    ``t1`` is the initiator's transmit stamp if known, else `MISSING`; ``sent_ns`` is the
    session time at which it was handed to the transport.
    """

    seq: int
    src: str
    dst: str
    sport: int
    pair_id: int
    pair_pos: int
    t1: int
    sent_ns: int

    def __post_init__(self) -> None:
        _check_path(self.src, self.dst, self.sport, self.seq, self.pair_id, self.pair_pos)


@dataclass(frozen=True, slots=True)
class TraceReached:
    """A path-discovery probe (``seq``) reached its destination NIC (hash ``sender``).

    ``rx_ns`` is the initiator's receive stamp of the reply. See `prober.pathdisc`.
    """

    seq: int
    sender: int
    rx_ns: int


BLOCK_COLUMNS = ("seq", "dst", "sport", "pair", "pos", "t1", "t2", "t3", "t4", "lost", "sent_ns")
"""The columns of `ResultBlock.rows` (``dst`` indexes ``dsts``; a loss has t2..t4 MISSING)."""


@dataclass(frozen=True, slots=True, eq=False)
class ResultBlock:
    """Results and losses of NIC ``src`` as rows (int64, `BLOCK_COLUMNS`), in completion order.

    ``dsts[row.dst]`` is the peer NIC id. Raises `ValueError` when ``rows`` is not an
    (n, 11) int64 array or a ``dst`` index is outside ``dsts``.
    """

    src: str
    dsts: tuple[str, ...]
    rows: np.ndarray

    def __post_init__(self) -> None:
        r = self.rows
        if r.dtype != np.int64 or r.ndim != 2 or r.shape[1] != len(BLOCK_COLUMNS):
            raise ValueError(
                f"rows must be int64 (n, {len(BLOCK_COLUMNS)}), got {r.dtype} {r.shape}"
            )
        if len(r) and (int(r[:, 1].min()) < 0 or int(r[:, 1].max()) >= len(self.dsts)):
            raise ValueError("dst index outside dsts")

    def __len__(self) -> int:
        """Return the number of rows."""
        return len(self.rows)

    @property
    def results(self) -> int:
        """Return how many rows are completed round trips (not losses)."""
        return int(len(self.rows) - self.rows[:, 9].sum())

    def events(self) -> list[ProbeResult | ProbeLost]:
        """Return the rows as `ProbeResult` / `ProbeLost` values (validated), in order."""
        out: list[ProbeResult | ProbeLost] = []
        for seq, dst, sport, pair, pos, t1, t2, t3, t4, lost, sent in self.rows.tolist():
            if lost:
                out.append(ProbeLost(seq, self.src, self.dsts[dst], sport, pair, pos, t1, sent))
            else:
                out.append(ProbeResult(seq, self.src, self.dsts[dst], sport, pair, pos,
                                       t1, t2, t3, t4))  # fmt: skip
        return out


ProbeEvent = ProbeResult | ProbeLost | TraceReached | ResultBlock


def results_to_batch(
    events: Iterable[ProbeEvent],
    *,
    origin: str,
    stamp: str = "sw",
    nic_ids: Sequence[str] = (),
    dport: int = 4791,
    batch_seq: int = 0,
) -> ProbeBatch:
    """Return a `ProbeBatch` holding ``events`` in order (losses have ``lost`` set).

    A loss without a transmit stamp (never sent: the OS refused it; or its stamp never came)
    carries its hand-out time ``sent_ns`` as ``t1`` (same NIC clock), so the controller files
    it in the detection window it was sent in instead of reading `MISSING` as a time.

    `TraceReached` events are not probe records and are skipped; the rows of `ResultBlock`s
    come after the single events, grouped by NIC (columns, no per-row work; the same rule for
    losses without t1).

    ``nic_ids`` seeds the string table (stable indices across batches); NICs not in it are
    appended in first-seen order. Raises `contract.records.RecordError` on invalid columns.
    """
    table = list(nic_ids)
    index = {nic: i for i, nic in enumerate(table)}

    def idx(nic: str) -> int:
        i = index.get(nic)
        if i is None:
            i = index[nic] = len(table)
            table.append(nic)
        return i

    rows: list[tuple[int, ...]] = []
    chunks: list[np.ndarray] = []
    blocks: dict[tuple[str, tuple[str, ...]], list[np.ndarray]] = {}
    for ev in events:
        if isinstance(ev, ResultBlock):
            if len(ev.rows):
                blocks.setdefault((ev.src, ev.dsts), []).append(ev.rows)
        elif isinstance(ev, ProbeResult):
            rows.append((ev.seq, idx(ev.src), idx(ev.dst), ev.sport, ev.pair_id, ev.pair_pos,
                         ev.t1, ev.t2, ev.t3, ev.t4, 0))  # fmt: skip
        elif isinstance(ev, ProbeLost):
            t1 = ev.sent_ns if ev.t1 == MISSING else ev.t1
            rows.append((ev.seq, idx(ev.src), idx(ev.dst), ev.sport, ev.pair_id, ev.pair_pos,
                         t1, MISSING, MISSING, MISSING, 1))  # fmt: skip
    if rows:
        chunks.append(np.array(rows, dtype=np.int64))
    # blocks of one NIC (same dst table: the engine's, which only grows) go in at once, after
    # the single events: seq, dst, sport, pair, pos, t1..t4, lost -> the batch's columns
    for (src, dsts), parts in blocks.items():
        block = parts[0] if len(parts) == 1 else np.concatenate(parts)
        src_i = idx(src)
        used, first = np.unique(block[:, 1], return_index=True)
        dst_map = np.zeros(len(dsts), dtype=np.int64)
        for d in used[np.argsort(first)].tolist():  # table order: first use, as for events
            dst_map[d] = idx(dsts[d])
        out = np.empty((len(block), 11), dtype=np.int64)
        out[:, 0] = block[:, 0]
        out[:, 1] = src_i
        out[:, 2] = dst_map[block[:, 1]]
        out[:, 3:10] = block[:, 2:9]
        out[:, 10] = block[:, 9]
        no_t1 = (block[:, 9] != 0) & (block[:, 5] == MISSING)
        out[no_t1, 6] = block[no_t1, 10]
        chunks.append(out)
    names = ("seq", "src", "dst", "sport", "pair", "pos", "t1", "t2", "t3", "t4", "lost")
    if chunks:
        arr = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        cols = {name: np.ascontiguousarray(arr[:, i]) for i, name in enumerate(names)}
    else:
        cols = {name: np.zeros(0, dtype=np.int64) for name in names}
    lost = cols.pop("lost").astype(bool)
    return ProbeBatch.from_columns(
        origin, stamp, table, {**cols, "lost": lost}, dport=dport, batch_seq=batch_seq
    )
