"""The detection tests' probe mesh: a 16-NIC fabric (4 leaves x 4 hosts, 4 spines) where every
NIC probes every other on four source ports, with each probe's forward and reply hops from the
fabric model (shared by the brain's detection tests)."""

from __future__ import annotations

import numpy as np

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
