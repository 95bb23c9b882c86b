"""The live loopback tests' exchange: queue coded pairs from one endpoint to another, wait for
their results, stop the endpoints' tasks (shared by the compiled, deferred and HMAC tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from prober.events import ResultBlock, results_to_batch

LO = "127.0.0.1"


async def exchange(
    a: Any,
    b: Any,
    got: list[Any],
    tasks: list[asyncio.Task[Any]],
    *,
    spacing_ns: int = 0,
    polls: int = 300,
    drained: Iterable[Any] = (),
) -> None:
    """Queue 10 coded pairs from endpoint ``a`` (nicA) to ``b`` (nicB) on one new source port,
    ``spacing_ns`` apart, poll every 20 ms until ``got`` holds their 20 results (at most
    ``polls`` times), then cancel ``tasks`` (the caller closes the endpoints).

    ``drained``: endpoints whose records wait in their engine for a batch (driven compiled
    endpoints: ``a`` is drained into ``got`` at every poll when it is one of them).
    """
    sport = a.add_source_port(0)
    for i in range(10):
        a.session.queue_pair("nicB", (LO, b.dport), sport, a.now_ns() + i * spacing_ns)
    a.wake()
    drain = a in list(drained)
    for _ in range(polls):
        await asyncio.sleep(0.02)
        if drain:
            got.extend(a.session.take_events())
        if len(results_to_batch(got, origin="x")) >= 20:
            break
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def events_of(got: list[Any]) -> list[Any]:
    """Return the events of ``got`` (results and result blocks), flattened."""
    return [e for g in got for e in (g.events() if isinstance(g, ResultBlock) else [g])]
