"""Serving the API app: on the running loop (`start_api`) or in its own thread (`ApiThread`).

Thin shell: aiohttp's `AppRunner` and `TCPSite`, over TLS when given an ``ssl_context``
(`controller.api.access.TlsFiles.context`). `parse_listen` (pure) reads ``HOST:PORT``.
`quiet_bad_requests` makes aiohttp's report of a request it could not parse (a client's
fault, answered 400) one warning line instead of an error with a traceback; every server of
the API (`start_api`, the controller's API process) installs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import threading

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

SERVER_LOGGER = "aiohttp.server"


def parse_listen(text: str) -> tuple[str, int]:
    """Return (host, port) of ``HOST:PORT`` (``[v6]:PORT`` too; port 0 = any free port);
    raise ValueError."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address must look like HOST:PORT, got {text!r}")
    return host, int(port)


class BadRequests(logging.Filter):
    """Turns aiohttp's "Error handling request" for a request it could not parse
    (`HttpProcessingError`: a bad header, a bad request line) into one WARNING line
    without a traceback, and without the request bytes aiohttp quotes after the first line
    of its message (a bad header may hold a token); other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            first = str(exc.message).strip().split("\n", 1)[0]
            detail = re.sub(r"\s+", " ", f"{exc.code} {first}").strip()
            record.msg, record.args = f"{record.getMessage()}: {detail}", ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def quiet_bad_requests() -> None:
    """Install `BadRequests` on aiohttp's server logger (once per process)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, BadRequests) for f in logger.filters):
        logger.addFilter(BadRequests())


async def start_api(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` in the running loop (HTTPS with ``ssl_context``);
    return the runner (call its ``cleanup()`` to stop) and the bound port. Raises OSError if
    the address is taken."""
    quiet_bad_requests()
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    addrs = runner.addresses
    return runner, int(addrs[0][1]) if addrs else port


class ApiThread:
    """The API served by an event loop in a daemon thread (for synchronous producers);
    HTTPS with ``ssl_context``."""

    def __init__(
        self, app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.app, self.host, self.port, self.ssl_context = app, host, port, ssl_context
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="qpmesh-api",
                                        daemon=True)  # fmt: skip
        self._runner: web.AppRunner | None = None

    def start(self, timeout_s: float = 10.0) -> int:
        """Start serving; return the bound port. Raises OSError if the address is taken."""
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            start_api(self.app, self.host, self.port, self.ssl_context), self._loop
        )
        try:
            self._runner, self.port = fut.result(timeout_s)
        except BaseException:
            self._stop_loop()
            raise
        return self.port

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and end the thread (idempotent)."""
        if self._runner is not None and self._loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            with contextlib.suppress(Exception):
                fut.result(timeout_s)
            self._runner = None
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():
            self._thread.join(5.0)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()
