"""What a controller remembers across restarts, as JSON (pure), and its file (atomic write).

`dump_state(policy, fingerprints, records)` returns the JSON document of the policy's state
(`controller.remediation.policy.PolicyState`: ids issued, last issue per (kind, target, job),
jobs moved off each NIC, flap history, queued actions, budget), the Alertmanager fingerprints
already acted on and the recent audit records; `load_state(doc, now_ns)` returns them back.
On load the NICs and links that were down or lossy (``down``, ``bad``, ``troubled``) are forgotten: the restarted
controller's detection rebuilds them from fresh findings within one detection window, while
``issued``, ``last`` and ``moved`` keep it from telling a job again what it was told before the
restart (a finding seen anew after a restart starts a new episode, so only ``moved`` and the
rate limits stand between it and a repeated action). Raises `StateError` on a malformed
document. `StateFile` reads and writes ``<dir>/remediation-state.json`` (write to a temporary
file, fsync, rename: a crash leaves the old or the new file, never half of one).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contract.remediation import ActionDoc, DocumentError
from controller.remediation.policy import PolicyState

VERSION = 1
FILE = "remediation-state.json"


class StateError(ValueError):
    """A state document or file is unusable (one line)."""


def dump_state(
    st: PolicyState, fingerprints: Mapping[str, int], records: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Return the JSON document of the state (see the module docstring)."""
    return {
        "version": VERSION,
        "history": {k: list(v) for k, v in st.history.items()},
        "moved": {k: sorted(v) for k, v in st.moved.items()},
        "stable": {k: [t, ref] for k, (t, ref) in st.stable.items()},
        "wanted": [a.to_dict() for a in st.wanted],
        "issued": dict(st.issued),
        "last": [[k[0], k[1], k[2], t] for k, t in st.last.items()],
        "sent": list(st.sent),
        "reported": sorted(st.reported),
        "fingerprints": dict(fingerprints),
        "records": [dict(r) for r in records],
    }


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
        raise StateError(f"remediation state: {what} must be a list of integers")
    return tuple(v)


def _obj(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = doc.get(key, {})
    if not isinstance(v, dict):
        raise StateError(f"remediation state: {key} must be an object")
    return v


def load_state(doc: Any) -> tuple[PolicyState, dict[str, int], list[dict[str, Any]]]:
    """Return (policy state, fingerprints, audit records) of ``doc``; raise `StateError`."""
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise StateError(f"remediation state: not a version {VERSION} state document")
    try:
        history = {str(k): _ints(v, f"history.{k}") for k, v in _obj(doc, "history").items()}
        moved = {str(k): frozenset(map(str, v)) for k, v in _obj(doc, "moved").items()}
        stable = {str(k): (int(v[0]), str(v[1])) for k, v in _obj(doc, "stable").items()}
        wanted = tuple(ActionDoc.decode(json.dumps(a).encode()) for a in doc.get("wanted", []))
        issued = {str(k): int(v) for k, v in _obj(doc, "issued").items()}
        last = {(str(k), str(t), str(j)): int(x) for k, t, j, x in doc.get("last", [])}
        sent = _ints(doc.get("sent", []), "sent")
        reported = frozenset(map(str, doc.get("reported", [])))
        fps = {str(k): int(v) for k, v in _obj(doc, "fingerprints").items()}
        records = [dict(r) for r in doc.get("records", []) if isinstance(r, dict)]
    except (TypeError, ValueError, IndexError, DocumentError) as exc:
        if isinstance(exc, StateError):
            raise
        raise StateError(f"remediation state: {type(exc).__name__}: {exc}") from None
    st = PolicyState(history=history, moved=moved, stable=stable, wanted=wanted, issued=issued,
                     last=last, sent=sent, reported=reported)  # fmt: skip
    return st, fps, records


class StateFile:
    """``<dir>/remediation-state.json``: `read` (None when absent), `write` (atomic)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self._last = b""

    def read(self) -> Any:
        """Return the JSON document in the file, None if there is none; raise `StateError`
        when it cannot be read or is not JSON."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StateError(f"{self.path}: not JSON: {exc}") from None

    def write(self, doc: Mapping[str, Any]) -> bool:
        """Write ``doc`` atomically unless it equals what was written last; return True if it
        wrote. Raises OSError."""
        raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        if raw == self._last:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as fh:
                fh.write(raw)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._last = raw
        return True
