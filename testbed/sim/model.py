"""The simulator's fabric model knobs: one frozen value naming every non-ideal effect.

`ModelKnobs()` is the realistic default (each default and its source: docs/simulator.md);
`ModelKnobs.ideal_model()` switches every effect off and reproduces the original, kinder model
(one utilisation for both directions of every hop, near-symmetric floors, clocks as smooth
lines, identical kernel-stamp delays on every host, independent queues for the two probes of a
coded pair, no loss, the controller knowing the switches' ECMP hash). Pure data: the effect
generators live in `testbed.sim.load_model`, `asymmetry`, `clock_model`, `stamp_model`,
`loss_model`, `ecmp_model` and `reroute_model`; the NIC clocks' steps and servo steering in
`clock_events`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class ModelError(ValueError):
    """A model knob out of range or unknown."""


@dataclass(frozen=True, slots=True)
class ModelKnobs:
    """Every non-ideal effect of the simulator; see docs/simulator.md for units and sources."""

    ideal: bool = False
    # utilisation per directed hop and over time (load_model)
    util_spread: float = 0.05  # per directed hop: load + U(-s, s), constant
    hotspot_frac: float = 0.05  # fraction of directed hops hot at a time
    hotspot_util: float = 0.3  # utilisation added on a hot hop
    hotspot_period_s: float = 5.0  # hot spots move this often
    incast_prob: float = 0.02  # per leaf->host hop and 100 ms step: an incast burst
    incast_queue_us: float = 5.0  # mean extra queueing of a probe caught in a burst
    incast_hit: float = 0.2  # fraction of the step's probes on that hop the burst catches
    overflow_rho: float = 0.85  # utilisation above which buffers overflow
    overflow_loss: float = 1e-2  # per-traversal loss as utilisation approaches 1
    redistribute: bool = True  # a down link's load moves to its sibling uplinks
    # constant directional asymmetry (asymmetry)
    cable_m: tuple[float, float] = (1.0, 30.0)  # cable length per link, uniform
    ns_per_m: float = 5.0  # propagation in copper / fibre
    port_spread_ns: float = 10.0  # per egress port: switch latency + U(-s, s)
    nic_txrx_ns: float = 10.0  # per NIC: TX and RX fixed delays U(0, s) each
    # clocks (clock_model)
    wander_ppb_sqrt_s: float = 10.0  # frequency random walk, ppb per sqrt(s)
    temp_steps_per_h: float = 2.0  # per NIC, Poisson
    temp_step_ppb: float = 50.0  # frequency step size (sign random)
    # NIC clocks as they are (clock_events, stamp_model): off by default, measured by knob
    clock_step_per_h: float = 0.0  # per NIC, Poisson: a host reboot, ptp4l / phc2sys stepping
    clock_step_us: tuple[float, float] = (1.0, 1000.0)  # step size, log-uniform, sign random
    servo_interval_s: float = 0.0  # PHC steered by a PI servo every interval (0: free-running)
    servo_noise_ns: float = 20.0  # the servo's offset measurement noise (standard deviation)
    servo_kp: float = 0.7  # linuxptp's PI constants for hardware stamps
    servo_ki: float = 0.3
    hw_bad_stamp_prob: float = 0.0  # per hw / CQE stamp: a gross bad stamp
    hw_bad_stamp_us: tuple[float, float] = (1.0, 50.0)  # its size, uniform, sign random
    # completion-queue (CQE) send stamps, `--timestamps cqe` (stamp_model)
    cqe_lead_ns: float = 600.0  # a TX completion is stamped this long before the wire
    cqe_lead_spread_ns: float = 10.0  # per NIC: the lead + U(-s, s), constant
    cqe_jitter_ns: float = 20.0  # per stamp: exponential, mean
    # software stamps (stamp_model)
    sw_host_bias_ns: float = 500.0  # per host and direction (tx / rx): U(-b, b)
    sw_outlier_prob: float = 1e-3  # per stamp
    sw_outlier_us: tuple[float, float] = (10.0, 100.0)  # scheduler / IRQ-coalescing outliers
    # coded probe pairs (engine)
    coded_fifo: bool = True  # the second probe of a pair goes through each FIFO behind the first
    hw_stamp_at_wire: bool = True  # hw send stamps after the NIC's own egress queue
    # loss (loss_model)
    background_loss: float = 1e-4  # per directed hop traversal
    burst_per_link_h: float = 0.2  # loss bursts per link per hour, Poisson
    burst_ms: float = 50.0  # burst length
    burst_loss: float = 0.3  # per-traversal loss inside a burst
    # ECMP the controller does not know (ecmp_model)
    ecmp_mismatch: float = 0.25  # flows whose real hash differs from the controller's model
    discovered: float = 0.8  # of those, fraction whose path the controller knows at the start
    # paths that move (reroute_model)
    rehash: bool = True  # flows of a down switch link re-hash onto its siblings
    reroute_local_ms: float = 10.0  # the switch below the link drops it from its ECMP group
    reroute_remote_ms: float = 300.0  # every switch has routed around it
    traces_per_s: float = 5.0  # path discovery per host (prober paths.traces_per_s); 0: none
    # optic faults (fault_model): Gilbert-Elliott bursts
    optic_duty: float = 0.05  # share of the time a marginal optic is in a bad period
    optic_burst_ms: float = 2.0  # mean bad period

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            vals = v if isinstance(v, tuple) else (v,)
            if any(isinstance(x, (int, float)) and not isinstance(x, bool) and x < 0 for x in vals):
                raise ModelError(f"model knob {f.name} must be >= 0, got {v}")
        for name in (
            "util_spread",
            "hotspot_frac",
            "incast_prob",
            "incast_hit",
            "overflow_loss",
            "background_loss",
            "burst_loss",
            "ecmp_mismatch",
            "discovered",
            "optic_duty",
            "hw_bad_stamp_prob",
        ):
            if getattr(self, name) > 1:
                raise ModelError(f"model knob {name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 < self.overflow_rho < 1:
            raise ModelError(f"overflow_rho must be in (0, 1), got {self.overflow_rho}")
        if self.hotspot_period_s <= 0:
            raise ModelError("hotspot_period_s must be > 0")
        if not 0 < self.optic_duty <= 1 or self.optic_burst_ms <= 0:
            raise ModelError("optic_duty must be in (0, 1] and optic_burst_ms > 0")
        if self.reroute_local_ms > self.reroute_remote_ms:
            raise ModelError("reroute_local_ms must be <= reroute_remote_ms")
        if self.clock_step_us[0] <= 0:
            raise ModelError(f"clock_step_us must be > 0, got {self.clock_step_us}")
        for name in ("cable_m", "sw_outlier_us", "clock_step_us", "hw_bad_stamp_us"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ModelError(f"model knob {name} needs lo <= hi, got {(lo, hi)}")

    @classmethod
    def ideal_model(cls) -> ModelKnobs:
        """Return the knobs of the original, kinder model (every effect off)."""
        return cls(
            ideal=True,
            util_spread=0.0,
            hotspot_frac=0.0,
            incast_prob=0.0,
            overflow_loss=0.0,
            redistribute=False,
            port_spread_ns=0.0,
            nic_txrx_ns=0.0,
            wander_ppb_sqrt_s=0.0,
            temp_steps_per_h=0.0,
            cqe_lead_spread_ns=0.0,
            cqe_jitter_ns=0.0,
            sw_host_bias_ns=0.0,
            sw_outlier_prob=0.0,
            coded_fifo=False,
            hw_stamp_at_wire=False,
            background_loss=0.0,
            burst_per_link_h=0.0,
            ecmp_mismatch=0.0,
            rehash=False,
            traces_per_s=0.0,
        )

    def with_overrides(self, pairs: list[str]) -> ModelKnobs:
        """Return a copy with ``name=value`` overrides (tuples as ``lo,hi``).

        Raises `ModelError` on an unknown name or a bad value.
        """
        fields = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for item in pairs:
            name, sep, raw = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in fields or name == "ideal":
                raise ModelError(f"unknown model knob {item!r} (known: {', '.join(fields)})")
            cur = getattr(self, name)
            try:
                if isinstance(cur, bool):
                    if raw.lower() not in ("0", "1", "true", "false"):
                        raise ValueError(raw)
                    changes[name] = raw.lower() in ("1", "true")
                elif isinstance(cur, tuple):
                    lo, hi = (float(x) for x in raw.split(","))
                    changes[name] = (lo, hi)
                else:
                    changes[name] = float(raw)
            except ValueError:
                raise ModelError(f"bad value for model knob {name}: {raw!r}") from None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the knobs as a JSON-ready dict (``{"ideal": bool, ...}``)."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
        }
