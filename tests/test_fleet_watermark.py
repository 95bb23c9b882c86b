"""When a window is whole (`controller.fleet.watermark`, issue 32): per host the newest send
time ingested; a window closes when every live prober's batches cover it, or short past a
bound. Pure: arrays in, integers out; and the worker that closes windows by it."""

from __future__ import annotations

import numpy as np

from controller.fleet.config import FleetConfig
from controller.fleet.grid import WindowGrid
from controller.fleet.watermark import WAIT_NS, Watermarks
from controller.fleet.worker import FleetWorker
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator
from testbed.sim.ingest_traffic import host_batches

S = 1_000_000_000
ALL = np.ones(3, bool)


def test_a_window_waits_for_the_slowest_live_host_heard_from() -> None:
    m = Watermarks(3)
    assert m.close_until(ALL, 9 * S, 5 * S) is None  # nobody heard from: nothing to wait for
    m.note(np.array([0, 0, 1]), np.array([5 * S, 7 * S, 4 * S], np.int64))
    assert m.newest() == 7 * S
    assert m.close_until(ALL, 8 * S, 5 * S) == 4 * S  # host 2 never sent: not waited for
    assert m.close_until(np.array([True, False, True]), 8 * S, 5 * S) == 7 * S  # 1 is down
    assert m.close_until(ALL, 12 * S, 5 * S) == 7 * S  # past the wait: closes anyway
    assert m.short(ALL, 6 * S) == 1 and m.short(ALL, 4 * S) == 0
    assert m.short(ALL, 8 * S) == 0  # nobody covered it: not one-sided


FAB = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, nics_per_host=1, spines=2))


def _steps() -> list[tuple[int, list[tuple[str, bytes]]]]:
    sim = Simulator(FAB, SimConfig(seed=2, peers=4, timestamps="sw"))
    host = {n.id: n.host for n in FAB.nics}
    out = []
    for i, st in enumerate(sim.run(6, 0.25)):
        pays = host_batches(FAB, st.batch, i + 1)[0]
        b = st.batch
        hosts = sorted({host[b.nic_ids[int(s)]] for s in np.unique(b.src)})
        assert len(hosts) == len(pays)
        out.append((EPOCH_NS + round(st.t1_s * S), list(zip(hosts, pays, strict=True))))
    return out


def test_a_window_waits_for_a_late_prober_and_closes_whole() -> None:
    """host5's batches arrive 2 s late from its 3rd second on (in order, as a late prober's
    do): the worker holds that window until they come, then hands it out whole, with host5's
    probes in it."""
    w = FleetWorker(FAB, FleetConfig(grid=WindowGrid(S), wait_ns=WAIT_NS), name="w")
    k0 = WindowGrid(S).index(EPOCH_NS)
    held: list[tuple[int, bytes]] = []
    parts = {}
    for now, pays in _steps():
        for host, p in pays:
            if host == "host5" and now > EPOCH_NS + 2 * S:
                held.append((now + 2 * S, p))
            else:
                w.admit(None, p, now)
        for _t, p in [h for h in held if h[0] <= now]:
            w.admit(None, p, now)
        held = [h for h in held if h[0] > now]
        for part in w.close(now + S // 2):  # a tick half a window after the step
            parts[part.window - k0] = (now - EPOCH_NS, part)
    host5 = FAB.nic_index[next(n.id for n in FAB.nics if n.host == "host5")]
    at, third = parts[2]
    assert at >= 4 * S  # not before host5's late batches came
    assert host5 in third.detection.nic.tolist() and third.counts.short == 0
    assert all(p.counts.short == 0 for _, p in parts.values())
    assert parts[0][0] < 2 * S  # the windows host5 had covered were not held


def test_a_prober_that_stopped_closes_windows_short_past_the_bound() -> None:
    w = FleetWorker(FAB, FleetConfig(grid=WindowGrid(S), wait_ns=2 * S), name="w")
    k0 = WindowGrid(S).index(EPOCH_NS)
    parts = {}
    for now, pays in _steps():
        for host, p in pays:
            if host != "host5" or now <= EPOCH_NS + S:  # host5 stops after its first second
                w.admit(None, p, now)
        for part in w.close(now + S // 2):
            parts[part.window - k0] = part
    # host5 sent nothing at or past the end of its first second: every window the others
    # covered is short of it, and closed 2 s after its end, not held for good
    assert [parts[k].counts.short for k in range(1, 4)] == [1, 1, 1]
    assert max(parts) == 3  # the last tick at 6.5 s: the windows ending by 4.5 s
