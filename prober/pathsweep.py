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
