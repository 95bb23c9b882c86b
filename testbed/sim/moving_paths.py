"""The simulator's paths over time: where switches send each flow now (ECMP re-hash around
down links) and which path the controller holds for it (discovered at the start, or traced
since by the probers' sweep). The state behind `Simulator.step`'s paths; the models are in
`testbed.sim.reroute_model` and `testbed.sim.ecmp_model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from testbed.scenario import Fault
from testbed.sim.ecmp_model import mismatched
from testbed.sim.reroute_model import PathSweep, Rerouter, Router, outages

if TYPE_CHECKING:
    from testbed.sim.engine import Simulator

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


class MovingPaths:
    """Re-hash and discovery for one simulator (realistic model; inert in the ideal one)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        k = sim.config.model
        self.on = sim.real and k.rehash
        self._router = (
            Router(sim.fabric, k.reroute_local_ms / 1e3, k.reroute_remote_ms / 1e3)
            if self.on
            else None
        )
        self._switch_link = np.array(
            [lk.lower not in sim.fabric.nic_index for lk in sim.fabric.links]
        )

    @cached_property
    def _mismatched(self) -> B:
        """Per (pair, port slot): whether the switches hash the flow salted (`ecmp_model`)."""
        n_pairs, k = self.sim.ports.shape
        return mismatched(n_pairs * k, self.sim.config.model, self.sim.config.seed).reshape(
            n_pairs, k
        )

    @cached_property
    def _sweep(self) -> PathSweep:
        k = self.sim.ports.shape[1]
        src = np.repeat(self.sim.pairs_src, k)
        return PathSweep(src, self.sim.config.model.traces_per_s, self.sim.config.seed)

    def reroutes(self, link: int) -> bool:
        """Return True if a down ``link``'s flows are re-routed (`route`), not simply lost."""
        return self.on and bool(self._switch_link[link])

    def route(
        self,
        active: Sequence[Fault],
        t_s: F64,
        pidx: I64,
        slot: I64,
        hops_f: I32,
        hops_r: I32,
    ) -> tuple[I32, I32, B]:
        """Return the probes' (pairs ``pidx``, port slots ``slot``, sent at ``t_s``) forward
        and reply hops as the switches route them with the ``active`` faults, and which were
        lost to a down switch link (NIC links and the ideal model: see the caller)."""
        lost = np.zeros(len(t_s), dtype=bool)
        if self._router is None:
            return hops_f, hops_r, lost
        outs = outages(self.sim.fabric, list(active))
        if not outs:
            return hops_f, hops_r, lost
        sim = self.sim
        return Rerouter(self._router, outs).apply(
            t_s,
            sim.pairs_src[pidx],
            sim.pairs_dst[pidx],
            sim.ports[pidx, slot],
            self._mismatched[pidx, slot],
            hops_f,
            hops_r,
        )

    def known(self, pidx: I64, slot: I64) -> tuple[I32, I32]:
        """Return the forward and reply hops the controller holds for probes of (pair, slot)."""
        _, _, sf, sr = self.sim._all_paths
        return sf[pidx, slot], sr[pidx, slot]

    def discover(self, t0_s: float, t1_s: float) -> tuple[I64, I64, I64, I32, I32] | None:
        """Trace the flows whose turn in the probers' sweep falls in [t0_s, t1_s): the
        controller's paths for them become their paths at ``t0_s``. Return the traces that
        changed a path (src, dst, sport, forward hops, reply hops), or None."""
        due = self._sweep.due(t0_s, t1_s)
        if not len(due):
            return None
        sim = self.sim
        k = sim.ports.shape[1]
        pidx, slot = due // k, due % k
        a, b, sf, sr = sim._all_paths
        fwd, rev = a[pidx, slot], b[pidx, slot]
        if self._router is not None:
            active = [f for f in sim.faults if f.start_s <= t0_s < f.end_s]
            fwd, rev, _ = self.route(active, np.full(len(due), t0_s), pidx, slot, fwd, rev)
        changed = (fwd != sf[pidx, slot]).any(axis=1) | (rev != sr[pidx, slot]).any(axis=1)
        if not changed.any():
            return None
        if sf is a or sr is b:  # no wrong paths at the start: the view shares the truth's arrays
            sf, sr = sf.copy(), sr.copy()
            sim._all_paths = (a, b, sf, sr)
        pidx, slot = pidx[changed], slot[changed]
        sf[pidx, slot], sr[pidx, slot] = fwd[changed], rev[changed]
        return (
            sim.pairs_src[pidx],
            sim.pairs_dst[pidx],
            sim.ports[pidx, slot].astype(np.int64),
            fwd[changed],
            rev[changed],
        )
