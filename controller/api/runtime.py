"""The API of a controller service, served by its own process (thin shell).

`ApiRuntime(config, snapshot, jobs=..., control=..., actions=...)` (the tenants' NIC grants
are the job registry's, `JobRegistry.grants`): ``start()`` starts the API process
(`controller.api.process.ApiProcess`, `controller.api.child`) and returns the base URL once
it serves (``https://`` when ``config.access`` names TLS files: the API process serves TLS); the service calls `publish(snapshot, events)` after every tick
(nothing there waits for the API: the snapshot is pickled and written by a thread, requests
are served in the other process). The API's writes come back as calls that run on the
service's event loop (``submit``) against the job registry, Control and Alertmanager intake
given here, with their usual checks and audit; after each the API process mirrors the
state. ``await stop()`` ends serving. The API process holds no state of its own: the
runtime keeps the last `EVENT_LOG` events published, so when the process dies (a bug, or
killed) the next `publish` notices and starts another, which is handed the controller's
snapshot, state and those events (also the ones published while it was starting; their
sequence numbers start again at 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any

from contract.documents import EventDoc
from controller.api.app import AlertIntake, JobStatus
from controller.api.config import ApiConfig
from controller.api.feed import CONTROL_AUDIT, SharedState
from controller.api.process import ApiProcess
from controller.control import Control
from controller.jobs import Job, JobRegistry
from controller.remediation.audit import ActionLog
from mesh.snapshot import MeshSnapshot

START_TIMEOUT_S = 60.0  # the API process imports numpy and aiohttp: seconds on a busy host
EVENT_LOG = 10_000  # events kept for a new API process (the API's own event log holds as many)


class ApiRuntime:
    """The served API of a controller."""

    def __init__(
        self,
        config: ApiConfig,
        snapshot: MeshSnapshot,
        *,
        jobs: JobRegistry | None = None,
        control: Control | None = None,
        actions: ActionLog | None = None,
        ask: AlertIntake | None = None,
        job_status: JobStatus | None = None,
        on_clients: Callable[[int], None] = lambda n: None,
        log: Callable[[str], None] = lambda msg: None,
    ) -> None:
        """``on_clients`` gets the number of websocket clients when it changes (the
        service's websocket-clients gauge); ``log`` gets channel problems."""
        self.config = config
        self.jobs = jobs or JobRegistry()
        self.control, self.actions, self._ask, self._job_status = control, actions, ask, job_status
        self._actions_sent = -1
        self._last: SharedState | None = None
        self._snapshot = snapshot
        self._on_clients, self._log = on_clients, log
        self.process: ApiProcess | None = None
        self.url = ""
        self.restarts = 0
        self._restarting: asyncio.Task[None] | None = None
        self._events: deque[EventDoc] = deque(maxlen=EVENT_LOG)

    def state(self, *, full: bool = False) -> SharedState:
        """Return the shared state now; the action log only when it changed since the last
        state returned (or with ``full``)."""
        ctl = None
        if self.control is not None:
            ctl = (self.control.enabled, self.control.audit()[-CONTROL_AUDIT:])
        acts = None
        if self.actions is not None and (full or self.actions.version != self._actions_sent):
            self._actions_sent = self.actions.version
            acts = self.actions.records()
        jobs = self.jobs.jobs()
        status: dict[str, Any] = {}
        if self._job_status is not None:
            for j in jobs:
                doc = self._job_status(j.id)
                if doc is not None:
                    status[j.id] = doc
        return SharedState(jobs, ctl, acts, status)

    def _handle(self, op: str, args: tuple[Any, ...]) -> Any:
        if op == "register_job":
            job = args[0]
            if not isinstance(job, Job):
                raise TypeError("register_job takes a Job")
            self.jobs.register(job)
            return None
        if op == "unregister_job":
            self.jobs.unregister(str(args[0]))
            return None
        if op == "set_control":
            if self.control is None:
                raise RuntimeError("no Control")
            self.control.set(bool(args[0]), str(args[1]), int(args[2]))
            return None
        if op == "ask":
            if self._ask is None:
                raise RuntimeError("no Alertmanager intake")
            return dict(self._ask(args[0], int(args[1])))
        raise ValueError(f"unknown call {op!r}")

    async def start(self) -> str:
        """Start the API process; return the base URL once it serves. Raises OSError (the
        address is taken, or the process did not start)."""
        loop = asyncio.get_running_loop()
        proc = ApiProcess(
            self.config, self._snapshot.fabric, self._snapshot, lambda: self.state(full=True),
            handle=self._handle, submit=loop.call_soon_threadsafe,
            on_clients=self._on_clients, can_ask=self._ask is not None,
            has_actions=self.actions is not None, log=self._log, grants=self.jobs.grants,
        )  # fmt: skip
        self._last = None
        port = proc.start()  # in the loop's thread: the API process dies with it
        self.process = proc
        try:
            await asyncio.to_thread(proc.wait_ready, START_TIMEOUT_S)
        except BaseException:
            self.process = None
            await asyncio.to_thread(proc.stop, 1.0)
            raise
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        self.url = f"{self.config.access.scheme}://{host}:{port}/api/v1/"
        if self._events:  # a replacement: the events its predecessor had, and any since
            proc.publish(None, tuple(self._events), None)
        return self.url

    async def _restart(self, code: int | None) -> None:
        self._log(f"the API process exited (code {code}); starting a new one")
        await asyncio.sleep(1.0)  # never a tight loop of failing starts
        try:
            url = await self.start()
        except OSError as exc:
            self._log(f"the API process did not restart: {exc}")
            return
        self.restarts += 1
        self._log(f"the API process serves again at {url}")

    def publish(self, snapshot: MeshSnapshot | None, events: tuple[EventDoc, ...]) -> None:
        """Hand the API the latest snapshot (None keeps the current one), new events, and the
        shared state when it changed."""
        if snapshot is not None:
            self._snapshot = snapshot
        self._events.extend(events)
        if self._restarting is not None and not self._restarting.done():
            return
        if self.process is None:
            return
        code = self.process.exit_code()
        if code is not None:  # it died (a bug, or killed): serve again, from this snapshot
            proc, self.process = self.process, None
            proc.stop(0.0)
            self._restarting = asyncio.get_running_loop().create_task(self._restart(code))
            return
        state = self.state()
        same = dataclasses.replace(state, actions=None)
        if same == self._last and state.actions is None:
            self.process.publish(snapshot, events, None)
        else:
            self._last = same
            self.process.publish(snapshot, events, state)

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._restarting is not None:
            self._restarting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._restarting
        if self.process is not None:
            proc, self.process = self.process, None
            await asyncio.to_thread(proc.stop)
