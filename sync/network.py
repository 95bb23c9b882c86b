"""Network effect: reconcile pair estimates on the probe graph by sparse weighted least squares.

Unknown node offsets x minimize ``sum_e w_e (x_j - x_i - theta_e)^2`` (same for drifts), so the
offsets around every loop agree. The normal equations are the weighted graph Laplacian; each
connected component is pinned (its reference node at 0, or its mean at 0) and the reduced SPD
system is solved by conjugate gradients preconditioned by small blocks (`_blocks`: nodes
tied by an edge that carries most of their weight, inverted exactly; the rest by their
diagonal). Probe graphs are expanders, so equal weights need a few dozen iterations; the
envelope's weights span ten decades, and with the diagonal alone a Huber round took 70-360
iterations (blocks: ~20-60). It stops on the residual with each row over its node's weight
(every node's rows count, the lightly tied ones too), and each component holds its most
weight-connected node during the solve when only the mean is pinned. Each round is
warm-started from the last reweighting round's.
The CG loop is our own, with BLAS-free inner products: OpenBLAS threads ``ddot`` above
10,000 elements, and on a busy machine those threaded calls stalled for milliseconds each
(10k-NIC solve 4-10 s -> < 0.5 s). Edges whose loop residual is large relative to their
uncertainty (asymmetric paths, bad data) are flagged, down-weighted and the system
re-solved. Solves on the same edges share one `ProbeGraph`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray
from scipy.sparse.csgraph import connected_components

from sync._arrays import as_edges, as_float

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
STRONG = 0.5  # an edge with this share of an endpoint's weight ties the two in one block
BLOCK_MAX = 32  # nodes a block may have (larger: each node keeps its diagonal)


@dataclass(frozen=True)
class NetworkSolution:
    """Per-node clock estimates relative to the reference node (or the mean).

    ``known`` marks nodes in the reference's component; other nodes have NaN offset/drift/std
    (they are solved against their own component's pin in ``component_offset_ns``).
    ``flagged`` marks edges whose loop residual exceeded the threshold (down-weighted);
    ``residual_ns`` is ``x_j - x_i - theta_ij`` for every edge after the final solve.
    """

    offset_ns: F64
    drift: F64
    offset_std_ns: F64
    known: BoolArray
    component: I64
    component_offset_ns: F64
    component_drift: F64
    flagged: BoolArray
    residual_ns: F64
    iterations: int


def _edge_sum(n: int, node: I64, v: F64) -> F64:
    """Sum of edge values ``v`` per endpoint ``node`` (length n)."""
    return np.bincount(node, weights=v, minlength=n).astype(np.float64)


class _Laplacian:
    """Weighted graph Laplacian ``D - A`` with the sparsity pattern built once per edge list
    and the weights swapped in per IRLS round (no re-assembly). Duplicate edges are fine."""

    def __init__(self, n: int, i: I64, j: I64) -> None:
        rows = np.concatenate([i, j])
        cols = np.concatenate([j, i])
        order = np.argsort(rows.astype(np.int32) if n < 2**31 else rows)  # a row in any order
        self.n, self.i, self.j = n, i, j
        self.edge_of = np.concatenate([np.arange(len(i)), np.arange(len(i))])[order]
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        self.adj = sp.csr_matrix(
            (np.zeros(len(rows)), cols[order], indptr), shape=(n, n)
        )  # entries are never summed: the matvec adds duplicates itself
        self.diag = np.zeros(n)
        self.w = np.zeros(len(i))

    def set_weights(self, w: F64) -> None:
        """Use edge weights ``w`` (length m) from now on."""
        self.w = w
        self.adj.data = w[self.edge_of]
        self.diag = _edge_sum(self.n, self.i, w) + _edge_sum(self.n, self.j, w)

    def matvec(self, x: F64) -> F64:
        """Return ``L x``."""
        return np.asarray(self.diag * x - self.adj @ x)


def _dot(a: F64, b: F64) -> float:
    """Inner product without BLAS: OpenBLAS threads ``ddot`` above 10,000 elements, and on a
    busy machine each threaded call can stall for milliseconds (measured 8 ms vs 19 us)."""
    return float(np.multiply(a, b).sum())


class _Precond:
    """A block-Jacobi preconditioner ``M^-1``: per node the inverse of its diagonal (0 for
    the nodes of a block and for the pinned ones), and for the block nodes ``nodes`` the
    inverses of their blocks (``mat``: a sparse matrix over their positions in ``nodes``)."""

    def __init__(self, diag: F64, nodes: I64, mat: sp.csr_matrix) -> None:
        self.diag, self.nodes, self.mat = diag, nodes, mat

    def __matmul__(self, r: F64) -> F64:
        """Return ``M^-1 r``."""
        z = self.diag * r
        if len(self.nodes):
            z[self.nodes] += self.mat @ r[self.nodes]
        return z

    def dense(self) -> F64:
        """``M^-1`` as a dense (n, n) array (small cases: tests)."""
        out = np.diag(self.diag)
        out[np.ix_(self.nodes, self.nodes)] += self.mat.toarray()
        return out


def _blocks(lap: _Laplacian, free: BoolArray) -> _Precond:
    """The block-Jacobi preconditioner of the free nodes: nodes joined by a strong edge (one
    that carries at least `STRONG` of an endpoint's weight) form a block, whose rows of ``L``
    restricted to its strong edges are inverted exactly; the other nodes (and those of a
    block over `BLOCK_MAX` nodes) keep their diagonal. Jacobi alone leaves a block of
    strongly tied nodes a mode of its own that is barely coupled to the rest (a tiny
    eigenvalue: hundreds of iterations when the weights span decades, as the envelope's
    per-edge uncertainties do); inverting the block takes that mode out."""
    n, i, j, w, d = lap.n, lap.i, lap.j, lap.w, lap.diag
    inv = np.zeros(n)
    inv[free] = 1.0 / np.maximum(d[free], 1e-300)
    none = _Precond(inv, np.zeros(0, np.int64), sp.csr_matrix((0, 0)))
    share = STRONG * d
    strong = np.flatnonzero((w >= share[i]) | (w >= share[j]))  # few: the rest is one pass
    strong = strong[free[i[strong]] & free[j[strong]]]
    if not len(strong):
        return none
    si, sj, sw = i[strong], j[strong], w[strong]
    graph = sp.coo_matrix((np.ones(len(si)), (si, sj)), shape=(n, n))
    lab = connected_components(graph, directed=False)[1].astype(np.int64)
    size = np.bincount(lab)
    inside = (size[lab] >= 2) & (size[lab] <= BLOCK_MAX)
    if not inside.any():
        return none
    keep = inside[si]  # both ends share a label: the edge joined them
    si, sj, sw = si[keep], sj[keep], sw[keep]
    nodes = np.flatnonzero(inside)
    nodes = nodes[np.argsort(lab[nodes], kind="stable")]  # block by block
    first = np.searchsorted(lab[nodes], lab[nodes])  # where each node's block starts
    at = np.zeros(n, np.int64)
    at[nodes] = np.arange(len(nodes))
    pos = np.zeros(n, np.int64)
    pos[nodes] = at[nodes] - first
    rows, cols, vals = [], [], []
    for s in np.unique(size[lab[nodes]]):
        mine = nodes[size[lab[nodes]] == s]  # whole blocks of s nodes, block by block
        k = len(mine) // s
        block = np.full(n, -1, np.int64)
        block[mine] = np.arange(len(mine)) // s
        mat = np.zeros((k, s, s))
        mat[block[mine], pos[mine], pos[mine]] = d[mine]
        e = block[si] >= 0
        b, pu, pv = block[si[e]], pos[si[e]], pos[sj[e]]
        np.add.at(mat, (b, pu, pv), -sw[e])
        np.add.at(mat, (b, pv, pu), -sw[e])
        grid = at[mine].reshape(k, s)
        rows.append(np.repeat(grid, s, axis=1).ravel())
        cols.append(np.tile(grid, (1, s)).ravel())
        vals.append(np.linalg.inv(mat).ravel())
    inv[nodes] = 0.0
    nb = len(nodes)
    mat_all = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(nb, nb)
    )
    return _Precond(inv, nodes, mat_all)


def _pcg(lap: _Laplacian, b: F64, free: BoolArray, x0: F64, rtol: float) -> tuple[F64, int]:
    """Block-Jacobi-preconditioned CG (`_blocks`) on the free nodes (others held at 0),
    warm-started at ``x0``, until the residual is under ``rtol`` of ``b``'s, each row read
    over its node's weight (``|D^-1/2 r| <= rtol |D^-1/2 b|``: the rows of nodes with light
    edges only count as much as the others; on the plain residual they were left tens of
    ns off). Returns the solution and the iteration count. Raises RuntimeError if it does
    not converge."""
    prec = _blocks(lap, free)
    x = np.where(free, x0, 0.0)
    r = np.where(free, b - lap.matvec(x), 0.0)
    sc = np.where(free, 1.0 / np.maximum(lap.diag, 1e-300), 0.0)  # rows on equal terms
    stop = rtol * np.sqrt(_dot(b * sc, b))
    if np.sqrt(_dot(r * sc, r)) <= stop:
        return x, 0
    z = prec @ r
    p = z.copy()
    rz = _dot(r, z)
    max_iter = 10 * int(free.sum()) + 10
    for it in range(1, max_iter + 1):
        q = lap.matvec(p)
        q[~free] = 0.0
        alpha = rz / _dot(p, q)
        x += alpha * p
        r -= alpha * q
        if np.sqrt(_dot(r * sc, r)) <= stop:
            return x, it
        z = prec @ r
        rz_new = _dot(r, z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    raise RuntimeError(f"CG did not converge in {max_iter} iterations")


def _solve(
    lap: _Laplacian,
    rhs: F64,
    free: BoolArray,
    pin_mean: bool,
    comp: I64,
    rtol: float,
    x0: F64 | None = None,
) -> F64:
    """Solve lap x = rhs with the non-free nodes (one per component) held at 0, then shift
    each component to zero mean if ``pin_mean``. ``x0`` (same pinning convention, before the
    mean shift) warm-starts CG."""
    x = np.zeros(lap.n)
    if free.any():
        scale = float(np.max(np.abs(rhs[free]))) or 1.0
        start = np.zeros(lap.n) if x0 is None else x0 / scale
        sol, _ = _pcg(lap, np.where(free, rhs, 0.0) / scale, free, start, rtol)
        x = sol * scale
    if pin_mean:
        sums = np.bincount(comp, weights=x)
        x = x - (sums / np.bincount(comp))[comp]
    return x


def _flag(
    n: int,
    i: I64,
    j: I64,
    resid: F64,
    z: F64,
    sw0: F64,
    flagged: BoolArray,
    flag_sigma: float,
    flag_min_ns: float,
) -> BoolArray:
    """Edges over threshold that were flagged already, plus new over-threshold edges whose
    normalized residual ``z`` (``|resid| * sw0``, ``sw0`` the root of the edge weights) is
    the largest among the over-threshold edges at both endpoints (a bad edge drags its
    neighbours' residuals up too; only the culprit is flagged per round)."""
    scale = 1.4826 * float(np.median(z[~flagged])) if (~flagged).any() else 0.0
    over = np.abs(resid) > np.maximum(flag_min_ns, flag_sigma * scale / sw0)
    cand = over & ~flagged
    if not cand.any():
        return np.asarray(flagged & over)
    zc = np.where(cand, z, 0.0)
    node_max = np.zeros(n)
    np.maximum.at(node_max, i, zc)
    np.maximum.at(node_max, j, zc)
    local = cand & (zc >= node_max[i]) & (zc >= node_max[j])
    return np.asarray((flagged & over) | local)


def _held(comp: I64, ref: int, deg: F64 | None) -> I64:
    """Per component the node CG holds at 0: ``ref`` in its own and the lowest node in the
    others; with ``deg`` (each node's summed weight; ``pin="mean"``, where any node will do)
    the most weight-connected node of each. A node tied by light edges only makes "all the
    others move together" a mode of its own, barely coupled: its offset was ~1 ns off."""
    n = len(comp)
    if deg is not None:
        order = np.lexsort((-deg, comp))
        return order[np.flatnonzero(np.r_[True, comp[order][1:] != comp[order][:-1]])]
    first = np.full(int(comp.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, comp, np.arange(n))
    first[comp[ref]] = ref
    return first


class ProbeGraph:
    """One edge list's structure for several solves on it (`solve_network`'s ``graph``):
    the endpoint arrays, the connected components and the Laplacian's sparsity pattern,
    built once (at 100,000 NICs each build sorts 3.2 M entries: ~0.2 s). The weights are
    each solve's own. Raises ValueError on malformed edges (as `solve_network`)."""

    def __init__(self, n_nodes: int, edges: ArrayLike) -> None:
        i, j = as_edges(edges, n_nodes)
        if np.any(i == j):
            raise ValueError("self-loop edges are not allowed")
        self.n, self.i, self.j = n_nodes, i, j
        adj = sp.coo_matrix((np.ones(len(i)), (i, j)), shape=(n_nodes, n_nodes))
        self.component = connected_components(adj, directed=False)[1].astype(np.int64)
        self.lap = _Laplacian(n_nodes, i, j)

    def same_edges(self, n_nodes: int, edges: ArrayLike) -> bool:
        """Whether ``edges`` over ``n_nodes`` nodes are the ones this graph was built on."""
        e = np.asarray(edges)
        return bool(
            n_nodes == self.n and e.shape == (len(self.i), 2)
            and np.array_equal(e[:, 0], self.i) and np.array_equal(e[:, 1], self.j)
        )  # fmt: skip


def solve_network(
    n_nodes: int,
    edges: ArrayLike,
    theta_ns: ArrayLike,
    weight: ArrayLike,
    *,
    drift: ArrayLike | None = None,
    drift_weight: ArrayLike | None = None,
    ref: int = 0,
    pin: Literal["ref", "mean"] = "ref",
    loss: Literal["l2", "huber"] = "l2",
    huber_k: float = 1.5,
    flag_sigma: float = 5.0,
    flag_min_ns: float = 20.0,
    downweight: float = 1e-4,
    max_rounds: int = 10,
    rtol: float = 1e-10,
    start: ArrayLike | None = None,
    graph: ProbeGraph | None = None,
) -> NetworkSolution:
    """Weighted least-squares node offsets (and drifts) from pair estimates.

    ``edges`` is (m, 2) int with ``theta_ns[e]`` = offset of ``edges[e, 1]`` minus offset of
    ``edges[e, 0]`` and ``weight[e] = 1 / variance`` (> 0). ``drift`` (optional) holds the same
    difference for drifts, weighted by ``drift_weight`` (default: ``weight``). ``pin="ref"``
    holds ``ref`` (and the lowest node of every other component) at 0; ``pin="mean"`` gives
    every component zero mean. After each solve, an edge is flagged when
    ``|residual| > max(flag_min_ns, flag_sigma * robust_sigma * std_e)`` where ``std_e`` is
    ``1/sqrt(w_e)`` and robust_sigma the MAD scale of the normalized residuals; per round only
    edges that are the worst at both endpoints are newly flagged. Flagged edges get
    ``downweight`` times their weight and the solve repeats until the flags settle (at most
    ``max_rounds`` solves; ``iterations`` reports how many). ``loss="huber"`` also reweights
    every edge by ``min(1, huber_k * robust_sigma / |z_e|)`` each round (IRLS), until the
    offsets move by < 0.01 ns: many moderately bad pairs (loaded fabrics) then weigh less.
    Node offset std is the effective-resistance approximation ``sqrt(1/W_i + 1/W_pin)``
    (W = summed incident weight). Each solve iterates until its residual is under ``rtol``
    of the right-hand side's. ``start`` (per node, any pin; NaN read as 0) starts the
    first solve's iterations there instead of at 0: the same solution to the solver's
    tolerance, in fewer iterations when it is close (the last stage's offsets). ``graph``:
    the `ProbeGraph` of these same ``edges`` (checked), built once for several solves.
    Raises ValueError on malformed input.
    """
    if graph is None:
        graph = ProbeGraph(n_nodes, edges)
    elif not graph.same_edges(n_nodes, edges):
        raise ValueError("graph was built on other edges")
    i, j = graph.i, graph.j
    m = len(i)
    th = as_float(theta_ns, "theta_ns", m)
    w0 = as_float(weight, "weight", m)
    if not (np.isfinite(th).all() and np.isfinite(w0).all() and (w0 > 0).all()):
        raise ValueError("theta_ns must be finite and weight finite and > 0")
    if not 0 <= ref < n_nodes:
        raise ValueError(f"ref must be in [0, {n_nodes})")
    if pin not in ("ref", "mean"):
        raise ValueError(f"pin must be 'ref' or 'mean', got {pin!r}")
    if loss not in ("l2", "huber") or not huber_k > 0:
        raise ValueError(f"loss must be 'l2' or 'huber' and huber_k > 0, got {loss!r}, {huber_k}")
    dr = None if drift is None else as_float(drift, "drift", m)
    dw = w0 if drift_weight is None else as_float(drift_weight, "drift_weight", m)
    if dr is not None and not (np.isfinite(dr).all() and (dw > 0).all()):
        raise ValueError("drift must be finite and drift_weight > 0")

    comp = graph.component
    free = np.ones(n_nodes, dtype=bool)
    pin_mean = pin == "mean"
    deg = _edge_sum(n_nodes, i, w0) + _edge_sum(n_nodes, j, w0) if pin_mean else None
    first = _held(comp, ref, deg)
    free[first] = False

    w = w0.copy()
    sw0 = np.sqrt(w0)
    flagged = np.zeros(m, dtype=bool)
    rounds = 0
    x_prev: F64 | None = None
    lap = graph.lap
    pinned = first[comp]
    guess = None if start is None else np.nan_to_num(as_float(start, "start", n_nodes))
    while True:
        rounds += 1
        lap.set_weights(w)
        rhs = _edge_sum(n_nodes, j, w * th) - _edge_sum(n_nodes, i, w * th)
        from_x = guess if x_prev is None else x_prev
        warm = None if from_x is None else from_x - from_x[pinned]  # back to pinned-at-0
        x = _solve(lap, rhs, free, pin_mean, comp, rtol, warm)
        resid = x[j] - x[i] - th
        z = np.abs(resid) * sw0
        new = _flag(n_nodes, i, j, resid, z, sw0, flagged, flag_sigma, flag_min_ns)
        settled = np.array_equal(new, flagged)
        factor = np.ones(m)
        if loss == "huber":
            scale = 1.4826 * float(np.median(z[~new])) if (~new).any() else 0.0
            factor = np.minimum(1.0, huber_k * scale / np.maximum(z, 1e-300))
            settled = settled and x_prev is not None and np.max(np.abs(x - x_prev)) < 0.01
        if settled or rounds >= max_rounds:
            flagged = new
            break
        flagged, x_prev = new, x
        w = w0 * factor * np.where(flagged, downweight, 1.0)

    xd = np.zeros(n_nodes)
    if dr is not None:
        wd = np.where(flagged, dw * downweight, dw)
        rhs_d = _edge_sum(n_nodes, j, wd * dr) - _edge_sum(n_nodes, i, wd * dr)
        lap.set_weights(wd)
        xd = _solve(lap, rhs_d, free, pin_mean, comp, rtol)
    else:
        xd[:] = np.nan

    wsum = _edge_sum(n_nodes, i, w) + _edge_sum(n_nodes, j, w)
    with np.errstate(divide="ignore"):
        inv = 1.0 / wsum
    if pin_mean:
        var = inv
    else:
        var = inv + inv[first[comp]]
        var[~free] = 0.0
    known = comp == comp[ref]
    nan = np.full(n_nodes, np.nan)
    return NetworkSolution(
        offset_ns=np.where(known, x, nan),
        drift=np.where(known, xd, nan),
        offset_std_ns=np.where(known, np.sqrt(var), nan),
        known=known,
        component=comp.copy(),
        component_offset_ns=x,
        component_drift=xd,
        flagged=flagged,
        residual_ns=resid,
        iterations=rounds,
    )
