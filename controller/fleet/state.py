"""What a solver hands its workers after a window (`FleetState`): the clock models they turn
stamps into one-way delays with, and the few facts their folding needs.

A worker judges its own records (`controller.detect.window.DetectionWindow.fold`), so it needs
what the single controller's brain and clock sync would have at that moment: the clock state
and the trust it earned (`controller.clocksync.ClockSync.adopt`), the solver's first send
stamp (the clock bins' warm-up, `controller.clocksync.bin_keys`), the hosts whose prober is
down (their probes are not evidence), since when each host's prober is alive (probes sent to
it before are not judged), the paths' propagation baselines the solver folded (delays are
judged against them; a path's baseline mixes the probes of both its ends, which different
workers ingest) and the paths learned anywhere (a reply's path is learned by the other end's
prober). Baselines and learned paths come as the change since window ``since`` (exclusive)
up to ``window``, or whole (``full``): a worker that missed a state asks for a full one
(`controller.fleet.worker.FleetWorker.needs_full`).

`encode_state` / `decode_state` carry it in the fleet's columnar frame; a malformed payload
raises `StateError`, nothing else. Pure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from controller.clocksync import ClockState, ClockTrust
from controller.fleet.codec import CodecError, pack, unpack
from controller.fleet.partial import LearnedPaths
from sync import ClockModels

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
F64 = NDArray[np.float64]

MAGIC = b"QPFS"
VERSION = 2  # 2: the clocks moved (`ClockTrust.moved_at`)
NONE = -(1 << 62)
"""``since`` of a full state: everything from the beginning."""


class StateError(CodecError):
    """A payload that is not a fleet state this version reads (the reason in one line)."""


@dataclass(frozen=True, eq=False)
class FleetState:
    """The solver's state after judging ``window`` (see the module docstring).

    ``base_sig``/``base_hops``/``base_ns``: paths (signature, hop row) and their baselines
    (ns, inf: none) changed in windows ``since`` < w <= ``window`` (all of them when
    ``full``); ``learned``: the paths learned in those windows. ``alive_since``: per host
    index (fabric order) when its prober became alive (0: never said)."""

    window: int
    since: int
    full: bool
    clock: ClockState | None
    trust: ClockTrust
    first_stamp: int | None
    hosts_down: tuple[str, ...]
    alive_since: I64
    base_sig: I64
    base_hops: I32
    base_ns: F64
    learned: LearnedPaths


def encode_state(state: FleetState, *, compress: bool = True) -> bytes:
    """Return ``state`` as bytes (`decode_state` reads them back)."""
    head: dict[str, Any] = {
        "window": state.window,
        "since": state.since,
        "full": state.full,
        "first_stamp": state.first_stamp,
        "hosts_down": list(state.hosts_down),
        "clock": None,
    }
    cols: dict[str, NDArray[Any]] = {
        "alive_since": state.alive_since,
        "base.sig": state.base_sig,
        "base.hops": state.base_hops,
        "base.ns": state.base_ns,
    }
    for f in dataclasses.fields(state.trust):
        cols[f"trust.{f.name}"] = getattr(state.trust, f.name)
    for f in dataclasses.fields(state.learned):
        cols[f"lrn.{f.name}"] = getattr(state.learned, f.name)
    if state.clock is not None:
        head["clock"] = _split(state.clock, "clock", cols)
    return pack(MAGIC, VERSION, head, cols, compress=compress)


def _split(value: Any, prefix: str, cols: dict[str, NDArray[Any]]) -> dict[str, Any]:
    """Scalars of a dataclass value into the returned dict, arrays into ``cols``, nested
    dataclasses (the clock models) recursively."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if isinstance(v, np.ndarray):
            cols[f"{prefix}.{f.name}"] = v
        elif dataclasses.is_dataclass(v):
            out[f.name] = {"@": _split(v, f"{prefix}.{f.name}", cols)}
        else:
            out[f.name] = v
    return out


def decode_state(data: bytes, n_nics: int, n_hosts: int) -> FleetState:
    """Return the state of ``data`` for a fabric of ``n_nics`` NICs and ``n_hosts`` hosts.
    Raises `StateError` (one line) on anything malformed or of another fabric's size."""
    try:
        _, head, cols = unpack(data, MAGIC, frozenset({VERSION}))
        return _build(head, cols, n_nics, n_hosts)
    except StateError:
        raise
    except CodecError as exc:
        raise StateError(str(exc)) from None
    except (ValueError, TypeError, KeyError) as exc:  # a dataclass refusing the values
        raise StateError(f"bad state ({exc})") from None


def _build(
    head: dict[str, Any], cols: dict[str, NDArray[Any]], n_nics: int, n_hosts: int
) -> FleetState:
    def col(name: str, dt: str, ndim: int, n: int | None = None) -> NDArray[Any]:
        a = cols.pop(name, None)
        if a is None or a.dtype.str != dt or a.ndim != ndim or (n is not None and len(a) != n):
            raise StateError(f"column {name} is missing or not {dt} {ndim}-d of the fabric's size")
        return np.array(a)  # writable: a worker keeps these

    window, since = head.get("window"), head.get("since")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (window, since)):
        raise StateError("window and since must be integers")
    assert isinstance(window, int) and isinstance(since, int)
    first = head.get("first_stamp")
    if first is not None and not isinstance(first, int):
        raise StateError("first_stamp must be an integer")
    down = head.get("hosts_down")
    if not isinstance(down, list) or not all(isinstance(h, str) for h in down):
        raise StateError("hosts_down must be a list of host ids")
    trust = ClockTrust(
        *(col(f"trust.{f.name}", "<i8" if f.name == "moved_at" else "<f8", 1, n_nics)
          for f in dataclasses.fields(ClockTrust))
    )  # fmt: skip
    learned = LearnedPaths(
        col("lrn.src", "<i8", 1), col("lrn.dst", "<i8", 1), col("lrn.sport", "<i8", 1),
        col("lrn.hops", "<i4", 2), col("lrn.reply", "<i4", 2),
    )  # fmt: skip
    if len({len(learned.src), len(learned.dst), len(learned.sport), len(learned.hops)}) > 1 or (
        learned.hops.shape != learned.reply.shape
    ):
        raise StateError("learned paths: columns of unequal shapes")
    alive = col("alive_since", "<i8", 1, n_hosts)
    sig, hops, base = (
        col("base.sig", "<i8", 1),
        col("base.hops", "<i4", 2),
        col("base.ns", "<f8", 1),
    )
    if not len(sig) == len(hops) == len(base):
        raise StateError("baselines: columns of unequal lengths")
    clock = None
    if head.get("clock") is not None:
        clock = _join(ClockState, head["clock"], "clock", cols)
        if len(clock.models) != n_nics:
            raise StateError(f"clock models cover {len(clock.models)} NICs, not {n_nics}")
    if cols:
        raise StateError(f"unknown column {sorted(cols)[0]}")
    return FleetState(
        window, since, bool(head.get("full")), clock, trust, first,
        tuple(down), alive, sig, hops, base, learned,
    )  # fmt: skip


def _join(cls: type[Any], doc: Any, prefix: str, cols: dict[str, NDArray[Any]]) -> Any:
    """The dataclass ``cls`` back from `_split`'s scalars and columns; raises `StateError`."""
    if not isinstance(doc, dict):
        raise StateError(f"{prefix} is not an object")
    kw: dict[str, Any] = {}
    hints = {"models": ClockModels}
    for f in dataclasses.fields(cls):
        name = f"{prefix}.{f.name}"
        if name in cols:
            kw[f.name] = np.array(cols.pop(name))
        elif isinstance(doc.get(f.name), dict) and "@" in doc[f.name]:
            kw[f.name] = _join(hints[f.name], doc[f.name]["@"], name, cols)
        elif f.name in doc:
            kw[f.name] = doc[f.name]
    return cls(**kw)
