"""``qpmesh tui --api URL --token T``: a remote controller as a `SnapshotSource` (thin shell).

`ApiSource(url, token)` runs an aiohttp client on an event loop in a daemon thread: it opens
the websocket (``/api/v1/ws``), reads ``/version``, ``/snapshot``, ``/events`` and ``/jobs``,
then follows the websocket's snapshots and events; every ``refresh_s`` (and at once when the
screen focuses another NIC) it reads that NIC's row and column of the delay matrix
(``/delays?nic=N``) and the jobs. The documents become `MeshSnapshot` values through
`mesh.documents` (pure: the decoders beside the encoders the API writes them with); the screen
reads the latest one with `snapshot()`, never waiting.

When the controller goes away the source keeps the last snapshot, says so in `connection()`
("disconnected, retrying") and reconnects with exponential backoff; when it is back it reads
a fresh snapshot and the events since the newest one it had (all of them when the
controller's ``instance`` id changed: it restarted and its sequence numbers started over).

`start()` raises `ApiTokenRefused` (a ValueError: exit 2) when the token is refused, and
`ApiUnreachable` (an OSError: exit 1) when the first connection fails otherwise.
`set_control` PUTs ``/api/v1/control`` and raises `ControlUnavailable` with the controller's
one-line reason (a tenant token, a controller without Control, no connection).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from contract.jsondoc import DocumentError
from mesh.documents import (
    DelayPairs,
    FabricKey,
    delays_from_doc,
    event_from_doc,
    fabric_from_doc,
    fabric_key,
    jobs_from_doc,
    snapshot_from_doc,
)
from mesh.fabric import Fabric
from mesh.snapshot import ControlUnavailable, MeshSnapshot
from mqttlink.reconnect import Backoff
from tui.apimodel import HistoryRing, merge_events
from tui.panes import Connection

F64 = npt.NDArray[np.float64]
MAX_CATCH_UP = 1000
MAX_MESSAGE = 64 << 20


class ApiTokenRefused(ValueError):
    """The controller refused the token (401)."""


class ApiUnreachable(OSError):
    """The controller's API did not answer (or did not answer like a qpmesh API)."""


class _HttpError(Exception):
    """A non-2xx answer: ``status`` and the error body's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


def api_base(url: str) -> str:
    """Return the API base (``http://HOST:PORT/api/v1/``) of ``url`` (``http(s)://HOST:PORT``
    with or without ``/api/v1``); raise ValueError for anything else."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"--api: bad URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--api: bad URL {url!r}: expected http://HOST:PORT")
    if parts.query or parts.fragment:
        raise ValueError(f"--api: bad URL {url!r}: no query or fragment, please")
    path = parts.path.rstrip("/")
    if path not in ("", "/api/v1"):
        raise ValueError(f"--api: bad URL {url!r}: the path may only be /api/v1")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}/api/v1/"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class ApiSource:
    """The live state of a remote controller through its API (see the module docstring)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        backoff_s: tuple[float, float] = (0.5, 5.0),
        refresh_s: float = 1.0,
        heartbeat_s: float = 5.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``ssl_context``: how to check an ``https`` controller (its CA, a client
        certificate; None: the system's CAs). Raises ValueError for a bad URL or an empty
        token."""
        self.base = api_base(url)
        if not token.strip():
            raise ValueError("--token: empty token")
        Backoff(*backoff_s)  # validates
        self._headers = {"Authorization": f"Bearer {token.strip()}"}
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self.backoff_s, self.refresh_s = backoff_s, refresh_s
        self.heartbeat_s, self.timeout_s, self.clock = heartbeat_s, timeout_s, clock
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="qpmesh-tui-api",
                                        daemon=True)  # fmt: skip
        self._task: concurrent.futures.Future[None] | None = None
        self._ready = threading.Event()
        self._first_error: BaseException | None = None
        self._wake: asyncio.Event | None = None
        self._atask: asyncio.Task[None] | None = None
        self._last_data_s: float | None = None
        self._http: aiohttp.ClientSession | None = None
        # state (written by the loop thread under the lock, read by the screen)
        self._doc: Mapping[str, Any] | None = None
        self._fkey: FabricKey | None = None
        self._fabric: Fabric | None = None
        self._snap: MeshSnapshot | None = None
        self._events: tuple[tuple[int, EventDoc], ...] = ()
        self._jobs: tuple[Mapping[str, object], ...] | None = None
        self._delays = DelayPairs.empty()
        self._hist = HistoryRing(0)
        self._focus: str | None = None
        self._instance: str | None = None
        self._conn = Connection(self.base, connected=False, reason="connecting")
        self.reconnects = 0
        self.bad_messages = 0

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, timeout_s: float = 20.0) -> None:
        """Connect and read the first snapshot. Raises `ApiTokenRefused` (token refused) or
        `ApiUnreachable` (no answer, not a qpmesh API) and stops again."""
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        if not self._ready.wait(timeout_s):
            self.close()
            raise ApiUnreachable(f"no answer from {self.base} within {timeout_s:g} s")
        if self._first_error is not None:
            self.close()
            raise self._first_error

    def close(self) -> None:
        """Disconnect and end the thread (idempotent)."""
        if self._task is not None and self._loop.is_running():
            # closing: a failure of the loop was already reported through connection()
            with contextlib.suppress(Exception, concurrent.futures.CancelledError):
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(5.0)
        self._task = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():
            self._thread.join(5.0)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()

    async def _stop(self) -> None:
        task = self._atask
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ---- SnapshotSource -------------------------------------------------------------------
    def snapshot(self) -> MeshSnapshot:
        """Return the latest snapshot (raises RuntimeError before `start` succeeded)."""
        snap = self._snap
        if snap is None:
            raise RuntimeError("ApiSource.start() has not connected yet")
        return snap

    def history(self, nic: int, window_s: float) -> tuple[F64, F64]:
        """Return (times s relative to the newest snapshot, worst delay ns) of ``nic`` from
        the snapshots received (one per second of controller time)."""
        with self._lock:
            return self._hist.window(nic, window_s)

    def set_control(self, enabled: bool) -> None:
        """PUT ``/api/v1/control``; raise `ControlUnavailable` with the controller's reason."""
        if not self._conn.connected:
            raise ControlUnavailable(f"not connected to {self.base}")
        fut = asyncio.run_coroutine_threadsafe(self._put_control(enabled), self._loop)
        try:
            fut.result(self.timeout_s + 1.0)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ControlUnavailable("the controller did not answer in time") from None

    # ---- what the screen asks besides ---------------------------------------------------------
    def connection(self) -> Connection:
        """Return the connection state (for the status line)."""
        return self._conn

    def focus(self, nic: int | None) -> None:
        """Read NIC index ``nic``'s delay row and column from now on (None: none)."""
        with self._lock:
            fab = self._fabric
            ok = fab is not None and nic is not None and 0 <= nic < len(fab.nics)
            self._focus = fab.nics[nic].id if ok and fab is not None and nic is not None else None
            self._delays = DelayPairs.empty()
        if self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # ---- the loop thread ---------------------------------------------------------------------
    async def _run(self) -> None:
        self._atask = asyncio.current_task()  # type: ignore[assignment]
        self._wake = asyncio.Event()
        backoff = Backoff(*self.backoff_s)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(ssl=self._ssl)
        async with aiohttp.ClientSession(headers=self._headers, timeout=timeout,
                                         connector=connector) as http:  # fmt: skip
            self._http = http
            while True:
                try:
                    await self._session(http, backoff.reset)
                    reason = "the controller closed the connection"
                except (aiohttp.ClientError, OSError, TimeoutError, DocumentError, _HttpError,
                        ValueError) as exc:  # fmt: skip
                    reason = _one_line(exc)
                    if not self._ready.is_set():
                        self._first_error = _first_error(self.base, exc)
                        self._ready.set()
                        return
                delay = backoff.next_delay()
                self.reconnects += 1
                self._conn = Connection(self.base, connected=False, reason=reason,
                                        retry_at_s=self.clock() + delay,
                                        since_s=self._last_data_s)  # fmt: skip
                await asyncio.sleep(delay)

    async def _get(self, http: aiohttp.ClientSession, path: str) -> Any:
        async with http.get(self.base + path) as r:
            return await _json_or_raise(r)

    async def _session(self, http: aiohttp.ClientSession, connected: Callable[[], None]) -> None:
        """One connection: websocket, catch up, then follow until it closes."""
        # a 10,000-NIC snapshot document is ~5 MB: above aiohttp's 4 MB default
        async with http.ws_connect(
            self.base + "ws", heartbeat=self.heartbeat_s, max_msg_size=MAX_MESSAGE
        ) as ws:
            version = await self._get(http, "version")
            inst = version.get("instance") if isinstance(version, dict) else None
            same = inst is not None and inst == self._instance
            doc = await self._get(http, "snapshot")
            q = f"events?limit={MAX_CATCH_UP}"
            if same and self._events:
                q += f"&since_ns={self._events[-1][1].t_ns}"
            got = _events(await self._get(http, q))
            jobs = None
            if isinstance(doc, dict) and doc.get("running_jobs") is not None:
                jobs = jobs_from_doc(await self._get(http, "jobs"))
            with self._lock:
                self._events = merge_events(self._events, got, restarted=not same)
                self._jobs = jobs
                self._install(doc)
            self._instance = inst
            self._conn = Connection(self.base, connected=True)
            connected()
            self._ready.set()
            refresher = asyncio.create_task(self._refresh(http))
            try:
                async for msg in ws:
                    if refresher.done():
                        refresher.result()
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        self._on_message(msg.data)
                    elif msg.type == aiohttp.WSMsgType.ERROR:
                        break
            finally:
                refresher.cancel()
                await asyncio.gather(refresher, return_exceptions=True)

    def _on_message(self, text: str) -> None:
        try:
            msg = json.loads(text)
            kind, data = msg["type"], msg["data"]
            with self._lock:
                if kind == "snapshot":
                    self._install(data)
                elif kind == "event":
                    self._events = merge_events(self._events, (event_from_doc(data),))
                    if self._snap is not None:
                        self._snap = dataclasses.replace(
                            self._snap, events=tuple(e for _, e in self._events)
                        )
        except (ValueError, KeyError, TypeError):
            self.bad_messages += 1

    async def _refresh(self, http: aiohttp.ClientSession) -> None:
        """Every ``refresh_s`` (or when woken by `focus`): the focused NIC's delays, the jobs."""
        assert self._wake is not None
        while True:
            self._wake.clear()
            nic = self._focus
            delays: Mapping[str, Any] | None = None
            if nic is not None:
                try:
                    delays = await self._get(http, f"delays?nic={quote(nic)}")
                except _HttpError as exc:
                    if exc.status != 404:  # 404: the NIC left the fabric (or our scope)
                        raise
            jobs = None
            doc = self._doc
            if doc is not None and doc.get("running_jobs") is not None:
                jobs = jobs_from_doc(await self._get(http, "jobs"))
            with self._lock:
                if nic == self._focus and self._fabric is not None:
                    self._delays = (
                        DelayPairs.empty()
                        if delays is None
                        else delays_from_doc(delays, self._fabric)
                    )
                self._jobs = jobs
                if self._doc is not None:
                    self._install(self._doc, history=False)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.refresh_s):
                    await self._wake.wait()

    def _install(self, doc: Any, *, history: bool = True) -> None:
        """Make ``doc`` the current snapshot (caller holds the lock). Raises `DocumentError`."""
        if not isinstance(doc, dict):
            raise DocumentError("snapshot: not an object")
        key = fabric_key(doc)
        if key != self._fkey or self._fabric is None:
            self._fabric = fabric_from_doc(doc)
            self._fkey = key
            self._hist = HistoryRing(len(self._fabric.nics))
            self._delays = DelayPairs.empty()
        snap = snapshot_from_doc(doc, self._fabric, events=self._events, jobs=self._jobs,
                                 delays=self._delays)  # fmt: skip
        if history:
            self._hist.add(snap.t_ns, snap.worst_in_ns, snap.worst_out_ns)
            self._last_data_s = self.clock()
        self._doc = doc
        self._snap = snap

    async def _put_control(self, enabled: bool) -> None:
        http = self._http
        if http is None:
            raise ControlUnavailable(f"not connected to {self.base}")
        try:
            async with http.put(self.base + "control", json={"enabled": enabled}) as r:
                doc = await _json_or_raise(r)
        except _HttpError as exc:
            raise ControlUnavailable(exc.message) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ControlUnavailable(f"controller not reachable: {_one_line(exc)}") from None
        now = doc.get("enabled") if isinstance(doc, dict) else None
        with self._lock:
            if self._snap is not None and isinstance(now, bool):
                self._snap = dataclasses.replace(self._snap, control_enabled=now)


def _events(doc: Any) -> list[tuple[int, EventDoc]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
        raise DocumentError("events: missing 'events'")
    out = []
    for e in doc["events"]:
        try:
            out.append(event_from_doc(e))
        except DocumentError:
            continue  # one odd event does not hide the others
    return out


async def _json_or_raise(r: aiohttp.ClientResponse) -> Any:
    if r.status >= 400:
        msg = r.reason or ""
        try:
            body = await r.json(content_type=None)
            msg = str(body["error"]["message"])
        except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
            pass
        raise _HttpError(r.status, msg)
    try:
        return await r.json(content_type=None)
    except ValueError:
        raise DocumentError(f"{r.url.path}: the answer is not JSON") from None


def _first_error(base: str, exc: BaseException) -> BaseException:
    status = getattr(exc, "status", None)
    if status == 401:
        return ApiTokenRefused(f"{base}: the controller refused the token (401)")
    if isinstance(exc, _HttpError | aiohttp.WSServerHandshakeError) and status == 404:
        return ApiUnreachable(f"{base}: no qpmesh API there (404)")
    return ApiUnreachable(f"cannot reach {base}: {_one_line(exc)}")
