"""ECMP hashing the controller does not know (pure, seeded).

Real switches hash with their own functions and seeds. For a fraction ``ecmp_mismatch`` of
flows (pair, source port) the real path differs from the controller's hash model
(`mesh.fabric.ecmp.flow_paths`): the simulator routes them with a salted hash. The
controller discovers a fraction ``discovered`` of those (TTL probes); for the rest it keeps the
model's path, which is then wrong.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths
from testbed.sim.model import ModelKnobs

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
SALT = 0x5A5A


def mismatched(n: int, knobs: ModelKnobs, seed: int) -> npt.NDArray[np.bool_]:
    """Return which of ``n`` flows the switches hash otherwise than the controller's model
    (the draw `true_and_seen_paths` makes)."""
    if knobs.ecmp_mismatch <= 0:
        return np.zeros(n, dtype=bool)
    return np.asarray(np.random.default_rng([seed, 601]).random(n) < knobs.ecmp_mismatch)


def true_and_seen_paths(
    fabric: Fabric, src: I64, dst: I64, sport: I64, knobs: ModelKnobs, seed: int
) -> tuple[I32, I32, I32, I32]:
    """Return (true fwd, true rev, controller's fwd, controller's rev) hops per flow (n, H)."""
    fwd = flow_paths(fabric, src, dst, sport)
    rev = flow_paths(fabric, dst, src, ROCEV2_PORT, sport)
    if knobs.ecmp_mismatch <= 0:
        return fwd, rev, fwd, rev
    rng = np.random.default_rng([seed, 601])
    n = len(src)
    mis = rng.random(n) < knobs.ecmp_mismatch
    disc = rng.random(n) < knobs.discovered
    tf, tr = fwd.copy(), rev.copy()
    if mis.any():
        sp = sport[mis] ^ SALT
        tf[mis] = flow_paths(fabric, src[mis], dst[mis], sp)
        tr[mis] = flow_paths(fabric, dst[mis], src[mis], ROCEV2_PORT ^ SALT, sp)
    seen_f = np.where((mis & disc)[:, None], tf, fwd)
    seen_r = np.where((mis & disc)[:, None], tr, rev)
    return tf, tr, seen_f.astype(np.int32), seen_r.astype(np.int32)
