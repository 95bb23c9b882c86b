"""The knobs a fleet worker and its solver share (`FleetConfig`): one value for both, so the
windows, clock bins and detection thresholds agree across processes."""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.brain import BrainConfig
from controller.clocksync import ClockSyncConfig
from controller.fleet.grid import WindowGrid


@dataclass(frozen=True)
class FleetConfig:
    """``grid``: the fleet's windows (`WindowGrid`; the brain judges one per window, a
    worker sends one partial per window); ``lateness_ns``: a window is closed once its end is
    this old (records that arrive later go into the oldest window still open); ``sync``: the
    clock selection and solve; ``detection``: the brain's thresholds (workers judge delays
    with ``detection.delay``, the solver's brain uses all of it; its own ``lateness_ns`` is
    not used: windows close on the grid); ``baseline_bucket_ns``: the per-flow baseline of
    the delays a worker shows (`controller.windows.FlowStore`); ``max_gap``: past this many
    windows without records (a long silence, a clock that jumped) a worker hands out and a
    solver judges only the windows that have records and the last ones, not every empty one
    between. ``wait_ns``: a window some prober's batches cover waits for every live
    prober's, at most this long past its end (then it closes short:
    `controller.fleet.watermark`); 0: windows close at end + lateness whatever arrived (the
    NATS fleet's default: its solver's deadlines assume it). ``edge_owners``: 0, the solver
    folds the workers' clock parts and summarizes its solve windows itself; k >= 1, k edge
    owners do (`controller.fleet.edges`: the solver joins their summary blocks, on a solve
    cadence of the grid). Raises ValueError on a negative lateness, wait or edge_owners, or a
    max_gap below 1."""

    grid: WindowGrid = field(default_factory=WindowGrid)
    lateness_ns: int = 0
    sync: ClockSyncConfig = field(default_factory=ClockSyncConfig)
    detection: BrainConfig = field(default_factory=BrainConfig)
    baseline_bucket_ns: int = 60_000_000_000
    max_gap: int = 3600
    wait_ns: int = 0
    edge_owners: int = 0

    def __post_init__(self) -> None:
        if self.lateness_ns < 0:
            raise ValueError(f"lateness_ns must be >= 0, got {self.lateness_ns}")
        if self.max_gap < 1:
            raise ValueError(f"max_gap must be >= 1, got {self.max_gap}")
        if self.wait_ns < 0:
            raise ValueError(f"wait_ns must be >= 0, got {self.wait_ns}")
        if self.edge_owners < 0:
            raise ValueError(f"edge_owners must be >= 0, got {self.edge_owners}")

    @property
    def late_windows(self) -> int:
        """Return how many windows the lateness spans (rounded up)."""
        return -(-self.lateness_ns // self.grid.width_ns)
