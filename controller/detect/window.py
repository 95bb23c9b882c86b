"""One detection window's evidence, as accumulated, exported and merged.

`DetectionWindow` holds what the brain counts over one window (`LossWindow`: probes per
(forward, reply) path pair and the link sets of the lost ones; `DelayWindow`: judged delays
per path, each path's window minimum, the hop sets and flows of the slow ones, and every
fine delay's path, queueing delay, flow and stamp kind for the queue estimate; `FlowWindow`: probes and
losses per flow with its paths, for the per-flow loss test; probes each NIC initiated and
when it last did). `fold` adds observations (what `controller.brain.Brain`
does for its own windows and a fleet worker for its windows); `export` turns the window into
a `WindowPart`: the same evidence keyed by fleet-wide ids (a path by its signature and hop
row, a link or NIC by its fabric index), never by a process's own numbering; `absorb` adds a
part into a window of another process's numbering. Merging is exact: counts add, minima take
the minimum, lost and slow sets and fine delays concatenate (the tomography, the queue
estimate's histograms and the per-flow sums do not depend on their order),
so the parts of a window from any split of the hosts absorb into the window one process
holding every host would have made. Pure: arrays in, arrays out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controller.detect.delay import DelayParams, DelayWindow
from controller.detect.flowloss import FlowCounts, FlowWindow
from controller.detect.loss import LossWindow
from controller.detect.paths import PathIndex
from controller.detect.roundtrips import clock_split
from controller.observations import Observations

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class WindowPart:
    """One process's evidence of one window, keyed fleet-wide (see the module docstring).

    Paths (``P``): ``path_sig`` (`controller.detect.paths.path_signature` of the row),
    ``path_hops`` (P, H) directed hop ids, -1 padded; per path the fine and coarse delays
    judged on it (``judged``, ``coarse``) and its window minimum (``wmin``, inf: none).
    Path pairs (``Q``): rows of ``pair_fwd``/``pair_rev`` index the paths, ``pair_seen``
    probes sent on that (forward, reply) pair. ``lost``: link sets of lost probes (L, K).
    Slow delays (``slow_*``): hop sets (n, H), their flows (n, 3: src, dst, sport) and
    queueing delays (ns). Fine delays (``fine_*``): each one's path (an index into the
    paths), queueing delay (ns), flow and whether kernel-stamped (``fine_sw``). Flows
    (``flow_*``): (n, 3) src, dst, sport, probes and lost probes, the last forward and reply
    path (indices into the paths). Per NIC that initiated probes: ``nic``,
    ``src_count`` and ``last_src`` (its latest send time, ns). Round trips of the probes
    whose delays are not judged finely (``rt_*``): forward and reply path (indices into the
    paths) and excess over both baselines (ns; `controller.detect.roundtrips`)."""

    path_sig: I64
    path_hops: I32
    judged: I64
    coarse: I64
    wmin: F64
    pair_fwd: I32
    pair_rev: I32
    pair_seen: I64
    lost: I32
    slow_hops: I32
    slow_flows: I64
    slow_excess: F64
    fine_path: I32
    fine_excess: F64
    fine_flows: I32
    fine_sw: NDArray[np.bool_]
    flow: I64
    flow_probes: I64
    flow_lost: I64
    flow_fwd: I32
    flow_rev: I32
    nic: I32
    src_count: I64
    last_src: I64
    rt_fwd: I32
    rt_rev: I32
    rt_excess: F64

    @property
    def records(self) -> int:
        """Return the probes the part counts (its NICs' initiated probes)."""
        return int(self.src_count.sum())

    @classmethod
    def empty(cls, width: int) -> WindowPart:
        """Return a part with no evidence (hop rows of ``width``)."""
        i32, i64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
        hops = np.zeros((0, width), np.int32)
        flows = np.zeros((0, 3), np.int64)
        f64 = np.zeros(0, np.float64)
        return cls(
            i64, hops, i64, i64, f64, i32, i32, i64, np.zeros((0, 1), np.int32), hops, flows,
            f64, i32, f64, np.zeros((0, 3), np.int32), np.zeros(0, np.bool_), flows, i64, i64, i32,
            i32, i32, i64, i64, i32, i32, f64,
        )  # fmt: skip


@dataclass(eq=False)
class DetectionWindow:
    """Accumulators of one detection window (probes sent up to ``end_ns``; None: the
    window is still open at its end). ``src_count`` and ``last_src`` are per NIC (-1: none)."""

    end_ns: int | None
    loss: LossWindow
    delay: DelayWindow
    src_count: I64
    last_src: I64
    flows: FlowWindow
    clock_split: int = 0  # probes whose delays were withheld as split by a clock error

    @classmethod
    def empty(cls, n_links: int, n_hops: int, n_nics: int, pairs: PathIndex) -> DetectionWindow:
        """Return an open window over a fabric of these sizes; ``pairs``: the path-pair
        numbering shared by the owner's windows (its width: twice the paths')."""
        return cls(
            None,
            LossWindow(n_links, pairs.width // 2, pairs),
            DelayWindow(n_hops),
            np.zeros(n_nics, np.int64),
            np.full(n_nics, -1, np.int64),
            FlowWindow(n_nics),
        )

    def fold(
        self,
        obs: Observations,
        paths: PathIndex,
        excluded: NDArray[np.bool_],
        params: DelayParams,
    ) -> None:
        """Add ``obs``: count every probe's initiator, then, without the probes to and from
        ``excluded`` NICs (hosts whose prober is down), their loss and delay evidence on the
        paths of ``paths`` (whose baselines judge the delays: `DelayWindow.add`)."""
        if not len(obs):
            return
        self.src_count += np.bincount(obs.src, minlength=len(self.src_count))
        np.maximum.at(self.last_src, obs.src, obs.t_ns)
        if excluded.any():
            keep = ~(excluded[obs.src] | excluded[obs.dst])
            if not keep.all():
                obs = obs.select(keep)
        pf, pr = paths.paths(obs.hops_fwd), paths.paths(obs.hops_rev)
        # a probe whose delays split its round trip by a clock error: both withheld
        off = clock_split(
            obs.owd_fwd_ns - paths.base[pf], obs.owd_rev_ns - paths.base[pr], params.clock_split_ns
        )
        off &= ~obs.coarse
        if off.any():
            self.clock_split += int(off.sum())
            obs = dataclasses.replace(
                obs,
                owd_fwd_ns=np.where(off, np.nan, obs.owd_fwd_ns),
                owd_rev_ns=np.where(off, np.nan, obs.owd_rev_ns),
            )
        self.loss.add(pf, pr, obs.hops_fwd, obs.hops_rev, obs.lost)
        self.flows.add(obs.src, obs.dst, obs.sport, pf, pr, obs.lost)
        self.delay.add(
            paths, pf, obs.hops_fwd, obs.owd_fwd_ns, (obs.src, obs.dst, obs.sport), params,
            obs.coarse, obs.sw,
        )  # fmt: skip
        self.delay.add(
            paths, pr, obs.hops_rev, obs.owd_rev_ns, (obs.dst, obs.src, obs.sport), params,
            obs.coarse, obs.sw,
        )  # fmt: skip
        fine = np.isfinite(obs.owd_fwd_ns) & np.isfinite(obs.owd_rev_ns) & ~obs.coarse
        with np.errstate(invalid="ignore"):
            unjudged = ~fine & ~obs.lost & (obs.rtt_ns > 0)
        if unjudged.any():
            self.delay.add_round_trips(paths, pf, pr, obs.rtt_ns, unjudged)

    def export(self, paths: PathIndex) -> WindowPart:
        """Return the window's evidence keyed fleet-wide (``paths``: the numbering `fold`
        used)."""
        pair_ids, seen, pf, pr = self.loss.pairs_seen()
        judged, coarse, wmin = self.delay.per_path()
        mark = np.zeros(paths.size, bool)  # a mask, not np.unique: O(paths), no sort
        mark[: len(judged)] = (judged > 0) | (coarse > 0) | np.isfinite(wmin)
        mark[pf] = True
        mark[pr] = True
        fine_p, fine_x, fine_f, fine_sw = self.delay.fine_sets()
        fc = self.flows.counts()
        rt_f, rt_r, rt_x = self.delay.round_trips()
        for more in (fine_p, fc.fwd, fc.rev, rt_f, rt_r):
            mark[more] = True
        ids = np.flatnonzero(mark)
        del pair_ids
        used = np.concatenate([pf, pr, fine_p, fc.fwd, fc.rev, rt_f, rt_r])
        number = np.zeros(paths.size, np.int32)  # a table, not a search: O(records)
        number[ids] = np.arange(len(ids), dtype=np.int32)
        local: I32 = number[used]
        q, nf, nc, nr = len(pf), len(fine_p), len(fc.fwd), len(rt_f)
        at_fine, at_flow = 2 * q, 2 * q + nf
        at_rt = at_flow + 2 * nc

        def at(col: NDArray[np.generic], fill: float) -> NDArray[np.generic]:
            out = np.full(len(ids), fill, col.dtype)
            inside = ids < len(col)
            out[inside] = col[ids[inside]]
            return out

        slow_h, slow_f, slow_x = self.delay.sets()
        nic = np.flatnonzero(self.src_count > 0).astype(np.int32)
        return WindowPart(
            paths.sigs[ids],
            paths.hops[ids],
            at(judged, 0).astype(np.int64),
            at(coarse, 0).astype(np.int64),
            at(wmin, np.inf).astype(np.float64),
            local[:q],
            local[q:at_fine],
            seen,
            self.loss.lost_sets(),
            slow_h,
            slow_f,
            slow_x,
            local[at_fine:at_flow],
            fine_x,
            fine_f,
            fine_sw,
            fc.flow,
            fc.probes,
            fc.lost,
            local[at_flow : at_flow + nc],
            local[at_flow + nc : at_rt],
            nic,
            self.src_count[nic],
            self.last_src[nic],
            local[at_rt : at_rt + nr],
            local[at_rt + nr :],
            rt_x,
        )

    def absorb(self, part: WindowPart, paths: PathIndex) -> None:
        """Add a part (of any process) into this window, its paths numbered in ``paths``
        (paths new to ``paths`` are added, with no baseline)."""
        part = _aligned(part)
        hops = part.path_hops
        pid = paths.ids(part.path_sig, lambda sel: hops[sel])
        self.delay.add_counts(paths.size, pid, part.judged, part.coarse, part.wmin)
        self.delay.add_sets(part.slow_hops, part.slow_flows, part.slow_excess)
        self.delay.add_fine(pid[part.fine_path], part.fine_excess, part.fine_flows, part.fine_sw)
        self.delay.add_round_trip_rows(pid[part.rt_fwd], pid[part.rt_rev], part.rt_excess)
        if len(part.flow):
            self.flows.add_counts(
                FlowCounts(part.flow, part.flow_probes, part.flow_lost,
                           pid[part.flow_fwd], pid[part.flow_rev])
            )  # fmt: skip
        if len(part.pair_seen):
            f, r = part.pair_fwd, part.pair_rev
            self.loss.add_pairs(pid[f], pid[r], hops[f], hops[r], part.pair_seen)
        self.loss.add_lost(part.lost)
        self.src_count[part.nic] += part.src_count
        np.maximum.at(self.last_src, part.nic, part.last_src)


def _aligned(part: WindowPart) -> WindowPart:
    """Return ``part`` with every column aligned to its type (copies of the columns that
    are not: a decoded partial's columns are views at any byte offset of its buffer, and
    numpy's ``ufunc.at`` takes a slow path on those, ~15x at 200,000 paths)."""
    cols = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)}
    bad = {k: v.copy() for k, v in cols.items() if not v.flags.aligned}
    return dataclasses.replace(part, **bad) if bad else part
