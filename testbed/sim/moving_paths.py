"""The simulator's paths over time: where switches send each flow now (ECMP re-hash around
down links) and which path the controller holds for it (discovered at the start, or traced
since by the probers' sweep). `MovingPaths` owns the path arrays behind `Simulator.step`'s
paths and answers the engine's questions about them; the models are in
`testbed.sim.reroute_model` and `testbed.sim.ecmp_model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths
from testbed.scenario import Fault
from testbed.sim.ecmp_model import mismatched, true_and_seen_paths
from testbed.sim.model import ModelKnobs
from testbed.sim.reroute_model import PathSweep, Rerouter, Router, outages

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


class MovingPaths:
    """The paths of one simulator's probed flows, per (pair, port slot): the true ones, the
    controller's view of them, re-hash around down links (realistic model; inert in the ideal
    one) and discovery by the probers' sweep."""

    def __init__(
        self,
        fabric: Fabric,
        knobs: ModelKnobs,
        seed: int,
        pairs_src: I64,
        pairs_dst: I64,
        ports: I64,
    ) -> None:
        """Paths of the directed pairs (``pairs_src``, ``pairs_dst``) over their source
        ``ports`` (pairs, port slots); ``knobs.ideal``: the model's hash, known to the
        controller, no re-hash."""
        self.fabric = fabric
        self.knobs = knobs
        self.seed = seed
        self.pairs_src = pairs_src
        self.pairs_dst = pairs_dst
        self.ports = ports
        self.real = not knobs.ideal
        self.on = self.real and knobs.rehash
        self._router = (
            Router(fabric, knobs.reroute_local_ms / 1e3, knobs.reroute_remote_ms / 1e3)
            if self.on
            else None
        )
        self._switch_link = np.array([lk.lower not in fabric.nic_index for lk in fabric.links])

    @cached_property
    def _arrays(self) -> tuple[I32, I32, I32, I32]:
        """True fwd/rev and the controller's fwd/rev hops per (pair, port slot): (pairs, ports,
        H). The controller's pair is the truth's own arrays until discovery changes one."""
        n_pairs, k = self.ports.shape
        src = np.repeat(self.pairs_src, k)
        dst = np.repeat(self.pairs_dst, k)
        sp = self.ports.ravel().astype(np.int64)
        if self.real:
            out = true_and_seen_paths(self.fabric, src, dst, sp, self.knobs, self.seed)
        else:
            fwd = flow_paths(self.fabric, src, dst, sp)
            rev = flow_paths(self.fabric, dst, src, ROCEV2_PORT, sp)
            out = (fwd, rev, fwd, rev)
        a, b, c, d = (x.reshape(n_pairs, k, -1) for x in out)
        return a, b, c, d

    @property
    def truth(self) -> tuple[I32, I32]:
        """Return the true forward and reverse hops per (pair, port slot), before any re-hash:
        shape (pairs, ports, H), -1 padding."""
        a, b, _, _ = self._arrays
        return a, b

    @property
    def seen(self) -> tuple[I32, I32]:
        """Return the forward and reverse hops the controller holds now per (pair, port slot):
        shape (pairs, ports, H), -1 padding."""
        _, _, sf, sr = self._arrays
        return sf, sr

    @cached_property
    def _mismatched(self) -> B:
        """Per (pair, port slot): whether the switches hash the flow salted (`ecmp_model`)."""
        n_pairs, k = self.ports.shape
        return mismatched(n_pairs * k, self.knobs, self.seed).reshape(n_pairs, k)

    @cached_property
    def _sweep(self) -> PathSweep:
        k = self.ports.shape[1]
        src = np.repeat(self.pairs_src, k)
        return PathSweep(src, self.knobs.traces_per_s, self.seed)

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
        outs = outages(self.fabric, list(active))
        if not outs:
            return hops_f, hops_r, lost
        return Rerouter(self._router, outs).apply(
            t_s,
            self.pairs_src[pidx],
            self.pairs_dst[pidx],
            self.ports[pidx, slot],
            self._mismatched[pidx, slot],
            hops_f,
            hops_r,
        )

    def known(self, pidx: I64, slot: I64) -> tuple[I32, I32]:
        """Return the forward and reply hops the controller holds for probes of (pair, slot)."""
        sf, sr = self.seen
        return sf[pidx, slot], sr[pidx, slot]

    def discover(
        self, t0_s: float, t1_s: float, faults: Sequence[Fault]
    ) -> tuple[I64, I64, I64, I32, I32] | None:
        """Trace the flows whose turn in the probers' sweep falls in [t0_s, t1_s): the
        controller's paths for them become their paths at ``t0_s`` (re-hashed around the
        ``faults`` active then). Return the traces that changed a path (src, dst, sport,
        forward hops, reply hops), or None."""
        due = self._sweep.due(t0_s, t1_s)
        if not len(due):
            return None
        k = self.ports.shape[1]
        pidx, slot = due // k, due % k
        a, b, sf, sr = self._arrays
        fwd, rev = a[pidx, slot], b[pidx, slot]
        if self._router is not None:
            active = [f for f in faults if f.start_s <= t0_s < f.end_s]
            fwd, rev, _ = self.route(active, np.full(len(due), t0_s), pidx, slot, fwd, rev)
        changed = (fwd != sf[pidx, slot]).any(axis=1) | (rev != sr[pidx, slot]).any(axis=1)
        if not changed.any():
            return None
        if sf is a or sr is b:  # no wrong paths at the start: the view shares the truth's arrays
            sf, sr = sf.copy(), sr.copy()
            self._arrays = (a, b, sf, sr)
        pidx, slot = pidx[changed], slot[changed]
        sf[pidx, slot], sr[pidx, slot] = fwd[changed], rev[changed]
        return (
            self.pairs_src[pidx],
            self.pairs_dst[pidx],
            self.ports[pidx, slot].astype(np.int64),
            fwd[changed],
            rev[changed],
        )
