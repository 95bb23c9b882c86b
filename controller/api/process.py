"""The controller's side of its API process (thin shell): start it, feed it, answer it.

`ApiProcess` binds the API's listening socket here (so a taken address is an OSError at
start, and port 0 is known at once), starts ``python -m controller.api.child`` with that
socket, and talks to it over the child's stdin/stdout in length-prefixed pickled frames
(`controller.api.feed`). A writer thread sends: `publish` only swaps the latest snapshot into
a slot (pickling and the pipe write happen in the writer, and a snapshot the API process has
not taken yet is replaced by the newer one, never queued), events and states are queued in
order. A reader thread takes the API process's `Call` s and hands each to ``submit`` (the
service runs them on its event loop, where the job registry and Control live), then replies
with the state after the call; its `Log` records (aiohttp's tracebacks too) go to ``log`` as
one string each, so the controller's log stays JSON lines. The API process dies with this one (parent-death signal, and
it exits when its stdin closes); `stop` asks it to finish and waits, then kills it.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from contract.documents import EventDoc
from controller.api import feed
from controller.api.config import ApiConfig
from controller.tenancy import Grants
from mesh.fabric import Fabric
from mesh.snapshot import MeshSnapshot

Handler = Callable[[str, tuple[Any, ...]], Any]
"""(op, args) -> result of a `feed.Call`; raises what the operation raises."""

_HEADER = 8


def write_frame(fd: int, data: bytes) -> None:
    """Write one frame (8-byte little-endian length, then ``data``); raises OSError."""
    view = memoryview(len(data).to_bytes(_HEADER, "little") + data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(stream: Any) -> bytes | None:
    """Read one frame from a binary unbuffered ``stream``; None at end of file."""
    head = _read_exact(stream, _HEADER)
    if head is None:
        return None
    body = _read_exact(stream, int.from_bytes(head, "little"))
    if body is None:
        raise EOFError("frame cut short")
    return body


def _read_exact(stream: Any, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            if got == 0:
                return None
            raise EOFError("frame cut short")
        got += k
    return bytes(buf)


def bind(host: str, port: int) -> socket.socket:
    """Return a listening TCP socket on ``host:port``; raises OSError (address taken)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


class ApiProcess:
    """One API process: `start`, `publish` after every tick, `stop`."""

    def __init__(
        self,
        config: ApiConfig,
        fabric: Fabric,
        snapshot: MeshSnapshot,
        state: Callable[[], feed.SharedState],
        *,
        handle: Handler,
        submit: Callable[[Callable[[], None]], object] = lambda fn: fn(),
        on_clients: Callable[[int], None] = lambda n: None,
        can_ask: bool = True,
        has_actions: bool = True,
        log: Callable[[str], None] = lambda msg: None,
        grants: Grants | None = None,
    ) -> None:
        """``state()`` returns the shared state now (called where ``submit`` runs calls and
        by `publish` callers); ``handle`` applies a call; ``submit(fn)`` runs ``fn`` where
        the state lives (default: in the reader thread); ``grants``: the tenants' NICs."""
        self.config, self.fabric = config, fabric
        self._state, self._handle, self._submit = state, handle, submit
        self._on_clients, self._log = on_clients, log
        self._init = feed.init_message(fabric, config, snapshot, state(), can_ask=can_ask,
                                       has_actions=has_actions, grants=grants)  # fmt: skip
        self._cv = threading.Condition()
        self._queue: deque[object] = deque()
        self._snap: MeshSnapshot | None = None
        self._closing = False
        self._ready = threading.Event()
        self._gone = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.publish_s = 0.0  # writer thread: pickling and writing snapshots
        self.sent = 0

    def start(self) -> int:
        """Bind, start the API process and its threads; return the bound port. Call from a
        thread that outlives the API process (the parent-death signal follows the thread
        that started the child). Raises OSError if the address is taken or it cannot
        start. `wait_ready` waits until it serves."""
        sock = bind(self.config.host, self.config.port)
        try:
            self.port = int(sock.getsockname()[1])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controller.api.child", str(os.getpid()),
                 str(sock.fileno())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(sock.fileno(),),
                env=env, bufsize=0,
            )  # fmt: skip
        finally:
            sock.close()  # the API process holds it now
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out = self.proc.stdin.fileno()
        self._queue.append(self._init)
        for target, name in ((self._write, "api-feed"), (self._read, "api-calls")):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self.port

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the API process serves; raises OSError if it exited or timed out."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self._ready.wait(0.05):
                return
            if self._gone.is_set():
                raise OSError(f"the API process exited (code {self.exit_code()})")
        raise OSError(f"the API process did not start in {timeout_s:g} s")

    def exit_code(self) -> int | None:
        """Return the API process's exit code (None while it runs or before start)."""
        return None if self.proc is None else self.proc.poll()

    def publish(
        self,
        snapshot: MeshSnapshot | None,
        events: tuple[EventDoc, ...] = (),
        state: feed.SharedState | None = None,
    ) -> None:
        """Hand the API process a new snapshot (None: none), new events and the state (None:
        unchanged). Never blocks on the API process (a snapshot it has not taken yet is
        replaced)."""
        with self._cv:
            if snapshot is not None:
                self._snap = snapshot
            if events or state is not None:
                self._queue.append(feed.Tick(tuple(events), state))
            self._cv.notify()

    def _send(self, msg: object) -> None:
        with self._cv:
            self._queue.append(msg)
            self._cv.notify()

    def _write(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._queue or self._snap is not None or self._closing):
                        self._cv.wait()
                    items, snap = list(self._queue), self._snap
                    self._queue.clear()
                    self._snap = None
                    closing = self._closing
                for msg in items:
                    write_frame(self._out, pickle.dumps(msg, protocol=5))
                if snap is not None:
                    t0 = time.thread_time()
                    data = pickle.dumps(feed.Snap(feed.pack_snapshot(snap, self.fabric)),
                                        protocol=5)  # fmt: skip
                    write_frame(self._out, data)
                    self.publish_s += time.thread_time() - t0
                    self.sent += 1
                if closing:
                    write_frame(self._out, pickle.dumps(feed.Stop(), protocol=5))
                    return
        except OSError:  # the API process is gone: the reader says so
            return

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream = self.proc.stdout
        try:
            while (data := read_frame(stream)) is not None:
                msg = pickle.loads(data)
                if isinstance(msg, feed.Ready):
                    self._ready.set()
                elif isinstance(msg, feed.Clients):
                    self._submit(functools.partial(self._on_clients, msg.n))
                elif isinstance(msg, feed.Call):
                    self._submit(functools.partial(self._serve, msg))
                elif isinstance(msg, feed.Log):
                    self._log(f"{msg.level} {msg.logger}: {msg.text}")
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            self._log(f"API process channel: {type(exc).__name__}: {exc}")
        finally:
            self._gone.set()

    def _serve(self, call: feed.Call) -> None:
        error: tuple[str, str] | None = None
        result: Any = None
        try:
            result = self._handle(call.op, call.args)
        except Exception as exc:  # sent back: the API answers 4xx or 500 as it would here
            error = (type(exc).__name__, str(exc))
        self._send(feed.Reply(call.id, error, result, self._state()))

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the API process to finish, wait up to ``timeout_s``, then kill it
        (idempotent)."""
        if self.proc is None:
            return
        with self._cv:
            self._closing = True
            self._cv.notify()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5.0)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
