"""The API inside the controller service (thin shell): hub + app + site on the service's loop.

`ApiRuntime(config, snapshot, jobs=..., control=..., actions=...)`; ``await start()`` serves and returns the
base URL; the service calls `publish(snapshot, events)` after every tick (from the loop's
thread or another); ``await stop()`` ends serving.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from controller.api.app import AlertIntake, ApiStats, JobStatus, api_stats, make_app
from controller.api.config import ApiConfig
from controller.api.hub import ApiHub
from controller.api.server import start_api
from controller.control import Control
from controller.jobs import JobRegistry
from controller.remediation.audit import ActionLog
from controller.snapshot import MeshEvent, MeshSnapshot


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
    ) -> None:
        """``on_clients`` gets the number of websocket clients after every publish (the
        service's websocket-clients gauge)."""
        self.config = config
        self._on_clients = on_clients
        self.hub = ApiHub(snapshot)
        self.jobs = jobs or JobRegistry()
        self.app = make_app(self.hub, config.tokens, jobs=self.jobs, control=control,
                            actions=actions, ask=ask, job_status=job_status,
                            options=config.options)  # fmt: skip
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        """Serve on the configured address; return the base URL. Raises OSError."""
        self._runner, port = await start_api(self.app, self.config.host, self.config.port)
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        self.url = f"http://{host}:{port}/api/v1/"
        return self.url

    def publish(self, snapshot: MeshSnapshot | None, events: tuple[MeshEvent, ...]) -> None:
        """Hand the API the latest snapshot (None keeps the current one) and new events."""
        self.hub.publish(snapshot, events)
        self._on_clients(self.hub.clients)

    @property
    def stats(self) -> ApiStats:
        """Return the API's counters."""
        return api_stats(self.app)

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
