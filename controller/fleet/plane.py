"""The fleet's data plane layout on NATS JetStream (pure): names, sizes, the window grid.

`Plane` is the ``[fleet]`` table's shell half (`controller.config.read_fleet`): how many
partitions the servers' subject mapping makes (it must equal the ``partition(n,1)`` of
their config: `natslink.serverconf.mapping`), the streams (probe batches, partials) and KV
buckets (leases, clock models), lease timing, and the fleet-wide window grid (wall-clock
aligned: window ``w`` is ``[w * window_ns, (w + 1) * window_ns)`` in UNIX ns, the same in
every process). Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from natslink.streams import BucketSpec, StreamSpec
from natslink.subjects import Subjects

STREAM_GAP_MIN_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Plane:
    """The data plane's settings; ValueError if inconsistent.

    ``partitions``: probe partitions (the servers' mapping); ``window_ns``: the window grid
    (the controller's tick: `controller.fleet.grid.WindowGrid`); ``grace_ns``: how long after
    a window's end a worker waits for its batches before closing it (the core's
    ``lateness_ns``: records that come later go into the oldest window still open);
    ``solver_wait_ns``: how long after ``window end + grace`` the solver waits for missing
    partitions before it solves without them (their partials are then late, counted and
    dropped); ``lease_ttl_s``: partition and solver leases; ``replicas``: of every stream and
    bucket; ``max_age_s``/``max_bytes``: the probe stream's replay buffer (the partial
    stream keeps ``max_age_s`` too); ``duplicate_window_s``: how long a message id is
    remembered (must cover a takeover's replay); ``chunk_bytes``: partials are sent in
    chunks of at most this; ``fetch_batch``: messages per pull; ``edge_owners``: 0, the
    solver does the clock work per edge itself; k >= 1, k edge owners do
    (`controller.fleet.ownerloop`); ``edge_wait_ns``: how long a solve window, otherwise
    due, waits for the owners' summary blocks (then it is judged without a clock solve).
    """

    partitions: int = 8
    window_ns: int = 1_000_000_000
    grace_ns: int = 2_000_000_000
    solver_wait_ns: int = 3_000_000_000
    lease_ttl_s: float = 3.0
    replicas: int = 3
    max_age_s: float = 600.0
    max_bytes: int = 8 << 30
    duplicate_window_s: float = 300.0
    chunk_bytes: int = 512 << 10
    fetch_batch: int = 256
    edge_owners: int = 0
    edge_wait_ns: int = 10_000_000_000
    probe_stream: str = "QPMESH_PROBES"
    partial_stream: str = "QPMESH_PARTIALS"
    lease_bucket: str = "qpmesh_leases"
    clock_bucket: str = "qpmesh_clock"

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= 1024:
            raise ValueError(f"partitions must be in 1..1024, got {self.partitions}")
        if self.window_ns <= 0 or self.grace_ns < 0 or self.solver_wait_ns < 0:
            raise ValueError("window_s must be > 0, grace_s and solver_wait_s >= 0")
        if self.duplicate_window_s * 1e9 < 2 * (self.window_ns + self.grace_ns):
            raise ValueError("duplicate_window_s must cover two windows and their grace")
        if not 1 << 10 <= self.chunk_bytes <= 8 << 20 or self.fetch_batch < 1:
            raise ValueError("chunk_bytes must be in 1 KiB..8 MiB, fetch_batch >= 1")
        if not 0 <= self.edge_owners <= 1024 or self.edge_wait_ns < 0:
            raise ValueError("edge_owners must be in 0..1024, edge_wait_s >= 0")
        StreamSpec(self.probe_stream, ("x",), self.replicas, self.max_age_s, self.max_bytes,
                   self.duplicate_window_s)  # fmt: skip

    def window_of(self, t_ns: int) -> int:
        """Return the window that holds ``t_ns``."""
        return t_ns // self.window_ns

    def window_end(self, window: int) -> int:
        """Return the first ns after ``window``."""
        return (window + 1) * self.window_ns

    def closable(self, now_ns: int) -> int:
        """Return the first window a worker may not close yet at ``now_ns`` (every window
        below it ended at least ``grace_ns`` ago)."""
        return (now_ns - self.grace_ns) // self.window_ns

    @property
    def stream_gap_ns(self) -> int:
        """Return how long a partition's stream time may jump between two messages before
        a worker takes the jump for an outage of the stream and holds its windows open
        (`controller.fleet.watermark.StreamClock`): the grace, at least 1 s (an owned
        partition stores a tick every half second when no batch comes)."""
        return max(self.grace_ns, STREAM_GAP_MIN_NS)

    def deadline(self, window: int) -> int:
        """Return when the solver stops waiting for ``window``'s missing partitions."""
        return self.window_end(window) + self.grace_ns + self.solver_wait_ns

    def probe_stream_spec(self, subjects: Subjects) -> StreamSpec:
        """Return the probe batches' stream: every partition's subjects."""
        return StreamSpec(self.probe_stream, (subjects.probes_mapped(),), self.replicas,
                          self.max_age_s, self.max_bytes, self.duplicate_window_s)  # fmt: skip

    def partial_stream_spec(self, subjects: Subjects) -> StreamSpec:
        """Return the partials' stream."""
        return StreamSpec(self.partial_stream, (subjects.partial_stream(),), self.replicas,
                          self.max_age_s, self.max_bytes, self.duplicate_window_s)  # fmt: skip

    def lease_bucket_spec(self) -> BucketSpec:
        """Return the leases' bucket (its TTL is the leases')."""
        return BucketSpec(self.lease_bucket, self.lease_ttl_s, self.replicas)

    def clock_bucket_spec(self) -> BucketSpec:
        """Return the clock models' bucket (no TTL: the newest models stay)."""
        return BucketSpec(self.clock_bucket, 0.0, self.replicas)


def partition_key(partition: int) -> str:
    """Return the lease key of ``partition``."""
    return f"part.{partition}"


def edge_key(owner: int) -> str:
    """Return the lease key of edge owner ``owner`` (`controller.fleet.ownerloop`)."""
    return f"edge.{owner}"


SOLVER_KEY = "solver"
MODELS_KEY = "models"
SOLVED_KEY = "solved"
