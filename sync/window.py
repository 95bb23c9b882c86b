"""One sync window: round-trip probe records in, per-NIC clock offsets out.

`sync_window` is the whole Huygens pipeline over one window of probes, as the controller and
the benchmarks run it:

1. orient every probe onto the unordered edge (i < j) of its NIC pair, giving forward (i->j)
   and reverse (j->i) delay samples, both timed in clock *i* (t1 or t4, whichever is i's);
2. coded-probe filter per direction (pairs whose received spacing matches the sent spacing);
3. batched pair fits (`fit_pairs`): offset and drift of ``theta_ij = offset_j - offset_i``;
4. network effect (`solve_network`, mean-pinned), then a second pass that re-evaluates every
   edge at the same *reference* instant (edge fits are lines in clock i's time, which runs up
   to a millisecond apart from other clocks: at 60 ppm of relative drift that is tens of ns),
   and solves again;
5. second stage (``refine``, default on): every pair's slope fixed to the solved node drift
   difference; candidate offsets from the Huygens envelope (k = 1) of the coded-clean samples
   and from the mean of the lowest 5/10/25/50 % of all arrived samples per direction; the
   candidate whose loop-closure residuals (one unweighted L2 solve) have the smallest robust
   scale wins (ties: the envelope) and is solved with the Huber loss. The data choose k: idle
   hw fabrics pick ~10 %, load 0.9 and software stamps 25-50 % (see docs/sync.md).

Everything is pure: arrays in, a frozen `WindowSync` out; ``t_ref_ns`` is given, never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sync._arrays import as_int
from sync.batchfit import fit_pairs
from sync.coded import coded_probe_mask
from sync.network import ProbeGraph, solve_network
from sync.pairfit import PairFits
from sync.refine import floor_excess_std, lowest_key_means, lowest_means, refit_fixed_slope

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
# candidate envelope statistics of the second stage: mean of the lowest q of each direction
FRACTIONS = (0.05, 0.1, 0.25, 0.5)
# and the mean per-exchange offset of the lowest-RTT q of the exchanges (both directions at once)
RTT_FRACTIONS = (0.01, 0.02, 0.05, 0.1)


@dataclass(frozen=True)
class EdgeSamples:
    """Probes oriented onto unordered edges ``edges[k] = (i, j)``, i < j.

    Per probe: ``edge`` index, forward sample (time in clock i relative to t_ref, delay
    recv_j - send_i) and reverse sample (time in clock i, delay recv_i - send_j), each with
    a validity mask (arrived and passed the coded filter); ``arrived`` (None: all) marks probes
    whose reply came back, for the second stage that uses every arrived sample.
    """

    edges: I64
    edge: I64
    fwd_t: F64
    fwd_d: F64
    fwd_ok: NDArray[np.bool_]
    rev_t: F64
    rev_d: F64
    rev_ok: NDArray[np.bool_]
    arrived: NDArray[np.bool_] | None = None


_CHUNK = 1 << 20


@dataclass(frozen=True)
class WindowSync:
    """Result of one window: per-node offset (ns, relative to the mean of known nodes, at
    ``t_ref_ns`` on the reference timescale), drift, uncertainty, known mask; per edge the
    fits, the aligned theta and whether the network solve flagged it."""

    offset_ns: F64
    drift: F64
    offset_std_ns: F64
    known: NDArray[np.bool_]
    edges: I64
    fits: PairFits
    theta_ns: F64
    flagged: NDArray[np.bool_]
    estimator: str = "envelope-free-slope"
    closure_scale_ns: float = float("nan")
    drift_from: str = "envelope"  # which pair slopes the node drifts come from
    # NICs whose clocks stepped inside the window (`sync.steps`: left unknown) and when (ns
    # from the reference instant, in the exchanges' time axis)
    stepped: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    step_at_ns: F64 = field(default_factory=lambda: np.zeros(0))


def drift_std_per_node(ws: WindowSync, n_nodes: int) -> F64:
    """Return each node's drift uncertainty: the inverse-variance combination of the drift
    std of the fitted edges it is on (inf where it has none)."""
    fits = ws.fits
    good = fits.ok & np.isfinite(fits.drift_std)
    e = ws.edges[good]
    wd = 1.0 / np.maximum(fits.drift_std[good], 1e-12) ** 2
    wsum = np.bincount(e[:, 0], wd, n_nodes) + np.bincount(e[:, 1], wd, n_nodes)
    with np.errstate(divide="ignore"):
        out: F64 = np.sqrt(1.0 / wsum)
    return out


def orient_samples(
    src: ArrayLike,
    dst: ArrayLike,
    pair: ArrayLike,
    t1: ArrayLike,
    t2: ArrayLike,
    t3: ArrayLike,
    t4: ArrayLike,
    lost: ArrayLike,
    t_ref_ns: int,
    *,
    coded_tol_ns: int,
    min_coded: int = 8,
) -> EdgeSamples:
    """Orient round-trip probes onto unordered edges and apply the coded-probe filter.

    ``src``/``dst`` are node indices, ``pair`` coded-pair ids (-1: not coded, always kept),
    ``t1..t4`` int64 ns stamps (t1, t4 in src's clock; t2, t3 in dst's). Raises ValueError on
    mismatched lengths or a probe from a node to itself.
    """
    s = np.asarray(src, dtype=np.int64)
    n = len(s)
    d = np.asarray(dst, dtype=np.int64)
    if len(d) != n or np.any(s == d):
        raise ValueError("src and dst must have equal lengths and differ per probe")
    pid = as_int(pair, "pair", n)
    s1, s2, s3, s4 = (
        as_int(a, name, n) for a, name in ((t1, "t1"), (t2, "t2"), (t3, "t3"), (t4, "t4"))
    )
    arrived = ~np.asarray(lost, dtype=bool)
    if len(arrived) != n:
        raise ValueError("lost must have one entry per probe")
    forward = s < d  # probe initiated by i of edge (i, j), i < j
    big = int(max(s.max(initial=0), d.max(initial=0))) + 1
    key = np.where(forward, s, d) * big + np.where(forward, d, s)
    del s, d
    uniq, edge = np.unique(key, return_inverse=True)
    del key
    edges = np.stack([uniq // big, uniq % big], axis=1)

    coded = pid >= 0
    # coded filter per direction: message 1 (src->dst: t1 -> t2), message 2 (dst->src: t3 -> t4)
    ok1 = arrived & ~coded
    ok2 = arrived & ~coded
    if coded.all():  # the usual case: no gathered copies of the stamp columns
        ok1 = coded_probe_mask(pid, s1, s2, coded_tol_ns, arrived=arrived, keep="both")
        ok2 = coded_probe_mask(pid, s3, s4, coded_tol_ns, arrived=arrived, keep="both")
    elif coded.any():
        ci = np.flatnonzero(coded)
        ok1[ci] = coded_probe_mask(
            pid[ci], s1[ci], s2[ci], coded_tol_ns, arrived=arrived[ci], keep="both"
        )
        ok2[ci] = coded_probe_mask(
            pid[ci], s3[ci], s4[ci], coded_tol_ns, arrived=arrived[ci], keep="both"
        )
    del pid, coded
    # Where queueing is heavy few coded pairs keep their spacing: an edge direction with fewer
    # than ``min_coded`` clean samples falls back to every arrived sample (the envelope fit
    # still works on minima; the network solve flags what that lets through).
    if min_coded > 0:
        ok1, ok2 = _fallback(edge, forward, ok1, ok2, arrived, len(uniq), min_coded)
    # forward samples (i -> j): message 1 when src is i (timed by t1), else message 2 (sent by
    # dst = i, timed by t3); reverse samples (j -> i), timed in clock i: message 2 received by
    # src = i (t4), or message 1 received by dst = i (t2). Built in chunks: no n-sized temporaries.
    fwd_t, fwd_d, rev_t, rev_d = (np.empty(n) for _ in range(4))
    for a in range(0, n, _CHUNK):
        b = min(a + _CHUNK, n)
        f = forward[a:b]
        c1, c2, c3, c4 = s1[a:b], s2[a:b], s3[a:b], s4[a:b]
        fwd_t[a:b] = np.where(f, c1, c3) - t_ref_ns
        fwd_d[a:b] = np.where(f, c2 - c1, c4 - c3)
        rev_t[a:b] = np.where(f, c4, c2) - t_ref_ns
        rev_d[a:b] = np.where(f, c4 - c3, c2 - c1)
    fwd_ok = np.where(forward, ok1, ok2)
    rev_ok = np.where(forward, ok2, ok1)
    return EdgeSamples(edges, edge, fwd_t, fwd_d, fwd_ok, rev_t, rev_d, rev_ok, arrived)


def _fallback(
    edge: I64,
    forward: NDArray[np.bool_],
    ok1: NDArray[np.bool_],
    ok2: NDArray[np.bool_],
    arrived: NDArray[np.bool_],
    m: int,
    min_coded: int,
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Return (ok1, ok2) with every arrived sample re-enabled on thin edge directions."""
    fwd_ok = np.where(forward, ok1, ok2)
    rev_ok = np.where(forward, ok2, ok1)
    thin_f = np.bincount(edge[fwd_ok], minlength=m) < min_coded
    thin_r = np.bincount(edge[rev_ok], minlength=m) < min_coded
    fwd_ok = np.where(thin_f[edge], arrived, fwd_ok)
    rev_ok = np.where(thin_r[edge], arrived, rev_ok)
    return np.where(forward, fwd_ok, rev_ok), np.where(forward, rev_ok, fwd_ok)


def sync_window(
    n_nodes: int,
    samples: EdgeSamples,
    *,
    quant_ns: float = 0.0,
    min_samples: int = 3,
    ref: int = 0,
    refine: bool = True,
    fractions: tuple[float, ...] = FRACTIONS,
    bias_bound: bool = True,
) -> WindowSync:
    """Fit every edge of ``samples``, solve the network twice, then (``refine``) run the second
    stage with an automatic envelope statistic (see module docstring).

    ``bias_bound``: score candidates by loop-closure noise *and* half the queueing they keep
    (docs/sync.md), for hardware and kernel stamps alike: queueing that differs by direction
    through a congested link is node-like for the NICs behind it and loop closure cannot see
    it (without the bound, `sim sync --timestamps sw` at load 0.9 was 1,392 ns p99 against
    891 ns with it, and a live testbed run read a congested uplink as a NIC downlink).
    False scores by closure noise alone (for comparison).

    Nodes outside the largest connected part of usable edges come back ``known`` False with
    NaN estimates. Raises ValueError on malformed input.
    """
    m = len(samples.edges)
    fw, rv = samples.fwd_ok, samples.rev_ok
    fits = fit_pairs(
        m,
        samples.edge[fw],
        samples.fwd_t[fw],
        samples.fwd_d[fw],
        samples.edge[rv],
        samples.rev_t[rv],
        samples.rev_d[rv],
        min_samples=min_samples,
        quant_ns=quant_ns,
    )
    if not fits.ok.any():
        return empty_window(n_nodes, samples.edges, fits)
    out, r = first_stage(n_nodes, samples.edges, fits, ref)
    if not refine:
        return out
    return _second_stage(n_nodes, samples, out, r, fractions, bias_bound)


def first_stage(n_nodes: int, edges: I64, fits: PairFits, ref: int) -> tuple[WindowSync, int]:
    """Network solve of the pair fits, edges re-evaluated at the reference instant, solved
    again (module docstring, step 4). Returns the window and the reference node used.
    Requires at least one OK fit."""
    m = len(edges)
    ok = fits.ok
    e = edges[ok]
    theta0, drift = fits.offset_ns[ok], fits.drift[ok]
    std = np.maximum(fits.offset_std_ns[ok], 0.5)
    w = 1.0 / std**2
    r = pick_ref(e, ref)
    graph = ProbeGraph(n_nodes, e)  # both solves' edges
    # re-evaluate each edge line at the reference instant: clock i reads ~ t_ref + offset_i
    # then. Only that shift is read of this solve, and only times a pair's drift (oscillators
    # within 100 ppm: < 2e-4), so one round (no flags) to 1e-8 of the right-hand side does:
    # clocks a second apart shift by ~10 ns at most, theta by ~0.002 ns
    first = solve_network(
        n_nodes, e, theta0, w, pin="mean", ref=r, graph=graph, max_rounds=1, rtol=1e-8
    )  # fmt: skip
    shift = np.nan_to_num(first.offset_ns[e[:, 0]])
    theta = theta0 + drift * shift
    sol = solve_network(
        n_nodes, e, theta, w, drift=drift, pin="mean", ref=r, graph=graph, start=first.offset_ns
    )  # fmt: skip
    theta_all = np.full(m, np.nan)
    theta_all[ok] = theta
    flagged = np.zeros(m, dtype=bool)
    flagged[ok] = sol.flagged
    out = WindowSync(
        sol.offset_ns,
        sol.drift,
        sol.offset_std_ns,
        sol.known,
        edges,
        fits,
        theta_all,
        flagged,
    )
    return out, r


def empty_window(n_nodes: int, edges: I64, fits: PairFits) -> WindowSync:
    """The window when no pair could be fitted: every node unknown, NaN everywhere."""
    m = len(edges)
    nan = np.full(n_nodes, np.nan)
    return WindowSync(
        nan, nan.copy(), nan.copy(), np.zeros(n_nodes, bool), edges, fits,
        np.full(m, np.nan), np.zeros(m, bool),
    )  # fmt: skip


def _second_stage(
    n_nodes: int,
    samples: EdgeSamples,
    first: WindowSync,
    ref: int,
    fractions: tuple[float, ...],
    bias_bound: bool = True,
) -> WindowSync:
    """Fixed-slope refit with the first solve's node drifts, candidate envelope statistics
    scored by loop-closure residuals, Huber network solve of the winner."""
    fits, edges = first.fits, samples.edges
    m = len(edges)
    i, j = edges[:, 0], edges[:, 1]
    slope = first.drift[j] - first.drift[i]  # NaN where an endpoint is unknown
    shift = first.offset_ns[i]
    usable = fits.ok & np.isfinite(slope) & np.isfinite(shift)
    if not usable.any():
        return first
    slope = np.where(usable, slope, 0.0)
    # candidate 0: the Huygens envelope (k = 1) of the coded-clean samples
    fw, rv = samples.fwd_ok, samples.rev_ok
    env_off, env_floor = refit_fixed_slope(
        m,
        samples.edge[fw],
        samples.fwd_t[fw],
        samples.fwd_d[fw],
        samples.edge[rv],
        samples.rev_t[rv],
        samples.rev_d[rv],
        slope,
    )
    cands = [env_off]
    names = ["envelope"]
    # queueing each candidate keeps above the window's minimum, per edge: half of it bounds the
    # bias the candidate cannot rule out without assuming both directions queue alike (the
    # envelope keeps none: it is the floor itself)
    excess = [np.zeros(m)]
    # candidates 1..: mean of the lowest fraction of every arrived sample (no coded filter)
    arr = samples.arrived
    idx = samples.edge if arr is None else samples.edge[arr]
    tiny = (1e-12,)
    if fractions:
        lf = lowest_means(idx, _detrend(samples.fwd_t, samples.fwd_d, -slope, samples.edge, arr),
                          m, tiny + tuple(fractions))  # fmt: skip
        lr = lowest_means(idx, _detrend(samples.rev_t, samples.rev_d, slope, samples.edge, arr),
                          m, tiny + tuple(fractions))  # fmt: skip
        cands.extend(0.5 * (lf[1:] - lr[1:]))
        excess.extend((lf[1:] - lf[0]) + (lr[1:] - lr[0]))
        names.extend(f"lowest{q:g}" for q in fractions)
    if RTT_FRACTIONS:
        # per exchange: forward and reverse sample of the same probe, both detrended; the
        # lowest-RTT exchanges are the least queued in both directions at once
        xf = _detrend(samples.fwd_t, samples.fwd_d, -slope, samples.edge, arr)
        xr = _detrend(samples.rev_t, samples.rev_d, slope, samples.edge, arr)
        rtt = xf + xr
        lk = lowest_key_means(idx, rtt, 0.5 * (xf - xr), m, RTT_FRACTIONS)
        lr_rtt = lowest_means(idx, rtt, m, tiny + RTT_FRACTIONS)
        del xf, xr, rtt
        cands.extend(lk)
        excess.extend(lr_rtt[1:] - lr_rtt[0])
        names.extend(f"lowrtt{q:g}" for q in RTT_FRACTIONS)
    return choose_candidate(
        n_nodes, first, ref, usable, slope * shift, cands, excess, names, env_floor, bias_bound
    )


def choose_candidate(
    n_nodes: int,
    first: WindowSync,
    ref: int,
    usable: NDArray[np.bool_],
    shift_term: F64,
    cands: list[F64],
    excess: list[F64],
    names: list[str],
    env_floor: F64,
    bias_bound: bool,
) -> WindowSync:
    """Score candidate pair offsets (per edge, at t = 0 on clock i's axis; candidate 0 is the
    envelope with its floors ``env_floor``) by loop-closure noise and, with ``bias_bound``, half
    the median queueing ``excess`` they keep; solve the winner with the Huber loss. Edges not
    ``usable`` are left out; ``shift_term`` (slope x clock i's offset) moves each candidate to
    the reference instant. Returns ``first`` when no candidate is finite."""
    fits, edges = first.fits, first.edges
    m = len(edges)
    e = edges[usable]
    # score = loop-closure noise (what residuals around loops show) combined with the bias bound
    # (what they cannot show: queueing that differs by direction looks like a node offset).
    # A candidate's score is at least its bias: one whose bias reaches the best score so far
    # cannot win (a later one wins only when strictly lower) and needs no closure solve; one
    # equal to an earlier candidate on every edge has that one's closure scale (at fleet
    # sizes a few kept exchanges per edge make the lowest 1, 2 and 5 % the same exchange).
    best, best_score, best_scale, best_theta = -1, np.inf, np.inf, np.empty(0)
    solved: list[tuple[F64, float]] = []
    graph = ProbeGraph(n_nodes, e)  # every solve here is on these edges
    for c, off in enumerate(cands):
        th = (off + shift_term)[usable]
        if not np.isfinite(th).all():
            continue
        bias = 0.5 * float(np.nanmedian(excess[c][usable])) if c and bias_bound else 0.0
        if bias >= best_score:
            continue
        scale = next((sc for t, sc in solved if np.array_equal(t, th)), None)
        if scale is None:
            scale = closure_scale(n_nodes, e, th, ref, graph, first.offset_ns)
            solved.append((th, scale))
        score = float(np.hypot(scale, bias))
        if score < best_score:
            best, best_score, best_scale, best_theta = c, score, scale, th
    if best < 0:
        return first
    if best == 0:
        sd_env = floor_excess_std(
            n_nodes, e, env_floor[usable], np.maximum(fits.offset_std_ns[usable], 0.5)
        )
        w = 1.0 / np.maximum(sd_env, 0.5) ** 2
    else:  # same statistic on every edge: equal weights, scaled by the closure residuals
        w = np.full(len(e), 1.0 / max(best_scale, 0.5) ** 2)
    sol = solve_network(
        n_nodes, e, best_theta, w, pin="mean", ref=pick_ref(e, ref), loss="huber", graph=graph,
        start=first.offset_ns,
    )  # fmt: skip
    theta_all = np.full(m, np.nan)
    theta_all[usable] = best_theta
    flagged = np.zeros(m, dtype=bool)
    flagged[usable] = sol.flagged
    known = sol.known & first.known
    return WindowSync(
        np.where(known, sol.offset_ns, np.nan),
        np.where(known, first.drift, np.nan),
        np.where(known, sol.offset_std_ns, np.nan),
        known,
        edges,
        fits,
        theta_all,
        flagged,
        estimator=names[best],
        closure_scale_ns=float(best_scale),
    )


def _detrend(t: F64, d: F64, slope: F64, edge: I64, arrived: NDArray[np.bool_] | None) -> F64:
    """``d + slope[edge] t`` for the arrived samples (forward: pass ``-slope``)."""
    if arrived is None:
        return np.asarray(d + slope[edge] * t)
    return np.asarray(d[arrived] + slope[edge[arrived]] * t[arrived])


def closure_scale(
    n_nodes: int,
    edges: I64,
    theta: F64,
    ref: int,
    graph: ProbeGraph | None = None,
    start: F64 | None = None,
) -> float:
    """Robust scale (ns) of the loop-closure residuals of one unweighted L2 network solve:
    how inconsistent the pair estimates are around loops, i.e. how noisy they are (``graph``:
    the `sync.network.ProbeGraph` of ``edges``, when the caller has it; ``start``: offsets
    near the solution, as `sync.network.solve_network` takes them). Returns inf when the
    graph has no loops (nothing to compare)."""
    sol = solve_network(
        n_nodes, edges, theta, np.ones(len(edges)), pin="mean", ref=pick_ref(edges, ref),
        flag_min_ns=np.inf, max_rounds=1, graph=graph, start=start,
    )  # fmt: skip
    r = sol.residual_ns[np.isfinite(sol.residual_ns)]
    if r.size == 0:
        return float("inf")
    return float(1.4826 * np.median(np.abs(r)))


def pick_ref(edges: I64, ref: int) -> int:
    """Keep ``ref`` if it has a usable edge, else the best-connected node."""
    deg = np.bincount(edges.ravel())
    if ref < len(deg) and deg[ref] > 0:
        return ref
    return int(np.argmax(deg))
