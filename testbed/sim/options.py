"""Command-line options shared by the ``qpmesh sim`` commands: the fabric model, the
fabric ``--nics`` builds, and number parsers."""

from __future__ import annotations

import argparse

from mesh.fabric import Fabric, FabricShape, build_fabric
from testbed.sim.model import ModelKnobs


def number(text: str) -> float:
    """Parse an option's number; raises `argparse.ArgumentTypeError` (one line) if not one."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive(text: str) -> float:
    """Parse an option's number > 0; raises `argparse.ArgumentTypeError` otherwise."""
    v = number(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text}")
    return v


def nics_fabric(nics: int) -> Fabric:
    """Return the two-tier fabric ``--nics`` names: up to 32 NICs per leaf (a quarter of
    them, at least 2), four spines."""
    per_leaf = min(32, max(2, nics // 4))
    return build_fabric(FabricShape.for_nics(nics, nics_per_leaf=per_leaf, spines=4))


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Add ``--ideal`` and ``--model-knob`` (the simulator's fabric model, docs/simulator.md)."""
    g = p.add_argument_group("fabric model")
    g.add_argument(
        "--ideal",
        action="store_true",
        help="the original, kinder model: every realistic effect off (for comparison)",
    )
    g.add_argument(
        "--model-knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override one realistic-model knob (repeatable; names and defaults in "
        "docs/simulator.md, e.g. util_spread=0.1, cable_m=1,30)",
    )


def model_from_args(args: argparse.Namespace) -> ModelKnobs:
    """Return the `ModelKnobs` named by the model options; raises `ModelError` if invalid."""
    base = ModelKnobs.ideal_model() if args.ideal else ModelKnobs()
    return base.with_overrides(list(args.model_knob))
