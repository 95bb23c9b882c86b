"""Probe outcomes ready for detection: the contract between ingest and the brain.

`Observations` is columnar (all arrays length n). The ingest pipeline builds it from decoded
probe batches (fabric NIC indices, ECMP paths, clock-synced one-way delays); the detectors in
`controller.brain` consume it. Constructing one validates dtypes and shapes and raises
`ObservationError` (a ValueError) on any mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

_UNSET: NDArray[np.bool_] = np.zeros(0, np.bool_)  # Observations.coarse / .sw not given


class ObservationError(ValueError):
    """Observations columns have wrong lengths, shapes or dtypes."""


_FLAT: tuple[tuple[str, type[np.generic]], ...] = (
    ("t_ns", np.int64),
    ("src", np.int32),
    ("dst", np.int32),
    ("sport", np.int32),
    ("lost", np.bool_),
    ("owd_fwd_ns", np.float64),
    ("owd_rev_ns", np.float64),
    ("rtt_ns", np.float64),
)


@dataclass(frozen=True, eq=False)
class Observations:
    """Probe outcomes ready for detection; all arrays length n."""

    t_ns: NDArray[np.int64]  # probe send time on the controller's timebase (~true time), ns
    src: NDArray[np.int32]  # initiator NIC index (fabric)
    dst: NDArray[np.int32]  # responder NIC index
    sport: NDArray[np.int32]  # UDP source port
    hops_fwd: NDArray[np.int32]  # (n, H) directed hop ids src->dst, -1 padded
    hops_rev: NDArray[np.int32]  # (n, H) reply path dst->src
    lost: NDArray[np.bool_]
    owd_fwd_ns: NDArray[np.float64]  # one-way delay after clock sync, NaN if lost/unknown
    owd_rev_ns: NDArray[np.float64]
    rtt_ns: NDArray[np.float64]  # (t4-t1)-(t3-t2), NaN if lost
    # True where both delays are known only coarsely: clocks certain to ClockSyncConfig
    # .coarse_unc_ns, not .max_unc_ns (controller.clocksync); not given: all False
    coarse: NDArray[np.bool_] = field(default_factory=lambda: _UNSET)
    # True where the stamps are the kernel's (the batch's ``stamp`` is "sw",
    # `contract.records`): their delays carry the hosts' stamp jitter (docs/detection.md,
    # "Kernel stamps"); not given: all False (NIC stamps)
    sw: NDArray[np.bool_] = field(default_factory=lambda: _UNSET)

    def __post_init__(self) -> None:
        n = len(self.t_ns) if isinstance(self.t_ns, np.ndarray) else -1
        if n < 0:
            raise ObservationError("t_ns must be a numpy array")
        for name, dt in _FLAT:
            col = getattr(self, name)
            if not isinstance(col, np.ndarray) or col.ndim != 1 or len(col) != n:
                raise ObservationError(f"{name} must be a 1-d array of length {n}")
            if col.dtype != np.dtype(dt):
                raise ObservationError(f"{name} must have dtype {np.dtype(dt)}, got {col.dtype}")
        for name in ("hops_fwd", "hops_rev"):
            col = getattr(self, name)
            if not isinstance(col, np.ndarray) or col.ndim != 2 or col.shape[0] != n:
                raise ObservationError(f"{name} must be a 2-d array with {n} rows")
            if col.dtype != np.int32:
                raise ObservationError(f"{name} must have dtype int32, got {col.dtype}")
        for name in ("coarse", "sw"):
            c = getattr(self, name)
            if c is _UNSET:
                object.__setattr__(self, name, np.zeros(n, np.bool_))
            elif not isinstance(c, np.ndarray) or c.shape != (n,) or c.dtype != np.bool_:
                raise ObservationError(f"{name} must be a bool array of length {n}")

    def __len__(self) -> int:
        return len(self.t_ns)

    @classmethod
    def empty(cls, max_hops: int = 0) -> Observations:
        """Return observations with no rows (hop matrices of width ``max_hops``)."""
        i32 = np.zeros(0, np.int32)
        f64 = np.zeros(0, np.float64)
        hops = np.zeros((0, max_hops), np.int32)
        return cls(
            np.zeros(0, np.int64),
            i32,
            i32.copy(),
            i32.copy(),
            hops,
            hops.copy(),
            np.zeros(0, np.bool_),
            f64,
            f64.copy(),
            f64.copy(),
        )

    def select(self, mask: NDArray[np.bool_] | NDArray[np.intp]) -> Observations:
        """Return the rows picked by a boolean mask or index array."""
        return Observations(
            self.t_ns[mask],
            self.src[mask],
            self.dst[mask],
            self.sport[mask],
            self.hops_fwd[mask],
            self.hops_rev[mask],
            self.lost[mask],
            self.owd_fwd_ns[mask],
            self.owd_rev_ns[mask],
            self.rtt_ns[mask],
            self.coarse[mask],
            self.sw[mask],
        )
