"""Utilisation per directed hop and over time: constant per-direction spread, moving hot spots,
incast bursts on leaf->host hops, overflow loss at high utilisation (pure, seeded).

Directed hop ``hop_id(link.index, False)`` leaves the link's lower node, ``hop_id(.., True)`` its upper
node (the convention of `testbed.sim.engine`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric, NodeKind, hop_id
from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]
RHO_MAX = 0.98


class UtilisationModel:
    """Utilisation of every directed hop at a time; hot spots and incasts drawn per time slot."""

    def __init__(self, fabric: Fabric, load: float, knobs: ModelKnobs, seed: int) -> None:
        self.knobs, self.seed, self.load = knobs, seed, load
        rng = np.random.default_rng([seed, 101])
        s = knobs.util_spread
        self.base: F64 = np.clip(load + rng.uniform(-s, s, fabric.n_hops), 0.0, RHO_MAX)
        kinds = {n.id: n.kind for n in fabric.nodes}
        down = np.zeros(fabric.n_hops, dtype=bool)
        up = np.zeros(fabric.n_hops, dtype=bool)
        for lk in fabric.links:
            if kinds.get(lk.lower) == NodeKind.HOST or lk.lower not in kinds:
                down[hop_id(lk.index, True)] = True  # leaf -> host (or NIC)
                up[hop_id(lk.index, False)] = True  # the NIC's own transmit queue
        self.leaf_to_host: B = down
        self.nic_egress: B = up

    def hot(self, t_s: float) -> B:
        """Return the mask of directed hops hot at ``t_s`` (redrawn every hotspot period)."""
        k = self.knobs
        if k.hotspot_frac <= 0:
            return np.zeros(len(self.base), dtype=bool)
        epoch = max(0, int(np.floor(t_s / k.hotspot_period_s)))
        rng = np.random.default_rng([self.seed, 102, epoch])
        return np.asarray(rng.random(len(self.base)) < k.hotspot_frac)

    def utilisation(self, t_s: float) -> F64:
        """Return the utilisation of every directed hop at ``t_s`` (before faults)."""
        rho = self.base + np.where(self.hot(t_s), self.knobs.hotspot_util, 0.0)
        return np.asarray(np.minimum(rho, RHO_MAX), dtype=np.float64)

    def incast(self, t0_s: float) -> B:
        """Return the leaf->host hops with an incast burst in the step starting at ``t0_s``."""
        k = self.knobs
        if k.incast_prob <= 0:
            return np.zeros(len(self.base), dtype=bool)
        rng = np.random.default_rng([self.seed, 103, max(0, round(t0_s * 1000))])
        return self.leaf_to_host & (rng.random(len(self.base)) < k.incast_prob)

    def overflow_loss(self, rho: F64) -> F64:
        """Return the per-traversal buffer-overflow loss of each hop at utilisation ``rho``:
        switch egress buffers only. A NIC's transmit queue is in its host: a full one stops
        the sender (socket or queue-pair back-pressure), it does not drop on the wire."""
        k = self.knobs
        x = np.clip((rho - k.overflow_rho) / (1.0 - k.overflow_rho), 0.0, 1.0)
        return np.asarray(np.where(self.nic_egress, 0.0, k.overflow_loss * x * x), np.float64)


def redistribution(fabric: Fabric, down_links: list[int], rho: F64) -> F64:
    """Return the utilisation added to each directed hop when ``down_links`` carry nothing.

    A down link's utilisation (both directions) moves evenly to its siblings
    (`Fabric.sibling_links`: the links with the same lower switch whose upper node is of the
    same tier; ECMP re-hashes onto them).
    """
    extra = np.zeros(len(rho))
    for li in down_links:
        sib = fabric.sibling_links[li]
        if not sib:
            continue
        for d in (0, 1):
            extra[[hop_id(s, bool(d)) for s in sib]] += rho[hop_id(li, bool(d))] / len(sib)
    return extra
