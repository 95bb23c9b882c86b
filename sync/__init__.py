"""Huygens-style clock sync for the probe mesh: pure numerics, arrays in, estimates out.

Pipeline: ``coded_probe_mask`` (keep probe pairs that kept their spacing) -> ``fit_pairs``
(per-pair offset + drift, max-margin line between the forward and reverse delay envelopes) ->
``solve_network`` (loop-consistent node offsets, bad edges flagged) -> optionally, on loaded
fabrics, ``refit_fixed_slope`` + ``floor_excess_std`` + ``solve_network(loss="huber")`` ->
``ClockModels`` and ``one_way_delays`` (real-time delays by extrapolation). ``ntp_offsets`` and
``anchor_tree`` are the comparison baselines. Conventions: int64 ns stamps; float64 only relative to ``t_ref``.
"""

from sync.baselines import NtpOffsets, TreeAnchoring, anchor_tree, ntp_offsets
from sync.batchfit import fit_pairs
from sync.bench import bench_network_solve
from sync.clock import ClockModel, ClockModels, one_way_delays
from sync.coded import coded_pair_mask, coded_probe_mask
from sync.network import NetworkSolution, solve_network
from sync.pairfit import REASONS, FitStatus, PairFit, PairFits, fit_pair
from sync.refine import floor_excess_std, refit_fixed_slope

__all__ = [
    "REASONS",
    "ClockModel",
    "ClockModels",
    "FitStatus",
    "NetworkSolution",
    "NtpOffsets",
    "PairFit",
    "PairFits",
    "TreeAnchoring",
    "anchor_tree",
    "bench_network_solve",
    "coded_pair_mask",
    "coded_probe_mask",
    "fit_pair",
    "fit_pairs",
    "floor_excess_std",
    "ntp_offsets",
    "one_way_delays",
    "refit_fixed_slope",
    "solve_network",
]
