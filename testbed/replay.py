"""Offline replay of a `qpmesh testbed run`: what the controller read, through a fresh pipeline.

`testbed.runner` writes every message the controller also reads (probe batches, paths, health,
presence, neighbours) with its arrival time to ``<out>/mqtt.jsonl`` (`write_capture`: one JSON object
``{"t_ns", "topic", "b64"}`` per line). `replay` builds the controller the service builds from
the run's ``controller.toml`` and feeds it those messages in arrival order with time passed in:
a tick and a due clock solve every ``tick_s`` of arrival time, as the service's ticker and
solver do. The solve runs inline (the service runs it in a worker thread and installs it a
little later), so the replay's events match the run's in kind and target, within a tick or two
in time. ``on_window`` sees the brain's delay verdict of every closed window, for diagnosing a
run (why a fault was or was not localized) after the namespaces are gone.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from contract.documents import EventDoc
from contract.topics import Topics
from controller.brain import Brain
from controller.clocksolve import timed_solve
from controller.clocksync import ClockState
from controller.coalesce import ProbeQueue
from controller.config import load_config
from controller.dispatch import handle_message
from controller.live import LiveController
from controller.service import live_state
from controller.topology import TopologyLearner, relearn_live
from testbed.clockcheck import ClockCheck
from testbed.vclock import load_truth

CAPTURE = "mqtt.jsonl"
"""File name of a run's capture inside its output directory."""
TRUTH = "clocks.json"
"""File name of a run's virtual clocks (`testbed.vclock`) inside its output directory."""
REPORT = "report.json"
"""File name of a run's report inside its output directory."""


class CaptureError(ValueError):
    """A capture file that cannot be read (its line number and reason in the message)."""


def write_capture(path: Path, raw: Iterable[tuple[int, str, bytes]]) -> int:
    """Write ``raw`` (arrival ns, topic, payload) to ``path`` as JSON lines; return the count."""
    n = 0
    with path.open("w") as f:
        for t_ns, topic, payload in raw:
            doc = {"t_ns": t_ns, "topic": topic, "b64": base64.b64encode(payload).decode()}
            f.write(json.dumps(doc) + "\n")
            n += 1
    return n


def read_capture(path: Path) -> Iterator[tuple[int, str, bytes]]:
    """Yield (arrival ns, topic, payload) of a capture file, in file order.

    Raises `CaptureError` on a line that is not a capture record, OSError if unreadable."""
    with path.open() as f:
        for i, line in enumerate(f, 1):
            try:
                doc = json.loads(line)
                yield (
                    int(doc["t_ns"]),
                    str(doc["topic"]),
                    base64.b64decode(doc["b64"], validate=True),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise CaptureError(f"{path}:{i}: not a capture record ({exc})") from None


@dataclass(frozen=True, slots=True)
class Replay:
    """What a replay produced: the events, how many messages of each outcome, solves, and the
    arrived probes' delays by clock trust (`LiveController.delay_trust`: fine, coarse,
    withheld)."""

    events: tuple[EventDoc, ...]
    outcomes: dict[str, int]
    solves: int
    delay_trust: tuple[int, int, int] = (0, 0, 0)


def replay(
    out_dir: Path,
    *,
    prefix: str = "qpmesh/v1",
    solve_delay_s: float = 0.0,
    on_tick: Callable[[LiveController, int], None] = lambda live, now: None,
) -> Replay:
    """Replay the capture of the run in ``out_dir`` through the controller its
    ``controller.toml`` describes; return its events. ``solve_delay_s``: a clock solve is
    installed this long after it started (the service's worker thread takes that long on a
    busy machine; 0: at once). ``on_tick(live, now_ns)`` runs after every tick (inspection).

    Raises FileNotFoundError without a capture or config, `CaptureError` on a bad capture,
    `controller.config.ConfigError` on a bad config."""
    cfg = load_config(out_dir / "controller.toml", out_dir)
    topology = TopologyLearner(cfg.learn) if cfg.learn is not None else None
    live = live_state(cfg, topology)  # solves left to `step`, as the service's worker
    topics = Topics(prefix)
    queue = ProbeQueue(cfg.ingest) if cfg.ingest.coalesce_ms > 0 else None
    tick_ns = round(cfg.tick_s * 1e9)
    events: list[EventDoc] = []
    outcomes: dict[str, int] = {}
    solves = 0
    next_tick: int | None = None
    running: list[tuple[int, ClockState | None, float]] = []  # (install at, state, cost s)
    delay_ns = round(solve_delay_s * 1e9)

    def step(now: int) -> None:
        nonlocal solves
        if queue is not None and len(queue):
            live.flush(queue, now)
        if topology is not None:  # a learned fabric: learn it again, as the service's ticker
            done = relearn_live(live, topology, now, lambda f: Brain(f, cfg.brain))
            events.extend([done[1]] if done else [])
        events.extend(live.tick(now))
        while running and running[0][0] <= now:
            solves += live.install_clock(*running.pop(0)[1:])
        if not running:  # the service runs one solve at a time
            job = live.start_solve(now)
            if job is not None:
                state, cpu_s = timed_solve(job)  # its CPU time sets the cadence, as in
                running.append((now + delay_ns, state, cpu_s))  # the service
                if not delay_ns:
                    solves += live.install_clock(*running.pop(0)[1:])
        on_tick(live, now)

    for t_ns, topic, payload in sorted(read_capture(out_dir / CAPTURE), key=lambda r: r[0]):
        if next_tick is None:
            next_tick = t_ns + tick_ns
        while t_ns >= next_tick:
            step(next_tick)
            next_tick += tick_ns
        if queue is not None and queue.due(t_ns):
            live.flush(queue, t_ns)
        out = handle_message(live, topics, topic, payload, t_ns, cfg.router_nodes, queue, topology)
        key = "bad" if out.startswith("bad:") else out
        outcomes[key] = outcomes.get(key, 0) + 1
    if next_tick is not None:  # close the window of the last messages (more ticks without
        step(next_tick)  # messages would only find the probers silent)
    fine, coarse, withheld = (int(n) for n in live.delay_trust)
    return Replay(tuple(events), outcomes, solves, (fine, coarse, withheld))


def clock_check(
    out_dir: Path, spans: Sequence[tuple[str, int, int]] | None = None
) -> tuple[ClockCheck | None, Callable[[LiveController, int], None]]:
    """A `testbed.clockcheck.ClockCheck` of the live clock against the run's virtual clocks,
    and the ``on_tick`` for `replay` that feeds it; (None, a no-op) when ``out_dir`` has no
    truth file. Its spans are ``spans`` if given, else the report's ``sync_windows`` (idle,
    congested; written by `qpmesh testbed run` since 2026-11-29), else the whole run as
    ``"run"``.

    Raises `testbed.vclock.ClockError` on a malformed truth file, OSError or ValueError on an
    unreadable report."""
    if not (out_dir / TRUTH).is_file():
        return None, lambda live, now: None
    clocks, nic_host = load_truth(out_dir / TRUTH)
    if spans is None:
        spans = [("run", 0, 2**63 - 1)]
        if (out_dir / REPORT).is_file():
            doc = json.loads((out_dir / REPORT).read_text())
            if doc.get("sync_windows"):
                spans = [(str(x[0]), int(x[1]), int(x[2])) for x in doc["sync_windows"]]
    cfg = load_config(out_dir / "controller.toml", out_dir).live.sync
    check = ClockCheck(spans, cfg.max_unc_ns, cfg.coarse_unc_ns)

    def on_tick(live: LiveController, now: int) -> None:
        off, unc = live.clock.offsets(now)
        truth = np.array([clocks[nic_host[n.id]].offset_at(now) for n in live.fabric.nics])
        check.observe(now, off, unc, truth)

    return check, on_tick


def live_clock(out_dir: Path, spans: Sequence[tuple[str, int, int]]) -> dict[str, object]:
    """The run's capture replayed through its controller with the clock held against its
    virtual clocks (`clock_check` over ``spans``): ``{"from": ..., "spans": report}``.
    Raises FileNotFoundError without a capture, config or truth file, `CaptureError` on a bad
    capture, `controller.config.ConfigError` on a bad config."""
    check, on_tick = clock_check(out_dir, spans)
    if check is None:
        raise FileNotFoundError(f"{out_dir / TRUTH}: no truth file")
    replay(out_dir, on_tick=on_tick)
    return {"from": f"replay of {CAPTURE} through controller.toml", "spans": check.report()}
