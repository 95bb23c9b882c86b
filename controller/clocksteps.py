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
small; oriented towards each NIC (+ where the NIC received the probe, - where it sent it)
and pooled over the NIC's peers, it is that NIC's clock error against its model
(`clock_errors`: the median over at least ``MIN_PROBES`` such probes from ``MIN_PEERS``
peers, ``MOVE_AGREE`` of them on its side). A model extrapolated from its solve drifts off
slowly; a step moves the error between two batches: a NIC moved when its error changed by
more than ``MOVE_NS`` and ``MOVE_Z`` times its clock uncertainty since the last batch that
measured it (`moved`). A peer of a moved NIC shows it on one pair only, so its own median
does not move.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
LOW_EXCESS_NS = 2_000.0  # probes this close to their floor are read
MOVE_NS = 500.0  # a NIC's median error beyond this: its clock moved
MOVE_Z = 4.0  # ... and beyond this many times the NIC's clock uncertainty
MOVE_AGREE = 0.8  # ... with at least this share of its probes on that side
MIN_PROBES = 6
MIN_PEERS = 3


def clock_errors(
    n_nics: int, src: I64, dst: I64, owd_fwd: F64, owd_rev: F64, rtt: F64, floor: F64
) -> tuple[F64, F64]:
    """Per NIC its clock's error against its model in one batch (ns, + : ahead), from the
    probes near their pairs' floors (module docstring): the median over them, NaN where fewer
    than ``MIN_PROBES`` from ``MIN_PEERS`` peers; and the share of them on the median's side
    (a moved clock puts nearly all on one side). Raises ValueError on arrays of different
    lengths."""
    n = len(src)
    if not all(len(a) == n for a in (dst, owd_fwd, owd_rev, rtt, floor)):
        raise ValueError("every column must have one entry per probe")
    out = np.full(n_nics, np.nan)
    excess = rtt - floor
    ok = np.isfinite(owd_fwd) & np.isfinite(owd_rev) & np.isfinite(excess)
    ok &= excess <= LOW_EXCESS_NS
    if not ok.any():
        return out, np.zeros(n_nics)
    s, d = np.asarray(src, np.int64)[ok], np.asarray(dst, np.int64)[ok]
    r = 0.5 * (owd_fwd[ok] - owd_rev[ok])  # + : dst ahead of its model (or src behind)
    node = np.concatenate([d, s])
    peer = np.concatenate([s, d])
    val = np.concatenate([r, -r])
    cnt = np.bincount(node, minlength=n_nics)
    order = np.lexsort((val, node))
    vv = val[order]
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    has = cnt > 0
    out[has] = 0.5 * (vv[start[has] + (cnt[has] - 1) // 2] + vv[start[has] + cnt[has] // 2])
    peers = _distinct(n_nics, node, peer, np.ones(len(node), bool))
    side = np.bincount(node, np.sign(val) == np.sign(np.nan_to_num(out[node])), n_nics)
    enough = (cnt >= MIN_PROBES) & (peers >= MIN_PEERS)
    return np.where(enough, out, np.nan), side / np.maximum(cnt, 1)


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


def _distinct(n_nics: int, node: I64, peer: I64, sel: NDArray[np.bool_]) -> I64:
    """Per NIC how many distinct peers the selected probes come from."""
    if not sel.any():
        return np.zeros(n_nics, np.int64)
    keys = np.unique(node[sel] * n_nics + peer[sel])
    return np.bincount(keys // n_nics, minlength=n_nics).astype(np.int64)
