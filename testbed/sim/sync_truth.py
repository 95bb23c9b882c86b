"""What is left of the clock-sync error, measured against the simulator's truth
(``qpmesh sim sync --truth-breakdown``).

Two questions the estimator cannot answer from its data, and the simulator can:

* **node-like vs loop part.** Each pair offset the network solve gets has an error; split it
  into a part of the form ``b_j - b_i`` (a node offset: loop closure cannot see it, the
  network solve keeps it) and the rest (what loops see and the solve averages away). Least
  squares over the edges gives ``b``; the rest is the residual.
* **what a perfect reading of every direction would reach.** Each pair offset the solve got,
  less half the difference of its two directions' true best-sample queueing, solved again with
  equal weights (``perfect_direction_p99_ns``): what is left is the constant asymmetry and the
  fits' noise. With that queueing's *expectation* (`mean_queueing` over luck draws) instead
  (``expected_direction_p99_ns``), the luck of each direction's best sample is left in: no
  reading of a window's samples knows more than that expectation (docs/sync.md, "CQE stamps:
  what is observable"), so this is the bound on any correction of the best samples'
  queueing, per NIC or per direction.
* **what a perfect receive-side correction would reach.** Per direction the best sample's
  true queueing (the envelope's excess), averaged per NIC over its incoming directions, is the
  quantity `sync.excess.receive_excess` estimates from the data; subtracting half of the true
  value instead of the estimate gives the error that is left when that estimate is perfect.
  The same true per-direction queueing through the leaf split (`sync.excess.split_sides`)
  is what the estimator with leaves would reach with perfect per-direction readings.

Pure except for reading a simulator step's truth arrays; nothing here feeds the estimator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sync import solve_network
from sync.excess import direction_ends, split_sides
from testbed.clockerr import node_errors
from testbed.sim.engine import SimStep, Simulator

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
_CHUNK = 1 << 18  # probes per chunk when summing fixed delays (bounds the temporaries)


class BestQueueing:
    """Per edge direction (group ``2 e + dir``, 0: i -> j for ``edges[e] = (i, j)``, i < j)
    the smallest true queueing of any arrived probe, accumulated step by step."""

    def __init__(self, edges: I64, n_nodes: int) -> None:
        self.edges, self.n_nodes = edges, n_nodes
        self._keys = edges[:, 0] * n_nodes + edges[:, 1]
        self.best = np.full(2 * len(edges), np.inf)

    def observe(self, sim: Simulator, st: SimStep) -> None:
        """Fold one step's probes in (forward and reverse samples). Raises ValueError on a
        probe of a pair outside ``edges``."""
        src, dst = np.asarray(st.batch.src, np.int64), np.asarray(st.batch.dst, np.int64)
        for lo in range(0, len(src), _CHUNK):
            sl = slice(lo, lo + _CHUNK)
            self._fold(sim, src[sl], dst[sl], st.true_fwd_ns[sl], st.hops_fwd[sl])
            self._fold(sim, dst[sl], src[sl], st.true_rev_ns[sl], st.hops_rev[sl])

    def _fold(self, sim: Simulator, a: I64, b: I64, owd: F64, hops: I32) -> None:
        """Samples from ``a`` to ``b`` with true one-way delay ``owd`` (NaN: lost)."""
        ok = np.isfinite(owd)
        a, b = a[ok], b[ok]
        key = np.minimum(a, b) * self.n_nodes + np.maximum(a, b)
        e = np.searchsorted(self._keys, key)
        last = len(self._keys) - 1
        if np.any(e > last) or np.any(self._keys[np.minimum(e, last)] != key):
            raise ValueError("a probe's pair is not among the window's edges")
        q = owd[ok] - sim.fixed_delay_ns(hops[ok], a, b)
        np.minimum.at(self.best, 2 * e + (a > b), q)

    def directions(self) -> tuple[I64, I64, F64]:
        """(sender, receiver, best sample's true queueing ns) of every direction with an
        arrived sample: the truth `sync.excess.direction_excess` estimates."""
        g = np.flatnonzero(np.isfinite(self.best))
        return (*direction_ends(self.edges, g), self.best[g])

    def receive_mean(self) -> F64:
        """Per NIC the mean over its incoming directions of their best sample's queueing (ns;
        NaN for a NIC with none)."""
        _, node, best = self.directions()
        cnt = np.bincount(node, minlength=self.n_nodes)
        tot = np.bincount(node, best, self.n_nodes)
        mean = tot / np.maximum(cnt, 1)
        return np.where(cnt > 0, np.maximum(mean, 0.0), np.nan)  # >= 0 but for rounding

    def through_split(self, leaf: I64) -> F64:
        """Per NIC the true best-sample queueing through the estimator's split
        (`sync.excess.split_sides`): receive part minus the NIC's send part (its leaf's, plus
        its own share where the data show one), what the estimator with leaves subtracts half
        of. Raises ValueError as `split_sides`."""
        recv, send, _ = split_sides(self.n_nodes, *self.directions(), leaf)
        return recv - send


def mean_queueing(draws: Sequence[BestQueueing]) -> BestQueueing:
    """Per direction the mean over ``draws`` (the same window simulated with other per-probe
    luck, same edges) of the best sample's true queueing, over the draws where it arrived:
    the *expected* best-sample queueing (up to the draws' own spread), which is what a reading
    of the direction's scale can at best give. Raises ValueError on no draws or draws of
    different edges."""
    if not draws:
        raise ValueError("no draws")
    first = draws[0]
    if any(not np.array_equal(d.edges, first.edges) for d in draws):
        raise ValueError("draws of different edges")
    b = np.stack([d.best for d in draws])
    ok = np.isfinite(b)
    cnt = ok.sum(axis=0)
    out = BestQueueing(first.edges, first.n_nodes)
    out.best = np.where(cnt > 0, np.where(ok, b, 0.0).sum(axis=0) / np.maximum(cnt, 1), np.inf)
    return out


def _p99(x: F64) -> float:
    x = x[np.isfinite(x)]
    return round(float(np.percentile(x, 99)), 2) if x.size else float("nan")


def _direction_p99(n_nodes: int, edges: I64, theta_ns: F64, truth: F64, q: BestQueueing) -> float:
    """Node p99 error of the pair offsets ``theta_ns`` (j minus i for ``edges[e] = (i, j)``)
    less half the difference of their two directions' queueing in ``q`` (a direction's best
    sample is late by it, so ``theta`` is high by half of ``q(i -> j) - q(j -> i)``), solved
    with equal weights (Huber, mean pinned); pairs with a direction ``q`` lacks are left out.
    Raises ValueError when ``q`` has other edges."""
    if not np.array_equal(q.edges, edges):
        raise ValueError("queueing of other edges")
    th = theta_ns - 0.5 * (q.best[0::2] - q.best[1::2])
    fin = np.isfinite(th)
    sol = solve_network(
        n_nodes, edges[fin], th[fin], np.ones(int(fin.sum())), pin="mean", loss="huber"
    )  # fmt: skip
    return _p99(node_errors(np.where(sol.known, sol.offset_ns, np.nan), truth))


def breakdown(
    n_nodes: int,
    edges: I64,
    theta_ns: F64,
    raw_offset_ns: F64,
    truth: F64,
    rx_true: F64,
    split_true: F64 | None = None,
    split_expected: F64 | None = None,
    best: BestQueueing | None = None,
    expected: BestQueueing | None = None,
) -> dict[str, Any]:
    """The report's ``truth_breakdown``: from the pair offsets the final solve got
    (``theta_ns``, offset of j minus offset of i at the reference instant, before any
    receive-side correction) their error against ``truth``, split into the node-like part
    (p99 over NICs of ``|b - mean b|``) and the loop part (robust scale and p99 of the
    residual per edge); and the node p99 error of ``raw_offset_ns`` (the same solve's node
    offsets, uncorrected) corrected by half of the true per-NIC receive excess ``rx_true``,
    and, given ``split_true`` (the true per-direction queueing through the estimator's leaf
    split, `sync.excess.split_sides`: receive part minus the NIC's send part), by half
    of that (``perfect_split_p99_ns``); given ``split_expected`` (the same from the
    directions' *expected* best-sample queueing, `mean_queueing`: the luck of each window's
    best samples left in), ``expected_split_p99_ns``, what a perfect reading of each
    direction's scale would reach. Given ``best`` / ``expected`` (per direction the true best
    sample's queueing / its expectation, on the same ``edges``), ``perfect_direction_p99_ns``
    / ``expected_direction_p99_ns``: ``theta_ns`` corrected pair by pair (`_direction_p99`).
    Raises ValueError when ``best`` or ``expected`` has other edges."""
    fin = np.isfinite(theta_ns)
    e = edges[fin]
    err = theta_ns[fin] - (truth[e[:, 1]] - truth[e[:, 0]])
    sol = solve_network(
        n_nodes, e, err, np.ones(len(e)), pin="mean", loss="huber", flag_min_ns=np.inf
    )  # fmt: skip
    b = np.where(sol.known, sol.offset_ns, np.nan)
    b = np.abs(b - np.nanmean(b))
    res = sol.residual_ns[np.isfinite(sol.residual_ns)]
    loop_scale = float(1.4826 * np.median(np.abs(res))) if res.size else float("nan")

    def corrected_p99(excess: F64) -> float:  # the raw offsets less half of a true excess
        return _p99(node_errors(raw_offset_ns - 0.5 * np.nan_to_num(excess), truth))

    extra: dict[str, Any] = {}
    if split_true is not None:
        extra["perfect_split_p99_ns"] = corrected_p99(split_true)
    if split_expected is not None:
        extra["expected_split_p99_ns"] = corrected_p99(split_expected)
    if best is not None:
        extra["perfect_direction_p99_ns"] = _direction_p99(n_nodes, edges, theta_ns, truth, best)
    if expected is not None:
        extra["expected_direction_p99_ns"] = _direction_p99(
            n_nodes, edges, theta_ns, truth, expected
        )
    return {
        "edge_error_p99_ns": _p99(np.abs(err)),
        "node_like_p99_ns": _p99(b),
        "loop_scale_ns": round(loop_scale, 2),
        "loop_p99_ns": _p99(np.abs(res)),
        "uncorrected_p99_ns": _p99(node_errors(raw_offset_ns, truth)),
        "rx_true_p99_ns": _p99(rx_true),
        "perfect_rx_p99_ns": corrected_p99(rx_true),
        **extra,
    }
