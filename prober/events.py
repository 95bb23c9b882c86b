"""Values the probe session exchanges with its transport and its consumers.

- `Datagram`: something to send (destination, bytes, `SendMeta` describing it).
- `ProbeResult`: a completed round trip with its four timestamps.
- `ProbeLost`: a probe with no complete reply before its timeout, with its path.
- `TraceReached`: a path-discovery probe got an answer from its destination.
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


ProbeEvent = ProbeResult | ProbeLost | TraceReached


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

    `TraceReached` events are not probe records and are skipped.

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
    for ev in events:
        if isinstance(ev, ProbeResult):
            rows.append((ev.seq, idx(ev.src), idx(ev.dst), ev.sport, ev.pair_id, ev.pair_pos,
                         ev.t1, ev.t2, ev.t3, ev.t4, 0))  # fmt: skip
        elif isinstance(ev, ProbeLost):
            t1 = ev.sent_ns if ev.t1 == MISSING else ev.t1
            rows.append((ev.seq, idx(ev.src), idx(ev.dst), ev.sport, ev.pair_id, ev.pair_pos,
                         t1, MISSING, MISSING, MISSING, 1))  # fmt: skip
    names = ("seq", "src", "dst", "sport", "pair", "pos", "t1", "t2", "t3", "t4", "lost")
    if rows:
        arr = np.array(rows, dtype=np.int64)
        cols = {name: arr[:, i] for i, name in enumerate(names)}
    else:
        cols = {name: np.zeros(0, dtype=np.int64) for name in names}
    lost = cols.pop("lost").astype(bool)
    return ProbeBatch.from_columns(
        origin, stamp, table, {**cols, "lost": lost}, dport=dport, batch_seq=batch_seq
    )
