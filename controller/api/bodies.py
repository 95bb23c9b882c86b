"""The API's request bodies, read strictly (pure): JSON values in, values or one-line errors out.

Every rule here is stated in ``docs/openapi.yaml`` (a test keeps the two together), so a
body the description allows is never refused for a reason it does not state, and one it
forbids is always refused. `job_body` reads ``POST /jobs``: ``{"id", "tenant"?, "ranks":
[{"nics": [...]}, ...]}``; a rank's number is its place in ``ranks`` (a ``rank`` key is an
unknown key: nothing is renumbered behind the caller's back), a rank names each NIC once.
A tenant registers jobs for itself only, with ids in its own namespace ``<tenant>:<name>``
(`controller.jobs.Job`): so no tenant can take, or learn of, another tenant's job id.
`control_body` reads ``PUT /control``. Errors: `BadQuery` (400) and `Forbidden` (403) of
`controller.api.views`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from controller.api.auth import Principal
from controller.api.views import BadQuery, Forbidden
from controller.jobs import Job, JobError
from controller.tenancy import NAME

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
MAX_RANKS = 4096
MAX_RANK_NICS = 64
MAX_ID = 128
JOB_SHAPE = '{"id": str, "tenant": str, "ranks": [{"nics": [str, ...]}, ...]}'


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise BadQuery(f"body names {k!r} twice")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise BadQuery(f"body must be JSON ({name} is not)")


def parse_json(data: bytes, want: str) -> Any:
    """Return the JSON value of body ``data`` (None for an empty body); raise `BadQuery` for
    anything but UTF-8 JSON, an object naming a key twice, or NaN/Infinity."""
    if not data:
        return None
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates,
                          parse_constant=_no_constant)  # fmt: skip
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, BadQuery):
            raise
        raise BadQuery(f"body must be JSON: {want}") from None


def _strict_keys(v: Any, required: set[str], optional: set[str], what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadQuery(f"{what} must be an object")
    missing = sorted(required - set(v))
    if missing:
        raise BadQuery(f"{what}: {missing[0]!r} is required")
    extra = sorted(set(v) - required - optional)
    if extra:
        raise BadQuery(f"{what}: unknown key {extra[0]!r}")
    return v


def _nic_list(v: Any, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_RANK_NICS:
        raise BadQuery(f"{what} must be a list of 1..{MAX_RANK_NICS} NIC ids")
    if not all(isinstance(n, str) and 1 <= len(n) <= MAX_ID for n in v):
        raise BadQuery(f"{what} must hold NIC ids (strings of 1..{MAX_ID} characters)")
    if len(set(v)) != len(v):
        raise BadQuery(f"{what} names a NIC twice")
    return tuple(v)


def job_body(body: Any, who: Principal) -> Job:
    """Return the job of a ``POST /jobs`` body sent by ``who``. Raises `BadQuery` for a
    body without the shape (see the module docstring), `Forbidden` when a tenant names
    another tenant or an id outside its namespace."""
    doc = _strict_keys(body, {"id", "ranks"}, {"tenant"}, "body")
    job_id, tenant = doc["id"], doc.get("tenant", "default" if who.is_operator else who.name)
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise BadQuery("id must be 1..128 of [A-Za-z0-9_.:-], starting with a letter or digit")
    if not isinstance(tenant, str) or not NAME.match(tenant):
        raise BadQuery("tenant must be 1..64 of [A-Za-z0-9_.-], starting with a letter or digit")
    if not who.is_operator:
        if tenant != who.name:
            raise Forbidden("a tenant token registers its own jobs only")
        if not job_id.startswith(f"{who.name}:"):
            raise Forbidden(f"a tenant's job ids start with its name and a colon: {who.name}:...")
    ranks = doc["ranks"]
    if not isinstance(ranks, list) or not 1 <= len(ranks) <= MAX_RANKS:
        raise BadQuery(f"ranks must be a list of 1..{MAX_RANKS} ranks")
    nics = tuple(
        _nic_list(_strict_keys(r, {"nics"}, set(), f"ranks[{k}]")["nics"], f"ranks[{k}].nics")
        for k, r in enumerate(ranks)
    )
    try:
        return Job(job_id, tenant, nics)
    except JobError as exc:  # an operator's id in a tenant's namespace
        raise Forbidden(str(exc)) from None


def control_body(body: Any) -> bool:
    """Return ``enabled`` of a ``PUT /control`` body; raise `BadQuery` unless it is exactly
    ``{"enabled": true|false}``."""
    doc = _strict_keys(body, {"enabled"}, set(), "body")
    if not isinstance(doc["enabled"], bool):
        raise BadQuery('body must be {"enabled": true|false}')
    return doc["enabled"]
