"""Coded-probe filter (Huygens): keep a probe pair only if it arrived with its sent spacing.

Probes go out in pairs a known spacing apart. If both arrive and the received spacing matches the
sent spacing within a tolerance, neither probe met queueing or a stamp glitch the other did not,
so both most likely sit on the delay floor. All stamps are int64 ns; spacings are differences
of stamps in the same clock, so they are exact in int64.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sync._arrays import as_int

BoolArray = NDArray[np.bool_]


def coded_pair_mask(
    send_first: ArrayLike,
    send_second: ArrayLike,
    recv_first: ArrayLike,
    recv_second: ArrayLike,
    tol_ns: int,
    *,
    arrived_first: ArrayLike | None = None,
    arrived_second: ArrayLike | None = None,
) -> BoolArray:
    """Mask over pairs: both arrived, sent spacing > 0 and
    ``|(recv_second - recv_first) - (send_second - send_first)| <= tol_ns``.

    Stamps are int64 ns (send in the sender clock, recv in the receiver clock). ``arrived_*``
    default to all True; recv stamps of probes that did not arrive are ignored. Raises
    ValueError on mismatched lengths, non-integer stamps or a negative tolerance.
    """
    if tol_ns < 0:
        raise ValueError(f"tol_ns must be >= 0, got {tol_ns}")
    s1 = as_int(send_first, "send_first")
    n = len(s1)
    s2 = as_int(send_second, "send_second", n)
    r1 = as_int(recv_first, "recv_first", n)
    r2 = as_int(recv_second, "recv_second", n)
    a1 = _arrived(arrived_first, "arrived_first", n)
    a2 = _arrived(arrived_second, "arrived_second", n)
    sent = s2 - s1
    both = a1 & a2
    err = np.abs(np.where(both, r2 - r1, 0) - sent)
    return np.asarray(both & (sent > 0) & (err <= tol_ns))


def _arrived(a: ArrayLike | None, name: str, n: int) -> BoolArray:
    if a is None:
        return np.ones(n, dtype=bool)
    arr = np.asarray(a)
    if arr.dtype != np.bool_ or arr.shape != (n,):
        raise ValueError(f"{name} must be a bool array of length {n}")
    return arr


def coded_probe_mask(
    pair_id: ArrayLike,
    send_ns: ArrayLike,
    recv_ns: ArrayLike,
    tol_ns: int,
    *,
    arrived: ArrayLike | None = None,
    keep: Literal["first", "both"] = "first",
) -> BoolArray:
    """Mask over probes: True for probes of a coded pair that passes ``coded_pair_mask``.

    ``pair_id`` groups probes (any int labels, any order); a group must hold exactly two
    probes, ordered by send stamp, or it is dropped. ``keep="first"`` marks only the earlier
    probe of each passing pair (independent samples), ``"both"`` marks both. Raises ValueError
    on mismatched lengths or an unknown ``keep``.
    """
    if keep not in ("first", "both"):
        raise ValueError(f"keep must be 'first' or 'both', got {keep!r}")
    pid = as_int(pair_id, "pair_id")
    n = len(pid)
    send = as_int(send_ns, "send_ns", n)
    recv = as_int(recv_ns, "recv_ns", n)
    arr = _arrived(arrived, "arrived", n)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    # by pair id (stable: a pair's probes come adjacent, so this sort is nearly free), then
    # the two of each pair by send stamp, the earlier row first where they tie: as
    # ``np.lexsort((send, pid))`` orders them
    order = np.argsort(pid, kind="stable")
    sp = pid[order]
    start = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    count = np.diff(np.r_[start, n])
    a, b = order[start[count == 2]], order[start[count == 2] + 1]
    swap = send[b] < send[a]
    first, second = np.where(swap, b, a), np.where(swap, a, b)
    ok = coded_pair_mask(
        send[first],
        send[second],
        recv[first],
        recv[second],
        tol_ns,
        arrived_first=arr[first],
        arrived_second=arr[second],
    )
    out[first[ok]] = True
    if keep == "both":
        out[second[ok]] = True
    return out
