"""A partial: what one ingest worker learned of one window of the fleet grid, as one value.

A worker (`controller.fleet.worker.FleetWorker`) reduces every window
(`controller.fleet.grid.WindowGrid`) of the batches it admitted into one `Partial`; the
solver (`controller.fleet.solver.FleetSolver`) merges the partials of a window from every
worker exactly (counts add, minima take the minimum, sets concatenate, the clock selections
take the best) and judges the window. A partial holds:

- ``covers``: the batches, (origin, batch_seq), that put records into it: what a shell needs
  for exactly-once (a batch may put records into two windows; `Covers.overlaps`);
- ``clock``: the clock selection (`controller.clocksolve.SampleRows`, the rows a clock solve
  reads): per (directed NIC pair, clock bin) the coded probe pair of lowest round trip among
  the window's records, raw stamps;
- ``detection``: the brain's accumulators of the window keyed fleet-wide
  (`controller.detect.window.WindowPart`: a path by its signature and hop row);
- ``learned``: paths learned (path discovery) while the window was open (`LearnedPaths`);
- ``nic_owd``: per NIC the worst fine one-way delay out of and into it (`NicDelays`);
- ``counts``: records and batches taken, dropped, and the delays by clock trust
  (`RecordCounts`);
- ``moved``: clocks the worker found moved between solves since its last partial
  (`MovedClocks`, `controller.clocksync.ClockSync.take_moves`), for the solver to mark and
  hand every worker in its state.

`Partial.encode` writes it in the fleet's columnar frame (`controller.fleet.codec`: a JSON
head, numpy columns, zlib); `Partial.decode` reads and checks one: every malformed payload
raises `PartialError`, nothing else. Pure: values in, values out.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from controller.clocksolve import SAMPLE_COLUMNS, SampleRows
from controller.detect.window import WindowPart
from controller.fleet.codec import CodecError, pack, unpack
from mesh.fabric import Fabric

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
F32 = NDArray[np.float32]

MAGIC = b"QPFP"
# 2: fine delays and per-flow counts replace the moderate tier's sets; 3: moved clocks
# (`MovedClocks`) and the fine delays' stamp kind; 4: round trips of the delays not judged
# finely (`WindowPart.rt_*`) and the slow delays' queueing delays
VERSION = 4


class PartialError(CodecError):
    """A payload that is not a partial this version reads (the reason in one line)."""


@functools.lru_cache(maxsize=8)
def fabric_id(fabric: Fabric) -> str:
    """Return a short fingerprint of ``fabric`` (its NICs and links, in index order): a
    partial names the fabric its indices refer to."""
    h = hashlib.sha256()
    for nic in fabric.nics:
        h.update(nic.id.encode() + b"\0")
    for lk in fabric.links:
        h.update(lk.id.encode() + b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Covers:
    """The batches (``origins[origin[i]]``, ``seq[i]``) that put records into a partial,
    sorted by (origin, seq), each once."""

    origins: tuple[str, ...]
    origin: I32
    seq: I64

    @classmethod
    def of(cls, pairs: set[tuple[str, int]] | list[tuple[str, int]]) -> Covers:
        """Return the covers of (origin, batch_seq) pairs."""
        items = sorted(set(pairs))
        origins = tuple(sorted({o for o, _ in items}))
        pos = {o: i for i, o in enumerate(origins)}
        return cls(
            origins,
            np.array([pos[o] for o, _ in items], np.int32),
            np.array([s for _, s in items], np.int64),
        )

    def __len__(self) -> int:
        return len(self.seq)

    def batches(self) -> set[tuple[str, int]]:
        """Return the (origin, batch_seq) pairs."""
        return {(self.origins[o], int(s)) for o, s in zip(self.origin, self.seq, strict=True)}

    def overlaps(self, other: Covers) -> bool:
        """Return True if a batch is in both."""
        return bool(self.batches() & other.batches())


@dataclass(frozen=True, eq=False)
class LearnedPaths:
    """Paths a worker learned (`controller.live.LiveController.learn_paths`): the forward
    hops of flows (src, dst, sport) and of their replies, rows -1 padded."""

    src: I64
    dst: I64
    sport: I64
    hops: I32
    reply: I32

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def empty(cls, width: int) -> LearnedPaths:
        """Return no paths (hop rows of ``width``)."""
        i64, hops = np.zeros(0, np.int64), np.zeros((0, width), np.int32)
        return cls(i64, i64, i64, hops, hops)

    @classmethod
    def join(cls, parts: list[LearnedPaths], width: int) -> LearnedPaths:
        """Return ``parts`` one after another (later rows replace earlier ones when
        learned in this order)."""
        if not parts:
            return cls.empty(width)
        cat = np.concatenate
        return cls(
            *(cat([getattr(p, f) for p in parts]) for f in ("src", "dst", "sport", "hops", "reply"))
        )


@dataclass(frozen=True, eq=False)
class NicDelays:
    """Per NIC (``nic``) the worst fine one-way delay out of it and into it (ns, NaN:
    none) among a window's probes."""

    nic: I32
    worst_out: F32
    worst_in: F32

    @classmethod
    def empty(cls) -> NicDelays:
        """Return no NICs."""
        f32 = np.zeros(0, np.float32)
        return cls(np.zeros(0, np.int32), f32, f32.copy())


@dataclass(frozen=True, eq=False)
class MovedClocks:
    """NICs (``nic``) whose clocks a worker found moved between solves, each since when
    (``since``: its own clock's ns; `controller.clocksync.ClockSync.take_moves`)."""

    nic: I64
    since: I64

    def __len__(self) -> int:
        return len(self.nic)

    @classmethod
    def empty(cls) -> MovedClocks:
        """Return no moves."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))


@dataclass(frozen=True, slots=True)
class RecordCounts:
    """What a worker did in a window: batches and records taken (their records put into
    windows, this one or others), records dropped (naming an unknown NIC, without stamps,
    sent to a host before its prober was alive, of a batch another worker's partial already
    covers), the window's arrived probes by clock trust (fine, coarse, withheld), and
    admission verdicts given (by outcome) while the window was the newest open one;
    ``short``: live probers whose batches did not cover the window when it closed (0: it
    was whole; `controller.fleet.watermark`)."""

    batches: int = 0
    records: int = 0
    unknown_nic: int = 0
    unstamped: int = 0
    early: int = 0
    covered: int = 0
    fine: int = 0
    coarse: int = 0
    withheld: int = 0
    short: int = 0
    verdicts: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        ints = [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "verdicts"]
        if any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in ints):
            raise ValueError("record counts are integers >= 0")

    def __add__(self, other: RecordCounts) -> RecordCounts:
        names = [f.name for f in dataclasses.fields(self) if f.name != "verdicts"]
        v = dict(self.verdicts)
        for k, n in other.verdicts:
            v[k] = v.get(k, 0) + n
        summed = {f: getattr(self, f) + getattr(other, f) for f in names}
        return dataclasses.replace(RecordCounts(verdicts=tuple(sorted(v.items()))), **summed)


_DETECT = {
    "path_sig": ("<i8", 1), "path_hops": ("<i4", 2), "judged": ("<i8", 1),
    "coarse": ("<i8", 1), "wmin": ("<f8", 1), "pair_fwd": ("<i4", 1), "pair_rev": ("<i4", 1),
    "pair_seen": ("<i8", 1), "lost": ("<i4", 2), "slow_hops": ("<i4", 2),
    "slow_flows": ("<i8", 2), "slow_excess": ("<f8", 1), "fine_path": ("<i4", 1),
    "fine_excess": ("<f8", 1), "fine_flows": ("<i4", 2), "fine_sw": ("|b1", 1), "flow": ("<i8", 2), "flow_probes": ("<i8", 1),
    "flow_lost": ("<i8", 1), "flow_fwd": ("<i4", 1), "flow_rev": ("<i4", 1),
    "nic": ("<i4", 1), "src_count": ("<i8", 1), "last_src": ("<i8", 1),
    "rt_fwd": ("<i4", 1), "rt_rev": ("<i4", 1), "rt_excess": ("<f8", 1),
}  # fmt: skip
_LEARNED = {"src": ("<i8", 1), "dst": ("<i8", 1), "sport": ("<i8", 1), "hops": ("<i4", 2),
            "reply": ("<i4", 2)}  # fmt: skip
_NIC = {"nic": ("<i4", 1), "worst_out": ("<f4", 1), "worst_in": ("<f4", 1)}
_MOVED = {"nic": ("<i8", 1), "since": ("<i8", 1)}
_COUNT_NAMES = tuple(f.name for f in dataclasses.fields(RecordCounts) if f.name != "verdicts")


@dataclass(frozen=True, eq=False)
class Partial:
    """One worker's reduction of one window (see the module docstring). ``window``: its
    number on the grid of ``grid_ns``; ``worker``: the worker's name; ``fabric``: the
    fingerprint of the fabric its indices refer to (`fabric_id`); ``first_stamp``: the
    worker's first send stamp (where its clock bins' warm-up is; None before any);
    ``moved``: the clocks it found moved (none, unless it is the first partial a `close`
    handed out after the finds)."""

    window: int
    worker: str
    grid_ns: int
    fabric: str
    first_stamp: int | None
    covers: Covers
    clock: SampleRows
    detection: WindowPart
    learned: LearnedPaths
    nic_owd: NicDelays
    counts: RecordCounts
    moved: MovedClocks = field(default_factory=MovedClocks.empty)

    @property
    def records(self) -> int:
        """Return the probes the partial's window counts."""
        return self.detection.records

    def encode(self, *, compress: bool = True) -> bytes:
        """Return the partial as bytes (`decode` reads them back to an equal partial)."""
        head = {
            "window": self.window,
            "worker": self.worker,
            "grid_ns": self.grid_ns,
            "fabric": self.fabric,
            "first_stamp": self.first_stamp,
            "origins": list(self.covers.origins),
            "counts": {n: getattr(self.counts, n) for n in _COUNT_NAMES},
            "verdicts": dict(self.counts.verdicts),
        }
        cols: dict[str, NDArray[Any]] = {
            "cov.origin": self.covers.origin,
            "cov.seq": self.covers.seq,
        }
        for group, value in (("clk", self.clock), ("det", self.detection), ("lrn", self.learned),
                             ("nic", self.nic_owd), ("mov", self.moved)):  # fmt: skip
            for f in dataclasses.fields(value):  # type: ignore[arg-type]
                cols[f"{group}.{f.name}"] = getattr(value, f.name)
        return pack(MAGIC, VERSION, head, cols, compress=compress)

    @classmethod
    def decode(cls, data: bytes) -> Partial:
        """Return the partial of ``data``. Raises `PartialError` (one line) on any payload
        that is not a well-formed partial of a version this code reads."""
        try:
            _, head, cols = unpack(data, MAGIC, frozenset({VERSION}))
            return _build(head, cols)
        except PartialError:
            raise
        except CodecError as exc:
            raise PartialError(str(exc)) from None


def _build(head: dict[str, Any], cols: dict[str, NDArray[Any]]) -> Partial:
    """The partial of a decoded frame; raises `PartialError` on a bad head or columns."""

    def need(key: str, kind: type | tuple[type, ...]) -> Any:
        v = head.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise PartialError(f"head field {key!r} is missing or not {kind}")
        return v

    window, worker, grid_ns, fab = (
        need("window", int),
        need("worker", str),
        need("grid_ns", int),
        need("fabric", str),
    )
    first = head.get("first_stamp")
    if first is not None and (not isinstance(first, int) or isinstance(first, bool)):
        raise PartialError("head field 'first_stamp' is not an integer")
    if grid_ns <= 0:
        raise PartialError(f"grid width {grid_ns} is not positive")
    origins = need("origins", list)
    if not all(isinstance(o, str) for o in origins):
        raise PartialError("origins must be strings")
    counts_doc, verdicts = need("counts", dict), need("verdicts", dict)
    try:
        counts = dataclasses.replace(
            RecordCounts(verdicts=tuple(sorted((str(k), v) for k, v in verdicts.items()))),
            **{n: counts_doc[n] for n in _COUNT_NAMES},
        )
        if any(not isinstance(v, int) or v < 0 for _, v in counts.verdicts):
            raise ValueError("verdict counts are integers >= 0")
    except (KeyError, ValueError, TypeError) as exc:
        raise PartialError(f"bad record counts ({exc})") from None

    def col(name: str, dt: str, ndim: int) -> NDArray[Any]:
        a = cols.pop(name, None)
        if a is None:
            raise PartialError(f"column {name} is missing")
        if a.dtype.str != dt or a.ndim != ndim:
            raise PartialError(f"column {name} is {a.dtype.str} {a.ndim}-d, not {dt} {ndim}-d")
        return a

    def group(prefix: str, spec: dict[str, tuple[str, int]]) -> dict[str, NDArray[Any]]:
        return {k: col(f"{prefix}.{k}", dt, nd) for k, (dt, nd) in spec.items()}

    cov = group("cov", {"origin": ("<i4", 1), "seq": ("<i8", 1)})
    clk = group("clk", {k: (dt, 1) for k, dt in SAMPLE_COLUMNS.items()})
    det = group("det", _DETECT)
    lrn = group("lrn", _LEARNED)
    nic = group("nic", _NIC)
    mov = group("mov", _MOVED)
    if cols:
        raise PartialError(f"unknown column {sorted(cols)[0]}")
    _same_len("covers", cov, ("origin", "seq"))
    if len(cov["origin"]) and not (cov["origin"].min() >= 0 and cov["origin"].max() < len(origins)):
        raise PartialError("a covered batch names no origin")
    _same_len("clock", clk, tuple(SAMPLE_COLUMNS))
    coded = clk["pair"] >= 0
    if coded.sum() % 2:
        raise PartialError("clock pairs must come as two rows each")
    _same_len("paths", det, ("path_sig", "path_hops", "judged", "coarse", "wmin"))
    _same_len("path pairs", det, ("pair_fwd", "pair_rev", "pair_seen"))
    _same_len("slow delays", det, ("slow_hops", "slow_flows", "slow_excess"))
    _same_len("fine delays", det, ("fine_path", "fine_excess", "fine_flows", "fine_sw"))
    _same_len("flows", det, ("flow", "flow_probes", "flow_lost", "flow_fwd", "flow_rev"))
    _same_len("NIC counts", det, ("nic", "src_count", "last_src"))
    _same_len("round trips", det, ("rt_fwd", "rt_rev", "rt_excess"))
    n_paths = len(det["path_sig"])
    for k in ("pair_fwd", "pair_rev", "fine_path", "flow_fwd", "flow_rev", "rt_fwd", "rt_rev"):
        if len(det[k]) and not (det[k].min() >= 0 and det[k].max() < n_paths):
            raise PartialError(f"{k} names a path the partial does not hold")
    for k in ("slow_flows", "fine_flows", "flow"):
        if det[k].shape[1] != 3:
            raise PartialError(f"{k} rows must be (src, dst, sport)")
    _same_len("learned paths", lrn, tuple(_LEARNED))
    if lrn["hops"].shape != lrn["reply"].shape:
        raise PartialError("learned hops and reply hops differ in shape")
    _same_len("NIC delays", nic, tuple(_NIC))
    _same_len("moved clocks", mov, tuple(_MOVED))
    return Partial(
        window, worker, grid_ns, fab, first,
        Covers(tuple(origins), cov["origin"], cov["seq"]),
        SampleRows(**clk),
        WindowPart(**det),
        LearnedPaths(**lrn),
        NicDelays(**nic),
        counts,
        MovedClocks(**mov),
    )  # fmt: skip


def _same_len(what: str, cols: dict[str, NDArray[Any]], names: tuple[str, ...]) -> None:
    n = {len(cols[k]) for k in names}
    if len(n) > 1:
        raise PartialError(f"{what}: columns of unequal lengths")
