"""Per-NIC clock models and real-time one-way delays by extrapolating them.

Model of NIC i: ``local_i(t) = t + offset_i + drift_i * (t - t_ref)``, with t the reference
("true") time, ``t_ref`` an int64 epoch in true ns. Inverting: for ``lam = local - t_ref``,
``t - t_ref = (lam - offset) / (1 + drift)``. Epoch-sized stamps stay int64 until the
subtraction of ``t_ref``; only the (small) relative part is float64. Uncertainty grows with the
distance from ``t_ref``: ``var = offset_std^2 + (drift_std * dt)^2 + wander * |dt| / 1e9``
(``wander`` in ns^2 per second: random-walk clock wander).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sync._arrays import as_float, as_index, as_int

F64 = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class ClockModel:
    """One NIC's clock: offset (ns) at ``t_ref_ns``, drift (ns/ns) and their 1-sigma errors."""

    t_ref_ns: int
    offset_ns: float
    drift: float
    offset_std_ns: float = 0.0
    drift_std: float = 0.0
    wander_ns2_per_s: float = 0.0

    def __post_init__(self) -> None:
        vals = (self.offset_ns, self.drift, self.offset_std_ns, self.drift_std)
        if not all(math.isfinite(v) for v in vals):
            raise ValueError("ClockModel values must be finite")
        if min(self.offset_std_ns, self.drift_std, self.wander_ns2_per_s) < 0:
            raise ValueError("ClockModel uncertainties must be >= 0")
        if not -0.1 < self.drift < 0.1:
            raise ValueError(f"drift {self.drift} is not a clock drift")

    def _dt(self, local_ns: int) -> float:
        return (float(local_ns - self.t_ref_ns) - self.offset_ns) / (1.0 + self.drift)

    def predict(self, local_ns: int) -> tuple[float, float]:
        """(offset_ns, std_ns) of this clock when it reads ``local_ns``."""
        dt = self._dt(local_ns)
        var = self.offset_std_ns**2 + (self.drift_std * dt) ** 2
        var += self.wander_ns2_per_s * abs(dt) / 1e9
        return float(local_ns - self.t_ref_ns) - dt, math.sqrt(var)

    def to_true(self, local_ns: int) -> int:
        """True time (int ns, rounded) at which this clock reads ``local_ns``."""
        return self.t_ref_ns + round(self._dt(local_ns))


@dataclass(frozen=True)
class ClockModels:
    """Vectorized clock models indexed by NIC; ``known`` False means no usable estimate
    (offset/drift NaN) and every derived value for that NIC is NaN."""

    t_ref_ns: int
    offset_ns: F64
    drift: F64
    offset_std_ns: F64
    drift_std: F64
    known: BoolArray
    wander_ns2_per_s: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.known)
        for name in ("offset_ns", "drift", "offset_std_ns", "drift_std"):
            if np.shape(getattr(self, name)) != (n,):
                raise ValueError(f"{name} must have shape ({n},)")
        k = self.known
        good = np.isfinite(self.offset_ns[k]).all() and np.isfinite(self.drift[k]).all()
        if not good or (np.abs(self.drift[k]) >= 0.1).any():
            raise ValueError("known NICs need finite offset and |drift| < 0.1")
        if self.wander_ns2_per_s < 0:
            raise ValueError("wander_ns2_per_s must be >= 0")

    @classmethod
    def build(
        cls,
        t_ref_ns: int,
        offset_ns: ArrayLike,
        drift: ArrayLike,
        offset_std_ns: ArrayLike,
        drift_std: ArrayLike,
        *,
        wander_ns2_per_s: float = 0.0,
    ) -> ClockModels:
        """Models from arrays (e.g. a ``NetworkSolution``); NaN offset or drift => unknown."""
        off = as_float(offset_ns, "offset_ns")
        n = len(off)
        dr = as_float(drift, "drift", n)
        known = np.isfinite(off) & np.isfinite(dr)
        nan = np.full(n, np.nan)
        return cls(
            t_ref_ns=int(t_ref_ns),
            offset_ns=np.where(known, off, nan),
            drift=np.where(known, dr, nan),
            offset_std_ns=np.where(known, as_float(offset_std_ns, "offset_std_ns", n), nan),
            drift_std=np.where(known, as_float(drift_std, "drift_std", n), nan),
            known=known,
            wander_ns2_per_s=wander_ns2_per_s,
        )

    def __len__(self) -> int:
        return len(self.known)

    def model(self, nic: int) -> ClockModel:
        """Scalar model of one NIC; raises ValueError if it is unknown."""
        if not self.known[nic]:
            raise ValueError(f"NIC {nic} has no clock estimate")
        return ClockModel(
            self.t_ref_ns,
            float(self.offset_ns[nic]),
            float(self.drift[nic]),
            float(self.offset_std_ns[nic]),
            float(self.drift_std[nic]),
            self.wander_ns2_per_s,
        )

    def true_rel_ns(self, local_ns: NDArray[np.int64], nic: NDArray[np.integer[Any]]) -> F64:
        """(true time - t_ref) in float ns for stamps ``local_ns`` of NICs ``nic``, NaN for
        unknown NICs: the inversion of `true_rel` without its checks and uncertainty (for hot
        paths whose indices are already valid)."""
        lam = (local_ns - self.t_ref_ns).astype(np.float64)
        lam -= np.take(self.offset_ns, nic)
        lam /= np.take(1.0 + self.drift, nic)
        return lam

    def true_rel(self, local_ns: ArrayLike, nic: ArrayLike) -> tuple[F64, F64]:
        """(true time - t_ref, std) in float ns for stamps ``local_ns`` (int64) of NICs ``nic``;
        NaN for unknown NICs. Raises ValueError on mismatched lengths or bad NIC indices."""
        loc = as_int(local_ns, "local_ns")
        idx = as_index(nic, "nic", len(self), len(loc))
        dt = self.true_rel_ns(loc, idx)
        var = self.offset_std_ns[idx] ** 2 + (self.drift_std[idx] * dt) ** 2
        var = var + self.wander_ns2_per_s * np.abs(dt) / 1e9
        return dt, np.sqrt(var)


def one_way_delays(
    send_local_ns: ArrayLike,
    send_nic: ArrayLike,
    recv_local_ns: ArrayLike,
    recv_nic: ArrayLike,
    models: ClockModels,
) -> tuple[F64, F64]:
    """(owd_ns, uncertainty_ns) per probe: each stamp mapped to true time by its NIC's model
    (extrapolated as far as needed, so usable "now"). The two clock errors are treated as
    independent. NaN where either NIC is unknown; ValueError on mismatched lengths."""
    ts, ss = models.true_rel(send_local_ns, send_nic)
    tr, sr = models.true_rel(recv_local_ns, recv_nic)
    if ts.shape != tr.shape:
        raise ValueError("send and recv arrays must have the same length")
    return tr - ts, np.sqrt(ss**2 + sr**2)
