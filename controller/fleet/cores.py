"""What the fleet's shells need of the pure core (`controller.fleet.worker`,
`controller.fleet.solver`): complete protocols, so a shell is tested with a stand-in and
runs with the real core unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from contract.documents import EventDoc
from controller.admission import Verdict


class CoversLike(Protocol):
    """The batches a partial holds."""

    def __len__(self) -> int: ...

    def batches(self) -> set[tuple[str, int]]: ...


class PartialLike(Protocol):
    """One window's mergeable partial of one worker core."""

    @property
    def window(self) -> int: ...

    @property
    def covers(self) -> CoversLike: ...

    def encode(self) -> bytes: ...


class WorkerCore(Protocol):
    """An ingest worker's core: admits batches, closes windows into partials: ``close(now)``
    closes every window whose end is at least the plane's grace before ``now``."""

    def admit(self, host: str, payload: bytes, now_ns: int) -> Verdict: ...

    def close(self, upto_ns: int) -> Sequence[PartialLike]: ...

    def install_clock(self, models: bytes) -> None: ...


class SolveResultLike(Protocol):
    """What one window's solve gives the shell."""

    @property
    def events(self) -> Sequence[EventDoc]: ...

    @property
    def clock(self) -> bytes: ...


class SolverCore(Protocol):
    """The solver's core: merges partials (encoded), solves a window."""

    def add(self, partial: bytes) -> None: ...

    def solve(self, window: int, now_ns: int) -> SolveResultLike: ...


class BlockSink(Protocol):
    """A solver core with edge owners apart (`controller.fleet.ownerloop`): takes their
    encoded summary blocks, says which windows need them and how many are in."""

    def add_block(self, block: bytes) -> None: ...

    def needs_blocks(self, window: int) -> bool: ...

    def blocks_in(self, window: int) -> int: ...

    def use_stages(self, remote: Callable[..., Any]) -> None:
        """Run the solve windows' rounds through ``remote`` (the owners apart answer them:
        `controller.fleet.stagelink.StageLink.ranges`)."""


class FleetCore(SolverCore, BlockSink, Protocol):
    """The solver core the controller service runs (`controller.fleet.compose.SolverCore`):
    partials, and with edge owners apart their blocks."""
