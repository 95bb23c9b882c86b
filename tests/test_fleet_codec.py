"""The fleet's grid and payloads: `WindowGrid`, the columnar frame, `Partial` and `FleetState`
round trips, and every malformed payload as one error type."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from contract.records import encode_batch
from controller.fleet.codec import CodecError, pack, unpack
from controller.fleet.config import FleetConfig
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import VERSION, Covers, Partial, PartialError
from controller.fleet.solver import FleetSolver
from controller.fleet.state import StateError, decode_state, encode_state
from controller.fleet.worker import FleetWorker
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

FAB = build_fabric(FabricShape.for_nics(16, nics_per_leaf=4, spines=2))
MS = 1_000_000


def test_grid_windows_are_aligned_to_unix_time_not_to_a_start() -> None:
    g = WindowGrid(100 * MS)
    assert g.index(EPOCH_NS) == EPOCH_NS // (100 * MS)
    assert g.start(g.index(EPOCH_NS + 150 * MS)) == EPOCH_NS + 100 * MS
    assert g.end(g.index(EPOCH_NS + 150 * MS)) == EPOCH_NS + 200 * MS
    assert g.index(-1) == -1  # floor, not truncation
    assert g.indices(np.array([0, 99 * MS, 100 * MS], np.int64)).tolist() == [0, 0, 1]
    # window k is closed at upto once end + lateness <= upto
    assert g.closed_before(EPOCH_NS + 200 * MS) == g.index(EPOCH_NS) + 2
    assert g.closed_before(EPOCH_NS + 200 * MS, 1) == g.index(EPOCH_NS) + 1
    with pytest.raises(ValueError):
        WindowGrid(0)


def test_frame_round_trips_and_refuses_every_malformed_payload() -> None:
    cols = {"a": np.arange(5, dtype=np.int64), "b": np.ones((2, 3), np.int32)}
    for compress in (False, True):
        data = pack(b"TEST", 1, {"x": 1}, cols, compress=compress)
        v, head, got = unpack(data, b"TEST", frozenset({1}))
        assert v == 1 and head == {"x": 1}
        assert all(np.array_equal(got[k], cols[k]) and got[k].dtype == cols[k].dtype for k in cols)
    data = pack(b"TEST", 1, {"x": 1}, cols)
    hlen = struct.unpack_from("<I", data, 8)[0]
    bad = {
        "short": data[:5],
        "magic": b"XXXX" + data[4:],
        "version": data[:4] + struct.pack("<H", 9) + data[6:],
        "flags": data[:6] + struct.pack("<H", 4) + data[8:],
        "head length": data[:8] + struct.pack("<I", 1 << 20) + data[12:],
        "json": data[:12] + b"{" * hlen + data[12 + hlen :],
        "truncated body": data[:-3],
        "trailing bytes": data + b"\0",
        "not zlib": data[:6] + struct.pack("<H", 1) + data[8:],
    }
    for why, payload in bad.items():
        with pytest.raises(CodecError):
            unpack(payload, b"TEST", frozenset({1}))
        assert why  # each case named
    evil = pack(b"TEST", 1, {}, {"a": np.zeros(2, np.int64)}).replace(b'"<i8"', b'"<c8"')
    with pytest.raises(CodecError, match="dtype"):
        unpack(evil, b"TEST", frozenset({1}))
    zipped = pack(b"TEST", 1, {}, cols, compress=True)
    assert len(zipped) < len(data) + 64
    assert zlib.decompress(zipped[12 + struct.unpack_from("<I", zipped, 8)[0] :])


def _partials(seconds: float = 1.0) -> tuple[list[Partial], FleetWorker]:
    """A worker's partials of a short simulated run (per-host batches, 100 ms windows)."""
    cfg = FleetConfig(grid=WindowGrid(100 * MS))
    w = FleetWorker(FAB, cfg, name="w0")
    sim = Simulator(FAB, SimConfig(seed=2, peers=4))
    out: list[Partial] = []
    for i, st in enumerate(sim.run(seconds, 0.1)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        payloads, _ = host_batches(FAB, st.batch, i + 1)
        for p in payloads:
            w.admit(None, p, now)
        out += w.close(now)
    return out, w


def test_a_partial_round_trips_exactly_and_says_what_it_holds() -> None:
    parts, _ = _partials()
    assert [p.window for p in parts] == list(range(parts[0].window, parts[0].window + len(parts)))
    full = [p for p in parts if p.records]
    assert full and all(len(p.covers) == len(FAB.hosts) for p in full)  # every host's batch
    for p in parts:
        for compress in (True, False):
            q = Partial.decode(p.encode(compress=compress))
            assert q.encode(compress=False) == p.encode(compress=False)
        assert q.window == p.window and q.worker == "w0" and q.counts == p.counts
        assert q.covers.batches() == p.covers.batches()
    p = full[0]
    assert p.counts.records == p.records == int(p.detection.src_count.sum()) > 0
    assert len(p.clock) % 2 == 0 and len(p.clock) > 0
    assert len(p.detection.path_sig) == len(p.detection.path_hops) > 0


def test_every_malformed_partial_raises_partial_error() -> None:
    parts, _ = _partials(0.3)
    good = next(p for p in parts if p.records).encode(compress=False)
    cases = [
        b"",
        good[:40],
        good.replace(b'"window"', b'"wind0w"'),
        good.replace(b'"det.pair_fwd","<i4"', b'"det.pair_fwd","<i8"'),
        good.replace(b'"clk.src"', b'"clk.srd"'),
        encode_batch(Simulator(FAB, SimConfig(seed=1)).step(0.0, 0.1).batch),  # another kind
    ]
    for data in cases:
        with pytest.raises(PartialError):
            Partial.decode(data)
    # an index past what the partial holds
    p = next(p for p in parts if len(p.detection.pair_fwd))
    n_paths = len(p.detection.path_sig)
    head, cols = _head_and_cols(p)
    cols["det.pair_fwd"][0] = n_paths
    with pytest.raises(PartialError, match="pair_fwd"):
        Partial.decode(pack(b"QPFP", VERSION, head, cols))
    # a round trip on a path it does not hold, and round-trip columns of two lengths
    head, cols = _head_and_cols(p)
    cols["det.rt_fwd"] = np.array([n_paths], "<i4")
    cols["det.rt_rev"] = np.array([0], "<i4")
    cols["det.rt_excess"] = np.array([1.0], "<f8")
    with pytest.raises(PartialError, match="rt_fwd"):
        Partial.decode(pack(b"QPFP", VERSION, head, cols))
    cols["det.rt_fwd"] = np.array([0], "<i4")
    assert Partial.decode(pack(b"QPFP", VERSION, head, cols)).detection.rt_excess.tolist() == [1.0]
    cols["det.rt_excess"] = np.array([1.0, 2.0], "<f8")
    with pytest.raises(PartialError, match="round trips"):
        Partial.decode(pack(b"QPFP", VERSION, head, cols))


def _head_and_cols(p: Partial) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    _, head, cols = unpack(p.encode(), b"QPFP", frozenset({VERSION}))
    return head, {k: np.array(v) for k, v in cols.items()}


def test_the_solver_refuses_partials_of_another_grid_or_fabric_and_says_duplicate_late_overlap() -> (
    None
):
    from controller.fleet.solver import Added

    parts, _ = _partials(0.5)
    solver = FleetSolver(FAB, FleetConfig(grid=WindowGrid(100 * MS)))
    other = FleetSolver(FAB, FleetConfig(grid=WindowGrid(200 * MS)))
    with pytest.raises(PartialError, match="grid"):
        other.add(parts[0])
    small = build_fabric(FabricShape.for_nics(8, nics_per_leaf=4, spines=2))
    assert FleetSolver(small, FleetConfig(grid=WindowGrid(100 * MS))).add(parts[0]) is Added.STALE
    p = next(p for p in parts if p.records)
    assert solver.add(p) is Added.TAKEN
    assert solver.add(p) is Added.DUPLICATE
    twin = Partial(p.window, "w1", p.grid_ns, p.fabric, p.first_stamp, p.covers, p.clock,
                   p.detection, p.learned, p.nic_owd, p.counts)  # fmt: skip
    assert solver.add(twin) is Added.OVERLAP  # the same batches: counting them twice
    assert solver.complete(p.window, ["w0"]) and not solver.complete(p.window, ["w0", "w1"])
    solver.solve(p.window, EPOCH_NS + 10**9)
    assert solver.add(parts[0]) is Added.LATE and solver.late_partials == 1
    assert Covers.of([("h", 1)]).overlaps(Covers.of([("h", 1), ("g", 2)]))


def test_a_fleet_state_round_trips_and_a_bad_one_raises_state_error() -> None:
    cfg = FleetConfig(grid=WindowGrid(100 * MS))
    w = FleetWorker(FAB, cfg, name="w0")
    solver = FleetSolver(FAB, cfg)
    parts: list[Partial] = []
    for i, st in enumerate(Simulator(FAB, SimConfig(seed=2, peers=4)).run(3.0, 0.1)):
        now = EPOCH_NS + round(st.t1_s * 1e9)
        for p in host_batches(FAB, st.batch, i + 1)[0]:
            w.admit(None, p, now)
        for part in w.close(now):
            solver.add(part)
            parts.append(part)
        res = solver.solve(parts[-1].window, now)
        w.install_clock(res.clock)
    assert res.state.clock is not None and len(res.state.base_sig) > 0  # delays judged
    st = decode_state(res.clock, len(FAB.nics), len(FAB.hosts))
    again = encode_state(st)
    assert again == encode_state(res.state)
    assert np.array_equal(st.clock.models.offset_ns, res.state.clock.models.offset_ns,  # type: ignore[union-attr]
                          equal_nan=True)  # fmt: skip
    w.install_clock(res.clock)
    assert not w.needs_full
    with pytest.raises(StateError):
        decode_state(res.clock, len(FAB.nics) + 1, len(FAB.hosts))
    with pytest.raises(StateError):
        decode_state(res.clock[:30], len(FAB.nics), len(FAB.hosts))
    with pytest.raises(StateError):
        decode_state(parts[0].encode(), len(FAB.nics), len(FAB.hosts))
    full = solver.state(full=True)
    assert full.full and len(full.base_sig) >= len(res.state.base_sig)
