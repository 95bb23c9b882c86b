"""Ingest + continuous clock sync: mapping, paths, owd accuracy against simulator truth."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from contract.records import MISSING, ProbeBatch, decode_batch, encode_batch
from controller.clocksync import ClockSync, ClockSyncConfig
from controller.ingest import Ingestor, PathTable
from controller.observations import ObservationError, Observations
from controller.windows import FlowStore, KeyIndex, SampleRing
from mesh.fabric import FabricShape, build_fabric, flow_paths
from testbed.sim.engine import SimConfig, Simulator

FAB = build_fabric(FabricShape(leaves=2, hosts_per_leaf=4, spines=2))


def _batch(
    origin: str = "host0", seq: int = 0, nic_ids: tuple[str, ...] = ("nic0", "nic5")
) -> ProbeBatch:
    n = 4
    return ProbeBatch.from_columns(
        origin,
        "sw",
        nic_ids,
        {
            "seq": np.arange(n),
            "src": np.zeros(n),
            "dst": np.ones(n),
            "sport": np.array([49152, 49153, 49154, 49155]),
            "t1": np.arange(n) * 1000,
            "t2": np.arange(n) * 1000 + 500,
            "t3": np.arange(n) * 1000 + 600,
            "t4": np.arange(n) * 1000 + 1100,
        },
        batch_seq=seq,
    )


def test_observations_validate_shapes() -> None:
    obs = Observations.empty(4)
    assert len(obs) == 0
    with pytest.raises(ObservationError):
        Observations(
            np.zeros(2, np.int64), *(np.zeros(2, np.int32),) * 3,
            np.zeros((3, 4), np.int32), np.zeros((2, 4), np.int32), np.zeros(2, bool),
            *(np.zeros(2),) * 3,
        )  # fmt: skip


def test_ingest_maps_ids_and_model_paths() -> None:
    ing = Ingestor(FAB)
    out = ing.ingest(decode_batch(encode_batch(_batch())))
    assert out is not None
    assert out.src.tolist() == [0] * 4 and out.dst.tolist() == [5] * 4
    assert np.array_equal(out.hops_fwd, flow_paths(FAB, 0, 5, out.sport))
    # reply path: src/dst swapped, sport 4791, dport = the probe's sport
    expect_rev = np.stack([flow_paths(FAB, 5, 0, 4791, int(p))[0] for p in out.sport])
    assert np.array_equal(out.hops_rev, expect_rev)
    assert ing.ingest(_batch(origin="host1")) is not None
    assert ing.stats.records == 8 and ing.stats.origins == {"host0": 4, "host1": 4}
    again = ing.ingest(_batch(origin="host2"))
    assert again is not None and np.array_equal(again.flow, out.flow)
    assert len(set(out.flow.tolist())) == 4


def test_ingest_other_dport_uses_broadcast_flow_paths() -> None:
    b = _batch()
    b = ProbeBatch.from_columns(
        b.origin, b.stamp, b.nic_ids,
        {k: getattr(b, k) for k in ("seq", "src", "dst", "sport", "t1", "t2", "t3", "t4")},
        dport=5000, batch_seq=1,
    )  # fmt: skip
    out = Ingestor(FAB).ingest(b)
    assert out is not None
    assert np.array_equal(out.hops_fwd, flow_paths(FAB, 0, 5, out.sport, 5000))
    # the reply leaves from port 5000 towards the probe's sport, one dport per record
    expect_rev = np.stack([flow_paths(FAB, 5, 0, 5000, int(p))[0] for p in out.sport])
    assert np.array_equal(out.hops_rev, expect_rev)


def test_ingest_prefers_discovered_paths_and_degrades_without_model() -> None:
    table = PathTable(len(FAB.nics), 4)
    table.update(np.array([0]), np.array([5]), np.array([49152]), np.array([[1, 2, 3]], np.int32))
    ing = Ingestor(FAB, table, use_model_paths=False)
    out = ing.ingest(_batch())
    assert out is not None
    assert out.hops_fwd[0].tolist() == [1, 2, 3, -1]
    assert (out.hops_fwd[1:] == -1).all() and (out.hops_rev == -1).all()
    assert not out.path_known.any()


def test_ingest_drops_unknown_nics() -> None:
    ing = Ingestor(FAB)
    out = ing.ingest(_batch(nic_ids=("nic0", "nic999")))
    assert out is not None and len(out) == 0
    assert ing.stats.unknown_nic_records == 4


def test_ingest_drops_records_it_cannot_place_in_time() -> None:
    """A lost record with a MISSING t1 (probers before the refused-send fix) or a reply with a
    MISSING stamp is dropped and counted, and the rest of the batch is kept in order."""
    b = _batch()
    cols = {
        name: getattr(b, name).copy()
        for name in ("seq", "src", "dst", "sport", "t1", "t2", "t3", "t4", "lost")
    }
    cols["lost"][0] = True  # an old prober's loss: no t1 at all
    for t in ("t1", "t2", "t3", "t4"):
        cols[t][0] = MISSING
    cols["t3"][2] = MISSING  # a reply that lost a stamp on the way
    cols["lost"][3] = True  # a loss as today's probers send it: t1 = hand-out time
    for t in ("t2", "t3", "t4"):
        cols[t][3] = MISSING
    ing = Ingestor(FAB)
    out = ing.ingest(ProbeBatch.from_columns("host0", "sw", b.nic_ids, cols, batch_seq=1))
    assert out is not None
    assert out.t1.tolist() == [1000, 3000]
    assert out.lost.tolist() == [False, True]
    assert ing.stats.unstamped_records == 2 and ing.stats.unknown_nic_records == 0
    assert ing.stats.records == 2


def test_key_index_ring_and_flowstore() -> None:
    ki = KeyIndex()
    s, added = ki.insert(np.array([7, 3, 7, 9]))
    assert added == 3 and s[0] == s[2] and len(set(s.tolist())) == 3
    assert ki.lookup(np.array([3, 4])).tolist() == [s[1], -1]
    ring = SampleRing(4, {"x": np.int64})
    ring.append(x=np.arange(3))
    ring.append(x=np.arange(3, 6))
    assert ring.view()["x"].tolist() == [2, 3, 4, 5]
    fs = FlowStore(8, bucket_ns=100)
    sl = np.array([0, 1])
    assert fs.unregistered(sl).all()
    fs.register(sl, np.array([0, 0]), np.array([1, 2]), np.array([5, 5]), np.array([1, 1]))
    assert not fs.unregistered(sl).any() and len(fs) == 2
    q = fs.update(sl, np.array([0, 0]), np.array([10.0, 20.0]), now_ns=0)
    assert q.tolist() == [0.0, 0.0]
    q = fs.update(sl, np.array([1, 1]), np.array([15.0, np.nan]), now_ns=1)
    assert q[0] == 5.0 and np.isnan(q[1])
    fs.update(sl, np.array([2, 2]), np.array([30.0, 30.0]), now_ns=150)  # new bucket
    fs.update(sl, np.array([3, 3]), np.array([30.0, 30.0]), now_ns=300)  # old minimum gone
    assert fs.baseline(sl).tolist() == [30.0, 30.0]


def test_clock_sync_unknown_before_solve_then_accurate() -> None:
    fab = build_fabric(FabricShape.for_nics(32))
    sim = Simulator(fab, SimConfig(seed=5, peers=8))
    ing = Ingestor(fab)
    cs = ClockSync(len(fab.nics))
    steps = list(sim.run(4.0, 1.0))
    first = ing.ingest(steps[0].batch)
    assert first is not None
    d0 = cs.delays(first)
    assert np.isnan(d0.owd_fwd_ns).all() and np.isnan(d0.owd_rev_ns).all()
    assert np.isfinite(d0.rtt_ns[~first.lost]).all()
    cs.add(first)
    now = int(first.t1.max())
    assert cs.maybe_solve(now) and not cs.maybe_solve(now + 1)
    b = first
    checked = 0
    for st in steps[1:]:
        nb = ing.ingest(st.batch)
        assert nb is not None
        b = nb
        cs.add(b)
        cs.maybe_solve(int(b.t1.max()))
        d = cs.delays(b)
        ok = ~b.lost
        if cs.solves < 2:  # one solve: nothing has confirmed its drift yet, delays withheld
            assert np.isnan(d.owd_fwd_ns).all() and np.isnan(d.owd_rev_ns).all()
            continue
        checked += 1
        err = np.abs(d.owd_fwd_ns[ok] - st.true_fwd_ns[ok])
        err_r = np.abs(d.owd_rev_ns[ok] - st.true_rev_ns[ok])
        assert np.median(err) < 50 and np.median(err_r) < 50
        # controller timebase: the clock-corrected send time tracks true time up to a constant
        lag = d.t_ns[ok] - st.true_t_ns[ok]
        assert np.ptp(lag) < 5_000
    assert checked >= 2
    off, unc = cs.offsets(int(b.t1.max()))
    truth = sim.true_offset_ns(float(st.true_t_ns.max()))
    rel = (off - off.mean()) - (truth - truth.mean())
    assert np.max(np.abs(rel)) < 100
    assert np.all(unc > 0)


def testcoded_partners_match_sync_filter() -> None:
    from controller.clocksync import coded_partners
    from sync import coded_pair_mask, coded_probe_mask

    rng = np.random.default_rng(3)
    pair = rng.permutation(np.repeat(np.arange(50), 2)).astype(np.int64)
    pair[:5] = -1  # uncoded probes (their partners become singletons)
    send = rng.integers(0, 10**9, len(pair)).astype(np.int64)
    recv = send + rng.integers(0, 3000, len(pair))
    first, second = coded_partners(pair, send)
    assert (send[first] <= send[second]).all() and (pair[first] == pair[second]).all()
    ok = coded_pair_mask(send[first], send[second], recv[first], recv[second], 1000)
    mine = np.zeros(len(pair), bool)
    mine[first[ok]] = True
    ref = coded_probe_mask(np.where(pair >= 0, pair, -1 - np.arange(len(pair))), send, recv, 1000)
    assert np.array_equal(mine, ref)
    # fast path (partners on adjacent rows, either send order) gives the same partners
    adj = np.repeat(np.arange(50), 2).astype(np.int64)
    f2, s2 = coded_partners(adj, send)
    rows = np.arange(0, 100, 2)
    expect_first = np.where(send[rows] <= send[rows + 1], rows, rows + 1)
    assert np.array_equal(np.sort(f2), np.sort(expect_first))
    assert (adj[f2] == adj[s2]).all() and (send[f2] <= send[s2]).all()


def test_split_solve_matches_inline_solve() -> None:
    from controller.clocksync import compute_state

    fab = build_fabric(FabricShape.for_nics(16))
    st = Simulator(fab, SimConfig(seed=9, peers=4)).step(0.0, 2.0)
    b = Ingestor(fab).ingest(st.batch)
    assert b is not None
    inline, split = ClockSync(16), ClockSync(16)
    inline.add(b)
    split.add(b)
    assert inline.solve(5)
    window = split.start_solve(5)
    assert window is not None and split.start_solve(6) is None  # not due again yet
    assert split.install(compute_state(window, 16, split.config, 5))
    assert inline.state is not None and split.state is not None
    assert np.array_equal(
        inline.state.models.offset_ns, split.state.models.offset_ns, equal_nan=True
    )
    assert not split.install(None)


def test_clock_sync_keeps_lowest_rtt_pair_per_bin_and_delays_match_sync_clock() -> None:
    from sync import one_way_delays

    fab = build_fabric(FabricShape.for_nics(16))
    ingestor = Ingestor(fab)
    batches = [
        ingestor.ingest(st.batch) for st in Simulator(fab, SimConfig(seed=4, peers=4)).run(3.0, 0.5)
    ]
    # 1 s bins on the UNIX grid, the warm-up not split (see the warm-up test)
    cs = ClockSync(16, ClockSyncConfig(window_ns=4_000_000_000, bins=4, warmup_bins=1))
    kept = 0
    for one in batches:
        assert one is not None
        kept += cs.add(one)
    w = cs.window()
    assert w is not None and len(w) % 2 == 0 and 0 < len(w) <= 2 * kept
    # both probes of each kept coded pair (pair ids are unique per batch origin and src)
    assert (w.pair[0::2] == w.pair[1::2]).all()
    binw = cs.config.window_ns // cs.config.bins
    t0 = cs._t0
    assert t0 is not None

    def best_per_bin(*cols: npt.NDArray[np.int64]) -> dict[tuple[int, int, int], int]:
        src, dst, t1, t2, t3, t4 = cols
        out: dict[tuple[int, int, int], int] = {}
        for r in range(0, len(src), 2):  # partners on adjacent rows, first probe first
            k = (int(src[r]), int(dst[r]), int(min(t1[r], t1[r + 1]) // binw))  # UNIX grid
            rtt = int(sum((t4[q] - t1[q]) - (t3[q] - t2[q]) for q in (r, r + 1)))
            out[k] = min(out.get(k, rtt), rtt)
        return out

    cols = ("src", "dst", "t1", "t2", "t3", "t4")
    whole: dict[str, list[npt.NDArray[np.int64]]] = {c: [] for c in cols}
    for one in batches:  # every batch's pairs with both probes arrived, bins across batches
        assert one is not None
        ok = ~one.lost
        both = np.repeat(ok[0::2] & ok[1::2], 2)
        for c in cols:
            whole[c].append(getattr(one, c)[both])
    expect = best_per_bin(*(np.concatenate(whole[c]) for c in cols))
    got = best_per_bin(*(getattr(w, c) for c in cols))
    assert got == expect and len(w) == 2 * len(expect)  # one pair per key: the lowest RTT
    b = batches[-1]
    assert b is not None
    assert cs.maybe_solve(5) and cs.state is not None
    assert np.isnan(cs.delays(b).owd_fwd_ns).all()  # one solve: its drift is unconfirmed
    assert cs.solve(6) and cs.state is not None  # the same data again: confirmed
    d = cs.delays(b)
    owd, _ = one_way_delays(b.t1, b.src, b.t2, b.dst, cs.state.models)
    fin = ~b.lost
    assert np.allclose(d.owd_fwd_ns[fin], owd[fin], atol=1e-3, equal_nan=True)
    assert cs.state.n_samples == len(w)


def test_clock_sync_solves_once_per_window_and_forgets_old_rows() -> None:
    fab = build_fabric(FabricShape.for_nics(16))
    sim = Simulator(fab, SimConfig(seed=2, peers=4))
    ing = Ingestor(fab)
    cs = ClockSync(16, ClockSyncConfig(window_ns=2_000_000_000, solve_every_ns=2_000_000_000))
    times = []
    for st in sim.run(9.0, 0.5):
        b = ing.ingest(st.batch)
        assert b is not None
        cs.add(b)
        if cs.maybe_solve(int(st.t1_s * 1e9)):
            times.append(st.t1_s)
    assert len(times) == cs.solves
    # warm-up: a solve each time the data span doubles (0.5 s, ~1 s, ~2 s), then one per window
    warm = [t for t in times if t <= 2.5]
    assert 3 <= len(warm) <= 4 and times[0] == 0.5
    steady = [t for t in times if t > 2.5]
    assert np.allclose(np.diff([warm[-1], *steady]), 2.0) and len(steady) >= 3
    w = cs.window()
    assert w is not None and int(w.t1.max() - w.t1.min()) <= 2_000_000_000
