"""The static-threshold baseline of ``qpmesh sim rootcause``: one fixed limit per signal.

This is how hosts are usually watched (a node exporter and alert rules): a signal over its
limit for ``persist`` windows in a row flags its entity, with the same persistence the
detector uses. The limits are the ones such rules commonly use, fixed before any run (none
is tuned here): any physical or transport error at all, pauses or ECN marks above 1,000 /
10,000 a second, a pre-FEC error rate above 2.4e-6 on a 425 Gb/s line (1e6 bits/s; the
RS(544,514) FEC limit is 2.4e-4), GPU over 85 degC or throttling for heat, a host with a
fifth of its CPU in softirq or a quarter of its time stalled. `StaticFlags.step` returns
the flagged entities as `controller.anomaly.detector.Anomaly` values (score: the detector's
threshold times how far over the limit, at most 3x), so the same root-cause walk reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from contract.signals import Entity, names_of
from controller.anomaly.detector import Anomaly, Contributor
from controller.anomaly.frame import SignalFrame
from controller.rootcause.classes import role_of
from controller.rootcause.graph import CrossLayerGraph

# signal -> (limit, "above" | "below")
LIMITS: Mapping[Entity, Mapping[str, tuple[float, str]]] = {
    Entity.NIC: {
        **{n: (1e3, "above") for n in ("pause_rx", "pause_tx", "pfc_rx_p3", "pfc_tx_p3")},
        "ecn_marked": (1e4, "above"), "cnp_sent": (1e4, "above"), "cnp_handled": (1e4, "above"),
        "cnp_ignored": (1.0, "above"), "out_of_sequence": (100.0, "above"),
        "packet_seq_err": (10.0, "above"), "local_ack_timeout": (1.0, "above"),
        "fec_corrected_bits": (1e6, "above"), "fec_corrected_blocks": (1e6, "above"),
        "fec_uncorrectable_blocks": (0.05, "above"), "symbol_errors": (0.05, "above"),
        "pcs_symbol_errors": (0.05, "above"), "crc_errors_phy": (0.05, "above"),
        "link_down_events": (0.001, "above"), "rdma_link_downed": (0.001, "above"),
        **{n: (0.05, "above") for n in ("pcie_replay_rollover", "pcie_replay_timeout",
                                        "pcie_bad_tlp", "pcie_bad_dllp", "pcie_si_rx",
                                        "pcie_si_tx")},
        "rx_discards_phy": (10.0, "above"), "rx_out_of_buffer": (10.0, "above"),
        "pause_storm_warnings": (0.001, "above"), "mtu": (4000.0, "below"),
        "link_up": (0.5, "below"),
    },
    Entity.GPU: {
        "temperature_c": (85.0, "above"), "throttle_thermal": (0.5, "above"),
        "throttle_hw": (0.5, "above"), "power_limit_w": (650.0, "below"),
        "gpu_pcie_replay": (1.0, "above"), "ecc_corrected": (0.05, "above"),
    },
    Entity.HOST: {
        "cpu_softirq": (0.2, "above"), "cpu_steal": (0.1, "above"),
        "runq_per_cpu": (2.0, "above"), "psi_cpu_some": (0.25, "above"),
        "psi_io_some": (0.3, "above"), "psi_mem_some": (0.1, "above"),
        "softnet_dropped": (1.0, "above"), "mem_available": (0.1, "below"),
    },
}  # fmt: skip


class StaticFlags:
    """Fixed limits for one entity kind, with ``persist`` windows in a row to flag."""

    def __init__(self, kind: Entity, persist: int = 3, threshold: float = 6.0) -> None:
        self.kind = kind
        self.persist = persist
        self.threshold = threshold
        names = names_of(kind)
        lim = LIMITS[kind]
        self.cols = np.array([j for j, n in enumerate(names) if n in lim], np.intp)
        self.names = tuple(names[j] for j in self.cols)
        self.limit = np.array([lim[n][0] for n in self.names])
        self.below = np.array([lim[n][1] == "below" for n in self.names])
        self.streak: dict[str, int] = {}
        self.since: dict[str, int] = {}

    def step(self, frame: SignalFrame, t_ns: int) -> tuple[list[str], dict[str, Anomaly]]:
        """Return (entities whose flag starts this window, every flagged entity's anomaly)."""
        v = frame.values[:, self.cols]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(self.below, self.limit / v, v / self.limit)
        ratio = np.nan_to_num(ratio, nan=0.0, posinf=3.0)
        over = ratio > 1.0
        new: list[str] = []
        active: dict[str, Anomaly] = {}
        hit = np.asarray(over.any(axis=1), bool)
        for i, ent in enumerate(frame.entities):
            s = self.streak.get(ent, 0) + 1 if hit[i] else 0
            self.streak[ent] = s
            if s < self.persist:
                self.since.pop(ent, None)
                continue
            if s == self.persist:
                new.append(ent)
                self.since[ent] = t_ns
            active[ent] = self._anomaly(frame, i, ratio[i], t_ns)
        return new, active

    def _anomaly(
        self, frame: SignalFrame, i: int, ratio: npt.NDArray[np.float64], t_ns: int
    ) -> Anomaly:
        order = [j for j in np.argsort(-ratio) if ratio[j] > 1.0][:6]
        tops = tuple(
            Contributor(self.names[j], round(self.threshold * min(float(ratio[j]), 3.0), 2),
                        float(frame.values[i, self.cols[j]]), None, None)
            for j in order
        )  # fmt: skip
        score = max(c.score for c in tops)
        return Anomaly(
            t_ns, self.kind, frame.entities[i], score, self.since[frame.entities[i]], tops
        )


def naive_root_cause(graph: CrossLayerGraph, flagged: Mapping[str, Anomaly]) -> tuple[str, str]:
    """Return (class, target) as static alerts name a slow job's cause without a walk: the
    job's own entity with the alert furthest over its limit, its signal's class
    (`controller.rootcause.classes`) at that entity (a NIC receiving pauses or ECN marks
    names its leaf, transport retransmissions its link); ``("unknown", "")`` without one."""
    own = [*graph.nics, *graph.hosts(), *graph.gpus()]
    best: tuple[float, str, str] | None = None
    for ent in own:
        a = flagged.get(ent)
        if a is None:
            continue
        for c in a.top:
            role, cls = role_of(c.signal)
            if role == "root":
                tgt = graph.nic_link.get(ent, ent) if cls in ("link_degraded", "link_flap") else ent
                if cls in ("ecn_config", "mtu_config"):
                    tgt = graph.nic_host.get(ent, ent)
            elif role == "victim_pfc":
                cls, tgt = "pfc_storm", graph.nic_leaf.get(ent, ent)
            elif role in ("congestion_rx", "congestion_tx"):
                cls, tgt = "cnp_storm", graph.nic_leaf.get(ent, ent)
            elif role == "loss":
                cls, tgt = "link_loss", graph.nic_link.get(ent, ent)
            else:
                continue
            if best is None or c.score > best[0]:
                best = (c.score, cls, tgt)
    return ("unknown", "") if best is None else (best[1], best[2])
