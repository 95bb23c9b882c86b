"""Is the live clock honest? Its stated uncertainty held against the truth, tick by tick.

The controller judges a NIC's delays on its clock only while the clock's uncertainty is under
``max_unc_ns`` (fine) or ``coarse_unc_ns`` (coarse), and withholds them otherwise
(docs/controller.md, "Clock trust"). That promise is only as good as the uncertainty: a NIC
whose every path is queued (a leaf with all uplinks congested) has no clean sample left, and
its offset can be microseconds off while the solve still states nanoseconds. `ClockCheck`
holds each observation of the live clock (``ClockSync.offsets(now)``: offset and uncertainty
per NIC, NaN where unknown) against the testbed's virtual clocks and counts, per labelled span
of the run:

* NIC-ticks by the tier the uncertainty put them in (fine, coarse, withheld, unknown), as the
  controller puts a clock (`controller.clocksync.ClockSync.trusted`): fine while it is
  certain to ``max_unc_ns / sqrt 2``, coarse to ``coarse_unc_ns / sqrt 2`` (a delay has two
  clocks, and its tier bounds their sum);
* **overconfident** ones: in a tier whose bound the true error exceeds (a delay would have
  been judged on a clock less certain than the tier says), the count the issue asks to be 0;
* the error of the trusted ones (p50 / p99 / max, `testbed.clockerr.node_errors`: known NICs,
  centred on their median, since no sync sees the common offset).

Pure: arrays in, a dict out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from testbed.clockerr import node_errors

F64 = npt.NDArray[np.float64]
TIERS = ("fine", "coarse", "withheld", "unknown")


@dataclass
class _Span:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    over: dict[str, int] = field(default_factory=lambda: {"fine": 0, "coarse": 0})
    errors: list[float] = field(default_factory=list)
    ticks: int = 0
    worst: float = 0.0  # the largest error of a trusted NIC-tick over its tier's bound


class ClockCheck:
    """Tally of the live clock's offsets and uncertainties against the truth.

    ``spans``: (label, start ns, end ns) of the run (an observation outside every span goes
    to ``"other"``); ``max_unc_ns`` and ``coarse_unc_ns`` are the controller's trust bounds.
    Raises ValueError if a bound is not > 0 or the coarse one is below the fine one."""

    def __init__(
        self, spans: Sequence[tuple[str, int, int]], max_unc_ns: float, coarse_unc_ns: float
    ) -> None:
        if not 0 < max_unc_ns <= coarse_unc_ns:
            raise ValueError("need 0 < max_unc_ns <= coarse_unc_ns")
        self.spans = tuple(spans)
        self.max_unc_ns, self.coarse_unc_ns = float(max_unc_ns), float(coarse_unc_ns)
        self._by: dict[str, _Span] = {}

    def _label(self, t_ns: int) -> str:
        for label, a, z in self.spans:
            if a <= t_ns < z:
                return label
        return "other"

    def observe(self, t_ns: int, offset_ns: F64, unc_ns: F64, truth_ns: F64) -> None:
        """Add one observation at ``t_ns``: per NIC the live offset and uncertainty (NaN:
        unknown; inf: unconfirmed) and the true offset (local - true). Raises ValueError on
        arrays of different lengths."""
        off, unc = np.asarray(offset_ns, np.float64), np.asarray(unc_ns, np.float64)
        if not len(off) == len(unc) == len(truth_ns):
            raise ValueError("offset, uncertainty and truth must have one entry per NIC")
        span = self._by.setdefault(self._label(t_ns), _Span())
        span.ticks += 1
        known = np.isfinite(off)
        err = node_errors(off, np.asarray(truth_ns, np.float64), known)
        per_clock = 1.0 / np.sqrt(2.0)
        with np.errstate(invalid="ignore"):
            fine = known & (unc <= self.max_unc_ns * per_clock)
            coarse = known & ~fine & (unc <= self.coarse_unc_ns * per_clock)
        span.counts["fine"] += int(fine.sum())
        span.counts["coarse"] += int(coarse.sum())
        span.counts["withheld"] += int((known & ~fine & ~coarse).sum())
        span.counts["unknown"] += int((~known).sum())
        span.over["fine"] += int((fine & (err > self.max_unc_ns)).sum())
        span.over["coarse"] += int((coarse & (err > self.coarse_unc_ns)).sum())
        span.errors.extend(float(x) for x in err[fine | coarse])
        ratio = np.concatenate([err[fine] / self.max_unc_ns, err[coarse] / self.coarse_unc_ns])
        if len(ratio):
            span.worst = max(span.worst, float(ratio.max()))

    def report(self) -> dict[str, dict[str, object]]:
        """Per span label: ``ticks``, NIC-ticks per tier (``fine``, ``coarse``, ``withheld``,
        ``unknown``), ``overconfident`` (fine ones off by more than ``max_unc_ns`` plus coarse
        ones off by more than ``coarse_unc_ns``: 0 is honest) split as ``overconfident_fine``
        and ``overconfident_coarse``, ``worst_over_bound`` (the largest error of a fine or
        coarse NIC-tick over its tier's bound: above 1 is overconfident), and
        ``trusted_error`` (p50_ns, p99_ns, max_ns of the fine and coarse NIC-ticks' errors;
        None when there are none)."""
        out: dict[str, dict[str, object]] = {}
        for label, s in self._by.items():
            e = np.asarray(s.errors)
            err = None if not e.size else {
                "p50_ns": round(float(np.percentile(e, 50)), 1),
                "p99_ns": round(float(np.percentile(e, 99)), 1),
                "max_ns": round(float(e.max()), 1),
            }  # fmt: skip
            out[label] = {
                "ticks": s.ticks,
                **s.counts,
                "overconfident": s.over["fine"] + s.over["coarse"],
                "overconfident_fine": s.over["fine"],
                "overconfident_coarse": s.over["coarse"],
                "worst_over_bound": round(s.worst, 3),
                "trusted_error": err,
            }
        return out
