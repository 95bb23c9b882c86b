"""The evidence the queue estimate and the per-flow loss test read crosses the fleet seam
exactly: a window's fine delays (path, queueing delay, flow, stamp kind) and per-flow counts, split over
workers by host, exported (`DetectionWindow.export`) and absorbed into a window of another
path numbering (`DetectionWindow.absorb`), equal those of one window holding every probe."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from controller.detect.delay import DelayParams
from controller.detect.paths import PathIndex
from controller.detect.window import DetectionWindow
from controller.observations import Observations
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import routing_tables
from testbed.sim.engine import SimConfig, Simulator
from testbed.sim.localize_bench import observations_from_step

FAB = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8, spines=2))
WIDTH = routing_tables(FAB).max_hops
P = DelayParams()


def _window(paths: PathIndex) -> DetectionWindow:
    return DetectionWindow.empty(len(FAB.links), FAB.n_hops, len(FAB.nics), PathIndex(2 * WIDTH))


def _fold(win: DetectionWindow, paths: PathIndex, obs: Observations) -> None:
    win.fold(obs, paths, np.zeros(len(FAB.nics), bool), P)


def _fine_rows(
    win: DetectionWindow, paths: PathIndex
) -> list[tuple[int, float, bool, int, int, int]]:
    """Every fine delay as (path signature, queueing delay, kernel-stamped, src, dst, sport),
    sorted."""
    pid, excess, flows, sw = win.delay.fine_sets()
    sig = paths.sigs[pid]
    return sorted(
        (int(s), float(e), bool(k), *(int(x) for x in f))
        for s, e, f, k in zip(sig, excess, flows, sw, strict=True)
    )


def _flow_rows(
    win: DetectionWindow, paths: PathIndex
) -> list[tuple[int, int, int, int, int, int, int]]:
    """Per flow (src, dst, sport, probes, lost, forward path signature, reply one)."""
    c = win.flows.counts()
    return [
        (int(f[0]), int(f[1]), int(f[2]), int(n), int(k), int(paths.sigs[a]), int(paths.sigs[b]))
        for f, n, k, a, b in zip(c.flow, c.probes, c.lost, c.fwd, c.rev, strict=True)
    ]


def _installed(base: PathIndex, order: npt.NDArray[np.int64]) -> PathIndex:
    """A path numbering holding ``base``'s baselines, its paths numbered in ``order``."""
    out = PathIndex(WIDTH)
    out.install(base.sigs[order], base.hops[order], base.base[order])
    return out


def _learned(seed: int, load: float) -> tuple[PathIndex, Observations]:
    """Baselines learnt over a simulated 0.5 s (as a solver hands them to its workers) and
    the next 0.1 s of observations."""
    sim = Simulator(FAB, SimConfig(seed=seed, load=load))
    steps = [observations_from_step(sim, st) for st in sim.run(0.6, 0.1)]
    learn = PathIndex(WIDTH)
    for obs in steps[:-1]:
        w = _window(learn)
        _fold(w, learn, obs)
        w.delay.fold_baselines(learn, 0.1, P)
    return learn, steps[-1]


def _merged(learn: PathIndex, obs: Observations) -> tuple[DetectionWindow, PathIndex]:
    """The window two workers' parts (hosts split by parity, each its own path numbering)
    absorb into, in a third numbering."""
    host = FAB.nic_host_index[obs.src]
    merged_paths = _installed(learn, np.arange(learn.size)[::-1])
    merged = _window(merged_paths)
    for k, order in enumerate((np.arange(learn.size)[::-1], np.roll(np.arange(learn.size), 7))):
        worker_paths = _installed(learn, order)
        w = _window(worker_paths)
        _fold(w, worker_paths, obs.select(host % 2 == k))
        merged.absorb(w.export(worker_paths), merged_paths)
    return merged, merged_paths


def test_fine_delays_and_flow_counts_merge_exactly_across_workers() -> None:
    learn, obs = _learned(3, 0.7)
    # a third of the hosts stamp in the kernel (a batch's stamp kind is its host's)
    obs = dataclasses.replace(obs, sw=FAB.nic_host_index[obs.src] % 3 == 0)
    one_paths = _installed(learn, np.arange(learn.size))
    one = _window(one_paths)
    _fold(one, one_paths, obs)
    merged, merged_paths = _merged(learn, obs)
    fine = _fine_rows(one, one_paths)
    flows = _flow_rows(one, one_paths)
    assert len(fine) > 1000 and len(flows) > 500
    assert 0 < sum(r[2] for r in fine) < len(fine)
    assert sum(r[4] for r in flows) > 0  # some flows lost probes
    assert _fine_rows(merged, merged_paths) == fine
    assert _flow_rows(merged, merged_paths) == flows


def test_round_trips_and_slow_delays_merge_exactly_across_workers() -> None:
    """The round trips kept for the delays not judged finely (`WindowPart.rt_*`) and the
    slow delays' queueing delays cross the seam as the fine ones do."""
    learn, obs = _learned(5, 0.9)
    # NICs 0-3's clocks withheld (no delays), 4-7's coarse
    withheld = (obs.src < 4) | (obs.dst < 4)
    nan = np.where(withheld, np.nan, 0.0)
    obs = dataclasses.replace(
        obs, owd_fwd_ns=obs.owd_fwd_ns + nan, owd_rev_ns=obs.owd_rev_ns + nan,
        coarse=~withheld & (((obs.src >= 4) & (obs.src < 8)) | ((obs.dst >= 4) & (obs.dst < 8))),
    )  # fmt: skip
    host = FAB.nic_host_index[obs.src]
    one_paths = _installed(learn, np.arange(learn.size))
    one = _window(one_paths)
    for k in (0, 1):  # the same batches (the slow threshold is a batch's)
        _fold(one, one_paths, obs.select(host % 2 == k))
    merged, merged_paths = _merged(learn, obs)

    def rts(win: DetectionWindow, paths: PathIndex) -> list[tuple[int, int, float]]:
        f, r, x = win.delay.round_trips()
        return sorted(zip(paths.sigs[f].tolist(), paths.sigs[r].tolist(), x.tolist(), strict=True))

    def slow(win: DetectionWindow) -> list[tuple[tuple[int, ...], tuple[int, ...], float]]:
        h, f, x = win.delay.sets()
        return sorted(
            (tuple(int(v) for v in a if v >= 0), tuple(b.tolist()), float(c))
            for a, b, c in zip(h, f, x, strict=True)
        )

    kept = rts(one, one_paths)
    lost_or_none = int((obs.lost | ~np.isfinite(obs.rtt_ns)).sum())
    assert 0 < len(kept) <= int(withheld.sum() + obs.coarse.sum()) + one.clock_split
    assert lost_or_none < len(obs) and len(slow(one)) > 0
    assert rts(merged, merged_paths) == kept
    assert slow(merged) == slow(one)
    claims = one.delay.slow_claims()
    assert np.isfinite(claims).any()
    np.testing.assert_array_equal(merged.delay.slow_claims(), claims)


def _unaligned(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    """A copy of ``a`` at an odd byte offset of a buffer (as a decoded partial's columns)."""
    buf = np.zeros(a.nbytes + 1, np.uint8)
    out = np.frombuffer(buf.data, a.dtype, a.size, 1).reshape(a.shape)
    out[...] = a
    assert a.itemsize == 1 or a.size == 0 or not out.flags.aligned
    return out


def test_a_part_at_odd_byte_offsets_absorbs_as_an_aligned_one() -> None:
    sim = Simulator(FAB, SimConfig(seed=4, load=0.7))
    steps = [observations_from_step(sim, st) for st in sim.run(0.3, 0.1)]
    paths = PathIndex(WIDTH)
    w = _window(paths)
    for obs in steps:
        _fold(w, paths, obs)
    part = w.export(paths)
    odd = dataclasses.replace(
        part, **{f.name: _unaligned(getattr(part, f.name)) for f in dataclasses.fields(part)}
    )
    out = []
    for p in (part, odd):
        into = PathIndex(WIDTH)
        win = _window(into)
        win.absorb(p, into)
        out.append(win.export(into))
    assert len(part.path_sig) > 50 and len(part.pair_seen) > 50
    for f in dataclasses.fields(part):
        a, b = getattr(out[0], f.name), getattr(out[1], f.name)
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f.name
