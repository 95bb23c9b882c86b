"""Counters to per-second rates, with wraps, saturation and resets handled (pure).

One rule, in two shapes (scalars for the prober, arrays for the simulator; a test keeps them
equal): the rate of a counter from ``prev`` to ``cur`` over ``dt_s`` seconds is

- not available (None / NaN) when either reading is, when ``dt_s`` is not positive, when a
  saturating counter sits at its maximum (2**width - 1: the true count is unknown), or when
  the counter went backwards by more than a single wrap explains (a reset: driver reload,
  device reset);
- ``(cur + 2**width - prev) / dt_s`` when a ``width``-bit counter (width < 64) went backwards
  and one wrap explains it (the wrapped difference is under half the range);
- ``(cur - prev) / dt_s`` otherwise.

A 64-bit counter never wraps in practice (a 400 Gb/s byte counter needs 11 years), so going
backwards is always a reset. A counter that wraps more than once within one window reads
low: wrap-prone 32-bit counters need windows shorter than their wrap time (a 32-bit packet
counter at 12 Mpacket/s wraps every 6 minutes).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


def counter_rate(
    prev: float | None,
    cur: float | None,
    dt_s: float,
    width: int = 64,
    saturates: bool = False,
) -> float | None:
    """Return the per-second rate of one counter (the module's rule), or None."""
    if prev is None or cur is None or not dt_s > 0:
        return None
    top = float(2**width)
    if saturates and cur >= top - 1:
        return None
    if cur >= prev:
        return (cur - prev) / dt_s
    if width < 64 and not saturates:
        wrapped = cur + top - prev
        if wrapped < top / 2:
            return wrapped / dt_s
    return None


def counter_rates(
    prev: Array,
    cur: Array,
    dt_s: float,
    widths: npt.NDArray[np.int64],
    saturates: npt.NDArray[np.bool_],
) -> Array:
    """Return the rates of arrays of counters (NaN = not available); ``widths`` and
    ``saturates`` broadcast along the last axis (one per signal)."""
    if not dt_s > 0:
        return np.full(np.broadcast(prev, cur).shape, np.nan)
    top = np.ldexp(1.0, widths.astype(np.int64))
    diff = cur - prev
    wrapped = cur + top - prev
    can_wrap = (widths < 64) & ~saturates
    out = np.where(diff >= 0, diff, np.where(can_wrap & (wrapped < top / 2), wrapped, np.nan))
    out = np.where(saturates & (cur >= top - 1), np.nan, out)
    return np.asarray(out / dt_s, np.float64)  # NaN in prev or cur stays NaN
