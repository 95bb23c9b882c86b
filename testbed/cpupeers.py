"""The far side of ``qpmesh testbed prober-cpu``: many peer NICs in one process.

Run inside the peers' namespace as ``python -m testbed.cpupeers SPEC.json``. SPEC (written by
`testbed.probercpu`) lists the peer NICs (id, address), the streams each peer probes back
(to the measured host's NICs, coded pairs at ``rate_hz``), the broker and the measured
host's id. The process

- answers every probe of the measured prober (one `prober.compiled.CompiledUdpEndpoint` per
  peer NIC on its probe port, deferred follow-ups on, as the rest of a fleet of this prober
  would; `prober.fastudp.BatchUdpEndpoint` when the extension is not built or the spec says
  ``"peer_path": "batched"``), so the prober's own probes complete. With ``"peer_ticks":
  "driver"`` (the default) one `prober.drive.CompiledDriver` ticks all of them every 10 ms, as
  the agent ticks its NICs: a datagram arriving does not wake the process (nothing waits on
  the engines' readiness). On veth the sender's ``sendmmsg`` runs the receiver's UDP receive,
  wake-up included, so peers woken per datagram (``"readiness"``: each endpoint's own timer and
  readiness callback, as before 2026-11-23 22:30) charge the measured prober with waking them,
  a cost a fleet of driven probers does not have;
- probes the prober's NICs back at the default schedule's rate, so the prober answers as many
  probes as it sends (a host in a mesh does both);
- counts the records the prober publishes (``<prefix>/probes/<host>``, decoded) and the
  results of its own probes, and rewrites ``stats`` (JSON: results, lost, batches, answered)
  every 0.5 s for the orchestrator to read.

With ``key_file`` (a `contract.keys` hmac-sha256 file) every peer NIC tags what it sends and
verifies what it receives with those keys (the engine's HMAC, keyed from `prober.wire.Codec.keys`);
``bad_auth`` in its counters counts what failed, and ``prober_bad_auth`` the prober's own
(its health document). Stops on SIGTERM. Test and benchmark machinery, not production code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

from contract.keys import HMAC, load_key_file
from contract.records import RecordError, decode_batch
from prober import compiled
from prober.drive import CompiledDriver
from prober.events import ProbeEvent, ProbeLost, ProbeResult, ResultBlock
from prober.fastudp import BatchUdpEndpoint
from prober.session import ProbeSession
from prober.wire import codec_for


def _count_records(spec: dict[str, Any], counts: dict[str, int], health: dict[str, Any]) -> Any:
    """Start a paho client (its own network thread) counting the prober's published records."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    topic = f"{spec['prefix']}/probes/{spec['host']}"
    client: Any = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"cpupeers-{os.getpid()}")

    health_topic = f"{spec['prefix']}/health/{spec['host']}"

    def on_connect(c: Any, _u: Any, _f: Any, _rc: Any, _p: Any = None) -> None:
        c.subscribe(topic, qos=1)
        c.subscribe(health_topic, qos=1)

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        if msg.topic == health_topic:  # keep the prober's own session counters
            try:
                doc = json.loads(msg.payload)
                health["sessions"] = doc.get("counters", {}).get("sessions", {})
                health["bad_auth"] = int(doc.get("counters", {}).get("bad_auth", 0))
            except ValueError:
                pass
            return
        try:
            batch = decode_batch(bytes(msg.payload))
        except RecordError:
            counts["bad_batches"] += 1
            return
        lost = int(batch.lost.sum())
        counts["lost"] += lost
        counts["results"] += len(batch) - lost
        counts["batches"] += 1

    client.on_connect, client.on_message = on_connect, on_message
    client.connect_async(spec["broker"][0], spec["broker"][1], keepalive=10)
    client.loop_start()
    return client


async def run(spec: dict[str, Any]) -> None:
    """Run the peers of ``spec`` until SIGTERM."""
    counts = {"results": 0, "lost": 0, "batches": 0, "bad_batches": 0, "answered": 0,
              "unanswered": 0}  # fmt: skip

    def answered(events: list[ProbeEvent]) -> None:
        for e in events:
            if isinstance(e, ResultBlock):
                counts["answered"] += e.results
                counts["unanswered"] += len(e) - e.results
            elif isinstance(e, ProbeResult):
                counts["answered"] += 1
            elif isinstance(e, ProbeLost):
                counts["unanswered"] += 1

    eps: dict[str, BatchUdpEndpoint] = {}
    use_compiled = spec.get("peer_path", "compiled") == "compiled" and compiled.available()
    driven = use_compiled and spec.get("peer_ticks", "driver") == "driver"
    keys = load_key_file(spec["key_file"], HMAC) if spec.get("key_file") else None
    for nic in spec["peers"]:
        kw: dict[str, Any] = {"dport": spec["port"], "sports": nic["sports"], "on_events": answered}
        codec, timeout_ns = codec_for(keys), 1_000_000_000
        ep: BatchUdpEndpoint
        if use_compiled:
            session = compiled.CompiledSession(nic["id"], codec, timeout_ns=timeout_ns)
            ep = compiled.CompiledUdpEndpoint(session, nic["address"], external_ticks=driven, **kw)
        else:
            ep = BatchUdpEndpoint(ProbeSession(nic["id"], codec, timeout_ns=timeout_ns),
                                  nic["address"], **kw)  # fmt: skip
        await ep.start(warmup_s=0.5 if not eps else 0.0)  # RX stamping is switched on once
        eps[nic["id"]] = ep
    if driven:  # one timer for all, records taken from the engines below
        driven_eps = [e for e in eps.values() if isinstance(e, compiled.CompiledUdpEndpoint)]
        driver = CompiledDriver(driven_eps, tick_ns=10_000_000)
        tasks = [asyncio.create_task(driver.run())]
    else:
        tasks = [asyncio.create_task(ep.run()) for ep in eps.values()]
    health: dict[str, Any] = {}
    counter = _count_records(spec, counts, health) if spec.get("count_records", True) else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    rng = random.Random(1)
    period = 1.0 / spec["rate_hz"]
    streams = [
        (s["src"], s["dst"], (s["address"], spec["port"]), s["sport"], time.monotonic() + rng.random() * period)
        for s in spec["streams"]
    ]  # fmt: skip
    next_at = [s[4] for s in streams]
    stats = Path(spec["stats"])
    next_write = 0.0
    while not stop.is_set():
        now = time.monotonic()
        woken: set[str] = set()
        for i, (src, dst, dest, sport, _) in enumerate(streams):
            if next_at[i] <= now:
                ep = eps[src]
                ep.session.queue_pair(dst, dest, sport, ep.now_ns())
                woken.add(src)
                next_at[i] = max(now, next_at[i] + period * (1 + 0.5 * (rng.random() - 0.5)))
        for src in woken:
            eps[src].wake()
        if now >= next_write:
            if driven:  # the records wait in the engines (as the agent's do for its batch)
                for ep in eps.values():
                    if isinstance(ep, compiled.CompiledUdpEndpoint):
                        answered(ep.csession.take_events())
            usage = resource.getrusage(resource.RUSAGE_SELF)
            doc: dict[str, Any] = {**counts, "t": time.time(),
                                   "cpu_s": usage.ru_utime + usage.ru_stime}  # fmt: skip
            agg: dict[str, int] = {}
            for ep in eps.values():
                for k, v in [*ep.session.counters.items(), *ep.counters.items()]:
                    agg[k] = agg.get(k, 0) + v
            doc["counters"] = agg
            if health:
                doc["prober_sessions"] = health.get("sessions", {})
                doc["prober_bad_auth"] = health.get("bad_auth", 0)
            tmp = stats.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(stats)
            next_write = now + 0.5
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.005):
                await stop.wait()
    if counter is not None:
        counter.loop_stop()
    for ep in eps.values():
        ep.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str]) -> int:
    """Entry point: ``python -m testbed.cpupeers SPEC.json``."""
    if len(argv) != 1:
        print("usage: python -m testbed.cpupeers SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    asyncio.run(run(spec))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
