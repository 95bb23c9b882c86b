"""Contention from queue estimates pooled over windows: a standing queue near the threshold.

`controller.detect.queues.QueueEstimate.contended` decides one window at a time: a hop is over
when its median queue less ``z`` standard errors is over its class's threshold, and the health
machine raises ``contention`` after ``raise_windows`` such windows in a row. A queue just over
the threshold (a true median 1.0-1.15x it, ~190 delays a hop a window at 1,024 NICs: standard
error 160-250 ns) clears that margin in a few windows only, and rarely twice running, however
long it stands. Its evidence adds up over windows, so this module pools it.

**The pooled test.** Per hop and window, ``d = queue - threshold`` with standard error ``s``
(the estimate's). The *pool* of a hop is the windows since its last *reset* (below), at most
``max_windows`` of them, each read by one estimate only (an estimate that read ``span``
windows, `controller.brain.Brain._estimate_queues` on a small fabric, pools with the estimate
``span`` windows before it, never with one that shares its delays). Its inverse-variance
weighted mean and that mean's standard error are::

    D = sum(d_i / s_i^2) / sum(1 / s_i^2),    S = sum(1 / s_i^2) ** -0.5

and the hop is over when the pool holds at least two windows and ``D - z S > 0``. The
decision of a window is this test *or* the one-window test (`QueueEstimate.contended`), so a
strong queue is found as before and a marginal one once the pooled ``S`` has shrunk under its
margin over ``z`` (``S = s / sqrt(k)`` over ``k`` windows: a queue 150 ns over with ``s`` =
200 ns is over in ~20 windows, 2 s).

**Its false-alarm rate.** The null is "the hop's queue is at or under its threshold"; its
worst case is a queue exactly at it (under it every rate below falls). There, if the
per-window estimates are unbiased, normal with the stated standard errors and independent
across the windows they read (the reason for the span rule), ``D / S`` is standard normal
whatever ``k``, so one window's pooled test is a false "over" with probability ``Phi(-z)``.
The pool's length depends only on resets, which are decided on windows the pool no longer
holds or (the ``z``-truncation below) change its windows' law by a negligible
``phi(z) / Phi(z)`` of a standard error. With ``z`` = 3.29 that is 5.0e-4, the rate at which
today's rule raises at the threshold: two one-window tests at ``z1`` = 2 in a row,
``Phi(-2)^2`` = 5.2e-4. A raise needs over in two windows running, which is either two
one-window tests (``Phi(-z1)^2``), or the pooled test now (``Phi(-z)``), or the pooled test
in the last window and the one-window test now (independent windows:
``Phi(-z) Phi(-z1)``). So per hop and window at the threshold::

    P(false raise) <= Phi(-z1)^2 + Phi(-z) (1 + Phi(-z1))   = 1.03e-3 for z1 = 2, z = 3.29

at most twice today's bound, on hops whose queue sits at the threshold only: a hop one
pooled standard error under it is over with ``Phi(-z - 1)`` = 9e-6 a window.

**Resets: a queue that is gone is not held up.** A hop's pool is emptied by a window that
is *conclusively under* the threshold (``d + z s < 0``: that window is left out too, so a
queue that starts after a quiet spell is not averaged with it), by a window whose
``d`` is *significantly under the pool before it* (``D_old - d > z sqrt(S_old^2 + s^2)``:
the queue fell; the pool restarts at that window) and by a window with no estimate (too few
delays) or whose estimate does not place the hop's queue on it
(`controller.detect.queues.QueueEstimate.placed`). A queue that vanishes (or falls well
under the threshold) therefore resets its pool in the first window that shows it and the
hop is decided by the one-window test alone from then on: it clears after the health
machine's ``clear_windows`` as it always did. A queue that falls to just under the threshold
is held only while the pooled evidence still says over, and never longer than
``max_windows``. Under a standing queue at the threshold a window
resets with probability about ``Phi(-z)``: the truncation that makes is the negligible one
above.

Pure: the state is the last ``max_windows`` windows' ``d`` and weights per hop; values in,
hop numbers out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.detect.queues import QueueEstimate

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PooledParams:
    """See the module docstring. ``z``: standard errors by which the pooled mean must clear
    the threshold, and by which a window must be under the threshold or under its pool to
    reset it; ``max_windows``: windows a pool covers at most (0: no pooling, the one-window
    test alone)."""

    z: float = 3.29
    max_windows: int = 30

    def __post_init__(self) -> None:
        if self.z <= 0 or self.max_windows < 0:
            raise ValueError("z must be > 0 and max_windows >= 0")


@dataclass(frozen=True, slots=True)
class _Entry:
    """One window's evidence: ``d`` (queue less threshold, ns; 0 where unmeasured), weight
    ``w`` = 1 / s^2 (0: not in any pool), ``cut``: hops whose pool ends at this window (the
    windows before it are not pooled with it or later ones), ``span``: windows the
    estimate read."""

    d: F64
    w: F64
    cut: B
    span: int


class PooledContention:
    """Per hop, the pooled test of the module docstring over the windows it is given. One
    instance per brain; `contended` once per judged window, in order."""

    def __init__(self, params: PooledParams | None = None) -> None:
        self.params = params or PooledParams()
        self._entries: deque[_Entry] = deque()  # newest last; one per window given

    def _pool(self, n_hops: int, start_back: int) -> tuple[F64, F64, I64]:
        """Return per hop the pool's sum of weights, of weighted ``d`` and its window count,
        walking the entries from ``start_back`` windows before the newest (0: the newest)
        back along the span chain."""
        ws, wd, k = np.zeros(n_hops), np.zeros(n_hops), np.zeros(n_hops, np.int64)
        alive = np.ones(n_hops, np.bool_)
        back, covered = start_back, start_back
        n = len(self._entries)
        while back < n and covered < self.params.max_windows:
            e = self._entries[n - 1 - back]
            if len(e.d) != n_hops:
                break  # the fabric changed size: older evidence does not apply
            on = alive & (e.w > 0)
            ws += np.where(on, e.w, 0.0)
            wd += np.where(on, e.w * e.d, 0.0)
            k += on
            alive &= ~e.cut
            if not alive.any():
                break
            back += e.span
            covered += e.span
        return ws, wd, k

    def contended(self, est: QueueEstimate, span: int = 1) -> I64:
        """Fold the window's estimate ``est`` (which read ``span`` detection windows) in and
        return the hops contended in it: `QueueEstimate.contended` (the one-window test) and
        the hops whose pool is over (the module docstring), sorted, unique."""
        one = est.contended()
        p = self.params
        if p.max_windows < 1:
            return one
        n = len(est.queue_ns)
        span = max(1, span)
        d = np.asarray(est.queue_ns - est.threshold_ns, np.float64)
        s = np.asarray(est.stderr_ns, np.float64)
        ok = np.isfinite(d) & np.isfinite(s) & (s > 0) & est.placed()
        s_ok = np.where(ok, s, 1.0)
        d0 = np.where(ok, d, 0.0)
        # the pool before this window: the estimate ``span`` windows back and its chain
        ws, wd, _ = self._pool(n, span - 1)
        has_old = ws > 0
        d_old = np.divide(wd, ws, out=np.zeros(n), where=has_old)
        var_old = np.divide(1.0, ws, out=np.zeros(n), where=has_old)
        under = ok & (d0 + p.z * s_ok < 0)  # conclusively under the threshold: left out too
        fell = ok & has_old & (d_old - d0 > p.z * np.sqrt(var_old + s_ok**2))
        w = np.where(ok & ~under, 1.0 / s_ok**2, 0.0)
        self._entries.append(_Entry(d0, w, ~ok | under | fell, span))
        while len(self._entries) > p.max_windows:
            self._entries.popleft()
        ws, wd, k = self._pool(n, 0)
        pooled = (k >= 2) & (ws > 0)
        mean = np.divide(wd, ws, out=np.zeros(n), where=pooled)
        se = np.divide(1.0, np.sqrt(ws), out=np.zeros(n), where=pooled)
        over = np.flatnonzero(pooled & (mean - p.z * se > 0))
        return np.union1d(one, over).astype(np.int64)
