"""``qpmesh testbed chaos``: when qpmesh's own parts fail, at seeded random times (pure plan).

`chaos_plan(seed, duration_s, components, hosts=...)` returns the `ComponentFault` list of one
run: each entry of ``components`` (``kill:<part>`` or ``starve:<part>``, `KILLABLE` and
`STARVABLE`) gets a slot of its own on the run's timeline (its outage, `RECOVERY_ROOM_S` and an equal
share of the time left over), in an order drawn from the seed, and a start drawn inside the
slot's share, so that its outage and the recovery after it fit before the next one starts (each finding can be laid at one fault's door). A killed part is
restarted ``down_s`` later by the harness (the API process by its controller, which notices
it died: ``down_s`` 0); a starved one gets ``share`` of one CPU for ``down_s``. Which prober
(``target``) is drawn from ``hosts``.

`repeat_faults(faults, period_s, duration_s)` repeats a scenario's network faults every
``period_s`` to fill a longer run, so component faults fall while network faults happen.

Nothing here reads a clock or starts a process: `testbed.chaosrun` does, and
`testbed.chaosreport` judges what it recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from testbed.scenario import Fault

KILLABLE = ("controller", "broker", "prober", "api", "tsdb", "agent")
"""Parts that are SIGKILLed and restarted: the controller, the broker (mosquitto), one prober,
the controller's API process, the time-series server (VictoriaMetrics), a recovery agent."""
STARVABLE = ("controller", "prober")
"""Parts that are starved of CPU (`testbed.cgroup`)."""
DEFAULT_FAULTS = (
    *(f"kill:{c}" for c in KILLABLE),
    *(f"starve:{c}" for c in STARVABLE),
)
KILL_DOWN_S = (1.0, 4.0)
"""A killed part stays dead a time drawn from this range before the harness restarts it."""
RECOVERY_ROOM_S = 12.0
"""Room left after a fault's outage before the next fault's slot (what recovery may take)."""
STARVE_S = 20.0
STARVE_SHARE = 0.02


class ChaosError(ValueError):
    """A plan that cannot be made (unknown part, a run too short for its faults)."""


@dataclass(frozen=True, slots=True)
class ComponentFault:
    """One fault of a qpmesh part: ``op`` ``kill`` (SIGKILL, restarted ``down_s`` later) or
    ``starve`` (``share`` of one CPU for ``down_s``) of ``component`` at ``t_s`` after the
    scenario's start; ``target``: which prober (host id) or agent, else ""."""

    component: str
    op: str
    t_s: float
    down_s: float
    share: float = 0.0
    target: str = ""

    def __post_init__(self) -> None:
        parts = KILLABLE if self.op == "kill" else STARVABLE if self.op == "starve" else ()
        if self.component not in parts:
            raise ChaosError(f"cannot {self.op} {self.component!r}")
        if self.t_s < 0 or self.down_s < 0:
            raise ChaosError("fault time and down time must be >= 0")
        if self.op == "starve" and not 0 < self.share <= 1:
            raise ChaosError(f"starve share must be in (0, 1], got {self.share}")

    @property
    def name(self) -> str:
        """Return ``op:component`` with the target, e.g. ``kill:prober:host3``."""
        return f"{self.op}:{self.component}" + (f":{self.target}" if self.target else "")

    def to_dict(self) -> dict[str, Any]:
        """Return the plain JSON object of this fault."""
        out: dict[str, Any] = {"component": self.component, "op": self.op,
                               "t_s": self.t_s, "down_s": self.down_s}  # fmt: skip
        if self.op == "starve":
            out["share"] = self.share
        if self.target:
            out["target"] = self.target
        return out


def parse_faults(specs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Return (op, component) of each ``op:component`` spec; raises `ChaosError`."""
    out = []
    for spec in specs:
        op, _, comp = spec.partition(":")
        if (op, comp) not in {("kill", c) for c in KILLABLE} | {("starve", c) for c in STARVABLE}:
            raise ChaosError(
                f"unknown component fault {spec!r}: kill:{'|'.join(KILLABLE)} or "
                f"starve:{'|'.join(STARVABLE)}"
            )
        out.append((op, comp))
    return tuple(out)


def needed_s(op: str, component: str, starve_s: float = STARVE_S) -> float:
    """Return the room one fault needs: its longest outage plus `RECOVERY_ROOM_S`."""
    if op == "starve":
        return starve_s + RECOVERY_ROOM_S
    return (0.0 if component == "api" else KILL_DOWN_S[1]) + RECOVERY_ROOM_S


def min_duration_s(specs: Sequence[str], start_s: float, starve_s: float = STARVE_S) -> float:
    """Return the shortest run that fits ``specs``: ``start_s`` and every fault's need."""
    return start_s + sum(needed_s(o, c, starve_s) for o, c in parse_faults(specs))


def chaos_plan(
    seed: int,
    duration_s: float,
    components: Sequence[str] = DEFAULT_FAULTS,
    *,
    hosts: Sequence[str] = (),
    agents: Sequence[str] = (),
    start_s: float = 6.0,
    starve_s: float = STARVE_S,
    share: float = STARVE_SHARE,
) -> list[ComponentFault]:
    """Return the component faults of a run of ``duration_s`` (see the module docstring),
    sorted by time. ``hosts``: the probers one may be picked from (needed for a prober
    fault); ``agents``: the recovery agents (needed for ``kill:agent``); ``start_s``: none
    before this (the first detection windows). Raises `ChaosError` for an unknown part,
    a missing host or agent, or a run shorter than `min_duration_s`."""
    ops = parse_faults(components)
    if not ops:
        return []
    need = min_duration_s(components, start_s, starve_s)
    if duration_s < need:
        raise ChaosError(f"{len(ops)} component faults need a run of at least {need:g} s "
                         f"(got {duration_s:g})")  # fmt: skip
    if any(c == "prober" for _, c in ops) and not hosts:
        raise ChaosError("a prober fault needs the hosts to pick from")
    if any(c == "agent" for _, c in ops) and not agents:
        raise ChaosError("kill:agent needs a recovery agent")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ops))
    spare = (duration_s - need) / len(ops)  # each slot: its need and an equal share of the rest
    slot_start = start_s
    out = []
    for i in order:
        op, comp = ops[int(i)]
        if op == "starve":
            down = starve_s
        elif comp == "api":
            down = 0.0  # its controller starts another when it notices
        else:
            down = round(float(rng.uniform(*KILL_DOWN_S)), 2)
        t = slot_start + float(rng.uniform(0.0, spare))
        slot_start += needed_s(op, comp, starve_s) + spare
        target = ""
        if comp == "prober":
            target = str(hosts[int(rng.integers(len(hosts)))])
        elif comp == "agent":
            target = str(agents[int(rng.integers(len(agents)))])
        out.append(ComponentFault(comp, op, round(t, 2), down, share if op == "starve" else 0.0,
                                  target))  # fmt: skip
    return sorted(out, key=lambda f: f.t_s)


def repeat_faults(faults: Sequence[Fault], period_s: float, duration_s: float) -> list[Fault]:
    """Return ``faults`` repeated every ``period_s`` (the scenario's own duration) for as long
    as each copy still ends within ``duration_s``. Raises `ChaosError` for a period <= 0."""
    if period_s <= 0:
        raise ChaosError("the repeat period must be > 0")
    out: list[Fault] = []
    k = 0
    while k * period_s < duration_s:
        for f in faults:
            g = replace(f, start_s=f.start_s + k * period_s)
            if g.start_s + g.duration_s <= duration_s:
                out.append(g)
        k += 1
    return sorted(out, key=lambda f: f.start_s)
