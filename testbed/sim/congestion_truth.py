"""The simulator's own congestion as ground truth: the typical (median) queueing a probe meets
on every directed hop in a step (pure, seeded).

A hop is *contended* when a probe crossing it typically waits more than `CONTENTION_NS`
(1.5 µs): the controller's documented contention threshold (docs/detection.md, "Congestion
and faults": the floor of the per-hop queue estimate, 1.5x the 1 µs clock-trust bound so a
clock error alone cannot reach it). It has a *standing queue* from `STANDING_NS` (1 µs, the
clock-trust bound) on: queueing that is real but under the threshold, where a finding of
contention is neither required nor false.

The wait of a probe at a hop is what `testbed.sim.engine` draws from the traffic: with
utilisation ``rho`` (a `congest` fault's extra utilisation and the load a down link's flows
moved onto its siblings included) it waits with probability ``rho`` an exponential time of
mean ``S / (1 - rho)`` (``S`` one MTU at link rate), plus, on a hop with an incast burst in
the step, an exponential wait for the share ``incast_hit`` of its probes. Without an incast
the median has a closed form (0 for ``rho <= 0.5``, else ``S / (1 - rho) * ln(2 rho)``);
with one it is read from a fixed sample of the sum (common random numbers, so the truth does
not move from step to step by sampling alone). The rare Pareto bursts (2e-4 of traversals)
do not move a median and are left out. The queue a `congest` fault adds in µs is the
fault's own truth (scored as that fault), not the traffic's.

A NIC's own transmit queue (the ``nic -> leaf`` hop's wait) is before its hardware send
stamp when stamps are taken at the wire (`ModelKnobs.hw_stamp_at_wire`): no measurement sees
it, and it is a queue in the host's NIC, not in the fabric. `hop_queue_ns` reports 0 there.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from testbed.sim.model import ModelKnobs

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]
CONTENTION_NS = 1500.0
STANDING_NS = 1000.0
_SAMPLES = 2048


def mm1_median_ns(rho: F64, svc_ns: F64) -> F64:
    """Return the median wait of the engine's M/M/1-like queue per hop (0 where rho <= 0.5)."""
    r = np.clip(rho, 0.0, 0.999)
    with np.errstate(divide="ignore", invalid="ignore"):
        med = svc_ns / (1.0 - r) * np.log(np.maximum(2.0 * r, 1.0))
    return np.asarray(np.where(r > 0.5, med, 0.0), dtype=np.float64)


class QueueTruth:
    """Median queueing per directed hop; one per simulator (its sample is fixed by the seed)."""

    def __init__(self, knobs: ModelKnobs, seed: int, nic_egress: B, hw_at_wire: bool) -> None:
        """``nic_egress``: mask of the ``nic -> leaf`` hops; ``hw_at_wire``: their wait is
        before the send stamp (hardware stamps at the wire), so it is reported as 0."""
        self.knobs = knobs
        rng = np.random.default_rng([seed, 1101])
        self._u_wait = rng.random(_SAMPLES)
        self._e_wait = rng.exponential(1.0, _SAMPLES)
        self._u_hit = rng.random(_SAMPLES)
        self._e_hit = rng.exponential(1.0, _SAMPLES)
        self._hidden = nic_egress if hw_at_wire else np.zeros_like(nic_egress)

    def hop_queue_ns(self, rho: F64, svc_ns: F64, incast: B | None) -> F64:
        """Return per directed hop the median queueing (ns) the traffic makes a probe meet
        there in a step: ``rho`` utilisation, ``svc_ns`` one MTU's time, ``incast`` the hops
        with an incast burst (None: none)."""
        med = mm1_median_ns(rho, svc_ns)
        idx = np.flatnonzero(incast) if incast is not None else np.zeros(0, np.int64)
        if len(idx):
            r = np.clip(rho[idx], 0.0, 0.999)[:, None]
            w = (self._u_wait < r) * self._e_wait * (svc_ns[idx, None] / (1.0 - r))
            hit = self._u_hit < self.knobs.incast_hit
            w = w + hit * self._e_hit * (self.knobs.incast_queue_us * 1000.0)
            med[idx] = np.median(w, axis=1)
        med[self._hidden] = 0.0
        return med
