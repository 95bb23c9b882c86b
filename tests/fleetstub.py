"""A stand-in for the fleet's pure core (`controller.fleet.cores`): batches are
``b"<origin>:<batch_seq>:<t_ns>"``; a partial lists the batches it covers, so the solver's
stand-in counts every batch's share (exactly once or not)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from contract.documents import EventDoc
from controller.admission import Outcome, Verdict


def batch(origin: str, seq: int, t_ns: int) -> bytes:
    """Return a stand-in batch."""
    return f"{origin}:{seq}:{t_ns}".encode()


@dataclass(frozen=True)
class StubCovers:
    keys: frozenset[tuple[str, int]]

    def __len__(self) -> int:
        return len(self.keys)

    def batches(self) -> set[tuple[str, int]]:
        return set(self.keys)


@dataclass(frozen=True)
class StubPartial:
    window: int
    covers: StubCovers

    def encode(self) -> bytes:
        return json.dumps({"window": self.window, "covers": sorted(self.covers.keys)}).encode()


@dataclass
class StubWorker:
    """Closes the windows whose end is ``grace_ns`` before ``close``'s time (like the core);
    a batch of a closed window is dropped as late."""

    window_ns: int
    grace_ns: int
    open: dict[int, set[tuple[str, int]]] = field(default_factory=dict)
    seen: set[tuple[str, int]] = field(default_factory=set)
    closed_below: int = -(1 << 62)
    clocks: list[bytes] = field(default_factory=list)
    late: int = 0

    def admit(self, host: str, payload: bytes, now_ns: int) -> Verdict:
        try:
            origin, seq, t = payload.decode().split(":")
            key, w = (origin, int(seq)), int(t) // self.window_ns
        except ValueError:
            return Verdict(Outcome.MALFORMED, "not a stand-in batch")
        if origin != host:
            return Verdict(Outcome.UNTRUSTED, "origin is not the subject's host")
        if key in self.seen:
            return Verdict(Outcome.DUPLICATE)
        self.seen.add(key)
        if w < self.closed_below:
            self.late += 1
            return Verdict(Outcome.REPLAYED, "late: its window was closed")
        self.open.setdefault(w, set()).add(key)
        return Verdict(Outcome.ACCEPTED, records=1)

    def close(self, now_ns: int) -> Sequence[StubPartial]:
        below = (now_ns - self.grace_ns) // self.window_ns
        out = [StubPartial(w, StubCovers(frozenset(self.open.pop(w))))
               for w in sorted(self.open) if w < below]  # fmt: skip
        self.closed_below = max(self.closed_below, below)
        return out

    def install_clock(self, models: bytes) -> None:
        self.clocks.append(models)


@dataclass(frozen=True)
class StubResult:
    events: tuple[EventDoc, ...]
    clock: bytes


@dataclass
class StubSolver:
    """Counts each batch's appearances in merged partials; solve returns one event."""

    counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    windows: dict[int, set[tuple[str, int]]] = field(default_factory=dict)
    solved: list[int] = field(default_factory=list)

    def add(self, partial: bytes) -> None:
        doc = json.loads(partial)
        for origin, seq in doc["covers"]:
            self.counts[(origin, seq)] += 1
            self.windows.setdefault(doc["window"], set()).add((origin, seq))

    def solve(self, window: int, now_ns: int) -> StubResult:
        self.solved.append(window)
        n = len(self.windows.get(window, ()))
        ev = EventDoc(t_ns=now_ns, kind="fleet_window", target=f"window{window}",
                      severity="info", detail=f"{n} batches")  # fmt: skip
        return StubResult((ev,), f"models-{window}".encode())
