"""The job registry: which tenant's job runs on which NICs (pure, in memory).

A `Job` is an id, a tenant and its ranks, each rank with the NIC ids it uses. Job ids are
global (they name MQTT topics and remediation actions), so a tenant has a namespace of its
own: an id ``T:name`` belongs to tenant ``T`` (`Job` refuses it for anyone else), and the API
lets a tenant register ids in its namespace only; so no tenant can take, or learn of, an id
another tenant holds. `JobRegistry` holds the running jobs: `register` (a new id; raises
`JobError` on a duplicate or a bad job), `put` (add or replace, same tenant), `unregister`
(raises `JobError` for an unknown id), `get`, `jobs`, `jobs_of(tenant)` and
`tenant_nics(tenant)`; `screen_jobs` gives the mesh screen's view of them. The operator's
grants (`controller.tenancy.Grants`) bind every job, however it arrives (the API, a recovery
agent's rank on MQTT): a tenant's job runs only on NICs granted to that tenant, the
operator's jobs only on NICs granted to nobody (`Grants.may_use`). The API scopes a
tenant's view by the grants, never by its jobs. Methods take a lock, so the API's event loop
and another thread may share one registry.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from controller.tenancy import NAME, Grants

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class JobError(ValueError):
    """A bad job, a duplicate job id or an unknown job id."""


@dataclass(frozen=True, slots=True)
class Job:
    """A job: ``id``, ``tenant``, and ``ranks`` (per rank, the ids of the NICs it uses, no
    NIC twice in one rank; ranks may share a NIC). An id ``T:name`` must have tenant ``T``."""

    id: str
    tenant: str
    ranks: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if not _ID.match(self.id) or not NAME.match(self.tenant):
            raise JobError(f"bad job id {self.id!r} or tenant {self.tenant!r}")
        space, sep, _ = self.id.partition(":")
        if sep and space != self.tenant:
            raise JobError(f"job id {self.id!r} lies in tenant {space}'s namespace")
        if not self.ranks or any(not r for r in self.ranks):
            raise JobError(f"job {self.id}: needs at least one rank, each with a NIC")
        for k, r in enumerate(self.ranks):
            if len(set(r)) != len(r):
                raise JobError(f"job {self.id}: rank {k} names a NIC twice")

    @property
    def nics(self) -> frozenset[str]:
        """Return the NIC ids of every rank."""
        return frozenset(n for r in self.ranks for n in r)


class JobRegistry:
    """The running jobs, by id (thread-safe)."""

    def __init__(self, jobs: tuple[Job, ...] = (), *, grants: Grants | None = None) -> None:
        """``grants``: the operator's NIC grants (None: none, any job may use any NIC)."""
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self.grants = grants if grants is not None else Grants()
        for j in jobs:
            self.register(j)

    def _granted(self, job: Job) -> None:
        for nic in sorted(job.nics):
            if not self.grants.may_use(job.tenant, nic):
                raise JobError(f"job {job.id}: {nic} is not granted to tenant {job.tenant}")

    def register(self, job: Job) -> None:
        """Add ``job``; raise `JobError` if its id is already registered or it uses a NIC
        its tenant may not (`Grants.may_use`)."""
        self._granted(job)
        with self._lock:
            if job.id in self._jobs:
                raise JobError(f"job {job.id!r} is already registered")
            self._jobs[job.id] = job

    def put(self, job: Job) -> Job | None:
        """Add ``job`` or replace the job of that id (its ranks changed); return the job it
        replaced, or None. Raises `JobError` if that id belongs to another tenant or the job
        uses a NIC its tenant may not (`Grants.may_use`)."""
        self._granted(job)
        with self._lock:
            old = self._jobs.get(job.id)
            if old is not None and old.tenant != job.tenant:
                raise JobError(f"job {job.id!r} belongs to another tenant")
            self._jobs[job.id] = job
            return old

    def unregister(self, job_id: str) -> Job:
        """Remove and return the job ``job_id``; raise `JobError` if it is unknown."""
        with self._lock:
            try:
                return self._jobs.pop(job_id)
            except KeyError:
                raise JobError(f"no job {job_id!r}") from None

    def get(self, job_id: str) -> Job | None:
        """Return the job ``job_id`` or None."""
        with self._lock:
            return self._jobs.get(job_id)

    def jobs(self) -> tuple[Job, ...]:
        """Return every job, in registration order."""
        with self._lock:
            return tuple(self._jobs.values())

    def jobs_of(self, tenant: str) -> tuple[Job, ...]:
        """Return the jobs of ``tenant``."""
        return tuple(j for j in self.jobs() if j.tenant == tenant)

    def tenant_nics(self, tenant: str) -> frozenset[str]:
        """Return the NIC ids used by any job of ``tenant`` (empty if it has none)."""
        return frozenset(n for j in self.jobs_of(tenant) for n in j.nics)


def screen_jobs(jobs: tuple[Job, ...]) -> tuple[dict[str, object], ...]:
    """Return ``jobs`` as the mesh screen's entries: ``{"name": id, "tenant", "nics": NIC ids
    in rank order}`` (the shape `mesh.documents.jobs_from_doc` makes of the API's ``/jobs``)."""
    return tuple(
        {"name": j.id, "tenant": j.tenant, "nics": [n for r in j.ranks for n in r]} for j in jobs
    )
