"""Faults that lose some packets but not others (pure, seeded): gray failures of some 5-tuples
and marginal optics that lose in bursts.

**Gray** (`FaultKind.GRAY`, magnitude = percent of 5-tuples): the link's switch drops every
packet of a fixed subset of 5-tuples and forwards the rest (a corrupted ECMP or ACL entry, a
bad hash bucket: the "gray failures" of Huang et al., *Gray failure: the Achilles' heel of
cloud-scale systems*, HotOS 2017; 007, Arzani et al., NSDI 2018, localizes such per-flow
drops). A packet is in the subset when a hash of its 5-tuple, salted per fault, falls under
the percentage; a probe and its reply have different 5-tuples (the reply's ports are
swapped), so they are dropped independently.

**Optic** (`FaultKind.OPTIC`, magnitude = mean loss percent): a marginal transceiver loses
packets to corruption (CRC errors) at a rate under 1 %, and in bursts rather than evenly. Zhuo
et al., *Understanding and mitigating packet corruption in data center networks*, SIGCOMM
2017: corruption is link-local, independent of utilisation, and its rates on affected
links span 1e-8 to above 1e-3 (1 % on the worst); bursts: a Gilbert-Elliott channel (Gilbert
1960, Elliott 1963, the standard model of bursty bit errors). The link spends
``optic_duty`` of its time in bad periods of mean ``optic_burst_ms`` (exponential), losing
``magnitude / optic_duty`` percent of traversals there and nothing between, so the mean is
the magnitude. Duty and burst length are assumptions (ModelKnobs; docs/simulator.md).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT, ecmp_hash, routing_tables
from testbed.scenario import Fault

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]


def _crosses(hops: I32, link: int) -> B:
    return np.asarray((((hops >> 1) == link) & (hops >= 0)).any(axis=1), dtype=bool)


def gray_drops(
    fabric: Fabric, fault: Fault, src: I64, dst: I64, sport: I64, hops_f: I32, hops_r: I32
) -> B:
    """Return which probes a gray ``fault`` drops: those whose probe (src -> dst, sport ->
    4791) or reply (dst -> src, 4791 -> sport) crosses its link with a 5-tuple in its
    dropped subset."""
    t = routing_tables(fabric)
    link = fabric.link_index[fault.target]
    salt = np.uint64(0x6A7 + link)
    cut = np.uint64(int(fault.magnitude / 100.0 * 2**32))
    port = np.full(len(src), ROCEV2_PORT, np.int64)
    out = np.zeros(len(src), dtype=bool)
    for hops, a, b, sp, dp in (
        (hops_f, src, dst, sport, port),
        (hops_r, dst, src, port, sport),
    ):
        on = _crosses(hops, link)
        if on.any():
            h = ecmp_hash(t.nic_addr[a[on]], t.nic_addr[b[on]], sp[on], dp[on], salt)
            out[np.flatnonzero(on)[(h >> np.uint64(32)) < cut]] = True
    return out


@lru_cache(maxsize=64)
def _bursts(key: tuple[int, float, float], duty: float, burst_s: float) -> tuple[F64, F64]:
    """Return the (starts, ends) of an optic fault's bad periods over its life (seeded by
    ``key`` = (link, start s, end s))."""
    link, t0, t1 = key
    rng = np.random.default_rng([link, round(t0 * 1e6), 1301])
    gap_s = burst_s * (1.0 - duty) / max(duty, 1e-9)  # mean good time between bursts
    n = int((t1 - t0) / (burst_s + gap_s) * 2) + 16
    good = rng.exponential(gap_s, n)
    bad = rng.exponential(burst_s, n)
    starts = t0 + np.cumsum(good + np.concatenate([[0.0], bad[:-1]]))
    ends = starts + bad
    keep = starts < t1
    return starts[keep], np.minimum(ends[keep], t1)


def optic_drops(
    fault: Fault,
    link: int,
    t_s: F64,
    hops_f: I32,
    hops_r: I32,
    duty: float,
    burst_ms: float,
    rng: np.random.Generator,
) -> B:
    """Return which probes sent at ``t_s`` an optic ``fault`` on ``link`` drops: in a bad
    period each traversal of the link is lost with ``magnitude / duty`` percent."""
    starts, ends = _bursts((link, fault.start_s, fault.end_s), duty, burst_ms / 1e3)
    i = np.searchsorted(starts, t_s, side="right") - 1
    bad = (i >= 0) & (t_s < ends[np.maximum(i, 0)])
    n = ((hops_f >> 1) == link).sum(axis=1) + ((hops_r >> 1) == link).sum(axis=1)
    p = min(fault.magnitude / 100.0 / max(duty, 1e-9), 1.0)
    return np.asarray(bad & (rng.random(len(t_s)) >= (1.0 - p) ** n))
