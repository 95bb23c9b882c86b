"""The command-line contract of a long ``--json`` command: stopped early, it still reports.

A benchmark, a scenario run or the headless demo that gets SIGTERM (systemd, ``timeout``, a
CI runner) or SIGINT (Ctrl-C) ends its work early, prints the JSON of what it did with
``"interrupted": true`` and exits 130. Every such command does it with `interruptible`, the
one implementation (docs/architecture.md, "Command line")::

    runs = []
    with interruptible() as stop:
        for seed in seeds:
            runs.append(run_once(seed))     # a signal ends the loop here ...
    report = summarize(runs)                # ... and the report covers the runs done
    return finish(stop, report, as_json=args.json, show=print_text)

`finish` prints the JSON (with ``"interrupted"``) or the text, and returns the exit status. A
command whose work yields its report only at the end passes None when it was interrupted
before: the JSON is then ``{"interrupted": true}`` and the text one line on stderr.

Inside the block SIGTERM is handled like SIGINT: the first one raises `KeyboardInterrupt`
where the work is (its ``finally`` clauses run), the block swallows it and `Stop.interrupted`
is True; further signals are only counted, so cleanup is not cut short. With
``cooperative=True`` the signals only set `Stop.event`, for a loop that checks it between two
steps (the demo's, whose report reads the live state: it must not be cut mid-step). On
leaving, the signal handlers that were there before are back. Outside the main thread (where
Python delivers no signal) the block is a plain block.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

EXIT_INTERRUPTED = 130
"""The exit status of a command stopped by a signal (128 + SIGINT, as shells report it)."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _SignalSafeEvent(threading.Event):
    """A `threading.Event` that a signal handler may set while its own thread is inside
    `wait` (the demo's paced loop waits on it between steps). The standard one guards its
    flag with a plain `threading.Lock`, and `wait` holds it for a few bytecodes on either
    side of the wait proper: a handler run there (Python runs handlers between two bytecodes
    of the main thread) blocks on the lock its own thread holds, for ever (a headless demo
    stopped by SIGINT hung so once). A re-entrant lock lets the handler in: it sets the
    flag and wakes the waiter, or the waiter, not yet queued, wakes at its timeout."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())


@dataclass
class Stop:
    """What the signals did to a block: ``event`` is set by the first one, ``signals``
    counts them."""

    event: threading.Event = field(default_factory=_SignalSafeEvent)
    signals: int = 0

    @property
    def interrupted(self) -> bool:
        """Return True if a signal ended (or asked to end) the work early."""
        return self.event.is_set()

    def mark(self, report: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        """Set ``report["interrupted"]`` to `interrupted`; return ``report``."""
        report["interrupted"] = self.interrupted
        return report

    def exit_code(self, done: int = 0) -> int:
        """Return `EXIT_INTERRUPTED` if interrupted, else ``done``."""
        return EXIT_INTERRUPTED if self.interrupted else done


@contextlib.contextmanager
def interruptible(*, cooperative: bool = False) -> Iterator[Stop]:
    """Run the block so that SIGTERM or SIGINT end it early (see the module); yield its
    `Stop`. A `KeyboardInterrupt` raised in the block ends it the same way."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.signals += 1
        stop.event.set()
        if stop.signals == 1 and not cooperative:
            raise KeyboardInterrupt

    before = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield stop
    except KeyboardInterrupt:
        stop.event.set()
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


def finish(
    stop: Stop,
    report: MutableMapping[str, Any] | None,
    *,
    as_json: bool,
    show: Callable[[Mapping[str, Any]], object] = lambda r: None,
    indent: int | None = None,
) -> int:
    """End a command: with ``as_json`` print ``report`` (None: none yet) as JSON (one line,
    or ``indent``) marked with ``"interrupted"``, else ``show(report)`` (None: a line on
    stderr instead); return `Stop.exit_code`."""
    if as_json:
        print(json.dumps(stop.mark({} if report is None else report), indent=indent), flush=True)
    elif report is not None:
        show(report)
        if stop.interrupted:
            print("interrupted: the report covers the work done before", file=sys.stderr)
    else:
        print("interrupted before there was anything to report", file=sys.stderr)
    return stop.exit_code()
