"""Pure fault timeline for ``qpmesh testbed run``: scenario faults -> timed actions."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.scenario import Fault, FaultKind, ScenarioError

_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*$")


def parse_duration(text: str) -> float:
    """Return seconds for ``"2s"``, ``"500ms"``, ``"1m"`` or ``"3"``; raise `ScenarioError`."""
    m = _DUR.match(text)
    if not m:
        raise ScenarioError(f"bad duration {text!r} (use e.g. 2s, 500ms, 1m)")
    v = float(m.group(1))
    return v / 1000 if m.group(2) == "ms" else v * 60 if m.group(2) == "m" else v


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """At ``t_s``: ``op`` (link_down, link_up, loss, loss_clear, congest, nic_down, nic_up,
    prober_stop, note) on ``target`` with ``value`` (percent / Mbit/s / seconds)."""

    t_s: float
    op: str
    target: str
    value: float = 0.0


def timeline(faults: Sequence[Fault], fabric_rate_mbit: float) -> list[Action]:
    """Return the sorted actions that realise ``faults`` on the namespace testbed.

    Congestion magnitude: <= 1 is extra utilisation of the shaped link (the generator sends
    ``(1 + m) x`` its rate so a queue builds), > 1 is taken as Mbit/s. ``gpu_fault`` has no
    namespace equivalent and becomes a ``note``.
    """
    out: list[Action] = []
    for f in faults:
        if f.kind in (FaultKind.FLAP, FaultKind.LINK_DOWN):
            for a, b in f.down_intervals():
                out += [Action(a, "link_down", f.target), Action(b, "link_up", f.target)]
        elif f.kind == FaultKind.LOSS:
            out += [
                Action(f.start_s, "loss", f.target, f.magnitude),
                Action(f.end_s, "loss_clear", f.target),
            ]
        elif f.kind == FaultKind.CONGEST:
            rate = fabric_rate_mbit * (1 + f.magnitude) if f.magnitude <= 1 else f.magnitude
            out.append(Action(f.start_s, "congest", f.target, rate))
            out.append(Action(f.end_s, "congest_stop", f.target))
        elif f.kind == FaultKind.NIC_DOWN:
            out += [Action(f.start_s, "nic_down", f.target), Action(f.end_s, "nic_up", f.target)]
        elif f.kind == FaultKind.PROBER_DOWN:
            out.append(Action(f.start_s, "prober_stop", f.target))
        else:
            out.append(Action(f.start_s, "note", f.target))
    return sorted(out)
