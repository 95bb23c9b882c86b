"""Huygens-style clock sync for the probe mesh: pure numerics, arrays in, estimates out.

Pipeline: ``coded_probe_mask`` (keep probe pairs that kept their spacing) -> ``fit_pairs``
(per-pair offset + drift, max-margin line between the forward and reverse delay envelopes) ->
``solve_network`` (loop-consistent node offsets, bad edges flagged) -> optionally, on loaded
fabrics, ``refit_fixed_slope`` + ``floor_excess_std`` + ``solve_network(loss="huber")`` ->
``ClockModels`` and ``one_way_delays`` (real-time delays by extrapolation). ``ntp_offsets`` and
``anchor_tree`` are the comparison baselines. Conventions: int64 ns stamps; float64 only relative to ``t_ref``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sync.baselines import NtpOffsets, TreeAnchoring, anchor_tree, ntp_offsets
    from sync.batchfit import fit_pairs
    from sync.bench import bench_network_solve
    from sync.clock import ClockModel, ClockModels, one_way_delays
    from sync.coded import coded_pair_mask, coded_probe_mask
    from sync.network import NetworkSolution, solve_network
    from sync.pairfit import REASONS, FitStatus, PairFit, PairFits, fit_pair
    from sync.refine import floor_excess_std, refit_fixed_slope

# Loaded on first use (PEP 562): `import sync.cli` (every qpmesh command builds its parser)
# must not pay for scipy.
_HOME = {
    "NtpOffsets": "sync.baselines",
    "TreeAnchoring": "sync.baselines",
    "anchor_tree": "sync.baselines",
    "ntp_offsets": "sync.baselines",
    "fit_pairs": "sync.batchfit",
    "bench_network_solve": "sync.bench",
    "ClockModel": "sync.clock",
    "ClockModels": "sync.clock",
    "one_way_delays": "sync.clock",
    "coded_pair_mask": "sync.coded",
    "coded_probe_mask": "sync.coded",
    "NetworkSolution": "sync.network",
    "solve_network": "sync.network",
    "REASONS": "sync.pairfit",
    "FitStatus": "sync.pairfit",
    "PairFit": "sync.pairfit",
    "PairFits": "sync.pairfit",
    "fit_pair": "sync.pairfit",
    "floor_excess_std": "sync.refine",
    "refit_fixed_slope": "sync.refine",
}


def __getattr__(name: str) -> Any:
    """Return the public name ``name`` from its module (imported on first use)."""
    try:
        module = _HOME[name]
    except KeyError:
        raise AttributeError(f"module 'sync' has no attribute {name!r}") from None
    return getattr(import_module(module), name)


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
