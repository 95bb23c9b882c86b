"""``qpmesh demo --serve HOST:PORT``: the embedded demo's live state on the HTTP API.

`DemoApi(runner, listen, token)` serves `controller.api` from a thread: after every demo step
the runner's hook publishes the controller's snapshot and new events into an `ApiHub`, so the
API only ever reads immutable snapshots. While serving, the headless demo runs in real time
(`testbed.sim.demo_runner.run_headless` with ``realtime``) so there is time to ask.
"""

from __future__ import annotations

import secrets

from contract.documents import EventDoc
from controller.api.app import make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.api.server import ApiThread, parse_listen
from testbed.sim.demo_runner import DemoRunner


def new_token() -> str:
    """Return a random operator token."""
    return secrets.token_urlsafe(18)


class DemoApi:
    """The API of a running demo: hub fed by the runner's step hook, served in a thread."""

    def __init__(self, runner: DemoRunner, listen: str, token: str) -> None:
        """Raises ValueError for a bad listen address or token."""
        self.host, port = parse_listen(listen)
        self.token = token
        self.jobs = runner.remediation.jobs
        self.hub = ApiHub(runner.controller.snapshot())
        tokens = TokenTable({token: Principal("operator", "demo")})
        # the demo's own remediation: PUT /control switches it, its job is listed, the
        # Alertmanager intake asks it; Control changes and alert requests are stamped on the
        # demo's simulated clock, the one its events carry
        app = make_app(self.hub, tokens, jobs=self.jobs, control=runner.remediation.control,
                       actions=runner.remediation.log, ask=runner.ask,
                       wall_ns=lambda: runner.now_ns)  # fmt: skip
        self.server = ApiThread(app, self.host, port)
        self.url = ""
        self._runner = runner
        runner.on_step.append(self._publish)

    def _publish(self, events: list[EventDoc]) -> None:
        self.hub.publish(self._runner.controller.snapshot(), tuple(events))

    def start(self) -> str:
        """Serve; return the base URL. Raises OSError if the address is taken."""
        port = self.server.start()
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{port}/api/v1/"
        return self.url

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._publish in self._runner.on_step:
            self._runner.on_step.remove(self._publish)
        self.server.stop()
