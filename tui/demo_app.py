"""The mesh screen on top of the embedded demo, with keys that inject faults.

The simulator + controller step runs in a worker thread (one step at a time); the screen reads
the snapshot that step produced, so the UI never waits on a step. Keys: ``f`` link flap,
``e`` ECMP contention, ``n`` NIC failure, ``x`` clear faults, plus every `MeshApp` key.
"""

from __future__ import annotations

import threading
from typing import ClassVar, Protocol

import numpy as np
import numpy.typing as npt
from textual.binding import Binding, BindingType

from mesh.snapshot import MeshSnapshot
from tui.app import MeshApp


class DemoFault(Protocol):
    """A fault the demo injected (what the notification shows)."""

    @property
    def kind(self) -> object: ...
    @property
    def target(self) -> str: ...
    @property
    def start_s(self) -> float: ...


class DemoController(Protocol):
    """The controller under the demo: what the screen reads and switches."""

    def snapshot(self) -> MeshSnapshot: ...
    def history(
        self, nic: int, window_s: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
    def set_control(self, enabled: bool) -> None: ...


class DemoDriver(Protocol):
    """What the demo screen needs of the simulation under it (the testbed's `DemoDriver`).

    ``step`` advances one step of ``step_s`` simulated seconds; ``inject(kind)`` starts a fault
    of demo kind ``kind`` (flap, contention, nic_down) now; ``clear`` ends them all.
    """

    @property
    def step_s(self) -> float: ...
    @property
    def nic_count(self) -> int: ...
    @property
    def controller(self) -> DemoController: ...
    def step(self) -> object: ...
    def inject(self, kind: str) -> DemoFault: ...
    def clear(self) -> None: ...


class DemoSource:
    """`SnapshotSource` over a `DemoDriver`: `advance` steps it (thread-safe), `snapshot` returns
    the snapshot taken after the last completed step."""

    def __init__(self, runner: DemoDriver) -> None:
        self.runner = runner
        self.lock = threading.Lock()
        self._snap = runner.controller.snapshot()

    def advance(self) -> None:
        """Run one simulator + controller step and keep its snapshot."""
        with self.lock:
            self.runner.step()
            self._snap = self.runner.controller.snapshot()

    def snapshot(self) -> MeshSnapshot:
        """Return the snapshot of the last completed step."""
        return self._snap

    def history(
        self, nic: int, window_s: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Return the controller's history of ``nic`` (waits for a running step)."""
        with self.lock:
            return self.runner.controller.history(nic, window_s)

    def set_control(self, enabled: bool) -> None:
        """Forward to the controller (which may raise `ControlUnavailable`)."""
        with self.lock:
            self.runner.controller.set_control(enabled)

    def inject(self, kind: str) -> str:
        """Inject a demo fault; return a one-line description."""
        with self.lock:
            f = self.runner.inject(kind)
        return f"injected {f.kind} on {f.target} at t={f.start_s:.1f}s"

    def clear(self) -> None:
        """End every fault now."""
        with self.lock:
            self.runner.clear()


class DemoApp(MeshApp):
    """`MeshApp` driving a `DemoDriver` in simulated time (one step per refresh)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "inject('flap')", "flap"),
        Binding("e", "inject('contention')", "contention"),
        Binding("n", "inject('nic_down')", "NIC down"),
        Binding("x", "clear", "clear"),
    ]

    def __init__(self, runner: DemoDriver, *, threshold_ns: float = 5_000.0) -> None:
        self.demo = DemoSource(runner)
        super().__init__(
            self.demo, interval_s=runner.step_s, threshold_ns=threshold_ns, on_tick=self._kick
        )
        self.sub_title = f"demo: {runner.nic_count} NICs, simulated"

    def _kick(self) -> None:
        if not self.demo.lock.locked():
            self.run_worker(self.demo.advance, thread=True, exclusive=True, group="sim")

    def action_inject(self, kind: str) -> None:
        """Inject a link flap, an ECMP contention or a NIC failure now."""
        self.notify(self.demo.inject(kind))

    def action_clear(self) -> None:
        """Clear every fault."""
        self.demo.clear()
        self.notify("faults cleared")
