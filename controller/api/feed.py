"""What the controller process and its API process (`controller.api.child`) tell each other.

Pure values, pickled into length-prefixed frames by the shells (`controller.api.process` in
the controller, `controller.api.child` in the API process). Controller -> API: `Init` (the
fabric, the ``[api]`` config, the tenants' grants, the first snapshot and the shared state), then per tick `Snap`
(a snapshot without its fabric: `pack_snapshot` / `unpack_snapshot`) and `Tick` (new events
and/or the shared state), `Reply` (the answer to a `Call`, with the state after it) and
`Stop`. API -> controller: `Ready`, `Call` (a write the API accepted: register or unregister
a job, switch Control, an Alertmanager webhook; applied in the controller, which keeps the
state), `Clients` (websocket clients attached) and `Log` (a ``logging`` record of the API
process, aiohttp's tracebacks included: the controller writes it into its JSON-lines log).

`SharedState` is what the API reads of the controller besides snapshots and events: the job
registry, Control with its recent audit, the action log (only when it changed: ``actions``
None = as before) and each job's step-time status. `Mirror` holds it in the API process and
offers the read-only views `controller.api.app` takes (`JobsView`, `ControlView`, the
`ActionLog`, ``job_status``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.documents import EventDoc
from controller.api.config import ApiConfig
from controller.control import ControlChange
from controller.jobs import Job
from controller.remediation.audit import ActionLog, ActionQuery
from controller.tenancy import Grants
from mesh.fabric import Fabric
from mesh.snapshot import MeshSnapshot

CONTROL_AUDIT = 20  # Control changes the API shows (the newest)


@dataclass(frozen=True)
class SharedState:
    """The controller's jobs, Control (None = unavailable: enabled, newest audit entries),
    action log (None = unchanged since the last state sent) and job status per job id."""

    jobs: tuple[Job, ...] = ()
    control: tuple[bool, tuple[ControlChange, ...]] | None = None
    actions: tuple[dict[str, Any], ...] | None = None
    job_status: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass(frozen=True)
class Init:
    """The first message: what the API process serves."""

    fabric: Fabric
    config: ApiConfig
    snapshot: dict[str, Any]
    state: SharedState
    can_ask: bool
    has_actions: bool
    grants: Grants | None = None


@dataclass(frozen=True)
class Snap:
    """A new snapshot (`pack_snapshot`)."""

    snapshot: dict[str, Any]


@dataclass(frozen=True)
class Tick:
    """New events and/or the shared state (None = unchanged)."""

    events: tuple[EventDoc, ...] = ()
    state: SharedState | None = None


@dataclass(frozen=True)
class Call:
    """A write to apply in the controller: ``op`` is a `Commands` method name."""

    id: int
    op: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Reply:
    """The answer to call ``id``: ``error`` (kind, message) or None, the result, the state
    after the call."""

    id: int
    error: tuple[str, str] | None
    result: Any
    state: SharedState


@dataclass(frozen=True)
class Ready:
    """The API process serves."""


@dataclass(frozen=True)
class Clients:
    """Websocket clients attached now."""

    n: int


@dataclass(frozen=True)
class Log:
    """A log record of the API process: level, logger, message with its traceback."""

    level: str
    logger: str
    text: str


@dataclass(frozen=True)
class Stop:
    """Stop serving and exit."""


def pack_snapshot(snap: MeshSnapshot, fabric: Fabric) -> dict[str, Any]:
    """Return ``snap``'s fields without the fabric when it is ``fabric`` (the one `Init`
    carried): what `unpack_snapshot` takes."""
    out = {f.name: getattr(snap, f.name) for f in dataclasses.fields(snap)}
    if out["fabric"] is fabric:
        del out["fabric"]
    return out


def unpack_snapshot(fields: Mapping[str, Any], fabric: Fabric) -> MeshSnapshot:
    """Return the snapshot of `pack_snapshot` (``fabric`` unless it carried its own); raises
    ValueError or TypeError on fields that do not make a snapshot."""
    return MeshSnapshot(**{"fabric": fabric, **fields})


class _Jobs:
    """The mirrored job registry (read-only; `controller.api.app.JobsView`)."""

    def __init__(self) -> None:
        self._jobs: tuple[Job, ...] = ()

    def load(self, jobs: tuple[Job, ...]) -> None:
        self._jobs = jobs

    def get(self, job_id: str) -> Job | None:
        """Return the job ``job_id`` or None."""
        return next((j for j in self._jobs if j.id == job_id), None)

    def jobs(self) -> tuple[Job, ...]:
        """Return every job, in registration order."""
        return self._jobs

    def jobs_of(self, tenant: str) -> tuple[Job, ...]:
        """Return the jobs of ``tenant``."""
        return tuple(j for j in self._jobs if j.tenant == tenant)

    def tenant_nics(self, tenant: str) -> frozenset[str]:
        """Return the NIC ids used by any job of ``tenant``."""
        return frozenset(n for j in self.jobs_of(tenant) for n in j.nics)


class _Control:
    """The mirrored Control (read-only; `controller.api.app.ControlView`)."""

    def __init__(self) -> None:
        self._enabled = False
        self._audit: tuple[ControlChange, ...] = ()

    def load(self, enabled: bool, audit: tuple[ControlChange, ...]) -> None:
        self._enabled, self._audit = enabled, audit

    @property
    def enabled(self) -> bool:
        """Return whether the controller may act."""
        return self._enabled

    def audit(self) -> tuple[ControlChange, ...]:
        """Return the newest recorded changes, oldest first."""
        return self._audit


class Mirror:
    """The `SharedState` as the API process reads it (apply each state as it arrives)."""

    def __init__(self, state: SharedState) -> None:
        self.jobs = _Jobs()
        self._control = _Control()
        self.has_control = state.control is not None
        self.actions = ActionLog()
        self._status: Mapping[str, Mapping[str, object]] = {}
        self.apply(state)

    @property
    def control(self) -> _Control | None:
        """Return the Control mirror, None when the controller has no Control."""
        return self._control if self.has_control else None

    def apply(self, state: SharedState) -> None:
        """Take ``state`` (the action log only when it carries one)."""
        self.jobs.load(state.jobs)
        if state.control is not None:
            self._control.load(*state.control)
        if state.actions is not None:
            log = ActionLog()
            log.restore(list(state.actions))
            self.actions = log
        self._status = state.job_status

    def query(self, q: ActionQuery, tenant: str | None = None) -> dict[str, Any]:
        """Return ``GET /actions`` of the mirrored action log (`ActionLog.query`)."""
        return self.actions.query(q, tenant)

    def job_status(self, job_id: str) -> Mapping[str, object] | None:
        """Return job ``job_id``'s step-time status, or None."""
        return self._status.get(job_id)


def init_message(
    fabric: Fabric, config: ApiConfig, snap: MeshSnapshot, state: SharedState, *,
    can_ask: bool, has_actions: bool, grants: Grants | None = None,
) -> Init:  # fmt: skip
    """Return the `Init` of an API process serving ``config`` from ``snap`` on, with the
    tenants' NIC grants (None: tenants hold none)."""
    return Init(fabric, config, pack_snapshot(snap, fabric), state, can_ask, has_actions,
                grants)  # fmt: skip
