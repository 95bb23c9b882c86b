"""The findings open to the event consumers, kept across a controller's restart (issue 32).

A consumer of the event stream (the TUI, Alertmanager, a job's agent) holds a finding open
from its raise to its ``clear``. A controller that restarts starts with a fresh brain: it
raised again what its predecessor had open (a second alert for one fault), and never cleared
what was over by then (open for good). `OpenFindings` sits after detection: it tracks every
raise and clear by target (a ``clear`` closes its target's finding), and, started with the
findings its predecessor left open (`load`), it drops a raise of what is already open (a
kind raised on a target since its last clear, by this process or its predecessor) and,
``grace_ns`` after its first window, clears what its own detection did not find again
("not found again after the controller's restart"). `save` / `load` keep the open set in a
file of the ``state_dir`` (JSON lines of events, written whole and renamed). Pure but for
those two.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from contract.documents import EventDoc
from controller.statefile import read_lines, write_lines

NOT_FINDINGS = frozenset({"clear", "topology", "remediation", "remediation_ack"})
"""Events that are not findings a consumer holds open."""

GRACE_NS = 20_000_000_000
"""How long a restarted controller has to find its predecessor's findings again."""

FILE = "open_findings.jsonl"


class OpenFindings:
    """Raises and clears by target (see the module docstring); ``inherited``: the
    predecessor's open findings."""

    def __init__(self, inherited: Iterable[EventDoc] = (), grace_ns: int = GRACE_NS) -> None:
        self.open: dict[str, EventDoc] = {}
        self.inherited = {e.target: e for e in inherited if e.kind not in NOT_FINDINGS}
        # the kinds raised (or inherited) on each target since its last clear
        self.kinds: dict[str, set[str]] = {t: {e.kind} for t, e in self.inherited.items()}
        self.grace_ns = grace_ns
        self._start: int | None = None
        self.changed = False

    def apply(self, events: Iterable[EventDoc], now_ns: int) -> list[EventDoc]:
        """Return ``events`` as the consumers are to see them: a raise of a finding the
        predecessor had open dropped (it stays open), a clear of it kept; then, past the
        grace, a ``clear`` of each inherited finding not found again."""
        if self._start is None:
            self._start = now_ns
        out: list[EventDoc] = []
        for e in events:
            if e.kind in NOT_FINDINGS - {"clear"}:
                out.append(e)
                continue
            if e.kind == "clear":
                self.changed |= self.open.pop(e.target, None) is not None
                self.changed |= self.inherited.pop(e.target, None) is not None
                self.kinds.pop(e.target, None)
                out.append(e)
                continue
            held = self.kinds.setdefault(e.target, set())
            if e.kind in held and e.target not in self.inherited:
                continue  # open already (raised by this process, or by its predecessor and
                # found again under another kind first): consumers hold it
            held.add(e.kind)
            old = self.inherited.pop(e.target, None)
            self.open[e.target] = old if old is not None and old.kind == e.kind else e
            self.changed = True
            if old is None or old.kind != e.kind:
                out.append(e)
        if self.inherited and now_ns - self._start >= self.grace_ns:
            for target, e in sorted(self.inherited.items()):
                self.kinds.pop(target, None)
                out.append(EventDoc(now_ns, "clear", target,
                                    f"{e.kind} not found again after the controller's restart",
                                    "info"))  # fmt: skip
            self.inherited.clear()
            self.changed = True
        return out

    def held(self) -> list[EventDoc]:
        """Return the findings open now (this process's and the inherited ones not yet
        confirmed or cleared), by target."""
        return [e for _, e in sorted({**self.inherited, **self.open}.items())]


def save(directory: Path, findings: OpenFindings) -> None:
    """Write the open findings to ``directory``/`FILE` (whole: a temporary file renamed);
    raises OSError."""
    write_lines(directory / FILE, (e.encode() + b"\n" for e in findings.held()))
    findings.changed = False


def load(directory: Path) -> list[EventDoc]:
    """Return the findings a predecessor left open in ``directory`` (none: no file; a line
    that is not an event is skipped: the file is ours, a torn one is not fatal)."""
    out = []
    for line in read_lines(directory / FILE):
        try:
            out.append(EventDoc.decode(line))
        except ValueError:  # DocumentError, a torn line
            continue
    return out
