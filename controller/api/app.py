"""The aiohttp application of ``/api/v1/``: thin handlers over `controller.api.views`.

`make_app(model, tokens, ...)` returns the app. ``model`` is the narrow `ReadModel` (the
`controller.api.hub.ApiHub` the producer publishes into); ``jobs``, ``control`` and
``actions`` are the controller's `JobRegistry`, `Control` (None = unavailable) and
remediation `ActionLog` (None = no actions); ``ask`` takes Alertmanager webhooks
(``POST /alertmanager``; None = unavailable); ``job_status`` gives each job's step time
and slowdown attribution (``perf`` in ``/jobs``). Writes (job registration, Control, the
Alertmanager intake) go through ``commands`` (`Commands`; default `LocalCommands` on the
``jobs``/``control``/``ask`` given); the API process (`controller.api.child`) passes read-only
mirrors of those and commands that ask the controller process. Every request needs a
bearer token (401 otherwise), except ``OPTIONS`` (a browser's preflight) and a websocket
opened with a ticket (``POST /tickets``, `controller.api.access`); a tenant token sees only
the NICs the operator granted it (``grants``, `controller.tenancy.Grants`; another tenant's
NIC, job or anything else answers 404, exactly like one that does not exist); every token has
a token bucket (429 past it). ``access`` (`WebAccess`) holds the browser origins allowed
(CORS) and the ticket lifetime; TLS is the server's business (`controller.api.server`).
Every error is a JSON body ``{"error": {"status", "message"}}``; 4xx answers are counted per
route in `ApiStats` (shown to operators by ``/api/v1/health``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from contract.documents import EventDoc
from controller.api.access import (
    Tickets,
    WebAccess,
    cors_headers,
    origin_allowed,
    preflight_headers,
)
from controller.api.auth import Principal, TokenBucket, TokenTable, bearer
from controller.api.bodies import control_body, job_body, parse_json
from controller.api.hub import Subscriber, snapshot_wait
from controller.api.views import (
    BadQuery,
    Forbidden,
    NotFound,
    Scope,
    actions_view,
    clocks_view,
    delays_view,
    event_view,
    events_view,
    jobs_view,
    links_view,
    nic_index,
    parse_event_query,
    snapshot_view,
    tenant_scope,
)
from controller.control import Control, ControlChange
from controller.jobs import Job, JobError, JobRegistry
from controller.remediation.alerts import WebhookError, known_only
from controller.remediation.audit import ActionQuery, ActionQueryError, parse_action_query
from controller.tenancy import Grants
from mesh.documents import job_doc, nic_doc
from mesh.snapshot import MeshSnapshot

log = logging.getLogger(__name__)

API_VERSION = "v1"
PREFIX = "/api/v1"


AlertIntake = Callable[[Any, int], Mapping[str, object]]
"""(Alertmanager webhook payload, now ns) -> summary; raises `WebhookError` when malformed."""


JobStatus = Callable[[str], Mapping[str, object] | None]
"""job id -> its step-time figures and slowdown attribution (``perf`` in ``/jobs``), or None."""


class JobsView(Protocol):
    """What the API reads of the job registry (`JobRegistry` or a mirror of it)."""

    def get(self, job_id: str) -> Job | None: ...
    def jobs(self) -> tuple[Job, ...]: ...
    def jobs_of(self, tenant: str) -> tuple[Job, ...]: ...
    def tenant_nics(self, tenant: str) -> frozenset[str]: ...


class ControlView(Protocol):
    """What the API reads of Control (`Control` or a mirror of it)."""

    @property
    def enabled(self) -> bool: ...
    def audit(self) -> tuple[ControlChange, ...]: ...


class ActionsView(Protocol):
    """What the API reads of the action log (`ActionLog` or a mirror of it)."""

    def query(self, q: ActionQuery, tenant: str | None = None) -> dict[str, Any]: ...


class Commands(Protocol):
    """The API's writes, applied where the state lives. Each raises what the local operation
    raises (`JobError`, `WebhookError`); ``can_ask`` False = no Alertmanager intake (409)."""

    can_ask: bool

    async def register_job(self, job: Job) -> None: ...
    async def unregister_job(self, job_id: str) -> None: ...
    async def set_control(self, enabled: bool, actor: str, t_ns: int) -> None: ...
    async def ask(self, payload: Any, now_ns: int) -> Mapping[str, object]: ...


class LocalCommands:
    """`Commands` on this process's registry, Control and intake (the API served in the
    producer's process: the demo, tests)."""

    def __init__(self, jobs: JobRegistry, control: Control | None, ask: AlertIntake | None):
        self._jobs, self._control, self._ask = jobs, control, ask
        self.can_ask = ask is not None

    async def register_job(self, job: Job) -> None:
        """Register ``job``; raises `JobError` on a duplicate id."""
        self._jobs.register(job)

    async def unregister_job(self, job_id: str) -> None:
        """Unregister ``job_id``; raises `JobError` if it is gone."""
        self._jobs.unregister(job_id)

    async def set_control(self, enabled: bool, actor: str, t_ns: int) -> None:
        """Switch Control (audited); raises RuntimeError without Control."""
        if self._control is None:
            raise RuntimeError("no Control")
        self._control.set(enabled, actor, t_ns)

    async def ask(self, payload: Any, now_ns: int) -> Mapping[str, object]:
        """Take an Alertmanager webhook; raises `WebhookError`, RuntimeError without intake."""
        if self._ask is None:
            raise RuntimeError("no Alertmanager intake")
        return self._ask(payload, now_ns)


class ReadModel(Protocol):
    """What the API reads: the latest snapshot, the event log, subscriptions, health."""

    def snapshot(self) -> MeshSnapshot: ...
    def events(self) -> Sequence[tuple[int, EventDoc]]: ...
    def subscribe(self) -> Subscriber: ...
    def unsubscribe(self, sub: Subscriber) -> None: ...
    def health(self) -> Mapping[str, object]: ...


@dataclass
class ApiStats:
    """Counters: requests and 4xx/5xx answers per route, websocket messages sent."""

    requests: Counter[str] = field(default_factory=Counter)
    client_errors: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    ws_sent: int = 0

    def to_dict(self) -> dict[str, object]:
        """Return the counters as JSON-ready values."""
        return {
            "requests": sum(self.requests.values()),
            "client_errors": dict(self.client_errors),
            "server_errors": dict(self.server_errors),
            "ws_messages_sent": self.ws_sent,
        }


@dataclass(frozen=True)
class ApiOptions:
    """Rate limit per token (requests/s and burst) and the websocket snapshot interval."""

    rate_per_s: float = 50.0
    burst: float = 100.0
    ws_min_interval_s: float = 0.25

    def __post_init__(self) -> None:
        TokenBucket.full(self.rate_per_s, self.burst, 0.0)  # validates
        if not self.ws_min_interval_s > 0:
            raise ValueError("ws_min_interval_s must be > 0")


@dataclass
class _State:
    model: ReadModel
    tokens: TokenTable
    jobs: JobsView
    control: ControlView | None
    actions: ActionsView | None
    commands: Commands
    job_status: JobStatus | None
    options: ApiOptions
    clock: Callable[[], float]
    wall_ns: Callable[[], int]
    grants: Grants
    access: WebAccess
    tickets: Tickets
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    # the latest fleet snapshot document without Control and jobs: (snapshot, JSON text)
    fleet_base: tuple[MeshSnapshot, str] | None = None
    # ... and with them: ((snapshot, control, jobs), UTF-8 JSON)
    fleet_text: tuple[tuple[MeshSnapshot, bool | None, int], bytes] | None = None
    stats: ApiStats = field(default_factory=ApiStats)
    buckets: dict[str, TokenBucket] = field(default_factory=dict)


STATE: web.AppKey[_State] = web.AppKey("qpmesh_api", _State)
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("qpmesh_principal", Principal)
TOKEN: web.RequestKey[str] = web.RequestKey("qpmesh_token", str)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    body = {"error": {"status": status, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _route_name(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "(unmatched)"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error into a JSON body and count it per route."""
    st = request.app[STATE]
    route = _route_name(request)
    st.stats.requests[route] += 1
    try:
        resp = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate",
                                                                  "Retry-After")}  # fmt: skip
        resp = _error(exc.status, exc.reason if exc.text is None else _plain(exc), headers)
    except (BadQuery, ActionQueryError, WebhookError, json.JSONDecodeError) as exc:
        resp = _error(400, str(exc))
    except Forbidden as exc:
        resp = _error(403, str(exc))
    except NotFound as exc:
        resp = _error(404, str(exc))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as exc:  # a bug: still JSON, counted, logged, never silent
        log.exception("API %s %s failed", request.method, request.path)
        st.stats.server_errors[route] += 1
        return _error(500, f"internal error: {type(exc).__name__}")
    if 400 <= resp.status < 500:
        st.stats.client_errors[route] += 1
    elif resp.status >= 500:
        st.stats.server_errors[route] += 1
    return resp


def _plain(exc: web.HTTPException) -> str:
    text = exc.text or exc.reason
    if text.startswith("{"):  # already JSON (raised by our handlers)
        try:
            doc = json.loads(text)
            return str(doc["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return text
    return text.removeprefix(f"{exc.status}: ").strip()


@web.middleware
async def _cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Add the CORS headers an allowed browser origin needs to every answer (errors too;
    ``OPTIONS`` answers are `_options`'s own; a websocket has sent its headers already)."""
    resp = await handler(request)
    if request.method != "OPTIONS" and not resp.prepared:
        resp.headers.update(cors_headers(request.app[STATE].access, request.headers.get("Origin")))
    return resp


WS_PATH = PREFIX + "/ws"


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Require a known bearer token (or, for the websocket, a live ticket) and charge its
    token bucket. ``OPTIONS`` needs none: a browser's preflight carries no credentials."""
    st = request.app[STATE]
    if request.method == "OPTIONS":
        return await handler(request)
    tok = bearer(request.headers.get("Authorization"))
    who = st.tokens.lookup(tok) if tok is not None else None
    ticket = request.query.get("ticket") if request.path == WS_PATH else None
    if tok is None and ticket is not None:
        redeemed = st.tickets.redeem(ticket, st.clock())
        if redeemed is not None:
            tok, who = redeemed.token, redeemed.who
    if tok is None or who is None:
        return _error(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
    now = st.clock()
    bucket = st.buckets.get(tok) or TokenBucket.full(st.options.rate_per_s, st.options.burst, now)
    ok, bucket, wait = bucket.take(now)
    st.buckets[tok] = bucket
    if not ok:
        return _error(429, "rate limit exceeded", {"Retry-After": str(max(1, round(wait)))})
    request[PRINCIPAL] = who
    request[TOKEN] = tok
    return await handler(request)


def _scope(request: web.Request, snap: MeshSnapshot) -> Scope:
    who: Principal = request[PRINCIPAL]
    if who.is_operator:
        return Scope.fleet()
    st = request.app[STATE]
    foreign = frozenset(j.id for j in st.jobs.jobs() if j.tenant != who.name)
    return tenant_scope(snap.fabric, st.grants.nics_of(who.name), foreign)


def _params(request: web.Request, allowed: tuple[str, ...] = ()) -> dict[str, str]:
    q = request.query
    for key in q:
        if key not in allowed:
            raise BadQuery(f"unknown query parameter {key!r}")
        if len(q.getall(key)) > 1:
            raise BadQuery(f"query parameter {key!r} given more than once")
    return {k: q[k] for k in q}


def _running_jobs(st: _State, who: Principal) -> int:
    return len(st.jobs.jobs() if who.is_operator else st.jobs.jobs_of(who.name))


_TAIL = ', "control_enabled": null, "running_jobs": null}'


def chunked_dumps(doc: Mapping[str, object]) -> str:
    """Return ``json.dumps(doc)`` built one list element at a time, so a thread making a large
    document gives the interpreter lock back between elements (a request served meanwhile
    waits ~1 ms, not the whole document)."""
    parts = []
    for k, v in doc.items():
        if isinstance(v, list):
            body = "[" + ", ".join(json.dumps(x) for x in v) + "]"
        else:
            body = json.dumps(v)
        parts.append(json.dumps(k) + ": " + body)
    return "{" + ", ".join(parts) + "}"


def fleet_base_text(snap: MeshSnapshot) -> str:
    """Return the fleet snapshot document of ``snap`` as JSON with Control and running jobs
    null (`with_control` fills them in)."""
    return chunked_dumps(snapshot_view(snap, Scope.fleet(), control=None, jobs=None))


def with_control(base: str, control: bool | None, jobs: int | None) -> str:
    """Return ``base`` (from `fleet_base_text`) with Control and the running jobs set: the
    same text as ``json.dumps(snapshot_view(snap, Scope.fleet(), control=..., jobs=...))``."""
    if not base.endswith(_TAIL):
        raise ValueError("not a fleet snapshot document")
    return f"{base[: -len(_TAIL)]}, \"control_enabled\": {json.dumps(control)}, " \
           f"\"running_jobs\": {json.dumps(jobs)}}}"  # fmt: skip


def prime_snapshot(app: web.Application, snap: MeshSnapshot) -> None:
    """Make the fleet document of ``snap`` now (any thread; the API process does it as a
    snapshot arrives, before publishing it), so no request pays for it."""
    app[STATE].fleet_base = (snap, fleet_base_text(snap))


def _snapshot_bytes(st: _State, request: web.Request, snap: MeshSnapshot) -> bytes:
    """Return the snapshot document as UTF-8 JSON. The fleet document of one snapshot is
    made once (`prime_snapshot`, or here on first use) and shared by every operator request
    and websocket, with that moment's Control and job count spliced in: a 1,024-NIC document
    is ~0.5 MB of JSON, 20 clients at 4/s would otherwise serialize it 80 times a second."""
    who: Principal = request[PRINCIPAL]
    scope = _scope(request, snap)
    ctl = None if st.control is None else st.control.enabled
    jobs = _running_jobs(st, who)
    if not scope.is_fleet:
        return json.dumps(snapshot_view(snap, scope, control=ctl, jobs=jobs)).encode()
    hit = st.fleet_text
    if hit is not None and hit[0][0] is snap and hit[0][1:] == (ctl, jobs):
        return hit[1]
    base = st.fleet_base
    if base is None or base[0] is not snap:
        base = st.fleet_base = (snap, fleet_base_text(snap))
    text = with_control(base[1], ctl, jobs).encode()
    st.fleet_text = ((snap, ctl, jobs), text)
    return text


async def _snapshot(request: web.Request) -> web.Response:
    _params(request)
    st = request.app[STATE]
    body = _snapshot_bytes(st, request, st.model.snapshot())
    return web.Response(body=body, content_type="application/json")


async def _nic(request: web.Request) -> web.Response:
    _params(request)
    snap = request.app[STATE].model.snapshot()
    i = nic_index(snap, _scope(request, snap), request.match_info["nic"])
    return web.json_response(nic_doc(snap, i))


async def _delays(request: web.Request) -> web.Response:
    q = _params(request, ("nic",))
    snap = request.app[STATE].model.snapshot()
    return web.json_response(delays_view(snap, _scope(request, snap), q.get("nic")))


async def _links(request: web.Request) -> web.Response:
    _params(request)
    snap = request.app[STATE].model.snapshot()
    return web.json_response(
        {"t_ns": int(snap.t_ns), "links": links_view(snap, _scope(request, snap))}
    )


async def _events(request: web.Request) -> web.Response:
    q = parse_event_query(_params(request, ("since_ns", "until_ns", "kind", "target",
                                            "severity", "limit")))  # fmt: skip
    st = request.app[STATE]
    snap = st.model.snapshot()
    return web.json_response(events_view(st.model.events(), snap.fabric, _scope(request, snap), q))


async def _clocks(request: web.Request) -> web.Response:
    _params(request)
    snap = request.app[STATE].model.snapshot()
    return web.json_response(clocks_view(snap, _scope(request, snap)))


async def _jobs(request: web.Request) -> web.Response:
    _params(request)
    st = request.app[STATE]
    who: Principal = request[PRINCIPAL]
    jobs = st.jobs.jobs() if who.is_operator else st.jobs.jobs_of(who.name)
    snap = st.model.snapshot()
    return web.json_response(jobs_view(jobs, st.job_status, snap.fabric, _scope(request, snap)))


async def _json_body(request: web.Request, want: str) -> Any:
    """Return the request's JSON body (None when empty); 415 for a body that is not
    ``application/json``, 400 for one that is not strict JSON (`parse_json`)."""
    data = await request.read()
    if data and request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(reason="the body must be application/json")
    return parse_json(data, want)


def _check_nics(snap: MeshSnapshot, scope: Scope, job: Job) -> None:
    """Raise `NotFound` for the first NIC of ``job`` that does not exist or is not in
    ``scope`` (the same answer for both)."""
    for nic in sorted(job.nics):
        nic_index(snap, scope, nic)


async def _jobs_post(request: web.Request) -> web.Response:
    _params(request)
    st = request.app[STATE]
    who: Principal = request[PRINCIPAL]
    job = job_body(await _json_body(request, "a job"), who)
    snap = st.model.snapshot()
    _check_nics(snap, _scope(request, snap), job)
    try:
        await st.commands.register_job(job)
    except JobError as exc:  # a taken id (in the caller's own namespace), or a grant refused
        return _error(409, str(exc))
    return web.json_response(job_doc(job.id, job.tenant, job.ranks), status=201)


async def _jobs_delete(request: web.Request) -> web.Response:
    _params(request)
    st = request.app[STATE]
    who: Principal = request[PRINCIPAL]
    job_id = request.match_info["job"]
    job = st.jobs.get(job_id)
    if job is None or not (who.is_operator or job.tenant == who.name):
        raise NotFound(f"no job {job_id!r}")
    with contextlib.suppress(JobError):  # gone meanwhile: the same answer
        await st.commands.unregister_job(job_id)
    return web.json_response(job_doc(job.id, job.tenant, job.ranks))


async def _actions(request: web.Request) -> web.Response:
    q = parse_action_query(_params(request, ("since_ns", "until_ns", "kind", "status", "job",
                                             "limit")))  # fmt: skip
    st = request.app[STATE]
    who: Principal = request[PRINCIPAL]
    if st.actions is None:
        return web.json_response({"actions": [], "truncated": False})
    doc = st.actions.query(q, None if who.is_operator else who.name)
    snap = st.model.snapshot()
    return web.json_response(actions_view(doc, snap.fabric, _scope(request, snap)))


async def _alertmanager(request: web.Request) -> web.Response:
    _params(request)
    st = request.app[STATE]
    who: Principal = request[PRINCIPAL]
    if not who.is_operator:
        return _error(403, "asking for actions needs an operator token")
    if not st.commands.can_ask:
        return _error(409, "remediation is not available in this controller")
    body = await _json_body(request, "an Alertmanager webhook payload")
    fab = st.model.snapshot().fabric
    body, unknown = known_only(body, fab.nic_index, fab.link_index,
                               {j.id for j in st.jobs.jobs()})  # fmt: skip
    out = dict(await st.commands.ask(body, st.wall_ns()))
    out["unknown"] = unknown
    return web.json_response(out)


def _control_doc(st: _State, who: Principal) -> dict[str, object]:
    if st.control is None:
        return {"available": False, "enabled": None}
    doc: dict[str, object] = {"available": True, "enabled": st.control.enabled}
    if who.is_operator:
        doc["audit"] = [c.to_dict() for c in st.control.audit()[-20:]]
    return doc


async def _control_get(request: web.Request) -> web.Response:
    _params(request)
    st = request.app[STATE]
    return web.json_response(_control_doc(st, request[PRINCIPAL]))


async def _control_put(request: web.Request) -> web.Response:
    _params(request)
    st = request.app[STATE]
    who: Principal = request[PRINCIPAL]
    if not who.is_operator:
        return _error(403, "writing Control needs an operator token")
    if st.control is None:
        return _error(409, "Control is not available in this controller")
    enabled = control_body(await _json_body(request, '{"enabled": true|false}'))
    await st.commands.set_control(enabled, who.name, st.wall_ns())
    return web.json_response(_control_doc(st, who))


async def _health(request: web.Request) -> web.Response:
    """The API's health: for an operator the fleet's NIC count, the source's and the API's
    figures; for a tenant only its own NIC count (nothing fleet-wide)."""
    _params(request)
    st = request.app[STATE]
    snap = st.model.snapshot()
    scope = _scope(request, snap)
    doc: dict[str, object] = {
        "status": "ok",
        "t_ns": int(snap.t_ns),
        "nics": len(snap.fabric.nics) if scope.nics is None else len(scope.nics),
    }
    if scope.is_fleet:
        doc["source"] = dict(st.model.health())
        doc["api"] = st.stats.to_dict()
    return web.json_response(doc)


def package_version() -> str:
    """Return the installed qpmesh version ("unknown" if not installed)."""
    try:
        return metadata.version("qpmesh")
    except metadata.PackageNotFoundError:
        return "unknown"


async def _version(request: web.Request) -> web.Response:
    """Versions and this app's ``instance`` id (random per start: a client that sees it
    change knows the controller restarted and its event sequence numbers started over)."""
    _params(request)
    st = request.app[STATE]
    return web.json_response(
        {"qpmesh": package_version(), "api": API_VERSION, "instance": st.instance}
    )


async def _ws(request: web.Request) -> web.StreamResponse:
    """Stream ``{"type": "snapshot"|"event", "data": ...}`` messages (snapshots coalesced to
    at most one per ``ws_min_interval_s``, events as they are published)."""
    _params(request, ("ticket",))
    st = request.app[STATE]
    if not origin_allowed(st.access, request.headers.get("Origin")):
        return _error(403, "this origin may not open the websocket")
    ws = web.WebSocketResponse(heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        return _error(400, "this route needs a websocket upgrade")
    await ws.prepare(request)
    sub = st.model.subscribe()
    sender = asyncio.create_task(_ws_send(request, ws, sub))
    try:
        async for msg in ws:
            if msg.type == WSMsgType.ERROR:
                break
    finally:
        sender.cancel()
        st.model.unsubscribe(sub)
        await asyncio.gather(sender, return_exceptions=True)
    return ws


async def _ws_send(request: web.Request, ws: web.WebSocketResponse, sub: Subscriber) -> None:
    st = request.app[STATE]
    last: float | None = None
    while not ws.closed:
        wait = snapshot_wait(last, st.clock(), st.options.ws_min_interval_s)
        if not (sub.snap_dirty and wait == 0):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait if sub.snap_dirty else None):
                    await sub.wake.wait()
        sub.wake.clear()
        snap = st.model.snapshot()
        scope = _scope(request, snap)
        for seq, ev in sub.drain():
            if scope.target_visible(snap.fabric, ev.target):
                await ws.send_json(
                    {"type": "event", "data": event_view(ev, snap.fabric, scope, seq)}
                )
                st.stats.ws_sent += 1
        if sub.snap_dirty and snapshot_wait(last, st.clock(), st.options.ws_min_interval_s) == 0:
            sub.snap_dirty = False
            text = _snapshot_bytes(st, request, snap)
            msg = b'{"type": "snapshot", "data": ' + text + b"}"
            await ws.send_frame(msg, WSMsgType.TEXT)  # encoded once, sent as text
            st.stats.ws_sent += 1
            last = st.clock()


async def _tickets_post(request: web.Request) -> web.Response:
    """Issue a websocket ticket for the caller (single use, short-lived)."""
    _params(request)
    st = request.app[STATE]
    if await request.read():
        raise BadQuery("this route takes no body")
    ticket = st.tickets.issue(request[PRINCIPAL], request[TOKEN], st.clock())
    return web.json_response({"ticket": ticket, "expires_in_s": st.access.ticket_ttl_s}, status=201)


async def _options(request: web.Request) -> web.Response:
    """Answer ``OPTIONS``: the route's methods, and a browser's preflight when its origin is
    allowed (no credentials needed)."""
    path = request.match_info.route.resource
    canon = path.canonical.removeprefix(PREFIX) if path is not None else ""
    methods = [m for m, p, _ in ROUTES if p == canon]
    st = request.app[STATE]
    headers = preflight_headers(st.access, request.headers.get("Origin"), methods,
                                request.headers.get("Access-Control-Request-Method"))  # fmt: skip
    return web.Response(status=204, headers=headers)


ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/snapshot", _snapshot),
    ("GET", "/nics/{nic}", _nic),
    ("GET", "/delays", _delays),
    ("GET", "/links", _links),
    ("GET", "/events", _events),
    ("GET", "/clocks", _clocks),
    ("GET", "/jobs", _jobs),
    ("POST", "/jobs", _jobs_post),
    ("DELETE", "/jobs/{job}", _jobs_delete),
    ("GET", "/actions", _actions),
    ("POST", "/alertmanager", _alertmanager),
    ("GET", "/control", _control_get),
    ("PUT", "/control", _control_put),
    ("GET", "/health", _health),
    ("GET", "/version", _version),
    ("GET", "/ws", _ws),
    ("POST", "/tickets", _tickets_post),
)


def make_app(
    model: ReadModel,
    tokens: TokenTable,
    *,
    jobs: JobsView | None = None,
    control: ControlView | None = None,
    actions: ActionsView | None = None,
    ask: AlertIntake | None = None,
    job_status: JobStatus | None = None,
    options: ApiOptions | None = None,
    commands: Commands | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_ns: Callable[[], int] = time.time_ns,
    grants: Grants | None = None,
    access: WebAccess | None = None,
) -> web.Application:
    """Return the API app. ``clock`` (seconds, monotonic) drives rate limits, websocket
    coalescing and tickets; ``wall_ns`` stamps Control changes and Alertmanager requests
    (the producer's clock: the demo passes its simulated one, so the audit and the events
    agree). ``grants``: the tenants' NICs (None: tenants hold none). Without ``commands``,
    writes go to ``jobs`` (then a `JobRegistry`), ``control`` (then a `Control`) and
    ``ask``. Raises ValueError without any token, TypeError for read-only
    ``jobs``/``control`` without ``commands``."""
    if not len(tokens):
        raise ValueError("the API needs at least one token")
    jobs = JobRegistry() if jobs is None else jobs
    if commands is None:
        if not isinstance(jobs, JobRegistry) or not isinstance(control, Control | None):
            raise TypeError("read-only jobs or control need commands")
        commands = LocalCommands(jobs, control, ask)
    access = access or WebAccess()
    app = web.Application(middlewares=[_cors, _errors, _auth], client_max_size=64 * 1024)
    app[STATE] = _State(model, tokens, jobs, control, actions, commands, job_status,
                        options or ApiOptions(), clock, wall_ns, grants or Grants(), access,
                        Tickets(access.ticket_ttl_s))  # fmt: skip
    for method, path, handler in ROUTES:
        app.router.add_route(method, PREFIX + path, handler)
    for path in dict.fromkeys(p for _, p, _ in ROUTES):
        app.router.add_route("OPTIONS", PREFIX + path, _options)
    return app


def api_stats(app: web.Application) -> ApiStats:
    """Return the counters of an app made by `make_app`."""
    return app[STATE].stats
