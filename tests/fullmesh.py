"""The detection tests' probe mesh: a 16-NIC fabric (4 leaves x 4 hosts, 4 spines) where every
NIC probes every other on four source ports, with each probe's forward and reply hops from the
fabric model (shared by the brain's detection tests)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from controller.observations import Observations
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths

FAB = build_fabric(FabricShape(leaves=4, hosts_per_leaf=4, spines=4))
WIN = 100_000_000  # one detection window, ns
N = len(FAB.nics)
_S, _D = (a.ravel() for a in np.meshgrid(np.arange(N), np.arange(N), indexing="ij"))
_KEEP = _S != _D
SRC = np.repeat(_S[_KEEP], 4)
DST = np.repeat(_D[_KEEP], 4)
SPORT = np.tile(np.array([49152, 50000, 51234, 60001]), int(_KEEP.sum()))
FWD = flow_paths(FAB, SRC, DST, SPORT)
REV = flow_paths(FAB, DST, SRC, ROCEV2_PORT, SPORT)


def mesh_window(
    k: int,
    rng: np.random.Generator,
    owd_fwd: NDArray[np.float64],
    owd_rev: NDArray[np.float64],
    **columns: NDArray[np.bool_],
) -> Observations:
    """Return window ``k`` of the full mesh: every probe sent at a random time in it, none
    lost, with the given one-way delays (rtt their sum) and any optional boolean column of
    `Observations` (``coarse``, ``sw``) given by name."""
    n = len(SRC)
    return Observations(
        (k * WIN + rng.integers(0, WIN, n)).astype(np.int64),
        SRC.astype(np.int32),
        DST.astype(np.int32),
        SPORT.astype(np.int32),
        FWD,
        REV,
        np.zeros(n, dtype=bool),
        owd_fwd,
        owd_rev,
        owd_fwd + owd_rev,
        **columns,
    )
