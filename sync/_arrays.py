"""Input validation helpers shared by the sync modules (1-D arrays, lengths, index ranges)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def as_float(a: ArrayLike, name: str, n: int | None = None) -> NDArray[np.float64]:
    """Return ``a`` as a 1-D float64 array; raise ValueError if not 1-D or not length ``n``."""
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has length {arr.shape[0]}, expected {n}")
    return arr


def as_int(a: ArrayLike, name: str, n: int | None = None) -> NDArray[np.int64]:
    """Return ``a`` as a 1-D int64 array; raise ValueError if not 1-D, not integral or wrong length."""
    raw = np.asarray(a)
    if raw.size and not np.issubdtype(raw.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {raw.dtype}")
    arr = raw.astype(np.int64, copy=False)  # read-only use everywhere: no copy of big columns
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has length {arr.shape[0]}, expected {n}")
    return arr


def as_index(a: ArrayLike, name: str, size: int, n: int | None = None) -> NDArray[np.int64]:
    """Like ``as_int`` and also require every value in ``[0, size)``."""
    arr = as_int(a, name, n)
    if arr.size and (arr.min() < 0 or arr.max() >= size):
        raise ValueError(f"{name} values must lie in [0, {size})")
    return arr


def as_edges(edges: ArrayLike, n_nodes: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Endpoint arrays (i, j) of an (m, 2) edge list with nodes in ``[0, n_nodes)``; raise
    ValueError on another shape or an out-of-range node."""
    e = np.asarray(edges)
    if e.ndim != 2 or e.shape[1:] != (2,):
        raise ValueError(f"edges must have shape (m, 2), got {e.shape}")
    return as_index(e[:, 0], "edges[:, 0]", n_nodes), as_index(e[:, 1], "edges[:, 1]", n_nodes)
