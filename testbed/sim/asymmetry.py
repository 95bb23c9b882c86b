"""Constant directional asymmetry: cable lengths, per-egress-port switch latency, NIC TX/RX.

Two-way probes cannot see a constant difference between a path's two directions: it shifts
the estimated offset by half of it. `pair_asymmetry_ns` gives that half per probed pair so a
benchmark can report the bound it puts on any two-way sync.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric, NodeKind, hop_id
from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]


def hop_base_ns(
    fabric: Fabric,
    knobs: ModelKnobs,
    seed: int,
    switch_latency_ns: tuple[float, float],
    probe_bytes: int,
) -> F64:
    """Return the fixed delay of every directed hop: cable + serialization + egress port.

    Cable: one length per link U(cable_m) x ns_per_m (same both ways). Switch: one latency per
    tier U(switch_latency_ns) plus U(-port_spread_ns, +port_spread_ns) per egress port, so the
    two directions of a link leave different ports of different switches.
    """
    rng = np.random.default_rng([seed, 201])
    tier_lat = {kind: float(rng.uniform(*switch_latency_ns)) for kind in NodeKind}
    kinds = {n.id: n.kind for n in fabric.nodes}
    base = np.empty(fabric.n_hops)
    cable = rng.uniform(*knobs.cable_m, len(fabric.links)) * knobs.ns_per_m
    port = rng.uniform(-1.0, 1.0, fabric.n_hops) * knobs.port_spread_ns
    for lk in fabric.links:
        ser = probe_bytes * 8 / lk.capacity_bps * 1e9
        for d, leaving in ((0, lk.lower), (1, lk.upper)):
            kind = kinds.get(leaving, NodeKind.HOST)
            hop = hop_id(lk.index, bool(d))
            sw = 0.0 if kind == NodeKind.HOST else tier_lat[kind] + port[hop]
            base[hop] = cable[lk.index] + ser + sw
    return base


def nic_txrx_ns(n_nics: int, knobs: ModelKnobs, seed: int) -> tuple[F64, F64]:
    """Return per NIC the fixed TX and RX delays between the stamp point and the wire."""
    rng = np.random.default_rng([seed, 202])
    return (
        rng.uniform(0.0, knobs.nic_txrx_ns, n_nics),
        rng.uniform(0.0, knobs.nic_txrx_ns, n_nics),
    )


def path_fixed_ns(hops: npt.NDArray[np.int32], base: F64) -> F64:
    """Return the fixed delay of each path (…, H) padded with -1: the sum of its hops' bases."""
    valid = hops >= 0
    return np.asarray(np.where(valid, base[np.where(valid, hops, 0)], 0.0).sum(axis=-1))


def pair_asymmetry_ns(
    fwd: npt.NDArray[np.int32],
    rev: npt.NDArray[np.int32],
    base: F64,
    tx: F64,
    rx: F64,
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
) -> F64:
    """Return per probed pair half the constant forward-minus-reverse delay, averaged over the
    pair's swept paths (``fwd``/``rev`` shape (pairs, ports, H)): the offset bias of any
    estimator that assumes the two directions equal."""
    f = path_fixed_ns(fwd, base).mean(axis=1) + tx[src] + rx[dst]
    r = path_fixed_ns(rev, base).mean(axis=1) + tx[dst] + rx[src]
    return np.asarray((f - r) / 2.0, dtype=np.float64)
