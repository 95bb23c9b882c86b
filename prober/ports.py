"""How many UDP source ports a NIC pair must sweep to cover all its ECMP paths.

Switches pick one of ``m`` equal-cost next hops by hashing the 5-tuple. For probes between two
fixed addresses only the UDP source port varies, and a good hash maps each port to a path
uniformly and independently. With ``n`` random ports:

- one given path is missed by all of them with probability ``q = ((m-1)/m) ** n``;
- treating the ``m`` misses as independent, all paths are hit with probability
  ``(1 - q) ** m``; asking this to be at least ``p`` and solving for ``n`` gives

      n = ceil( ln(1 - p ** (1/m)) / ln((m-1)/m) )

  (R-Pingmesh's bound; m=16, p=0.9 -> 78, "about 80").

The independence step is an approximation: the events "path i is hit" are negatively
correlated (a port that lands on one path cannot land on another), so the exact coverage
(`coverage_probability`) is slightly *lower* than ``(1 - q) ** m``: for m=16 the formula's 78
ports give 0.8993, and 79 are needed for 0.9. `ports_needed_exact` returns that smallest n and
is what the schedule uses. Multi-tier fabrics multiply the path
count (m = product of the fan-outs along the way): pass that product as ``m``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

ROCE_SPORT_RANGE = (0xC000, 0xFFFF)  # mlx5 sets the top two bits: 49152..65535


def ports_needed(m: int, p: float) -> int:
    """Return the number of random source ports covering ``m`` equal paths with probability p.

    Raises `ValueError` unless m >= 1 and 0 < p < 1. For m == 1 one port suffices.
    """
    if m < 1 or not 0.0 < p < 1.0:
        raise ValueError(f"need m >= 1 and 0 < p < 1, got m={m}, p={p}")
    if m == 1:
        return 1
    return math.ceil(math.log(1.0 - p ** (1.0 / m)) / math.log((m - 1) / m))


def coverage_probability(n: int, m: int) -> float:
    """Return the exact probability that ``n`` uniform random ports hit all ``m`` paths.

    Computed as a Markov chain on the number of paths hit so far (numerically stable for any
    m, unlike inclusion-exclusion). Raises `ValueError` on m < 1 or n < 0.
    """
    if m < 1 or n < 0:
        raise ValueError("need m >= 1 and n >= 0")
    dist = [1.0] + [0.0] * m  # dist[k] = P(k distinct paths hit)
    for _ in range(n):
        nxt = [0.0] * (m + 1)
        for k, pk in enumerate(dist):
            if pk:
                nxt[k] += pk * k / m
                if k < m:
                    nxt[k + 1] += pk * (m - k) / m
        dist = nxt
    return dist[m]


def ports_needed_exact(m: int, p: float) -> int:
    """Return the smallest n with `coverage_probability(n, m) >= p` (at least `ports_needed`).

    Raises `ValueError` like `ports_needed`.
    """
    n = ports_needed(m, p)
    while coverage_probability(n, m) < p:
        n += 1
    return n


def pick_source_ports(
    n: int,
    rng: random.Random,
    port_range: tuple[int, int] = ROCE_SPORT_RANGE,
    usable: Callable[[int], bool] | None = None,
) -> tuple[int, ...]:
    """Return ``n`` distinct random ports from the inclusive ``port_range``, drawn with ``rng``.

    ``usable(port)`` False (e.g. another socket of the host holds it: the RoCE range overlaps
    Linux's ephemeral ports) replaces that port by further draws; the ports drawn are the same
    as without ``usable`` when all are usable. Raises `ValueError` if the range holds fewer
    than ``n`` (usable) ports or is not within 1..65535.
    """
    lo, hi = port_range
    if not 1 <= lo <= hi <= 0xFFFF:
        raise ValueError(f"bad port range {port_range}")
    if n < 0 or n > hi - lo + 1:
        raise ValueError(f"cannot pick {n} distinct ports from {port_range}")
    drawn = rng.sample(range(lo, hi + 1), n)
    if usable is None:
        return tuple(drawn)
    out = [p for p in drawn if usable(p)]
    if len(out) < n:
        taken = set(drawn)
        rest = [p for p in range(lo, hi + 1) if p not in taken]
        rng.shuffle(rest)
        out += [p for p in rest if usable(p)][: n - len(out)]
    if len(out) < n:
        raise ValueError(f"fewer than {n} usable ports in {port_range}")
    return tuple(out)
