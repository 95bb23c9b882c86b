"""Command-line options shared by the ``qpmesh sim`` commands: the fabric model."""

from __future__ import annotations

import argparse

from testbed.sim.model import ModelKnobs


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
