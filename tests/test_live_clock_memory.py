"""The live controller's clock sync, worker and solver as the fleet splits them (issue 34):
a NIC clock that steps is found within a window, reported unknown until a solve re-solves
it and never becomes a finding; the solver remembers each directed pair's round-trip floor
across windows and its workers judge delays against floors of their own."""

from __future__ import annotations

import numpy as np
import pytest

from contract.documents import EventDoc
from controller.clocksolve import ClockSyncConfig
from controller.live import LiveConfig, LiveController
from mesh.fabric import FabricShape, build_fabric
from testbed.sim.engine import EPOCH_NS, SimConfig, Simulator

STEP_NIC, STEP_AT_S, STEP_NS = 5, 20.0, 5_000.0


def _run(
    step: bool, seconds: float = 46.0, every_s: int | None = None
) -> tuple[LiveController, list[EventDoc], list[float]]:
    """A fault-free simulated run through one live controller (a worker and the solver in
    one process, the real brain); ``step``: NIC 5's clock steps 5 us at 20 s; ``every_s``:
    a clock solve every so many s (None: the default, once per window). Returns the
    controller, its events and, per batch from the step on, NIC 5's reported offset error
    (NaN while it is unknown)."""
    fab = build_fabric(FabricShape.for_nics(32, nics_per_leaf=8))
    sim = Simulator(fab, SimConfig(seed=3))
    if step:
        sim.step_clock(STEP_NIC, STEP_AT_S, STEP_NS)
    sync = ClockSyncConfig() if every_s is None else ClockSyncConfig(solve_every_ns=every_s * 10**9)
    lc = LiveController(fab, LiveConfig(sync=sync))
    events: list[EventDoc] = []
    errs: list[float] = []
    for st in sim.run(seconds, 0.5):
        now = EPOCH_NS + int(st.t1_s * 1e9)
        assert lc.admit(st.batch, now).accepted
        events += lc.tick(now)
        if st.t0_s >= STEP_AT_S and lc.clock.state is not None:
            t = lc.clock.state.t_ref_ns
            off, _ = lc.clock.offsets(t)
            truth = sim.true_offset_ns(float(t - EPOCH_NS))
            e = (off - truth) - np.nanmedian(np.delete(off - truth, STEP_NIC))
            errs.append(float(e[STEP_NIC]))
    return lc, events, errs


def _keys(events: list[EventDoc]) -> set[tuple[str, str]]:
    return {(e.kind, e.target) for e in events}


@pytest.mark.parametrize("every_s", [None, 2])
def test_a_step_is_found_within_one_solve_unknown_until_re_solved_and_never_a_finding(
    every_s: int | None,
) -> None:
    """Also with a solve every 2 s (the service's on a small fabric), which comes between
    the batch that shows the step and the one that confirms it: the NIC's last clock error
    is carried over the solve (`controller.clocksync.rebased_errors`; dropped, the step was
    never found and raised a ``contention`` on NIC 5's link)."""
    _, clean_events, _ = _run(step=False, every_s=every_s)
    lc, events, errs = _run(step=True, every_s=every_s)
    # never a finding: the run with the step raised nothing the clean run did not
    assert _keys(events) <= _keys(clean_events)
    assert lc.delay_trust.sum() > 0
    # found from the NIC's own probes and marked at the solver when the window of the find
    # closes: unknown within 1.5 s of the step (not one solve later), until re-solved ...
    assert np.isnan(errs[3:7]).all()
    # ... never reported off by the step while known, and known again once re-solved
    known = np.isfinite(errs)
    assert known[-1], "NIC 5 is re-solved from its data after the step"
    assert np.nanmax(np.abs(errs)) < 0.2 * STEP_NS
    assert lc.clock.stepped_at[STEP_NIC] == -1


def test_the_solver_remembers_each_pairs_floor_across_windows() -> None:
    """Every row of the solver's window carries its directed pair's remembered round-trip
    floor (`ClockSync.floors`, fed by the pairs the worker selected), which the rows' own
    round trips do not undercut."""
    lc, _, _ = _run(step=False, seconds=24.0)
    w = lc.clock.window()
    assert w is not None and w.floor is not None
    assert np.isfinite(w.floor).mean() > 0.99
    rtt = ((w.t4 - w.t1) - (w.t3 - w.t2)).astype(np.float64)
    assert np.nanmedian(rtt - w.floor) >= 0.0
    assert np.nanmean(rtt < w.floor - 5_000.0) < 1e-3
