"""What ``qpmesh testbed run`` watches and reports: MQTT monitor, sync error, localization.

- `Monitor`: a background thread with its own asyncio loop subscribed to ``<prefix>/events/#``,
  ``probes``, ``paths``, ``health``, ``presence`` and ``neighbors`` on the run's broker; keeps every event
  (JSON, with its arrival time in ``event_at``) and probe batch, and every message the
  controller also reads as it arrived (``raw``: arrival ns, topic, payload) so a run can be
  replayed offline (`testbed.replay`); ``watch``: more topic kinds (e.g. ``remediation``),
  kept as they arrived in ``other``.
- `sync_report(batches, truth, windows)`: sync error of the probes the probers really sent
  (kernel software stamps through the hosts' virtual clocks) against the clocks' truth, per
  window, with `sync.window` (Huygens) and the NTP-style baseline on the same probes, through
  `testbed.bench_sync_real` (the same error definitions as that benchmark).
- `localization(faults, events)`: per injected fault, the controller events naming its link.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiomqtt
import numpy as np

from contract.records import ProbeBatch, RecordError, decode_batch
from mqttlink.settings import MqttSecurity, client_kwargs
from testbed.bench_sync_real import summarize_errors, window_errors
from testbed.scenario import Fault, FaultKind
from testbed.vclock import VirtualClock

WINDOW_S = 5.0
RAW_KINDS = ("probes", "paths", "health", "presence", "neighbors")
"""Topic kinds `Monitor.raw` keeps: the ones the controller's pipeline reads."""


def digest(payload: bytes) -> str:
    """Return a short digest of a message payload (tells a forged copy from its twin)."""
    return hashlib.sha256(payload).hexdigest()[:16]


class Monitor:
    """Subscribe to events and probe batches of a broker in a background thread."""

    def __init__(
        self,
        host: str,
        port: int,
        prefix: str = "qpmesh/v1",
        security: MqttSecurity | None = None,
        watch: tuple[str, ...] = (),
        session: str = "",
    ) -> None:
        """``session``: a client id for a persistent session (the broker queues what the
        monitor subscribed to while it is away, e.g. while the broker restarts; a broker
        that keeps its state on disk keeps the session across its own restart); "": a
        clean session per connect."""
        self.host, self.port, self.prefix = host, port, prefix
        self.session = session
        self.security = security or MqttSecurity()
        self.watch = watch
        self.events: list[dict[str, Any]] = []
        self.event_at: list[int] = []  # arrival ns of each of ``events``
        self.other: list[tuple[int, str, bytes]] = []  # the ``watch`` kinds as they arrived
        self.batches: list[ProbeBatch] = []
        self.errors: list[str] = []
        self.paths: list[dict[str, Any]] = []
        # every probe batch delivered, (topic, origin, batch_seq, payload digest), repeats
        # included (a replay shows twice); ``batches`` keeps each (origin, batch_seq) once
        self.arrivals: list[tuple[str, str, int, str]] = []
        self.health: dict[str, dict[str, Any]] = {}  # host -> its latest health document
        # what the controller reads (probes, paths, health, presence) as it arrived
        self.raw: list[tuple[int, str, bytes]] = []
        self._seen: set[tuple[str, int]] = set()
        self.polls = 0  # turns of the watch over the reader (one per 0.2 s): how long it idled
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> None:
        """Start the thread (it reconnects until `stop`)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                kw: dict[str, Any] = dict(client_kwargs(self.security))
                if self.session:
                    kw.update(identifier=self.session, clean_session=False)
                async with aiomqtt.Client(self.host, self.port, timeout=5, **kw) as c:
                    await c.subscribe(f"{self.prefix}/events/#", qos=1, timeout=5)
                    await c.subscribe(f"{self.prefix}/probes/#", qos=1, timeout=5)
                    await c.subscribe(f"{self.prefix}/paths/#", qos=1, timeout=5)
                    await c.subscribe(f"{self.prefix}/health/#", qos=1, timeout=5)
                    await c.subscribe(f"{self.prefix}/presence/#", qos=1, timeout=5)
                    await c.subscribe(f"{self.prefix}/neighbors/#", qos=1, timeout=5)
                    for kind in self.watch:
                        await c.subscribe(f"{self.prefix}/{kind}/#", qos=1, timeout=5)
                    # The reader is never cancelled while it runs: cancelling aiomqtt's
                    # ``messages.__anext__`` (e.g. by a wait_for timeout) just after it took a
                    # message off its queue loses that message, which a busy machine hits.
                    reader = asyncio.create_task(self._read(c))
                    while not self._stop.is_set() and not reader.done():
                        await asyncio.sleep(0.2)
                        self.polls += 1
                    if reader.done():
                        reader.result()  # re-raise the reader's broker error
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reader
            except (aiomqtt.MqttError, OSError, TimeoutError) as exc:
                self.errors.append(str(exc))
                await asyncio.sleep(0.2)

    async def _read(self, client: aiomqtt.Client) -> None:
        async for msg in client.messages:
            self._take(str(msg.topic), msg.payload)

    def _take(self, topic: str, payload: Any) -> None:
        data = payload if isinstance(payload, bytes) else b""
        kind = topic[len(self.prefix) + 1 :].split("/", 1)[0]
        now = time.time_ns()
        if kind in RAW_KINDS:
            with self._lock:
                self.raw.append((now, topic, data))
        elif kind in self.watch:
            with self._lock:
                self.other.append((now, topic, data))
        with contextlib.suppress(RecordError, ValueError), self._lock:
            if kind == "probes":
                b = decode_batch(data)
                key = (b.origin, b.batch_seq)
                if key not in self._seen:
                    self._seen.add(key)
                    self.batches.append(b)
                self.arrivals.append((topic, b.origin, b.batch_seq, digest(data)))
            elif kind == "health":
                doc = json.loads(data)
                if isinstance(doc, dict):
                    self.health[topic.rsplit("/", 1)[-1]] = doc
            elif kind == "paths":
                doc = json.loads(data)
                if isinstance(doc, list):
                    self.paths += [e for e in doc if isinstance(e, dict)]
            elif kind == "events":
                doc = json.loads(data)
                if isinstance(doc, dict):
                    self.events.append(doc)
                    self.event_at.append(now)

    def bad_auth(self) -> dict[str, int]:
        """Return each host's ``bad_auth`` probe counter from its latest health document."""
        with self._lock:
            docs = dict(self.health)
        out: dict[str, int] = {}
        for host, doc in docs.items():
            counters = doc.get("counters")
            n = counters.get("bad_auth") if isinstance(counters, dict) else None
            if isinstance(n, int):
                out[host] = n
        return out

    def origins(self) -> frozenset[str]:
        """Return the origins (hosts) of every probe batch seen so far."""
        with self._lock:
            return frozenset(b.origin for b in self.batches)

    def latest_batch(self, origin: str) -> ProbeBatch | None:
        """Return the newest batch seen from ``origin`` (None if none)."""
        with self._lock:
            mine = [b for b in self.batches if b.origin == origin]
        return max(mine, key=lambda b: b.batch_seq, default=None)

    def old_batch(self, origin: str, behind: int = 24) -> ProbeBatch | None:
        """Return the oldest batch seen from ``origin`` if it lies at least ``behind``
        batches below the newest (a batch worth replaying), else None."""
        with self._lock:
            mine = [b for b in self.batches if b.origin == origin]
        if not mine:
            return None
        old = min(mine, key=lambda b: b.batch_seq)
        new = max(b.batch_seq for b in mine)
        return old if new - old.batch_seq >= behind else None


def _to_kernel(clock: VirtualClock, local: np.ndarray) -> np.ndarray:
    """Invert ``clock.apply_array`` (two fixed-point steps: exact to ~1 ns for |drift| < 1e-3)."""
    k = local - np.round(clock.offset_ns).astype(np.int64)
    for _ in range(2):
        k = local - (clock.apply_array(k) - k)
    out: np.ndarray = k
    return out


def sync_report(
    batches: Sequence[ProbeBatch],
    clocks: Mapping[str, VirtualClock],
    nic_host: Mapping[str, str],
    windows: Sequence[tuple[str, int, int]],
    coded_tol_ns: int = 2000,
) -> dict[str, Any] | None:
    """Return sync error figures per window label, or None without usable probes.

    ``windows``: (label, start, end) in kernel (true) ns; records are assigned by their true
    send time. Figures per label: `testbed.bench_sync_real` summary (``p50_ns``/``p99_ns`` of
    mean-removed node offsets vs truth, ``pair_p99_ns``, NTP baseline ``ntp_pair_p99_ns``...).
    """
    nics = sorted(nic_host)
    index = {n: i for i, n in enumerate(nics)}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("src", "dst", "pair", "t1", "t2",
                                                          "t3", "t4", "lost")}  # fmt: skip
    for b in batches:
        table = np.array([index.get(x, -1) for x in b.nic_ids], np.int64)
        src, dst = table[b.src], table[b.dst]
        ok = (src >= 0) & (dst >= 0)
        pair = np.where(b.pair >= 0, (src << 32) | b.pair.astype(np.int64), -1)
        for k, v in (("src", src), ("dst", dst), ("pair", pair), ("t1", b.t1), ("t2", b.t2),
                     ("t3", b.t3), ("t4", b.t4), ("lost", b.lost.astype(np.int64))):  # fmt: skip
            cols[k].append(np.asarray(v, np.int64)[ok])
    if not cols["src"] or not sum(len(c) for c in cols["src"]):
        return None
    w = {k: np.concatenate(v) for k, v in cols.items()}
    lost = w["lost"].astype(bool)
    host_clock = [clocks[nic_host[n]] for n in nics]
    for c, clk in enumerate(host_clock):  # stamps are local: back to kernel time
        ms, md = ~lost & (w["src"] == c), ~lost & (w["dst"] == c)
        w["t1"][ms], w["t4"][ms] = _to_kernel(clk, w["t1"][ms]), _to_kernel(clk, w["t4"][ms])
        w["t2"][md], w["t3"][md] = _to_kernel(clk, w["t2"][md]), _to_kernel(clk, w["t3"][md])
    out: dict[str, Any] = {}
    for label, a, z in windows:
        sel_all = (w["t1"] >= a) & (w["t1"] < z) & ~lost
        errs = []
        step = min(int(WINDOW_S * 1e9), z - a)
        for s in np.arange(a, z - step + 1, max(step, 1)):
            m = sel_all & (w["t1"] >= s) & (w["t1"] < s + step)
            if m.sum() < 50:
                continue
            sub = {k: v[m] for k, v in w.items()}
            with contextlib.suppress(ValueError, np.linalg.LinAlgError):
                e = window_errors(sub, host_clock, coded_tol_ns)
                if e["node"] and e["ntp_pair"]:
                    errs.append(e)
        if errs:
            out[label] = {k: round(v, 1) for k, v in summarize_errors(errs).items()}
    return out or None


def _ends(name: str) -> frozenset[str]:
    for sep in ("->", "-"):
        if sep in name:
            return frozenset(name.replace(" ", "").split(sep)[:2])
    return frozenset((name,))


def localization(
    faults: Sequence[Fault], events: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Return per fault the controller events that name its link (or NIC), and ``localized``.

    Flap / link down / loss want ``link_flap``, ``link_down`` or ``loss`` on the link;
    congestion wants ``contention`` on either direction of the link.
    """
    want = {
        FaultKind.FLAP: ("link_flap", "link_down", "loss"),
        FaultKind.LINK_DOWN: ("link_down", "link_flap", "loss"),
        FaultKind.LOSS: ("loss", "link_flap"),
        FaultKind.CONGEST: ("contention",),
        FaultKind.NIC_DOWN: ("nic_down",),
        FaultKind.PROBER_DOWN: ("prober_down",),
    }.get
    out = []
    for f in faults:
        kinds = want(f.kind, ())
        hits = [e for e in events if e.get("kind") in kinds
                and _ends(str(e.get("target", ""))) == _ends(f.target)]  # fmt: skip
        others = sorted({f"{e.get('kind')}:{e.get('target')}" for e in events
                         if e.get("kind") in kinds and e not in hits})  # fmt: skip
        out.append({"fault": f.kind.value, "target": f.target, "localized": bool(hits),
                    "events": [f"{e.get('kind')}:{e.get('target')}" for e in hits][:5],
                    "other_events": others[:10]})  # fmt: skip
    return out
