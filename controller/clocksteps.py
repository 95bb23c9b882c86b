"""Clocks that moved since the last solve, seen in one batch's delays (pure).

Between two solves the controller turns stamps into one-way delays with the last solve's
clock models. When a NIC's clock steps (a host reboot, ptp4l / phc2sys stepping it), every
delay into it grows by the step and every delay out of it shrinks by it, and a detector
would read that as a queue on the NIC's link (a ±5 µs step raised a false ``contention``
0.2 s later, issue 34). The next solve finds the step (`sync.steps`); until then the batch
itself shows it.

Per probe, half the difference of its two one-way delays is the clock models' error for its
pair plus half the difference of its two directions' queueing, and that queueing part is at
most half the probe's round trip above its pair's remembered floor
(`controller.clockfloors`). On the probes within ``LOW_EXCESS_NS`` of their floor it is
small; over the probes a NIC sent (to its ~K peers: what the fleet worker owning the NIC's
host sees, however hosts are split among workers), it is that NIC's clock error against its
model
(`clock_errors`: the median over at least ``MIN_PROBES`` such probes, which the few pairs
whose floor a standing queue raised cannot move, and the share of them on its side,
``MOVE_AGREE`` at least for a move). A model
extrapolated from its solve drifts off slowly; a step moves the error between two batches: a NIC moved when its error changed by
more than ``MOVE_NS`` and ``MOVE_Z`` times its clock uncertainty since the last batch that
measured it (`moved`). A peer of a moved NIC shows it on one pair of its ~30 only, so its own
mean barely moves.

The probes into a moved NIC come from its peers' hosts: in a fleet, other workers than the
one that finds the move ingest them. Each of those probes shows the move itself (`off_probes`):
its half difference is its source's error (which its source's own probes measure) less its
destination's, give or take half its queueing (at most its excess over its pair's floor plus
``FLOOR_SLACK_NS``: a queue raises the round trip by what it adds to one direction, a clock
move shifts the two directions oppositely and leaves the round trip at its floor; the floor is
the lowest the pair has on an epoch's evidence, `queue_floor`, for `clock_errors` too); a
destination whose error that leaves beyond ``MOVE_NS`` (and ``MOVE_Z``
times its uncertainty) is off its model, and the probe's delays are not to be judged: a step
of a few µs is caught on the probes queued less than a few µs. Every input is the probe's own or its source's, so any
worker decides the same for it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
LOW_EXCESS_NS = 2_000.0  # probes this close to their floor are read
MOVE_NS = 500.0  # a NIC's error moved by more than this: its clock moved
MOVE_Z = 4.0  # ... and beyond this many times the NIC's clock uncertainty
MOVE_AGREE = 0.8  # ... with at least this share of its probes on that side
MIN_PROBES = 6
FLOOR_SLACK_NS = 2_000.0  # a probe's queueing may be this much more than its excess over its
# pair's floor (an epoch's fourth lowest round trip, above the unqueued one at high load): at
# 0 a 64-NIC live run at load 0.9 withheld 1.7 % more delays, at 2 µs 0.06 % (2 seeds, 30 s)


def clock_errors(
    n_nics: int, src: I64, owd_fwd: F64, owd_rev: F64, rtt: F64, floor: F64
) -> tuple[F64, F64]:
    """Per NIC its clock's error against its model in one batch (ns, + : ahead), from the
    probes near their pairs' floors (module docstring): the median of them, NaN where fewer
    than ``MIN_PROBES``; and the share of them on the mean's side (a moved clock puts nearly
    all on one side, and a peer's own trouble is one pair of a NIC's ~30). Raises ValueError
    on arrays of different lengths."""
    n = len(src)
    if not all(len(a) == n for a in (owd_fwd, owd_rev, rtt, floor)):
        raise ValueError("every column must have one entry per probe")
    out = np.full(n_nics, np.nan)
    excess = rtt - floor
    ok = np.isfinite(owd_fwd) & np.isfinite(owd_rev) & np.isfinite(excess)
    ok &= excess <= LOW_EXCESS_NS
    if not ok.any():
        return out, np.zeros(n_nics)
    node = np.asarray(src, np.int64)[ok]
    val = 0.5 * (owd_rev[ok] - owd_fwd[ok])  # + : src ahead of its model (or dst behind)
    cnt = np.bincount(node, minlength=n_nics)
    out = _medians(node, val, cnt)
    side = np.bincount(node, np.sign(val) == np.sign(out[node]), n_nics)
    enough = cnt >= MIN_PROBES
    return np.where(enough, out, np.nan), side / np.maximum(cnt, 1)


def _medians(node: I64, val: F64, cnt: I64) -> F64:
    """Per NIC the median of its values ``val`` (``cnt``: how many each has; NaN where
    none). A median, not a mean: a pair whose path queues one way for the floor's whole
    memory (a standing queue) has its floor raised by that queue, so its probes at the floor
    are tens of µs off; two such pairs of a NIC's ~30 moved its mean by over 1 µs between
    two batches (issue 34: 6 of 64 NICs read as moved with no clock step). One sort of the
    values keyed by NIC (numbered within the batch, so the key keeps ns precision)."""
    out = np.full(len(cnt), np.nan)
    has = cnt > 0
    if not has.any():
        return out
    local = np.cumsum(has) - 1  # NIC -> its number among those with values
    span = 2.0**32  # key = local NIC * span + value (clipped to a quarter span: a rank only)
    key = local[node] * span + np.clip(val, -span / 4, span / 4)
    srt = np.sort(key)
    c = cnt[has]
    start = np.cumsum(c) - c
    mid = 0.5 * (srt[start + (c - 1) // 2] + srt[start + c // 2])
    out[has] = mid - np.arange(len(c)) * span
    return out


def moved(err: F64, agree: F64, before: F64, unc: F64) -> NDArray[np.bool_]:
    """Which NICs' clocks moved since the batch that gave ``before`` (their errors then;
    NaN: not measured, nothing to compare): the error ``err`` changed by more than
    ``MOVE_NS`` and ``MOVE_Z`` times the NIC's clock uncertainty now ``unc``, with
    ``MOVE_AGREE`` of its probes on one side (``agree``, `clock_errors`). A model extrapolated from its solve drifts off
    slowly (its drift error times the distance: hundreds of ns over a window at load 0.9);
    a step moves it between two batches."""
    jump = np.abs(err - before)
    limit = np.maximum(MOVE_NS, MOVE_Z * np.where(np.isfinite(unc), unc, np.inf))
    return np.asarray((np.nan_to_num(jump, nan=0.0) > limit) & (agree >= MOVE_AGREE), dtype=bool)


def queue_floor(floor: F64, settled: F64) -> F64:
    """Per probe the round-trip floor its queueing is read against (by `clock_errors`,
    which probes are near it, and `off_probes`, how much queueing a probe may have): the
    lower of its pair's floor ``floor`` (`FloorMemory.floor`, the current epoch's included)
    and its settled floor ``settled`` (closed epochs only; NaN: none). A queue raises a
    round trip and a clock move does not, so a probe's queueing is its round trip above the
    pair's unqueued one, which a floor bounds from above only: the lowest floor on an
    epoch's evidence is the closest. With one closed epoch the memory's floor is the higher
    of that epoch's and the current one's, and the current epoch's fourth lowest of its first
    few round trips is a hot hop's queue, not a floor (load 0.7, 256 NICs, seed 1: 9-12 % of
    the probes of the second epoch's first 0.2 s withheld as clock moves, their clocks 114 ns
    off the truth at the median; 32 NICs: 3 NICs read as moved, none had). NaN where both
    are. Raises ValueError on arrays of different lengths."""
    if len(floor) != len(settled):
        raise ValueError("every column must have one entry per probe")
    return np.fmin(floor, settled)


def off_probes(
    err_src: F64, owd_fwd: F64, owd_rev: F64, excess: F64, unc_dst: F64
) -> NDArray[np.bool_]:
    """Per probe: its destination's clock is off its model (module docstring): the source's
    error ``err_src`` (`clock_errors`, NaN: not measured) less the probe's half difference
    of its delays leaves more than ``MOVE_NS`` and ``MOVE_Z`` times the destination's clock
    uncertainty ``unc_dst``, after half the probe's ``excess`` over its pair's floor
    (`queue_floor`) plus ``FLOOR_SLACK_NS``: its queueing may explain that much. A queue
    raises the round trip by what it adds to one direction, so it moves the half difference
    by at most half the excess; a clock move shifts the two directions oppositely and leaves
    the round trip where it was. A round trip under its floor (excess < 0) shows that floor
    above the unqueued one: the queueing is then at most ``FLOOR_SLACK_NS``, as at the
    floor. False where anything is NaN. Raises ValueError on arrays of different lengths."""
    n = len(err_src)
    if not all(len(a) == n for a in (owd_fwd, owd_rev, excess, unc_dst)):
        raise ValueError("every column must have one entry per probe")
    with np.errstate(invalid="ignore"):
        queue = np.maximum(excess, 0.0) + FLOOR_SLACK_NS
        left = np.abs(err_src - 0.5 * (owd_rev - owd_fwd)) - 0.5 * queue
        limit = np.maximum(MOVE_NS, MOVE_Z * np.where(np.isfinite(unc_dst), unc_dst, np.inf))
        return np.asarray(left > limit, dtype=bool)
