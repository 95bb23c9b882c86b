"""What a testbed created, in ``/run/qpmesh/<prefix>/state.json`` (read by down/status/faults).

Records the prefix, the fabric shape and options (so the plan can be rebuilt exactly), and the
processes started in the testbed (role, pid, start time: a pid is only signalled if its start
time still matches, so a recycled pid is never hit).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_ROOT = Path(os.environ.get("QPMESH_RUN_DIR", "/run/qpmesh"))


def state_dir(prefix: str) -> Path:
    """Return the state directory of the testbed with ``prefix``."""
    return STATE_ROOT / prefix


def load_state(prefix: str) -> dict[str, Any] | None:
    """Return the recorded state, or None if there is none (or it is unreadable)."""
    try:
        doc = json.loads((state_dir(prefix) / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def save_state(prefix: str, doc: dict[str, Any]) -> Path:
    """Write ``doc`` atomically as the state of ``prefix``; return the file path."""
    d = state_dir(prefix)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def proc_start_time(pid: int) -> int | None:
    """Return the kernel start time (clock ticks) of ``pid``, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def record_process(prefix: str, role: str, pid: int, **extra: Any) -> None:
    """Add a started process (role e.g. ``congest:leaf0-spine1``) to the state of ``prefix``."""
    doc = load_state(prefix) or {"prefix": prefix}
    procs = doc.setdefault("processes", [])
    procs.append({"role": role, "pid": pid, "start": proc_start_time(pid), **extra})
    save_state(prefix, doc)


def forget_process(prefix: str, pid: int) -> None:
    """Remove ``pid`` from the recorded processes of ``prefix``."""
    doc = load_state(prefix)
    if doc is None:
        return
    doc["processes"] = [p for p in doc.get("processes", []) if p.get("pid") != pid]
    save_state(prefix, doc)


def alive(entry: dict[str, Any]) -> bool:
    """Return True if the recorded process still runs (same pid and same start time)."""
    pid = int(entry.get("pid", -1))
    start = proc_start_time(pid) if pid > 0 else None
    return start is not None and start == entry.get("start")
