"""The traced paths a controller learned, kept across its restart (issue 32).

The probers trace their flows in sweeps (``[paths] refresh_s`` apart, 60 s by default) and
publish each traced path once per sweep on ``paths/<host>``. A controller that restarts
started with none: with ``[paths] model = false`` (the testbed's: the kernel's hash is not
the fabric model's) a flow without a learned path is localized to its NICs and host only, so
until the next sweep a spine link's fault was localized nowhere (the chaos run's missed flap,
docs/reliability.md). `KeptPaths` holds the latest complete path per flow (src, dst, sport)
and when it came; `save` writes them to a file of the controller's ``state_dir`` (beside the
open findings, `controller.openfindings`), `load` reads them back at the successor's start,
before it subscribes.

Why kept here and not republished by the probers: a retained ``paths/<host>`` message keeps
only a host's last document (a sweep is many), and a republish on the controller's hello
needs a controller presence the probers follow; the state folder already survives the
restart and is read before the first message.

Stale paths do not win over fresh ones: the kept paths are installed before the first
message, so every path that arrives afterwards (queued by the broker for the controller's
persistent session, or the next sweep's) replaces its flow's; a kept path older than
``max_age_ns`` when loaded is dropped (a learned fabric's paths age out at the same bound);
a path that did not reach its destination or has a silent hop is not kept (a fault must not
unlearn a path). Pure but for `save` and `load`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from contract.documents import TracedPath
from controller.statefile import read_lines, write_lines

FILE = "learned_paths.jsonl"

MAX_AGE_NS = 600_000_000_000
"""A kept path older than this when loaded is dropped (`LearnConfig.path_max_age_ns`'s
default)."""

SAVE_EVERY_NS = 5_000_000_000
"""Changed paths are written at most this often (a sweep's documents come a second apart;
writing 51,200 paths took ~1 s of CPU on this busy machine, in a worker thread)."""

REFRESH_NS = 60_000_000_000
"""Paths that came again unchanged are written this often (their times on disk)."""

_Flow = tuple[str, str, int]


def complete(p: TracedPath) -> bool:
    """Return True when ``p`` reached its destination and every hop answered."""
    return p.reached and None not in p.hops


class KeptPaths:
    """The latest complete path per flow and the time it came (see the module docstring)."""

    def __init__(self, restored: Iterable[tuple[TracedPath, int]] = ()) -> None:
        self.paths: dict[_Flow, tuple[TracedPath, int]] = {}
        for p, t in restored:
            self._put(p, t)
        self.changed = False  # a flow's path is new or different since the last save
        self.touched = False  # a path came again since the last save (its time moved)
        self.saved_ns: int | None = None

    def _put(self, p: TracedPath, t_ns: int) -> bool:
        key = (p.src, p.dst, p.sport)
        had = self.paths.get(key)
        if had is not None and had[1] > t_ns:
            return False
        self.paths[key] = (p, t_ns)
        return had is None or had[0] != p

    def add(self, host: str, paths: Iterable[TracedPath], owners: Mapping[str, str],
            now_ns: int) -> int:  # fmt: skip
        """Keep the complete paths of ``host``'s document whose source NIC ``host`` owns
        (``owners``: NIC id -> host); return how many were kept."""
        kept = 0
        for p in paths:
            if owners.get(p.src) != host or not complete(p):
                continue
            self.changed |= self._put(p, now_ns)
            self.touched = True
            kept += 1
        return kept

    def restored(self) -> list[tuple[TracedPath, int]]:
        """Return every kept path with the time it came."""
        return list(self.paths.values())

    def entries(self) -> list[dict[str, object]]:
        """Return every kept path as a ``paths/<host>`` document's entries."""
        return [p.to_json() for p, _ in self.paths.values()]

    def due(self, now_ns: int, every_ns: int = SAVE_EVERY_NS) -> bool:
        """Return True when the paths changed and none were saved for ``every_ns``, or came
        again unchanged and none were saved for `REFRESH_NS` (so that the times on disk stay
        within the age bound of a path the probers keep tracing)."""
        since = None if self.saved_ns is None else now_ns - self.saved_ns
        return (self.changed and (since is None or since >= every_ns)) or (
            self.touched and (since is None or since >= REFRESH_NS)
        )

    def take(self, now_ns: int) -> list[tuple[TracedPath, int]]:
        """Return every kept path with its time, to be written (`write`), and count them as
        saved at ``now_ns``."""
        self.changed = self.touched = False
        self.saved_ns = now_ns
        return self.restored()


def save(directory: Path, kept: KeptPaths, now_ns: int) -> None:
    """Write the kept paths to ``directory`` (`write` of `KeptPaths.take`); raises OSError."""
    write(directory, kept.take(now_ns))


def write(directory: Path, paths: Iterable[tuple[TracedPath, int]]) -> None:
    """Write ``paths`` to ``directory``/`FILE` (JSON lines ``{"t_ns", "src", "dst", "sport",
    "hops", "reached"}``, whole: a temporary file renamed); raises OSError. Reads nothing
    shared: it may run in a worker thread."""
    write_lines(
        directory / FILE,
        (json.dumps({"t_ns": t, **p.to_json()}).encode() + b"\n" for p, t in paths),
    )


def load(
    directory: Path, now_ns: int, max_age_ns: int = MAX_AGE_NS
) -> list[tuple[TracedPath, int]]:
    """Return the paths a predecessor kept in ``directory`` with the times they came, less
    those older than ``max_age_ns`` at ``now_ns`` and the incomplete ones (none: no file; a
    line that is not a path is skipped: the file is ours, a torn one is not fatal)."""
    out = []
    for line in read_lines(directory / FILE):
        try:
            e = json.loads(line)
            t, hops = e["t_ns"], e["hops"]
            hops = tuple(hops) if isinstance(hops, list) else hops  # else refused below
            p = TracedPath(e["src"], e["dst"], e["sport"], hops, e["reached"])
        except (ValueError, KeyError, TypeError):  # a torn line, a bad field (DocumentError)
            continue
        fresh = type(t) is int and now_ns - t <= max_age_ns
        if fresh and complete(p):
            out.append((p, t))
    return out
