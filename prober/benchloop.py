"""The full-round-trip loop shared by `prober.bench` and `prober.benchprofile`.

`endpoint_round_trips` drives two endpoints of one hot path on loopback (both roles in this
process) and returns the round trips completed with all four stamps and the CPU time spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from prober import compiled
from prober.events import ProbeEvent, ProbeResult, ResultBlock
from prober.fastudp import BatchUdpEndpoint
from prober.session import ProbeSession
from prober.udp import UdpEndpoint
from prober.wire import Codec

_WINDOW = 128  # probes kept in flight: topped up whenever results come back (or every 2 ms)
ALL_PATHS = ("compiled", "batched", "per-datagram", "compiled-auth", "per-datagram-auth")
"""Hot paths, and ``<path>-auth``: the same path with probe HMAC on (both ends keyed)."""
PATHS = tuple(p for p in ALL_PATHS if compiled.available() or not p.startswith("compiled"))
"""The hot paths this install can run (compiled only when `prober._fastpath` was built)."""
AUTH_KEY = bytes(range(32))
"""The ``-auth`` paths' probe HMAC key (a fixed bench key: loopback only)."""


async def endpoint_round_trips(seconds: float, path: str) -> tuple[int, float, float]:
    """Run full round trips through two endpoints on loopback for ``seconds``.

    Returns (round trips completed with all four stamps, CPU seconds of this process, wall
    seconds). Both roles run in this process, so the CPU time covers initiator and responder
    (kernel time included:
    ``time.process_time`` is user + system time). ``path``: `prober.fastudp.BatchUdpEndpoint`
    ("batched"), `prober.udp.UdpEndpoint` ("per-datagram", the path before batching, the
    baseline) or `prober.compiled.CompiledUdpEndpoint` ("compiled", the C datagram loop);
    a ``-auth`` suffix: both ends tag and verify with `AUTH_KEY` (``[auth] key_file``).
    Raises `ValueError` for a path this install cannot run.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    base = path.removesuffix("-auth")
    key = AUTH_KEY if path.endswith("-auth") else None

    def endpoint(nic: str, **kw: Any) -> UdpEndpoint:
        if base == "compiled":
            s = compiled.CompiledSession(nic, Codec(key))
            return compiled.CompiledUdpEndpoint(s, "127.0.0.1", dport=0, **kw)
        cls = BatchUdpEndpoint if base == "batched" else UdpEndpoint
        return cls(ProbeSession(nic, Codec(key)), "127.0.0.1", dport=0, **kw)

    done = 0
    arrived = asyncio.Event()

    def count(events: list[ProbeEvent]) -> None:
        nonlocal done
        arrived.set()
        for e in events:
            if isinstance(e, ResultBlock):
                done += e.results
            elif isinstance(e, ProbeResult):
                done += 1

    a, b = endpoint("bench-a", on_events=count), endpoint("bench-b")
    async with a, b:
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]  # as the agent does
        sport = a.add_source_port(0)
        dest = ("127.0.0.1", b.dport)
        loop = asyncio.get_running_loop()
        cpu0, start = time.process_time(), loop.time()
        while loop.time() - start < seconds:
            if a.session.pending < _WINDOW:  # keep a window of probes in flight
                now = a.now_ns()
                for _ in range(_WINDOW - a.session.pending):
                    a.session.queue_probe("bench-b", dest, sport, now)
                a.flush()
            # wait for results (or 2 ms) instead of spinning: the CPU measured is the paths'
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.002):
                    await arrived.wait()
        cpu, elapsed = time.process_time() - cpu0, loop.time() - start
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return done, cpu, elapsed
