"""The simulator's memory savings change nothing it simulates, and `sim sync` holds no step
longer than it needs (issue 10, item 6: `sim sync --nics 10000` under 2 GB).

The step's arithmetic is done in place and in blocks; the reference below is the plain
whole-array form it replaced, and every probe and every truth column must be bit-identical.
"""

from __future__ import annotations

import dataclasses
import gc
import platform
import weakref
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from contract.records import COLUMNS, ProbeBatch
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.model import hop_links
from sync import summary
from sync.window import orient_samples
from testbed.scenario import Fault, FaultKind
from testbed.sim import engine, sync_stream
from testbed.sim.engine import SimConfig, SimStep, Simulator
from testbed.sim.heap import release_free_heap
from testbed.sim.model import ModelKnobs

FABRIC = build_fabric(FabricShape.for_nics(64, nics_per_leaf=16))
F64 = npt.NDArray[np.float64]


class WholeArraySim(Simulator):
    """The engine's per-probe arithmetic as whole-array expressions (the form before the
    in-place rework): the reference the rework must reproduce bit for bit."""

    def _delays(
        self,
        hops: npt.NDArray[np.int32],
        rho_hop: F64,
        queue_extra_us: F64,
        incast: npt.NDArray[np.bool_] | None,
    ) -> tuple[F64, F64]:
        cfg, rng = self.config, self.rng
        valid = hops >= 0
        h = np.where(valid, hops, 0)
        base = self._hop_base_ns[h]
        rho = rho_hop[h]
        svc = self._service_ns[h]
        u = rng.random(hops.shape)
        waits = u < rho
        q = np.where(waits, rng.exponential(1.0, hops.shape) * svc / (1.0 - rho), 0.0)
        burst = rng.random(hops.shape) < cfg.burst_prob * rho
        if burst.any():
            nb = int(burst.sum())
            q[burst] += np.minimum((rng.pareto(1.5, nb) + 1.0) * 1000.0, 200_000.0)
        extra = queue_extra_us[h]
        if extra.any():
            on = extra > 0
            q[on] += rng.exponential(1.0, int(on.sum())) * extra[on] * 1000.0
        if self.real:
            fx, m = self._fx, cfg.model
            if incast is not None and incast.any():
                hit = incast[h] & valid & (fx.random(hops.shape) < m.incast_hit)
                q[hit] += fx.exponential(m.incast_queue_us * 1000.0, int(hit.sum()))
            if m.coded_fifo and len(q) >= 2:
                self._coded_fifo(q, h, valid, rho, svc)
        owd = np.where(valid, base + q, 0.0).sum(axis=1)
        return owd, np.where(valid[:, 0], q[:, 0], 0.0)

    def _real_loss(
        self, hops_f: npt.NDArray[np.int32], hops_r: npt.NDArray[np.int32], rho: F64, t_s: F64
    ) -> npt.NDArray[np.bool_]:
        m, fx = self.config.model, self._fx
        hops = np.concatenate([hops_f, hops_r], axis=1)
        valid = hops >= 0
        h = np.where(valid, hops, 0)
        p_keep = np.where(
            valid, (1.0 - m.background_loss) * (1.0 - self._util.overflow_loss(rho)[h]), 1.0
        )
        keep = p_keep.prod(axis=1)
        for li, b0, b1 in self._loss.bursts(
            float(t_s.min(initial=0.0)), float(t_s.max(initial=0.0)) + 1e-3
        ):
            inb = (t_s >= b0) & (t_s < b1)
            n_cross = ((hop_links(h) == li) & valid).sum(axis=1)
            keep = keep * np.where(inb, (1.0 - m.burst_loss) ** n_cross, 1.0)
        return np.asarray(fx.random(len(keep)) >= keep)


def _assert_same_steps(a: list[SimStep], b: list[SimStep]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in dataclasses.fields(SimStep):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if f.name == "batch":
                for col, _ in COLUMNS:
                    np.testing.assert_array_equal(getattr(u, col), getattr(v, col), err_msg=col)
            elif isinstance(u, np.ndarray):
                assert u.dtype == v.dtype, f.name
                np.testing.assert_array_equal(u, v, err_msg=f.name)
            elif isinstance(u, tuple) and u and isinstance(u[0], np.ndarray):
                assert len(u) == len(v), f.name
                for p, q in zip(u, v, strict=True):
                    np.testing.assert_array_equal(p, q, err_msg=f.name)
            else:
                assert u == v, f.name


BUSY = dataclasses.replace(ModelKnobs(), burst_per_link_h=20_000.0, incast_prob=0.3)


@pytest.mark.parametrize(
    ("model", "stamps", "load"),
    [
        (ModelKnobs(), "hw", 0.4),
        (BUSY, "hw", 0.9),  # loss bursts and incasts in every step
        (ModelKnobs(), "sw", 0.9),
        (ModelKnobs.ideal_model(), "hw", 0.9),
    ],
)
def test_in_place_and_blockwise_step_gives_the_same_probes(
    model: ModelKnobs, stamps: str, load: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = [lk.id for lk in FABRIC.links]
    faults = [
        Fault(FaultKind.LOSS, links[10], 0.1, 0.6, 5.0),
        Fault(FaultKind.CONGEST, links[20], 0.0, 1.0, 0.3),
        Fault(FaultKind.CONGEST, links[21], 0.3, 0.5, 20.0),
        Fault(FaultKind.FLAP, links[30], 0.1, 0.8, 0.0, 0.05, 0.1),
        Fault(FaultKind.PROBER_DOWN, FABRIC.hosts[5].id, 0.4, 0.3),
    ]
    cfg = SimConfig(load=load, timestamps=stamps, rate_hz=40.0, seed=3, model=model)
    want = list(WholeArraySim(FABRIC, cfg, faults).run(1.0, 0.1))
    monkeypatch.setattr(engine, "_ROWS", 1000)  # true_offset_ns in many blocks
    got = list(Simulator(FABRIC, cfg, faults).run(1.0, 0.1))
    assert sum(len(st.batch.t1) for st in got) > 20 * 1000
    assert any(st.batch.lost.any() for st in got)
    _assert_same_steps(want, got)


def test_clock_offsets_in_blocks_equal_the_whole_array() -> None:
    sim = Simulator(FABRIC, SimConfig(seed=4))
    rng = np.random.default_rng(5)
    n = engine._ROWS * 2 + 17
    t = rng.uniform(0, 3e9, n)
    nic = rng.integers(0, len(FABRIC.nics), n)
    blocked = sim.true_offset_ns(t, nic)
    for a in (0, engine._ROWS - 3, n - 5):  # any slice short enough to be done at once
        np.testing.assert_array_equal(
            blocked[a : a + 5], sim.true_offset_ns(t[a : a + 5], nic[a : a + 5])
        )


class _Watched:
    """A stand-in simulator whose steps record, as each is made, which earlier steps and
    batches are still alive."""

    def __init__(self, real: Simulator) -> None:
        self.real = real
        self.refs: list[tuple[weakref.ref[SimStep], weakref.ref[ProbeBatch]]] = []
        self.alive_at_step: list[int] = []

    def run(self, duration_s: float, step_s: float, start_s: float = 0.0) -> Iterator[SimStep]:
        n = int(np.ceil(duration_s / step_s - 1e-9))
        starts = [start_s + i * step_s for i in range(n)]
        return map(lambda t0: self._step(t0, step_s), starts)  # holds no step itself

    def _step(self, t0_s: float, dt_s: float) -> SimStep:
        gc.collect()  # before the step is simulated: what is still alive of the earlier ones
        self.alive_at_step.append(sum(s() is not None or b() is not None for s, b in self.refs))
        st = self.real.step(t0_s, dt_s)
        self.refs.append((weakref.ref(st), weakref.ref(st.batch)))
        return st


def test_sync_window_frees_each_step_before_the_next_is_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = Simulator(FABRIC, SimConfig(rate_hz=20.0, peers=4, mesh_in_group=False, seed=6))
    watched = _Watched(sim)
    batches = sync_stream.window_batches(watched, 0.5, 0.1)  # type: ignore[arg-type]
    merged_with_batch_alive: list[bool] = []
    real_merge = sync_stream.merge

    def merge(a: sync_stream.Summary, b: sync_stream.Summary) -> sync_stream.Summary:
        gc.collect()
        merged_with_batch_alive.append(watched.refs[-1][1]() is not None)
        return real_merge(a, b)

    monkeypatch.setattr(sync_stream, "merge", merge)
    edges, per = sync_stream.window_edges(sim.pairs_src, sim.pairs_dst, len(FABRIC.nics))
    out = sync_stream.collect_window(batches, edges, per * 2 * 11, len(FABRIC.nics),
                                     engine.EPOCH_NS, 0.5, 25)  # fmt: skip
    assert out.probes > 0 and len(watched.alive_at_step) == 5
    assert watched.alive_at_step == [0] * 5  # no step, no batch outlives its reduction
    assert merged_with_batch_alive == [False] * 4  # the batch is gone before the merge


def test_release_free_heap_runs_and_changes_no_values() -> None:
    x = np.arange(1000.0)
    freed = [np.ones(1 << 14) for _ in range(64)]
    del freed
    glibc = platform.libc_ver()[0] == "glibc"
    assert release_free_heap() is glibc  # a no-op where the C library has no malloc_trim
    np.testing.assert_array_equal(x, np.arange(1000.0))


def _parts(n_nics: int) -> list[summary.Summary]:
    fabric = build_fabric(FabricShape.for_nics(n_nics, nics_per_leaf=16))
    sim = Simulator(fabric, SimConfig(load=0.9, rate_hz=50.0, peers=8, mesh_in_group=False))
    n = len(fabric.nics)
    edges, per = sync_stream.window_edges(sim.pairs_src, sim.pairs_dst, n)
    cap, keys = summary.rtt_cap(per * 2 * 51), edges[:, 0] * n + edges[:, 1]
    out = []
    for st in sim.run(1.0, 0.1):
        b = st.batch
        s = orient_samples(
            b.src, b.dst, b.pair, b.t1, b.t2, b.t3, b.t4, b.lost, engine.EPOCH_NS + 500_000_000,
            coded_tol_ns=25, min_coded=0,
        )  # fmt: skip
        e = np.searchsorted(keys, s.edges[:, 0] * n + s.edges[:, 1])
        out.append(summary.reduce_chunk(s, e, edges, cap))
    return out


def test_merge_in_blocks_into_preallocated_arrays_is_the_whole_merge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts = _parts(128)
    whole = parts[0]
    for p in parts[1:]:  # one block: the hulls of all points at once
        whole = summary.merge(whole, p)
    cat = np.concatenate
    a, b = summary.merge(parts[0], parts[1]), parts[2]
    lowest = summary._lowest(cat([a.x_edge, b.x_edge]), cat([a.x_rtt, b.x_rtt]),
                             cat([a.x_off, b.x_off]), cat([a.x_mid, b.x_mid]), a.cap)  # fmt: skip
    monkeypatch.setattr(summary, "_BLOCK", 500)  # many blocks of groups and of edges
    for x, y in zip(summary._merge_lowest(a, b), lowest, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    blocked = parts[0]
    for p in parts[1:]:
        blocked = summary.merge(blocked, p)
    assert len(whole.all_g) > 20 * 500
    for f in dataclasses.fields(summary.Summary):
        x, y = getattr(whole, f.name), getattr(blocked, f.name)
        assert x.dtype == y.dtype, f.name
        np.testing.assert_array_equal(x, y, err_msg=f.name)


def test_envelope_of_thin_directions_alone_is_the_whole_hulls_part() -> None:
    parts = _parts(64)
    s = parts[0]
    for p in parts[1:]:
        s = summary.merge(s, p)
    for min_coded in (1, 3, 10**6):  # some, most and all directions thin (load 0.9)
        thin = s.n_clean < min_coded
        ag, at, ad = summary.lower_hull(s.all_g, s.all_t, s.all_d)  # the whole first layer
        kc, ka = ~thin[s.clean_g], thin[ag]
        want = (
            np.concatenate([s.clean_g[kc], ag[ka]]),
            np.concatenate([s.clean_t[kc], at[ka]]),
            np.concatenate([s.clean_d[kc], ad[ka]]),
        )
        got = summary.fit_hulls(s, min_coded)
        for x, y in zip(got[:3], want, strict=True):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
    assert 0 < (s.n_clean < 1).sum() < (s.n_clean < 3).sum() < len(thin)
