"""An edge owner's share of a partial (`controller.fleet.ownershare`): the bytes round-trip,
and owners fed the workers' shares build, to the byte, the blocks owners fed whole partials
build (`split_partial`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from contract.records import decode_batch
from controller.brain import BrainConfig
from controller.clocksolve import SAMPLE_COLUMNS
from controller.fleet.codec import pack
from controller.fleet.config import FleetConfig
from controller.fleet.edges import fold_order, owner_bounds, split_clock, split_partial
from controller.fleet.grid import WindowGrid
from controller.fleet.owner import OwnerCore
from controller.fleet.ownershare import (
    MAGIC,
    VERSION,
    OwnerCut,
    OwnerShare,
    ShareError,
    cut_shares,
    rejoin,
)
from controller.fleet.partial import MovedClocks, Partial
from controller.fleet.solver import Added, FleetSolver
from controller.fleet.worker import FleetWorker
from mesh.fabric import FabricShape, build_fabric
from testbed.scenario import Fault, FaultKind
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

STEP = 100_000_000
OWNERS = 3


def _partials() -> tuple[int, int, FleetConfig, list[Partial]]:
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8, spines=2))
    sim = Simulator(fab, SimConfig(seed=5))
    cfg = FleetConfig(grid=WindowGrid(STEP), detection=BrainConfig(lateness_ns=0),
                      edge_owners=OWNERS)  # fmt: skip
    workers = [FleetWorker(fab, cfg, name=f"w{i}") for i in range(2)]
    worker_of = {h.id: i % 2 for i, h in enumerate(fab.hosts)}
    out: list[Partial] = []
    for i, st in enumerate(sim.run(2.5, STEP / 1e9)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        payloads, _ = host_batches(fab, st.batch, i + 1)
        for p in payloads:
            assert workers[worker_of[decode_batch(p).origin]].admit(decode_batch(p).origin, p, now)
        out += [Partial.decode(x.encode()) for w in workers for x in w.close(now)]
    return len(fab.nics), len(fab.hosts), cfg, out


@pytest.fixture(scope="module")
def fleet() -> tuple[int, int, FleetConfig, list[Partial]]:
    return _partials()


def _same_input(a: OwnerShare, p: Partial, bounds: np.ndarray, k: int) -> None:
    want = split_partial(p, bounds)[k]
    got = a.input()
    assert (got.window, got.worker, got.first) == (want.window, want.worker, want.first)
    for c in SAMPLE_COLUMNS:
        x, y = getattr(got.rows, c), getattr(want.rows, c)
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert np.array_equal(got.moved.nic, want.moved.nic)
    assert np.array_equal(got.moved.since, want.moved.since)
    assert a.covers.batches() == p.covers.batches()


def test_shares_round_trip_and_equal_split_partial(fleet: tuple[int, int, FleetConfig,
                                                                list[Partial]]) -> None:  # fmt: skip
    n, _, _, parts = fleet
    bounds = owner_bounds(n, OWNERS)
    rows = empty = 0
    only0 = dataclasses.replace(parts[-1], clock=split_clock(parts[-1].clock, bounds)[0])
    moved = dataclasses.replace(parts[-2], moved=MovedClocks(np.array([3, 9]), np.array([5, 7])))
    for p in [*parts, only0, moved]:
        shares = cut_shares(p, bounds)
        assert [s.owner for s in shares] == list(range(OWNERS))
        assert sum(len(s.rows) for s in shares) == len(p.clock)
        for k, s in enumerate(shares):
            for compress in (True, False):
                back = OwnerShare.decode(s.encode(compress=compress))
                assert back.owner == k
                _same_input(back, p, bounds, k)
            rows += len(s.rows)
            empty += not len(s.rows)
    assert rows > 0 and empty > 0  # windows with rows, and owners with none of a partial's


def test_owners_fed_shares_build_the_same_blocks(fleet: tuple[int, int, FleetConfig,
                                                              list[Partial]]) -> None:  # fmt: skip
    n, hosts, cfg, parts = fleet
    bounds = owner_bounds(n, OWNERS)
    whole = [OwnerCore(n, hosts, cfg, k, None) for k in range(OWNERS)]
    cut = [OwnerCore(n, hosts, cfg, k, None) for k in range(OWNERS)]
    made = 0
    for w in sorted({p.window for p in parts}):
        for p in (p for p in parts if p.window == w):
            shares = [OwnerShare.decode(s.encode()) for s in cut_shares(p, bounds)]
            for k in range(OWNERS):
                assert whole[k].add(p) is cut[k].add_share(shares[k]) is True
                assert not cut[k].add_share(shares[k])  # a redelivery is dropped
        for a, b in zip(whole, cut, strict=True):
            got, want = [x.encode() for x in b.advance(w)], [x.encode() for x in a.advance(w)]
            assert got == want
            made += len(got)
    assert made > 0
    with pytest.raises(ValueError, match="owner 1 given to owner 0"):
        cut[0].add_share(dataclasses.replace(cut_shares(parts[0], bounds)[1]))


def test_a_malformed_share_is_one_line_error(fleet: tuple[int, int, FleetConfig,
                                                          list[Partial]]) -> None:  # fmt: skip
    n, _, _, parts = fleet
    p = max(parts, key=lambda x: len(x.clock))
    good = cut_shares(p, owner_bounds(n, OWNERS))[0]
    data = good.encode(compress=False)
    cols = {"cov.origin": good.covers.origin, "cov.seq": good.covers.seq,
            "mov.nic": good.moved.nic, "mov.since": good.moved.since,
            **{f"clk.{k}": getattr(good.rows, k) for k in SAMPLE_COLUMNS}}  # fmt: skip
    head = {"owner": 0, "window": good.window, "worker": good.worker, "first": good.first,
            "origins": list(good.covers.origins)}  # fmt: skip
    odd = {**cols, **{f"clk.{k}": getattr(good.rows, k)[:1] for k in SAMPLE_COLUMNS}}
    odd["clk.pair"] = np.array([4], np.int64)
    bad = {
        "truncated": data[:-3],
        "another magic": p.encode(),
        "a version": pack(MAGIC, VERSION + 1, head, cols),
        "no column": pack(MAGIC, VERSION, head, {k: v for k, v in cols.items() if k != "clk.t2"}),
        "a column more": pack(MAGIC, VERSION, head, {**cols, "x": np.zeros(1, np.int64)}),
        "a wrong dtype": pack(MAGIC, VERSION, head, {**cols, "clk.t1": good.rows.t1.astype("<f8")}),
        "unequal": pack(MAGIC, VERSION, head, {**cols, "clk.t1": good.rows.t1[:-1]}),
        "odd pairs": pack(MAGIC, VERSION, head, odd),
        "no worker": pack(MAGIC, VERSION, {**head, "worker": 3}, cols),
        "a bool window": pack(MAGIC, VERSION, {**head, "window": True}, cols),
        "no origin": pack(MAGIC, VERSION, {**head, "origins": []}, cols),
        "negative owner": pack(MAGIC, VERSION, {**head, "owner": -1}, cols),
    }
    assert len(good.rows) > 1 and len(good.covers) > 0
    for what, payload in bad.items():
        with pytest.raises(ShareError) as exc:
            OwnerShare.decode(payload)
        assert "\n" not in str(exc.value), what


def test_the_solver_reads_nothing_of_the_clock_rows_it_no_longer_gets() -> None:
    """A solver with owners apart fed `solver_part`s judges and solves as one fed whole
    partials; `rejoin` gives the whole partial back; `OwnerCut` is both."""
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8, spines=2))
    sim = Simulator(fab, SimConfig(seed=3), [Fault(FaultKind.LINK_DOWN, "leaf1-spine0", 1.5, 2.0)])
    cfg = FleetConfig(grid=WindowGrid(STEP), detection=BrainConfig(lateness_ns=0), edge_owners=2)
    worker = FleetWorker(fab, cfg, name="w0")
    n, hosts = len(fab.nics), len(fab.hosts)
    bounds = owner_bounds(n, 2)
    cut = OwnerCut(bounds)
    whole, trim = FleetSolver(fab, cfg, local_edges=False), FleetSolver(fab, cfg, local_edges=False)
    cores = [OwnerCore(n, hosts, cfg, k, None) for k in range(2)]
    solved = events = 0
    for i, st in enumerate(sim.run(4.0, STEP / 1e9)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        for p in host_batches(fab, st.batch, i + 1)[0]:
            assert worker.admit(decode_batch(p).origin, p, now).accepted
        for x in worker.close(now):
            p = Partial.decode(x.encode())
            wire = cut(p)
            part = Partial.decode(wire.part)
            assert len(part.clock) <= 2 and len(wire.part) < len(p.encode())
            shares = [OwnerShare.decode(b) for b in wire.shares]
            back = rejoin(part, shares)
            for c in SAMPLE_COLUMNS:
                a, b = fold_order([back.clock]), fold_order([p.clock])
                assert (a is None) == (b is None)
                assert a is None or b is None or np.array_equal(getattr(a, c), getattr(b, c))
            assert whole.add(p) is trim.add(part) is Added.TAKEN
            for k, core in enumerate(cores):
                assert core.add_share(shares[k])
        top = cfg.grid.closed_before(now, cfg.lateness_ns) - 1
        nxt = whole.next_window
        if nxt is None:
            nxt = min(whole.pending_windows(), default=top + 1)
        if top < nxt:
            continue
        for core in cores:
            for b in core.advance(top):
                assert whole.add_block(b) is trim.add_block(b) is Added.TAKEN
        got, want = trim.solve(top, now), whole.solve(top, now)
        assert got.solved == want.solved and trim.missing_blocks == whole.missing_blocks == 0
        assert np.array_equal(got.offsets_ns, want.offsets_ns, equal_nan=True)
        assert [e.to_json() for e in got.events] == [e.to_json() for e in want.events]
        assert got.clock == want.clock
        solved += got.solved
        events += len(got.events)
        worker.install_clock(got.clock)
        for core in cores:
            core.install(got.clock)
    assert solved >= 3 and events > 0
    with pytest.raises(TypeError):
        cut(object())
    with pytest.raises(ValueError, match="one per owner"):
        rejoin(part, shares[::-1])
