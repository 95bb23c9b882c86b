"""The API process: ``python -m controller.api.child PARENT_PID SOCKET_FD`` (thin shell).

Started by `controller.api.process.ApiProcess` with the listening socket; reads
`controller.api.feed` frames on stdin and writes its own on stdout (stray prints go to
stderr). It serves `controller.api.app` on an `ApiHub` that a reader thread fills: each
snapshot is unpickled and its fleet document made there (`prime_snapshot`, a list element at
a time) before it is published, so no request waits for either, and nothing here ever waits
for the controller's ingest. Writes go back to the controller as `feed.Call` s (`_Remote`) and
answer once the controller applied them, with the state after them mirrored here first.

Dies with its parent: the parent-death signal (Linux), and the end of stdin; SIGINT is left
to the parent (a terminal's Ctrl-C reaches the whole process group).

Its log is the controller's: every ``logging`` record (aiohttp's "Error handling request"
with its traceback, asyncio's unhandled exceptions) travels up the pipe as a `feed.Log`
(`controller.logrelay`); what it must say before the pipe works, or after it broke, is one
JSON line on stderr. Nothing here writes plain text.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from aiohttp import web

from controller.api import feed
from controller.api.app import make_app, prime_snapshot
from controller.api.hub import ApiHub
from controller.api.process import read_frame, write_frame
from controller.api.server import quiet_bad_requests
from controller.jobs import Job, JobError
from controller.logrelay import relay_logging
from controller.remediation.alerts import WebhookError

CALL_TIMEOUT_S = 30.0
_ERRORS: Mapping[str, type[Exception]] = {"JobError": JobError, "WebhookError": WebhookError}


def _say(msg: str, **fields: object) -> None:
    """Write one JSON line on stderr (the controller's stderr: before or after the pipe)."""
    line = json.dumps({"t_ns": time.time_ns(), "msg": "api process", "detail": msg, **fields},
                      default=str)  # fmt: skip
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    _say(f"{kind.__name__}: {exc}", traceback="".join(traceback.format_exception(kind, exc, tb)))


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)


class _Remote:
    """`controller.api.app.Commands` that ask the controller process (see the module)."""

    def __init__(self, out: int, mirror: feed.Mirror, can_ask: bool) -> None:
        self._out, self._mirror, self.can_ask = out, mirror, can_ask
        self._next = 0
        self._waiting: dict[int, asyncio.Future[feed.Reply]] = {}
        self._lock = threading.Lock()

    def send(self, msg: object) -> None:
        data = pickle.dumps(msg, protocol=5)
        with self._lock:
            write_frame(self._out, data)

    async def _call(self, op: str, *args: Any) -> Any:
        self._next += 1
        call_id = self._next
        fut: asyncio.Future[feed.Reply] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = fut
        self.send(feed.Call(call_id, op, args))
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                reply = await fut
        except TimeoutError:
            raise web.HTTPServiceUnavailable(
                reason=f"the controller did not answer in {CALL_TIMEOUT_S:g} s"
            ) from None
        finally:
            self._waiting.pop(call_id, None)
        if reply.error is not None:
            kind, text = reply.error
            raise _ERRORS.get(kind, RuntimeError)(text)
        return reply.result

    def answer(self, reply: feed.Reply) -> None:
        """Mirror the state after a call, then wake its caller (in the loop)."""
        self._mirror.apply(reply.state)
        fut = self._waiting.get(reply.id)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    async def register_job(self, job: Job) -> None:
        """Register ``job`` in the controller; raises `JobError`."""
        await self._call("register_job", job)

    async def unregister_job(self, job_id: str) -> None:
        """Unregister ``job_id`` in the controller; raises `JobError`."""
        await self._call("unregister_job", job_id)

    async def set_control(self, enabled: bool, actor: str, t_ns: int) -> None:
        """Switch the controller's Control (audited there)."""
        await self._call("set_control", enabled, actor, t_ns)

    async def ask(self, payload: Any, now_ns: int) -> Mapping[str, object]:
        """Hand the controller an Alertmanager webhook; raises `WebhookError`."""
        out: Mapping[str, object] = await self._call("ask", payload, now_ns)
        return out


def _quiet_resets(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A websocket client that leaves during a compressed send leaves aiohttp's send task
    with a connection-reset error nobody awaits: not worth a traceback on the controller's
    stderr. Everything else is reported as usual."""
    if isinstance(context.get("exception"), ConnectionError):
        return
    loop.default_exception_handler(context)


async def serve(init: feed.Init, sock: socket.socket, inp: Any, out: int) -> None:
    """Serve until stdin ends or a `feed.Stop` arrives."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet_resets)
    fabric = init.fabric
    hub = ApiHub(feed.unpack_snapshot(init.snapshot, fabric))
    mirror = feed.Mirror(init.state)
    remote = _Remote(out, mirror, init.can_ask)
    logging.raiseExceptions = False  # a record the pipe cannot take is dropped, not printed
    with relay_logging(lambda level, name, text: remote.send(feed.Log(level, name, text))):
        await _serve_app(init, hub, mirror, remote, sock, inp)


async def _serve_app(
    init: feed.Init, hub: ApiHub, mirror: feed.Mirror, remote: _Remote, sock: socket.socket,
    inp: Any,
) -> None:  # fmt: skip
    """Serve the app (HTTPS when the config names TLS files) until the feed ends."""
    loop = asyncio.get_running_loop()
    fabric, config = init.fabric, init.config
    app = make_app(hub, config.tokens, jobs=mirror.jobs, control=mirror.control,
                   actions=mirror if init.has_actions else None, job_status=mirror.job_status,
                   options=config.options, commands=remote, grants=init.grants,
                   access=config.access)  # fmt: skip
    tls = config.access.tls  # checked at load: fails here only if the files changed since
    ssl_context = tls.context() if tls is not None else None
    prime_snapshot(app, hub.snapshot())
    done = asyncio.Event()

    def take(msg: object) -> None:  # in the loop
        if isinstance(msg, feed.Tick):
            if msg.state is not None:
                mirror.apply(msg.state)
            if msg.events:
                hub.publish(None, msg.events)
        elif isinstance(msg, feed.Reply):
            remote.answer(msg)

    def read() -> None:  # the reader thread
        try:
            while (data := read_frame(inp)) is not None:
                msg = pickle.loads(data)
                if isinstance(msg, feed.Snap):
                    snap = feed.unpack_snapshot(msg.snapshot, fabric)
                    prime_snapshot(app, snap)
                    hub.publish(snap, ())
                elif isinstance(msg, feed.Stop):
                    break
                else:
                    loop.call_soon_threadsafe(take, msg)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
            _say(f"feed: {type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(done.set)

    quiet_bad_requests()
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    threading.Thread(target=read, name="api-feed", daemon=True).start()
    remote.send(feed.Ready())
    clients = 0
    try:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await done.wait()
            if hub.clients != clients:
                clients = hub.clients
                remote.send(feed.Clients(clients))
    finally:
        await runner.cleanup()


def main(argv: list[str]) -> int:
    """Run the API process; returns the exit code."""
    sys.excepthook = _excepthook
    parent, fd = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setswitchinterval(0.001)  # the loop waits <= 1 ms for the lock the reader holds
    out = os.dup(1)
    os.dup2(2, 1)  # print() must not write into the channel
    inp = os.fdopen(0, "rb", buffering=0)
    data = read_frame(inp)
    if data is None:
        return 0
    init = pickle.loads(data)
    if not isinstance(init, feed.Init):
        _say("the first message is not Init")
        return 2
    sock = socket.socket(fileno=fd)
    asyncio.run(serve(init, sock, inp, out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
