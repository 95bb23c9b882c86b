"""Periodic path discovery for the agent: which flows to trace, in what order, and the report.

The agent traces its own probe flows (local NIC, peer, source port) with `prober.pathdisc`
(TTL-limited TRACE probes on the probe's own socket, so the same 5-tuple and ECMP hash). A
sweep covers every flow once, interleaved across peers so early traces already cover every
peer; the next sweep starts ``refresh_s`` after the previous one began (or at once when a
path changed). Results go out as JSON on ``<prefix>/paths/<host>``
(`contract.topics.Topics.paths`). Pure helpers here; the agent runs the loop.

Reply paths are not traced: the reply of probe a -> b (sport s) is the flow b -> a with sport
4791 and dport s, whose source port the responder cannot choose for a TRACE. The controller
mirrors the forward path instead (Linux's L4 multipath hash is symmetric).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from prober.pathdisc import DiscoveredPath


def sweep_flows(
    peers: Mapping[str, Sequence[str]], ports: Mapping[str, Sequence[int]]
) -> list[tuple[str, str, int]]:
    """Return every (src, dst, sport) flow of the schedule, interleaved across destinations.

    Order: the k-th port of every (src, dst) stream before the (k+1)-th of any.
    """
    out: list[tuple[str, str, int]] = []
    depth = max((len(ports[s]) for s in peers), default=0)
    for k in range(depth):
        for src in sorted(peers):
            if k < len(ports[src]):
                out += [(src, dst, ports[src][k]) for dst in peers[src]]
    return out


def paths_payload(paths: Sequence[DiscoveredPath]) -> bytes:
    """Return the JSON payload of discovered paths (list of src, dst, sport, hops, reached)."""
    doc = [
        {
            "src": p.key.src,
            "dst": p.key.dst,
            "sport": p.key.sport,
            "hops": list(p.hops),
            "reached": p.reached,
        }
        for p in paths
    ]
    return json.dumps(doc, separators=(",", ":")).encode()


class TraceTimer:
    """When the agent starts its traces (pure; the compiled path's driver steps it every tick).

    Flow ``i`` of a sweep of ``flows`` is due at ``began + i * gap_s``; the next sweep begins
    ``refresh_s`` after this one began, or as soon as this one ends if it took longer. Between
    the end of a sweep and the next, one "idle" step per second (the agent then polls the
    finished traces and retraces one changed path), as the agent's own trace loop does.
    """

    def __init__(self, flows: int, gap_s: float, refresh_s: float, now_s: float) -> None:
        if flows < 0 or gap_s <= 0 or refresh_s < 0:
            raise ValueError("flows >= 0, gap_s > 0 and refresh_s >= 0 required")
        self.flows = flows
        self.gap_s = gap_s
        self.refresh_s = refresh_s
        self.began = now_s
        self._i = 0
        self._next_idle = now_s

    def due(self, now_s: float, most: int = 2) -> tuple[range, bool]:
        """Return (the indices of the flows due by ``now_s``, at most ``most`` of them, in
        order; whether an idle step is due) and consume them. Behind schedule (a stalled
        process), the sweep catches up ``most`` flows per step, never in one burst."""
        if not self.flows:
            return range(0), False
        if self._i >= self.flows:
            if now_s < self.began + max(self.refresh_s, self.flows * self.gap_s):
                if now_s >= self._next_idle:
                    self._next_idle = now_s + 1.0
                    return range(0), True
                return range(0), False
            self.began, self._i = now_s, 0  # a new sweep
        k = min(self.flows, int((now_s - self.began) / self.gap_s) + 1, self._i + most)
        out = range(self._i, max(self._i, k))
        self._i = max(self._i, k)
        if self._i >= self.flows:
            self._next_idle = now_s + 1.0
        return out, False
