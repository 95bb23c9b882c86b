"""One definition of a clock-sync error against the truth, for every benchmark and report.

Sync can only ever estimate the clocks up to one common offset (no NIC sees the reference
time), so an error is ``est - truth`` after removing a common part. Two rules, both learnt
the hard way (issue 34):

* **only the NICs the solve reports known** are scored; the others are counted apart
  (``unknown``). A NIC that is down, stepped or cut off comes back NaN, never a number: it
  has no error to score, and it must not move the others' (a testbed run with one NIC down
  for 12 s reported node p50 and p99 of ~5.9 µs while the pair p99 was 45 ns, because the
  truth's mean still included the unknown NIC);
* **centred on the median** of the known NICs' ``est - truth``, not the mean: one NIC far off
  (a step the solve has not seen yet) would otherwise shift every other NIC's figure by its
  error over the NIC count.

Pure: arrays in, arrays out.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def node_errors(est: F64, truth: F64, known: npt.NDArray[np.bool_] | None = None) -> F64:
    """Per NIC ``|est - truth - median(est - truth)|`` over the NICs with a finite estimate
    (and ``known`` where given), NaN for the others. Raises ValueError on arrays of different
    lengths."""
    est, truth = np.asarray(est, np.float64), np.asarray(truth, np.float64)
    if len(est) != len(truth) or (known is not None and len(known) != len(est)):
        raise ValueError("est, truth and known must have one entry per NIC")
    k = np.isfinite(est) & np.isfinite(truth)
    if known is not None:
        k &= np.asarray(known, bool)
    out = np.full(len(est), np.nan)
    if k.any():
        d = est[k] - truth[k]
        out[k] = np.abs(d - np.median(d))
    return out


def error_figures(
    est: F64, truth: F64, known: npt.NDArray[np.bool_] | None = None
) -> dict[str, float]:
    """``p50_ns``, ``p99_ns``, ``max_ns`` of `node_errors` over the known NICs (NaN when none),
    ``known`` and ``unknown`` (how many NICs were left out)."""
    e = node_errors(est, truth, known)
    f = e[np.isfinite(e)]
    nan = float("nan")
    return {
        "p50_ns": round(float(np.percentile(f, 50)), 2) if f.size else nan,
        "p99_ns": round(float(np.percentile(f, 99)), 2) if f.size else nan,
        "max_ns": round(float(f.max()), 2) if f.size else nan,
        "known": int(f.size),
        "unknown": int(len(e) - f.size),
    }
