"""Python ``logging`` records as one line each, for a JSON-lines log (thin shell).

Libraries (aiohttp, asyncio) report through ``logging``; left alone, their records and
tracebacks reach stderr as plain text, in the middle of the controller's JSON lines.
`RecordRelay` is a ``logging.Handler`` that hands every record to a sink as one value: the
record's level, logger and message, with its traceback (if any) in the same string, so a
JSON writer escapes it into one line. ``with relay_logging(sink):`` installs it on the root
logger (instead of the handlers there) and routes ``warnings`` through it too; on leaving,
the root logger's handlers, level and the ``warnings`` route are as they were. The API process
(`controller.api.child`) relays into its pipe, the controller (`controller.service`) into its
JSON-lines log.

``sink(level, logger, text)`` must not block for long and must not log itself.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator

Sink = Callable[[str, str, str], None]
"""(level name, logger name, message with its traceback) -> None."""


class RecordRelay(logging.Handler):
    """Hands each record to ``sink`` as (level, logger, text); text includes the traceback."""

    def __init__(self, sink: Sink, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.sink = sink
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a record whose arguments do not format: say so, never raise
            text = f"{record.msg!r} {record.args!r}"
        try:
            self.sink(record.levelname, record.name, text)
        except Exception:  # the sink is gone (e.g. a closed pipe): nothing to log to
            self.handleError(record)


@contextlib.contextmanager
def relay_logging(sink: Sink, level: int = logging.INFO) -> Iterator[RecordRelay]:
    """While inside, send every ``logging`` record (and ``warnings``) of this process to
    ``sink`` instead of the root logger's handlers (stderr); yield the handler."""
    root = logging.getLogger()
    before, before_level = list(root.handlers), root.level
    shown = warnings.showwarning
    for h in before:
        root.removeHandler(h)
    handler = RecordRelay(sink, level)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    try:
        yield handler
    finally:
        if warnings.showwarning is not shown:  # this call began the capture: end it
            logging.captureWarnings(False)
        root.removeHandler(handler)
        for h in before:
            root.addHandler(h)
        root.setLevel(before_level)
