"""Deterministic ECMP model: which directed hops a flow (src NIC, dst NIC, UDP sport) takes.

Up-down routing on a Clos: from the source leaf a flow climbs until some switch has the
destination leaf below it, then descends on the unique down link. At every climb the next hop
is chosen by a per-switch seeded hash of the 5-tuple (src address, dst address, sport, dport,
UDP), the way switches hash RoCEv2 flows. The hash is a model: real switches and the Linux
kernel use their own functions, which is why the prober also discovers paths with TTL probes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from mesh.fabric.model import (
    SWITCH_TIER,
    Fabric,
    FabricError,
    NodeKind,
    hop_ids,
    hop_link,
)

ROCEV2_PORT = 4791
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)

IntArray = npt.NDArray[np.int64] | npt.NDArray[np.int32] | npt.NDArray[np.uint64]


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def ecmp_hash(
    src_addr: npt.ArrayLike,
    dst_addr: npt.ArrayLike,
    sport: npt.ArrayLike,
    dport: npt.ArrayLike,
    seed: npt.ArrayLike,
) -> npt.NDArray[np.uint64]:
    """Return a 64-bit hash per flow of (src, dst, sport, dport, switch seed); vectorized."""
    s = np.asarray(src_addr, dtype=np.uint64)
    d = np.asarray(dst_addr, dtype=np.uint64)
    sp = np.asarray(sport, dtype=np.uint64)
    dp = np.asarray(dport, dtype=np.uint64)
    sd = np.asarray(seed, dtype=np.uint64)
    x = _mix((s << np.uint64(32)) | d)
    x = _mix(x ^ ((sp << np.uint64(16)) | dp) ^ (sd * _GOLD))
    return x


@dataclass(frozen=True)
class RoutingTables:
    """Dense arrays describing up/down next hops of every switch (switch index = `switches` order)."""

    n_up: npt.NDArray[np.int32]
    up_next: npt.NDArray[np.int32]
    up_link: npt.NDArray[np.int32]
    down_next: npt.NDArray[np.int32]  # [switch, dst leaf] -> next switch or -1
    down_link: npt.NDArray[np.int32]
    seed: npt.NDArray[np.uint64]
    nic_leaf: npt.NDArray[np.int32]  # NIC -> switch index of its leaf
    nic_link: npt.NDArray[np.int32]
    nic_addr: npt.NDArray[np.uint64]
    max_hops: int


@lru_cache(maxsize=16)
def routing_tables(fabric: Fabric) -> RoutingTables:
    """Return (and cache) the routing tables of ``fabric``."""
    sw = fabric.switches
    sidx = {n.id: i for i, n in enumerate(sw)}
    n_sw = len(sw)
    n_leaves = len(fabric.leaves)
    ups: list[list[tuple[int, int]]] = [[] for _ in range(n_sw)]
    downs: list[list[tuple[int, int]]] = [[] for _ in range(n_sw)]
    for lk in fabric.links:
        if lk.lower in sidx:
            lo, hi = sidx[lk.lower], sidx[lk.upper]
            ups[lo].append((hi, lk.index))
            downs[hi].append((lo, lk.index))
    max_up = max((len(u) for u in ups), default=0) or 1
    n_up = np.array([len(u) for u in ups], dtype=np.int32)
    up_next = np.full((n_sw, max_up), -1, dtype=np.int32)
    up_link = np.full((n_sw, max_up), -1, dtype=np.int32)
    for s, u in enumerate(ups):
        for k, (nxt, li) in enumerate(u):
            up_next[s, k], up_link[s, k] = nxt, li
    # leaves below each switch, tiers bottom-up (leaves are switch indices 0..n_leaves-1)
    below: list[set[int]] = [set() for _ in range(n_sw)]
    for s in range(n_leaves):
        below[s].add(s)
    for s in sorted(range(n_sw), key=lambda i: SWITCH_TIER[sw[i].kind]):
        for lo, _ in downs[s]:
            below[s] |= below[lo]
    down_next = np.full((n_sw, n_leaves), -1, dtype=np.int32)
    down_link = np.full((n_sw, n_leaves), -1, dtype=np.int32)
    for s in range(n_sw):
        for lo, li in downs[s]:
            for leaf in below[lo]:
                if down_next[s, leaf] < 0:
                    down_next[s, leaf], down_link[s, leaf] = lo, li
    seed = _mix(np.arange(1, n_sw + 1, dtype=np.uint64) * _GOLD)
    nic_leaf = np.array([sidx[n.leaf] for n in fabric.nics], dtype=np.int32)
    addr = np.array([_addr_u32(n.address) for n in fabric.nics], dtype=np.uint64)
    tiers = max((SWITCH_TIER[n.kind] for n in sw), default=1)
    return RoutingTables(
        n_up,
        up_next,
        up_link,
        down_next,
        down_link,
        seed,
        nic_leaf,
        fabric.nic_link,
        addr,
        max_hops=2 * tiers,
    )


def _addr_u32(addr: str) -> int:
    a, b, c, d = (int(p) for p in addr.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


def flow_paths(
    fabric: Fabric,
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    sport: npt.ArrayLike,
    dport: npt.ArrayLike = ROCEV2_PORT,
) -> npt.NDArray[np.int32]:
    """Return the directed hop ids of each flow, shape (n_flows, max_hops), padded with -1.

    ``src``/``dst`` are NIC indices, ``sport``/``dport`` UDP ports (all broadcast together;
    a reply travels ``flow_paths(f, dst, src, sport=4791, dport=probe_sport)``).
    Raises `FabricError` if a flow's source equals its destination or an index is out of range.
    """
    t = routing_tables(fabric)
    s_arr, d_arr, p_arr, dp_arr = (
        a.ravel()
        for a in np.broadcast_arrays(
            np.asarray(src, dtype=np.int64),
            np.asarray(dst, dtype=np.int64),
            np.asarray(sport),
            np.asarray(dport),
        )
    )
    n_nics = len(fabric.nics)
    if s_arr.size and (
        min(s_arr.min(), d_arr.min()) < 0 or max(s_arr.max(), d_arr.max()) >= n_nics
    ):
        raise FabricError("NIC index out of range")
    if np.any(s_arr == d_arr):
        raise FabricError("a flow needs two different NICs")
    n = s_arr.size
    out = np.full((n, t.max_hops), -1, dtype=np.int32)
    if n == 0:
        return out
    out[:, 0] = hop_ids(t.nic_link[s_arr], down=False)
    cur = t.nic_leaf[s_arr].astype(np.int64)
    dleaf = t.nic_leaf[d_arr].astype(np.int64)
    src_a, dst_a = t.nic_addr[s_arr], t.nic_addr[d_arr]
    active = np.ones(n, dtype=bool)
    for col in range(1, t.max_hops):
        if not active.any():
            break
        idx = np.flatnonzero(active)
        c, dl = cur[idx], dleaf[idx]
        at_leaf = c == dl
        fin = idx[at_leaf]
        out[fin, col] = hop_ids(t.nic_link[d_arr[fin]], down=True)
        active[fin] = False
        rest = idx[~at_leaf]
        c, dl = cur[rest], dleaf[rest]
        dn = t.down_next[c, dl]
        go_down = dn >= 0
        r_dn = rest[go_down]
        out[r_dn, col] = hop_ids(t.down_link[c[go_down], dl[go_down]], down=True)
        cur[r_dn] = dn[go_down]
        r_up = rest[~go_down]
        cu = c[~go_down]
        h = ecmp_hash(src_a[r_up], dst_a[r_up], p_arr[r_up], dp_arr[r_up], t.seed[cu])
        k = (h % t.n_up[cu].astype(np.uint64)).astype(np.int64)
        out[r_up, col] = hop_ids(t.up_link[cu, k], down=False)
        cur[r_up] = t.up_next[cu, k]
    return out


def flow_path(
    fabric: Fabric, src: str, dst: str, sport: int, dport: int = ROCEV2_PORT
) -> list[int]:
    """Return the directed hop ids one flow takes, by NIC ids. Raises `FabricError`."""
    row = flow_paths(fabric, fabric.nic(src).index, fabric.nic(dst).index, sport, dport)[0]
    return [int(h) for h in row if h >= 0]


def spine_of_path(fabric: Fabric, hops: list[int]) -> str | None:
    """Return the id of the highest switch a path crosses (its spine in two tiers), or None."""
    best: tuple[int, str] | None = None
    for h in hops:
        upper = fabric.links[hop_link(h)].upper
        node = fabric.node_by_id.get(upper)
        if node is not None and node.kind != NodeKind.HOST:
            tier = SWITCH_TIER[node.kind]
            if best is None or tier > best[0]:
                best = (tier, upper)
    return None if best is None else best[1]
