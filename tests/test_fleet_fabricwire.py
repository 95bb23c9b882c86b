"""A learned fabric in the fleet, the pure parts: a version as it travels (one encoder: the
fabric's own description), which version the solver publishes, which a worker follows and
which clock models it installs on it, the solver's stale partials, and the worker shell's
swap of a partition's core (driven directly, no server)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from controller.config import EMPTY_FABRIC, ServiceConfig
from controller.fleet.compose import SolverCore, worker_cores
from controller.fleet.config import FleetConfig
from controller.fleet.fabricwire import (
    MAGIC,
    FabricFollow,
    FabricPublisher,
    FabricWireError,
    decode_fabric,
    encode_fabric,
    version_of,
)
from controller.fleet.grid import WindowGrid
from controller.fleet.partial import fabric_id
from controller.fleet.plane import Plane
from controller.fleet.solver import Added, FleetSolver
from controller.fleet.state import StateError
from controller.fleet.watermark import StreamClock
from controller.fleet.worker import FleetWorker
from controller.fleet.workerloop import PartitionState, WorkerLoop
from controller.pathmap import PathRows, path_rows
from controller.topology import LearnConfig
from mesh.fabric import Fabric, FabricShape, build_fabric
from mesh.fabric.ecmp import routing_tables
from mesh.fabric.learn import learn_fabric
from natslink.settings import NatsSettings
from tests.fabricobs import by_router_id, neighbors, traces
from tests.fleetstub import StubWorker

MS = 1_000_000
PLAN = build_fabric(FabricShape(leaves=2, hosts_per_leaf=2, spines=2, nics_per_host=2))


def _learned() -> Fabric:
    return learn_fabric(neighbors(PLAN), traces(PLAN, by_router_id(PLAN))).fabric


def _rows(fab: Fabric) -> PathRows:
    lf = learn_fabric(neighbors(PLAN), traces(PLAN, by_router_id(PLAN)))
    assert lf.fabric.to_dict() == fab.to_dict()
    paths = [p.to_json() for p in traces(PLAN, by_router_id(PLAN))]
    return path_rows(lf.fabric, lf.router_nodes, paths, routing_tables(fab).max_hops)


def test_a_version_round_trips_through_the_fabrics_one_description() -> None:
    for fab in (PLAN, _learned()):
        data = encode_fabric(fab)
        assert data.startswith(MAGIC) and version_of(data) == fabric_id(fab)
        back = decode_fabric(data)
        assert back.fabric.to_dict() == fab.to_dict()  # (a Fabric equals only itself)
        assert len(back.paths.src) == 0
    learned = _learned()
    rows = _rows(learned)
    assert len(rows.src) > 100
    back = decode_fabric(encode_fabric(learned, rows)).paths
    for a, b in zip(back, rows, strict=True):
        assert np.array_equal(a, b) and a.dtype == b.dtype
    learned = _learned()  # a learned fabric has no shape, but every link of the plan
    assert learned.shape == {} and len(learned.links) == len(PLAN.links)
    assert any(n.kind == "spine" for n in learned.nodes)


def test_malformed_versions_are_one_line_errors() -> None:
    good = encode_fabric(PLAN)
    other = encode_fabric(build_fabric(FabricShape(leaves=3)))
    bad = [
        b"",
        b"QPF1short",
        b"XXXX" + good[4:],
        good[:20] + b"not zlib",
        good[:20] + zlib.compress(b"[1, 2]"),
        good[:20] + zlib.compress(b'{"nodes": 3}'),
        good[:20] + other[20:],  # the id names another fabric than the body
        encode_fabric(PLAN)[:20] + encode_fabric(_learned(), _rows(_learned()))[20:],
        encode_fabric(build_fabric(FabricShape(leaves=2, spines=1)), _rows(_learned())),  # misfit
    ]
    for data in bad:
        with pytest.raises(FabricWireError) as exc:
            decode_fabric(data)
        assert "\n" not in str(exc.value)


def test_the_solver_publishes_each_new_fabric_once_and_never_an_empty_one() -> None:
    pub = FabricPublisher()
    assert not pub.due(EMPTY_FABRIC)  # nothing learned yet: workers keep waiting
    assert pub.due(PLAN)
    assert not pub.current(PLAN)  # models of PLAN wait until it is published
    pub.published(PLAN)
    assert pub.current(PLAN) and not pub.due(PLAN)
    equal = Fabric.from_dict(PLAN.to_dict())  # an equal fabric, another object: not again
    assert not pub.due(equal) and pub.current(equal)
    learned = _learned()
    assert pub.due(learned) and not pub.current(learned)
    # a standby taking over: what the bucket holds is not published again
    standby = FabricPublisher()
    standby.seen(encode_fabric(learned))
    assert not standby.due(learned) and standby.due(PLAN)
    with pytest.raises(FabricWireError):
        standby.seen(b"junk")
    standby.refused(PLAN)  # over the servers' max_payload: not again, a later one is
    assert not standby.due(PLAN) and standby.due(build_fabric(FabricShape(leaves=3)))


def test_a_worker_follows_new_versions_and_installs_only_models_written_after_them() -> None:
    follow = FabricFollow()
    assert follow.fabric is None and not follow.fits(5)  # no fabric: no models either
    assert follow.take(encode_fabric(PLAN), revision=7)
    assert follow.fabric is not None and follow.fabric.to_dict() == PLAN.to_dict()
    assert follow.id == fabric_id(PLAN)
    assert not follow.fits(6) and not follow.fits(7) and follow.fits(8)
    assert not follow.take(encode_fabric(PLAN), revision=12)  # same fabric written again
    assert follow.revision == 7 and follow.fits(9)
    learned = _learned()
    assert follow.take(encode_fabric(learned, _rows(learned)), revision=20)
    assert np.array_equal(follow.paths.hops, _rows(learned).hops)
    assert follow.fabric is not None and follow.fabric.to_dict() == learned.to_dict()
    assert not follow.fits(19) and follow.fits(21)
    with pytest.raises(FabricWireError):
        follow.take(b"QPF1" + b"0" * 16 + b"junk", revision=30)
    assert follow.id == fabric_id(learned)  # a bad version changes nothing


def test_the_solver_drops_partials_of_another_fabric_as_stale() -> None:
    from tests.test_fleet_codec import _partials

    parts, _ = _partials(0.5)
    small = build_fabric(FabricShape.for_nics(8, nics_per_leaf=4, spines=2))
    solver = FleetSolver(small, FleetConfig(grid=WindowGrid(100 * MS)))
    assert solver.add(parts[0]) is Added.STALE and solver.stale_partials == 1
    assert solver.solve(parts[0].window, parts[0].window * 100 * MS).counts.records == 0


class _Core(StubWorker):
    """A stand-in core that names its fabric and refuses models of another size."""

    def __init__(self, fabric: Fabric, plane: Plane) -> None:
        super().__init__(plane.window_ns, plane.grace_ns)
        self.expect = fabric_id(fabric).encode()

    def install_clock(self, models: bytes) -> None:
        if models != self.expect:
            raise StateError("models of another fabric's size")
        super().install_clock(models)


def test_the_worker_shell_swaps_a_partitions_core_and_filters_models() -> None:
    plane = Plane(partitions=2, window_ns=1000, grace_ns=100, duplicate_window_s=1)
    follow = FabricFollow()
    logs: list[str] = []
    made: list[_Core] = []

    def make(p: int) -> _Core:
        made.append(_Core(follow.fabric if follow.fabric is not None else EMPTY_FABRIC, plane))
        return made[-1]

    loop = WorkerLoop(plane, NatsSettings(servers=("nats://127.0.0.1:1",)), "w1", make,
                      log=lambda t, what, **kw: logs.append(what), fabric=follow)  # fmt: skip
    follow.take(encode_fabric(PLAN), revision=3)
    st = PartitionState(make(0), StreamClock(plane.grace_ns, plane.stream_gap_ns), fabric=follow.id)
    st.next_window = 5
    loop._follow(0, st)
    assert len(made) == 1  # same version: the core stays
    loop.models, loop.models_revision = fabric_id(PLAN).encode(), 2  # written before the version
    loop._install(st)
    assert made[0].clocks == [] and st.models is None
    loop.models_revision = 4
    loop._install(st)
    assert made[0].clocks == [fabric_id(PLAN).encode()] and st.models is loop.models
    learned = _learned()
    follow.take(encode_fabric(learned), revision=10)
    loop._follow(0, st)
    assert len(made) == 2 and st.core is made[1] and st.fabric == fabric_id(learned)
    assert made[1].closed_below == 5  # its floor where the old core's was: nothing resent
    assert st.models is None and "partition refabric" in logs
    loop._install(st)  # the old fabric's models (revision 4 < 10): not on the new core
    assert made[1].clocks == []
    loop.models_revision = 11  # written after the version, but of another size: skipped
    loop._install(st)
    assert made[1].clocks == [] and "models skipped" in logs
    loop.models, loop.models_revision = fabric_id(learned).encode(), 12
    loop._install(st)
    assert made[1].clocks == [fabric_id(learned).encode()]


def test_traced_paths_reach_every_worker_core_with_the_version_and_through_the_solver() -> None:
    """Published with the fabric: a core built on the version knows them, and sends none of
    them back; learned where the solver runs later: in the next judged window's state."""
    learned = _learned()
    rows = _rows(learned)
    follow = FabricFollow()
    follow.take(encode_fabric(learned, rows), revision=1)
    cfg = ServiceConfig(fabric=EMPTY_FABRIC, learn=LearnConfig())
    plane = Plane(partitions=2, window_ns=100 * MS, grace_ns=0, duplicate_window_s=1)
    core = worker_cores(cfg, plane, follow)(0)
    fwd, _, known = core.paths(rows.src[:5], rows.dst[:5], rows.sport[:5])
    assert known.all() and np.array_equal(fwd[:, : rows.hops.shape[1]], rows.hops[:5])
    assert not core._ingestor.use_model_paths  # a learned fabric's ECMP model is no one's
    assert len(core.take_learned()) == 0  # nothing to send back to the solver
    # the solver process: paths its own worker learned go out in the next state
    here = FleetWorker(learned, core.config, name="local")
    here.learn_paths(rows.src[:3], rows.dst[:3], rows.sport[:3], rows.hops[:3])
    solver = FleetSolver(learned, core.config)
    adapter = SolverCore(solver, paths=lambda: here)
    state = adapter.solve(0, 100 * MS).state
    assert len(state.learned) == 3 and len(here.take_learned()) == 0
    other = FleetWorker(learned, core.config, name="p1")
    other.install(state)
    _, _, known = other.paths(rows.src[:3], rows.dst[:3], rows.sport[:3])
    assert known.all()
