"""Paths that move: ECMP re-hashing around a failed link, and the probers' path discovery
sweep that tells the controller where flows went (pure, seeded).

**Re-hash.** When a switch-to-switch link goes down, routing converges in two steps (RFC 7938,
*Use of BGP for Routing in Large-Scale Data Centers*, section 7: a link failure is a local
event for the switch that loses carrier and a BGP withdrawal for the others):

- after ``reroute_local_ms`` the switch below the link removes it from its ECMP group (carrier
  loss updates the hardware group): flows that climbed through it re-hash onto its siblings;
- after ``reroute_remote_ms`` the other switches have withdrawn the routes that needed it: a
  switch no longer climbs towards a switch that cannot reach the destination without it, so
  the flows that came down through it re-hash too (at the leaf they climb from).

Until then a probe sent into the dead link is lost. Hashing is *resilient* (only the failed
member's flows move; Broadcom / NVIDIA switches' resilient ECMP): a flow keeps its choice
unless that member is excluded, and then re-hashes over the members left. A path with no
member left (a NIC's own link, a pod cut off) stays lost. When the link comes back its flows
return at once (the hash is unchanged). The load that moves with them is `load_model`'s
``redistribute``.

**Discovery.** Each host's prober traces its flows one after another (`prober.agent`:
``paths.traces_per_s`` = 5 per host by default), so a flow is traced once per sweep of
``flows / traces_per_s`` seconds at its own phase, and the controller learns the path it has at
that moment: a path that moved is learned at the flow's next trace, a wrong start path
(`ecmp_model`: not discovered) at its first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric
from mesh.fabric.ecmp import ROCEV2_PORT, ecmp_hash, routing_tables
from mesh.fabric.model import hop_ids
from testbed.scenario import Fault, FaultKind
from testbed.sim.ecmp_model import SALT

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]
_MIX = np.uint64(0xD6E8FEB86659FD93)


@dataclass(frozen=True, slots=True)
class Outage:
    """A switch link down from ``start_s`` to ``end_s``."""

    link: int
    start_s: float
    end_s: float


def outages(fabric: Fabric, faults: list[Fault] | tuple[Fault, ...]) -> list[Outage]:
    """Return the down intervals of the switch-to-switch links among ``faults`` (flaps and
    link downs; a NIC's link has no alternative and is not re-routed)."""
    out = []
    for f in faults:
        if f.kind not in (FaultKind.FLAP, FaultKind.LINK_DOWN) or f.target not in fabric.link_index:
            continue
        li = fabric.link_index[f.target]
        if fabric.links[li].lower in fabric.nic_index:
            continue
        out += [Outage(li, a, b) for a, b in f.down_intervals()]
    return out


class Router:
    """Routes flows around the outages of a fabric as the switches would at a time."""

    def __init__(self, fabric: Fabric, local_s: float, remote_s: float) -> None:
        self.fabric, self.local_s, self.remote_s = fabric, local_s, remote_s
        self.t = routing_tables(fabric)
        self.n_leaves = len(fabric.leaves)

    def _view(self, dead: B, withdrawn: B) -> npt.NDArray[np.bool_]:
        """Return ok[switch, dst leaf, k]: may a switch climb through its k-th up link to
        reach a leaf, when ``dead`` links are out of their lower switch's group and
        ``withdrawn`` ones are known (by routing) to be gone."""
        t, nl = self.t, self.n_leaves
        n_sw = len(t.n_up)
        reach = np.zeros((n_sw, nl), dtype=bool)
        reach[np.arange(nl), np.arange(nl)] = True
        for s in range(nl, n_sw):  # switches are ordered bottom-up (leaves first)
            dn, dl = t.down_next[s], t.down_link[s]
            has = dn >= 0
            ok = np.zeros(nl, dtype=bool)
            ok[has] = ~withdrawn[dl[has]] & reach[dn[has], np.flatnonzero(has)]
            reach[s] = ok
        good = reach.copy()
        valid = t.up_link >= 0
        for s in range(n_sw - 1, -1, -1):  # top-down: a switch is good if it can climb to one
            ups = np.flatnonzero(valid[s])
            for k in ups:
                if not withdrawn[t.up_link[s, k]]:
                    good[s] |= good[t.up_next[s, k]]
        up_ok = valid & ~dead[np.maximum(t.up_link, 0)] & ~withdrawn[np.maximum(t.up_link, 0)]
        nxt = np.maximum(t.up_next, 0)
        return np.asarray(up_ok[:, None, :] & np.transpose(good[nxt], (0, 2, 1)), dtype=bool)

    def route(
        self, src: I64, dst: I64, sport: I64, dport: I64, dead: B, withdrawn: B
    ) -> tuple[I32, B]:
        """Return the hops of flows (src, dst, sport, dport: the switches' real hash inputs)
        under a routing view (``dead``: out of their switch's group; ``withdrawn``: routed
        around by every switch) and whether each found a route."""
        t = self.t
        n = len(src)
        ok_tab = self._view(dead, withdrawn)
        out = np.full((n, t.max_hops), -1, dtype=np.int32)
        routed = np.ones(n, dtype=bool)
        if not n:
            return out, routed
        out[:, 0] = hop_ids(t.nic_link[src], down=False)
        cur = t.nic_leaf[src].astype(np.int64)
        dleaf = t.nic_leaf[dst].astype(np.int64)
        sa, da = t.nic_addr[src], t.nic_addr[dst]
        active = np.ones(n, dtype=bool)
        for col in range(1, t.max_hops):
            idx = np.flatnonzero(active)
            if not len(idx):
                break
            c, dl = cur[idx], dleaf[idx]
            fin = idx[c == dl]
            out[fin, col] = hop_ids(t.nic_link[dst[fin]], down=True)
            active[fin] = False
            rest = idx[c != dl]
            c, dl = cur[rest], dleaf[rest]
            dn = t.down_next[c, dl]
            down = dn >= 0
            r = rest[down]
            out[r, col] = hop_ids(t.down_link[c[down], dl[down]], down=True)
            cur[r] = dn[down]
            r, c, dl = rest[~down], c[~down], dl[~down]
            h = ecmp_hash(sa[r], da[r], sport[r], dport[r], t.seed[c])
            n_up = t.n_up[c].astype(np.uint64)
            k = (h % n_up).astype(np.int64)
            ok = ok_tab[c, dl]  # (m, max_up)
            keep = ok[np.arange(len(r)), k]
            if not keep.all():  # resilient: only a flow whose member is out re-hashes
                j = np.flatnonzero(~keep)
                alive = ok[j]
                cnt = alive.sum(axis=1)
                none = cnt == 0
                routed[r[j[none]]] = False
                active[r[j[none]]] = False
                j, alive, cnt = j[~none], alive[~none], cnt[~none]
                pick = ((h[j] * _MIX) >> np.uint64(33)) % cnt.astype(np.uint64)
                order = np.cumsum(alive, axis=1) - 1
                k[j] = np.argmax(alive & (order == pick[:, None].astype(np.int64)), axis=1)
            go = active[r]
            r, c, k = r[go], c[go], k[go]
            out[r, col] = hop_ids(t.up_link[c, k], down=False)
            cur[r] = t.up_next[c, k]
        out[~routed] = -1
        return out, routed


def hash_inputs(sport: I64, mismatched: B, reply: bool) -> tuple[I64, I64]:
    """Return the (sport, dport) the switches hash for probes (or their replies) of flows with
    probe source port ``sport``; ``mismatched`` flows hash salted as `ecmp_model` routes them
    (a probe: sport ^ SALT, 4791; a reply: 4791 ^ SALT, sport ^ SALT)."""
    sp = sport.astype(np.int64)
    port = np.full(len(sp), ROCEV2_PORT, np.int64)
    salt = np.where(mismatched, SALT, 0).astype(np.int64)
    if reply:
        return port ^ salt, sp ^ salt
    return sp ^ salt, port


class Rerouter:
    """Re-routes probes whose path crosses a link that is down at their send time."""

    def __init__(self, router: Router, outages: list[Outage]) -> None:
        self.router = router
        self.outages = outages
        self.n_links = len(router.fabric.links)

    def phases(self, t_s: F64) -> npt.NDArray[np.int8]:
        """Return per time and outage its phase: 0 up, 1 down and nobody knows, 2 out of its
        switch's group, 3 routed around everywhere; shape (n, outages)."""
        out = np.zeros((len(t_s), len(self.outages)), dtype=np.int8)
        r = self.router
        for j, o in enumerate(self.outages):
            down = (t_s >= o.start_s) & (t_s < o.end_s)
            out[:, j] = np.where(
                down,
                1 + (t_s >= o.start_s + r.local_s) + (t_s >= o.start_s + r.remote_s),
                0,
            )
        return out

    def apply(
        self,
        t_s: F64,
        src: I64,
        dst: I64,
        sport: I64,
        mismatched: B,
        hops_f: I32,
        hops_r: I32,
    ) -> tuple[I32, I32, B]:
        """Return the probes' forward and reply hops as the switches route them at ``t_s``
        and which were lost (sent into a dead link, or no route left)."""
        lost = np.zeros(len(t_s), dtype=bool)
        if not self.outages or not len(t_s):
            return hops_f, hops_r, lost
        ph = self.phases(t_s)
        anyd = (ph > 0).any(axis=1)
        if not anyd.any():
            return hops_f, hops_r, lost
        hops_f, hops_r = hops_f.copy(), hops_r.copy()
        links = np.array([o.link for o in self.outages])
        keys, inv = np.unique(ph[anyd], axis=0, return_inverse=True)
        rows = np.flatnonzero(anyd)
        for g, key in enumerate(keys):
            sel = rows[inv.ravel() == g]
            down = np.zeros(self.n_links, dtype=bool)
            dead = np.zeros(self.n_links, dtype=bool)
            gone = np.zeros(self.n_links, dtype=bool)
            down[links[key > 0]] = True
            dead[links[key >= 2]] = True
            gone[links[key >= 3]] = True
            for hops, reply in ((hops_f, False), (hops_r, True)):
                a, b = (dst, src) if reply else (src, dst)
                h = hops[sel]
                hit = (down[np.maximum(h, 0) >> 1] & (h >= 0)).any(axis=1)
                if not hit.any():
                    continue
                idx = sel[hit]
                sp, dp = hash_inputs(sport[idx], mismatched[idx], reply)
                new, routed = self.router.route(a[idx], b[idx], sp, dp, dead, gone)
                into_dead = (down[np.maximum(new, 0) >> 1] & (new >= 0)).any(axis=1)
                lost[idx] |= ~routed | into_dead
                idx, new = idx[routed], new[routed]  # no route: it dies where it was sent
                w = min(new.shape[1], hops.shape[1])
                hops[idx] = -1
                hops[idx, :w] = new[:, :w]
        return hops_f, hops_r, lost


class PathSweep:
    """The probers' path discovery: each flow traced once per sweep of its source NIC's
    flows at ``traces_per_s``, at a seeded phase."""

    def __init__(self, flow_src: I64, traces_per_s: float, seed: int) -> None:
        counts = np.bincount(flow_src)
        self.period_s = counts[flow_src] / traces_per_s if traces_per_s > 0 else None
        rng = np.random.default_rng([seed, 1201])
        self.phase_s = rng.random(len(flow_src)) * (1.0 if self.period_s is None else self.period_s)

    def due(self, t0_s: float, t1_s: float) -> I64:
        """Return the flows traced in [t0_s, t1_s) (none without a sweep)."""
        if self.period_s is None:
            return np.zeros(0, np.int64)
        k0 = np.floor((t0_s - self.phase_s) / self.period_s)
        k1 = np.floor((t1_s - self.phase_s) / self.period_s)
        return np.flatnonzero(k1 > k0).astype(np.int64)
