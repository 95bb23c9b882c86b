"""Virtual clocks for emulated hosts: known offset, drift and optional wander over kernel stamps.

All namespaces share one kernel clock, so the testbed gives every host a `VirtualClock` and
passes it to the prober's clock hook (``prober.udp``'s ``clock`` callable: kernel ns -> NIC
clock ns). The truth (every clock's parameters) goes to a JSON file the benchmarks read.
Pure: no clock is read here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

MAX_OFFSET_NS = 1_000_000.0
MAX_DRIFT = 30e-6


class ClockError(ValueError):
    """A virtual clock description is invalid."""


@dataclass(frozen=True, slots=True)
class VirtualClock:
    """local = t + offset_ns + drift * (t - t0_ns) + wander_ns * sin(2 pi (t - t0) / period + phase).

    Raises `ClockError` if |drift| >= 1e-3, wander_ns < 0 or the period is not > 0.
    """

    offset_ns: float
    drift: float
    t0_ns: int
    wander_ns: float = 0.0
    wander_period_s: float = 60.0
    phase: float = 0.0

    def __post_init__(self) -> None:
        if not abs(self.drift) < 1e-3 or not math.isfinite(self.offset_ns):
            raise ClockError("drift must be below 1000 ppm and the offset finite")
        if self.wander_ns < 0 or self.wander_period_s <= 0:
            raise ClockError("wander_ns must be >= 0 and wander_period_s > 0")

    def offset_at(self, t_ns: int) -> float:
        """Return local - true (ns, float) at true kernel time ``t_ns``."""
        dt = float(t_ns - self.t0_ns)
        off = self.offset_ns + self.drift * dt
        if self.wander_ns:
            off += self.wander_ns * math.sin(
                2 * math.pi * dt / (self.wander_period_s * 1e9) + self.phase
            )
        return off

    def apply(self, kernel_stamp_ns: int) -> int:
        """Return the local clock reading for kernel stamp ``kernel_stamp_ns`` (int ns)."""
        return int(kernel_stamp_ns) + round(self.offset_at(kernel_stamp_ns))

    __call__ = apply

    def apply_array(self, stamps: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Vectorized `apply` over int64 kernel stamps."""
        s = np.asarray(stamps, dtype=np.int64)
        dt = (s - self.t0_ns).astype(np.float64)
        off = self.offset_ns + self.drift * dt
        if self.wander_ns:
            off = off + self.wander_ns * np.sin(
                2 * np.pi * dt / (self.wander_period_s * 1e9) + self.phase
            )
        return s + np.round(off).astype(np.int64)


def assign_clocks(
    ids: Iterable[str],
    *,
    seed: int,
    t0_ns: int,
    max_offset_ns: float = MAX_OFFSET_NS,
    max_drift: float = MAX_DRIFT,
    wander_ns: float = 0.0,
) -> dict[str, VirtualClock]:
    """Return a seeded clock per id: offset uniform in +-max_offset_ns, drift in +-max_drift."""
    rng = np.random.default_rng(seed)
    out = {}
    for ident in ids:
        off, drift = rng.uniform(-max_offset_ns, max_offset_ns), rng.uniform(-max_drift, max_drift)
        phase = float(rng.uniform(0, 2 * np.pi))
        out[ident] = VirtualClock(float(off), float(drift), t0_ns, wander_ns, 60.0, phase)
    return out


def truth_doc(clocks: Mapping[str, VirtualClock], nic_host: Mapping[str, str]) -> dict[str, object]:
    """Return the JSON-ready truth: per host its clock, per NIC its host."""
    return {"clocks": {k: asdict(v) for k, v in clocks.items()}, "nic_host": dict(nic_host)}


def write_clock(clock: VirtualClock, path: str | Path) -> None:
    """Write ``clock`` as JSON to ``path`` (read back by `load_clock`)."""
    Path(path).write_text(json.dumps(asdict(clock), sort_keys=True))


def load_clock(path: str | Path) -> VirtualClock:
    """Return the `VirtualClock` in JSON file ``path``.

    Raises `ClockError` (a ValueError) naming the file if it is not a valid clock, OSError
    if it cannot be read.
    """
    try:
        doc = json.loads(Path(path).read_text())
        if not isinstance(doc, dict):
            raise TypeError("not a JSON object")
        return VirtualClock(**doc)
    except (ValueError, TypeError) as exc:
        raise ClockError(f"{path}: not a virtual clock: {exc}") from None


def write_truth(
    path: str | Path, clocks: Mapping[str, VirtualClock], nic_host: Mapping[str, str]
) -> Path:
    """Write the truth file; return its path."""
    p = Path(path)
    p.write_text(json.dumps(truth_doc(clocks, nic_host), indent=1, sort_keys=True))
    return p


def load_truth(path: str | Path) -> tuple[dict[str, VirtualClock], dict[str, str]]:
    """Read a truth file: (clocks per host, host per NIC). Raises `ClockError` if malformed."""
    try:
        doc = json.loads(Path(path).read_text())
        clocks = {k: VirtualClock(**v) for k, v in doc["clocks"].items()}
        return clocks, {str(k): str(v) for k, v in doc["nic_host"].items()}
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ClockError(f"{path}: bad truth file: {exc}") from None
