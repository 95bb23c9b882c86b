"""The live-state snapshot: the one interface the TUI, the HTTP API and tests read.

A `MeshSnapshot` is an immutable picture of the mesh at one instant: per-NIC state and worst
one-way delays (inbound and outbound), the latest one-way delay per NIC pair, per-link state and
flap counts, clock models, events, and the places for features that arrive later (Control,
jobs, remediation) which are ``None`` while unavailable. A `SnapshotSource` hands out the latest
snapshot and per-NIC history: the in-process controller (demo) or `tui.apiclient.ApiSource`,
a remote controller through its HTTP API and websocket.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from mesh.fabric import Fabric


class Health(enum.StrEnum):
    """Health of a NIC or link, ordered from good to bad by `SEVERITY`. UNKNOWN: nothing
    measured it lately (the controller says so rather than calling it up)."""

    UP = "up"
    DEGRADED = "degraded"
    CONTENDED = "contended"
    FLAPPING = "flapping"
    DOWN = "down"
    UNKNOWN = "unknown"


def worst(states: Iterable[Health]) -> Health:
    """Return the worst of ``states`` by `SEVERITY` (UNKNOWN for none)."""
    return max(states, key=SEVERITY.__getitem__, default=Health.UNKNOWN)


SEVERITY: Mapping[Health, int] = {
    Health.UP: 0,
    Health.UNKNOWN: 1,
    Health.DEGRADED: 2,
    Health.CONTENDED: 3,
    Health.FLAPPING: 4,
    Health.DOWN: 5,
}


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """GPU health of one host: ``ok`` False when NVML reported errors; ``present`` False = no GPU."""

    present: bool
    ok: bool = True
    detail: str = ""


class PairPaths(Mapping[tuple[int, int], Mapping[str, float]]):
    """Per NIC pair (src, dst): the worst one-way delay through each top switch, held as
    arrays (one row per flow: pair key ``src * n + dst``, switch index into ``names`` with -1
    = unknown ``"?"``, delay ns) and sorted only when first asked (a 1,024-NIC controller has
    ~10^6 live flows and ~50,000 pairs: too much to sort and turn into dicts on every tick
    when nobody looks). A pair's dict is made when that pair is asked for."""

    DENSE_MAX = 1 << 22  # n * n up to this: `worst` uses a dense array instead of a sort

    def __init__(
        self,
        n: int,
        pair_key: npt.NDArray[np.int64],
        switch: npt.NDArray[np.int64],
        owd_ns: npt.NDArray[np.float64],
        names: tuple[str, ...],
    ) -> None:
        """Rows may repeat a (pair, switch): the worst delay wins. Raises ValueError if the
        arrays differ in length. Keeps the arrays (pass copies)."""
        if not len(pair_key) == len(switch) == len(owd_ns):
            raise ValueError("pair_key, switch and owd_ns must have equal lengths")
        self.n, self.names = n, names
        self._raw = (np.asarray(pair_key, np.int64), np.asarray(switch, np.int64),
                     np.asarray(owd_ns, np.float64))  # fmt: skip
        self._built: tuple[npt.NDArray[Any], ...] | None = None
        self._dense: npt.NDArray[np.float64] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the flows only (the API process gets them once per tick; the sorted tables
        are built there when someone asks)."""
        return (PairPaths, (self.n, *self._raw, self.names))

    def _tables(self) -> tuple[npt.NDArray[Any], ...]:
        """(pair keys, row starts, row ends, switch per row, worst per row), built once."""
        built = self._built
        if built is None:
            pair_key, switch, owd = self._raw
            width = len(self.names) + 1
            combo = pair_key * width + (switch + 1)
            uc, inv = np.unique(combo, return_inverse=True)
            worst = np.full(len(uc), -np.inf)
            np.maximum.at(worst, inv, owd)
            pair = uc // width
            keys, start = np.unique(pair, return_index=True)
            end = np.append(start[1:], len(pair))
            built = self._built = (keys, start, end, uc % width - 1, worst)
        return built

    def _row(self, k: int) -> dict[str, float]:
        keys, start, end, sw, owd = self._tables()
        i = int(np.searchsorted(keys, k))
        if i >= len(keys) or keys[i] != k:
            raise KeyError(k)
        lo, hi = int(start[i]), int(end[i])
        return {
            (self.names[j] if j >= 0 else "?"): v
            for j, v in zip(sw[lo:hi].tolist(), owd[lo:hi].tolist(), strict=True)
        }

    def __getitem__(self, key: tuple[int, int]) -> Mapping[str, float]:
        s, d = key
        if not (0 <= s < self.n and 0 <= d < self.n):
            raise KeyError(key)
        return self._row(s * self.n + d)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        n = self.n
        return ((k // n, k % n) for k in self._tables()[0].tolist())

    def __len__(self) -> int:
        return len(self._tables()[0])

    def dense(self) -> npt.NDArray[np.float64] | None:
        """Return the worst delay per pair as an n x n array (-inf: no flow; NaN stays), or
        None when ``n * n > DENSE_MAX``. Made once."""
        if self.n * self.n > self.DENSE_MAX:
            return None
        if self._dense is None:
            pair_key, _, owd = self._raw
            dense = np.full(self.n * self.n, -np.inf)
            np.maximum.at(dense, pair_key, owd)
            self._dense = dense.reshape(self.n, self.n)
        return self._dense

    def worst(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Return (pair keys ``src * n + dst`` ascending, worst delay over their switches);
        without sorting the flows when ``n * n <= DENSE_MAX``."""
        pair_key = self._raw[0]
        if not len(pair_key):
            return np.zeros(0, np.int64), np.zeros(0)
        dense = self.dense()
        if dense is not None:
            flat = dense.reshape(-1)
            keys = np.flatnonzero(~np.isneginf(flat)).astype(np.int64)  # NaN stays
            return keys, flat[keys]
        keys, start, _, _, row_owd = self._tables()
        return keys, np.maximum.reduceat(row_owd, start)

    def touching(self, nic: int) -> Iterator[tuple[tuple[int, int], Mapping[str, float]]]:
        """Return the (pair, per-switch delays) items whose source or destination is ``nic``."""
        keys = self._tables()[0]
        hit = (keys // self.n == nic) | (keys % self.n == nic)
        for k in keys[hit].tolist():
            yield (k // self.n, k % self.n), self._row(k)


@dataclass(frozen=True, eq=False)
class MeshSnapshot:
    """The mesh at ``t_ns``. Arrays are indexed by NIC index of ``fabric``.

    ``owd_src``/``owd_dst``/``owd_ns`` list the latest one-way delay per probed NIC pair
    (worst over its paths); ``path_owd`` maps (src, dst) to per-spine delays for drill-down
    (a `PairPaths` from the live controller).
    Delays are NaN where unknown. ``control_enabled``/``jobs`` are None while unavailable.
    ``behind_ns``/``status``: how far the controller is behind and why ("controller behind
    by 3.2 s (loop lag)"; "" on time); ``late_probers``: host -> send slip (ns) of the
    probers that report themselves late (`controller.behind`).
    """

    t_ns: int
    fabric: Fabric
    nic_health: tuple[Health, ...]
    worst_in_ns: npt.NDArray[np.float64]
    worst_out_ns: npt.NDArray[np.float64]
    owd_src: npt.NDArray[np.int32]
    owd_dst: npt.NDArray[np.int32]
    owd_ns: npt.NDArray[np.float64]
    clock_offset_ns: npt.NDArray[np.float64]
    clock_uncertainty_ns: npt.NDArray[np.float64]
    link_health: Mapping[str, Health] = field(default_factory=dict)
    flap_counts: Mapping[str, int] = field(default_factory=dict)
    path_owd: Mapping[tuple[int, int], Mapping[str, float]] = field(default_factory=dict)
    events: tuple[EventDoc, ...] = ()
    gpu: Mapping[str, GpuHealth] = field(default_factory=dict)
    throughput_bps: float | None = None
    control_enabled: bool | None = None
    jobs: tuple[Mapping[str, object], ...] | None = None
    behind_ns: int = 0
    status: str = ""
    late_probers: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.fabric.nics)
        if len(self.nic_health) != n:
            raise ValueError(f"nic_health has {len(self.nic_health)} entries for {n} NICs")
        for name in ("worst_in_ns", "worst_out_ns", "clock_offset_ns", "clock_uncertainty_ns"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have one entry per NIC ({n})")
        if not len(self.owd_src) == len(self.owd_dst) == len(self.owd_ns):
            raise ValueError("owd_src, owd_dst and owd_ns must have equal lengths")

    @property
    def healthy_count(self) -> int:
        """Number of NICs whose health is UP."""
        return sum(1 for h in self.nic_health if h == Health.UP)

    @property
    def unknown_count(self) -> int:
        """Number of NICs whose health is UNKNOWN (nothing measured them lately)."""
        return sum(1 for h in self.nic_health if h == Health.UNKNOWN)

    @property
    def unhealthy_count(self) -> int:
        """Number of NICs judged bad (neither UP nor UNKNOWN)."""
        return len(self.nic_health) - self.healthy_count - self.unknown_count

    @classmethod
    def blank(cls, fabric: Fabric, t_ns: int = 0) -> MeshSnapshot:
        """Return a snapshot with every NIC unknown and no delays."""
        n = len(fabric.nics)
        nan = np.full(n, np.nan)
        empty_i = np.zeros(0, dtype=np.int32)
        return cls(
            t_ns,
            fabric,
            (Health.UNKNOWN,) * n,
            nan,
            nan.copy(),
            empty_i,
            empty_i.copy(),
            np.zeros(0),
            nan.copy(),
            nan.copy(),
        )


class ControlUnavailable(RuntimeError):
    """Control (automatic remediation) is not available from this source."""


class SnapshotSource(Protocol):
    """Where a viewer gets live state: the in-process controller or a remote one."""

    def snapshot(self) -> MeshSnapshot:
        """Return the latest snapshot (never blocks)."""
        ...

    def history(
        self, nic: int, window_s: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Return (times in s relative to now, worst delay ns) of ``nic`` over ``window_s``."""
        ...

    def set_control(self, enabled: bool) -> None:
        """Turn automatic remediation on or off; raise `ControlUnavailable` if not supported."""
        ...
