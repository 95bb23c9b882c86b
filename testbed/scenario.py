"""Fault scenarios: one TOML format for the simulator (`qpmesh sim run`) and the testbed.

Example (see docs/scenarios.md)::

    name = "flap-and-contention"
    duration_s = 30
    load = 0.4            # background utilisation of every link, 0..0.9
    timestamps = "hw"     # hw | sw (simulator only; the testbed uses the kernel's)
    seed = 7

    [fabric]              # any FabricShape field; defaults: 4 leaves x 4 hosts x 1 NIC, 4 spines
    leaves = 4
    spines = 4

    [[faults]]
    kind = "flap"         # flap | link_down | congest | loss | gray | optic | nic_down | prober_down | gpu_fault
    target = "leaf1-spine2"
    start_s = 5
    duration_s = 10       # how long the fault lasts (flap: the whole flapping episode)
    down_s = 1.0          # flap only: each down period
    up_s = 2.0            # flap only: each up period
    magnitude = 0.0       # congest: extra utilisation (0..1) or extra delay in µs if > 1; loss: percent;
                          # gray: percent of the link's 5-tuples dropped; optic: mean loss percent, bursty

Targets: links for flap / link_down / congest / loss, NIC ids for nic_down, host ids for
prober_down and gpu_fault. `load_scenario` validates everything against the fabric and raises
`ScenarioError` with the file, fault number and field on bad input.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from contract.tomlcheck import Table, parse_toml
from mesh.fabric import Fabric, FabricError, FabricShape, build_fabric


class ScenarioError(ValueError):
    """A scenario file or fault is invalid."""


class FaultKind(enum.StrEnum):
    """Kinds of injected faults."""

    FLAP = "flap"
    LINK_DOWN = "link_down"
    CONGEST = "congest"
    LOSS = "loss"
    NIC_DOWN = "nic_down"
    PROBER_DOWN = "prober_down"
    GPU_FAULT = "gpu_fault"
    GRAY = "gray"
    OPTIC = "optic"


LINK_FAULTS = frozenset(
    {
        FaultKind.FLAP,
        FaultKind.LINK_DOWN,
        FaultKind.CONGEST,
        FaultKind.LOSS,
        FaultKind.GRAY,
        FaultKind.OPTIC,
    }
)
HOST_FAULTS = frozenset({FaultKind.PROBER_DOWN, FaultKind.GPU_FAULT})


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: kind, target id, start and duration in seconds, magnitude.

    ``down_s``/``up_s`` shape a flap (down period, up period, repeated over ``duration_s``).
    """

    kind: FaultKind
    target: str
    start_s: float
    duration_s: float
    magnitude: float = 0.0
    down_s: float = 1.0
    up_s: float = 2.0

    def __post_init__(self) -> None:
        if self.start_s < 0 or self.duration_s <= 0:
            raise ScenarioError(
                f"fault {self.kind} on {self.target}: start must be >= 0 and duration > 0"
            )
        if self.kind == FaultKind.FLAP and (self.down_s <= 0 or self.up_s <= 0):
            raise ScenarioError(f"flap on {self.target}: down_s and up_s must be > 0")
        if self.kind in (FaultKind.LOSS, FaultKind.GRAY, FaultKind.OPTIC) and not (
            0 < self.magnitude <= 100
        ):
            raise ScenarioError(f"{self.kind} on {self.target}: magnitude is a percent in (0, 100]")
        if self.kind == FaultKind.CONGEST and self.magnitude <= 0:
            raise ScenarioError(f"congest on {self.target}: magnitude must be > 0")

    @property
    def end_s(self) -> float:
        """Time the fault ends."""
        return self.start_s + self.duration_s

    def active(self, t_s: float) -> bool:
        """Return True if the fault is in effect at ``t_s`` (for a flap: the link is down)."""
        if not self.start_s <= t_s < self.end_s:
            return False
        if self.kind != FaultKind.FLAP:
            return True
        return (t_s - self.start_s) % (self.down_s + self.up_s) < self.down_s

    def down_intervals(self) -> list[tuple[float, float]]:
        """For flaps and link/NIC downs: the (start, end) intervals the target is down."""
        if self.kind in (FaultKind.LINK_DOWN, FaultKind.NIC_DOWN):
            return [(self.start_s, self.end_s)]
        if self.kind != FaultKind.FLAP:
            return []
        out, t = [], self.start_s
        while t < self.end_s:
            out.append((t, min(t + self.down_s, self.end_s)))
            t += self.down_s + self.up_s
        return out

    def to_dict(self) -> dict[str, object]:
        """Return the TOML/JSON-ready form."""
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), enum.Enum) else v)
            for f in fields(self)
        }


@dataclass(frozen=True)
class Scenario:
    """A fabric shape, background load, stamp kind, duration, seed and a list of faults."""

    name: str
    shape: FabricShape
    duration_s: float = 30.0
    load: float = 0.4
    timestamps: str = "hw"
    seed: int = 1
    faults: tuple[Fault, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.load <= 0.95:
            raise ScenarioError(f"load must be in [0, 0.95], got {self.load}")
        if self.duration_s <= 0:
            raise ScenarioError("duration_s must be > 0")
        if self.timestamps not in ("hw", "sw"):
            raise ScenarioError(f"timestamps must be hw or sw, got {self.timestamps!r}")

    def fabric(self) -> Fabric:
        """Return the fabric of this scenario."""
        return build_fabric(self.shape)


def validate_targets(fabric: Fabric, faults: Sequence[Fault]) -> None:
    """Raise `ScenarioError` if a fault names a target that does not exist in ``fabric``."""
    hosts = {h.id for h in fabric.hosts}
    for i, f in enumerate(faults, 1):
        if f.kind in LINK_FAULTS and f.target not in fabric.link_index:
            raise ScenarioError(f"fault {i} ({f.kind}): unknown link {f.target!r}")
        if f.kind == FaultKind.NIC_DOWN and f.target not in fabric.nic_index:
            raise ScenarioError(f"fault {i} ({f.kind}): unknown NIC {f.target!r}")
        if f.kind in HOST_FAULTS and f.target not in hosts:
            raise ScenarioError(f"fault {i} ({f.kind}): unknown host {f.target!r}")


def parse_scenario(doc: Mapping[str, Any], *, source: str = "<scenario>") -> Scenario:
    """Return the `Scenario` described by a parsed TOML document; raise `ScenarioError`.

    Read through `contract.tomlcheck` (as the prober and controller configs): strict types,
    unknown keys are errors, every error names the file and the key.
    """
    root = Table.root(doc, source, ScenarioError)
    try:
        shape = root.table("fabric").dataclass(FabricShape())
    except FabricError as exc:
        raise ScenarioError(f"{source}: fabric: {exc}") from None
    kinds = [k.value for k in FaultKind]
    faults: list[Fault] = []
    for t in root.tables("faults"):
        kind = FaultKind(t.require("kind", str, lambda v: v in kinds, f"one of {kinds}"))
        target = t.require("target", str, bool, "a link, NIC or host id")
        start_s = t.require("start_s", float)
        duration_s = t.require("duration_s", float)
        magnitude = t.get("magnitude", float, 0.0)
        down_s = t.get("down_s", float, 1.0)
        up_s = t.get("up_s", float, 2.0)
        t.finish()
        try:
            faults.append(Fault(kind, target, start_s, duration_s, magnitude, down_s, up_s))
        except ScenarioError as exc:
            raise ScenarioError(f"{source}: {t.path}: {exc}") from None
    name = root.get("name", str, Path(source).stem)
    duration_s = root.get("duration_s", float, 30.0)
    load = root.get("load", float, 0.4)
    timestamps = root.get("timestamps", str, "hw")
    seed = root.get("seed", int, 1)
    extra = dict(root.table("extra").values)  # free-form: read by whoever uses it
    root.finish()
    try:
        sc = Scenario(
            name=name,
            shape=shape,
            duration_s=duration_s,
            load=load,
            timestamps=timestamps,
            seed=seed,
            faults=tuple(faults),
            extra=extra,
        )
    except ValueError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    validate_targets(sc.fabric(), sc.faults)
    return sc


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario TOML file; raise `ScenarioError` (or OSError if unreadable)."""
    p = Path(path)
    return parse_scenario(parse_toml(p.read_bytes(), str(p), ScenarioError), source=str(p))


TESTBED_CONGEST = 0.6
"""Random congestion on the namespace testbed: a generator at 1.6x the shaped link rate (the
acceptance scenario's magnitude, which builds a standing queue of ms on this machine)."""


def random_faults(
    fabric: Fabric,
    k: int,
    *,
    seed: int,
    duration_s: float,
    kinds: Sequence[FaultKind] = (
        FaultKind.FLAP,
        FaultKind.CONGEST,
        FaultKind.LOSS,
        FaultKind.NIC_DOWN,
    ),
    spacing_s: float = 0.0,
    congest_magnitude: float = 20.0,
    loss_percent: float = 20.0,
    flap_down_s: float = 1.0,
    gray_percent: float = 5.0,
    optic_percent: float = 0.5,
) -> tuple[Fault, ...]:
    """Draw ``k`` faults of mixed kinds on distinct targets, inside ``duration_s``.

    Link faults go on leaf-spine (fabric) links, NIC faults on NICs, prober and GPU faults on
    hosts. With ``spacing_s`` = 0 the faults overlap in time (concurrent); otherwise they start
    ``spacing_s`` apart.
    ``congest_magnitude`` is in the units of whoever applies the fault: the simulator reads
    20 as 20 µs of extra queueing, the namespace testbed reads a magnitude <= 1 as extra
    utilisation of the shaped link (0.6: a generator at 1.6x the link rate, a standing queue)
    and one > 1 as a generator rate in Mbit/s (see `testbed.schedule.timeline`), so the
    testbed passes its own (`TESTBED_CONGEST`). ``loss_percent``: loss faults drop that share.
    ``flap_down_s``: each down period of a flap (up periods are 2 s). ``gray_percent``: gray
    faults drop that share of the link's 5-tuples; ``optic_percent``: optic faults lose that
    share on average, in bursts (`testbed.sim.fault_model`).
    Raises `ScenarioError` if ``k`` < 0 or the fabric has too few targets of the drawn kinds.
    """
    if k < 0:
        raise ScenarioError("number of random faults must be >= 0")
    rng = np.random.default_rng(seed)
    fabric_links = [lk.id for lk in fabric.links if not lk.lower.startswith("nic")]
    nics = [n.id for n in fabric.nics]
    if k > len(fabric_links):
        raise ScenarioError(f"at most {len(fabric_links)} random faults on this fabric")
    links_pick = list(rng.permutation(fabric_links))
    nics_pick = list(rng.permutation(nics))
    # hosts from a stream of their own: the links' and NICs' draws (and so every seed's
    # faults of the other kinds) stay what they were before host faults could be drawn
    hosts_pick = [str(h) for h in np.random.default_rng([seed, 1]).permutation(
        [h.id for h in fabric.hosts])]  # fmt: skip
    out: list[Fault] = []
    t0 = min(5.0, duration_s * 0.2)
    for i in range(k):
        kind = FaultKind(kinds[int(rng.integers(len(kinds)))])
        start = t0 + i * spacing_s + float(rng.uniform(0, 1.0))
        dur = max(1.0, min(duration_s - start - 1.0, 10.0 + float(rng.uniform(0, 5))))
        # a prober or a GPU on a host, a NIC down on a NIC, the rest on a fabric link
        pool = (
            hosts_pick if kind in HOST_FAULTS
            else nics_pick if kind == FaultKind.NIC_DOWN
            else links_pick
        )  # fmt: skip
        if not pool:
            raise ScenarioError(f"not enough distinct targets for {k} random faults")
        target = str(pool.pop())
        if kind == FaultKind.FLAP:
            out.append(Fault(kind, target, start, dur, down_s=flap_down_s, up_s=2.0))
        elif kind == FaultKind.CONGEST:
            out.append(Fault(kind, target, start, dur, magnitude=congest_magnitude))
        elif kind == FaultKind.LOSS:
            out.append(Fault(kind, target, start, dur, magnitude=loss_percent))
        elif kind in (FaultKind.GRAY, FaultKind.OPTIC):
            pct = gray_percent if kind == FaultKind.GRAY else optic_percent
            out.append(Fault(kind, target, start, dur, magnitude=pct))
        else:
            out.append(Fault(kind, target, start, dur))
    return tuple(out)
