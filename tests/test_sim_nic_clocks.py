"""NIC clocks as they are in the simulator: CQE send stamps, gross bad stamps, clock steps and
servo steering each do what their knob says (docs/simulator.md, "NIC clocks as they are")."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mesh.fabric import FabricShape, build_fabric
from testbed.sim import clock_events
from testbed.sim.clock_events import SERVO_CHUNK, SERVO_HISTORY_S, STEP_HISTORY_S, ClockEvents
from testbed.sim.engine import EPOCH_NS, SimConfig, SimError, Simulator
from testbed.sim.model import ModelError, ModelKnobs

FABRIC = build_fabric(FabricShape())
QUIET = dataclasses.replace(  # nothing random on top of the floors
    ModelKnobs(),
    hotspot_frac=0.0,
    incast_prob=0.0,
    background_loss=0.0,
    burst_per_link_h=0.0,
    overflow_loss=0.0,
)


def _clock_error(
    sim: Simulator, st_t: np.ndarray, stamp: np.ndarray, nic: np.ndarray
) -> np.ndarray:
    """Stamp minus (epoch + true time + the NIC's true offset)."""
    return np.asarray(stamp - EPOCH_NS - st_t - sim.true_offset_ns(st_t, nic), dtype=np.float64)


def _stamped_true(err: np.ndarray) -> None:
    """Stamps within a 6.4 ns tick of the truth, but for the hw TX outliers (10-300 ns, 1e-3)."""
    assert np.mean(np.abs(err) < 7.0) > 0.99 and np.max(np.abs(err)) < 310.0


def test_cqe_send_stamps_lead_the_wire_and_see_the_nic_queue() -> None:
    knobs = dataclasses.replace(QUIET, cqe_jitter_ns=0.0)
    hw = Simulator(FABRIC, SimConfig(load=0.6, seed=5, model=knobs))
    cqe = Simulator(FABRIC, SimConfig(load=0.6, seed=5, timestamps="cqe", model=knobs))
    a, b = hw.step(0.0, 0.5), cqe.step(0.0, 0.5)
    assert b.batch.stamp == "hw"  # the prober reports NIC stamps either way
    lead = cqe.nic_tx_ns - hw.nic_tx_ns
    assert np.all(np.abs(lead - 600.0) <= 10.0) and np.std(lead) > 1.0
    # a CQE delay is the wire delay plus the sender's lead plus its own egress queue's wait
    ok = np.isfinite(a.true_fwd_ns) & np.isfinite(b.true_fwd_ns)
    extra = (b.true_fwd_ns - a.true_fwd_ns)[ok] - lead[b.batch.src[ok]]
    assert np.all(extra >= -1e-6) and np.mean(extra > 0) > 0.3
    # the measured delay is the true one plus the clocks: the stamps agree with the truth
    first = np.asarray(b.batch.t1, dtype=np.int64)
    _stamped_true(_clock_error(cqe, b.true_t_ns, first, b.batch.src))
    # the constant lead is in the fixed delay (so the queueing truth excludes it)
    fixed = cqe.fixed_delay_ns(b.hops_fwd, b.batch.src, b.batch.dst)
    assert np.all((b.true_fwd_ns - fixed)[ok] >= -1e-6)
    with pytest.raises(SimError):
        SimConfig(timestamps="ptp")


def test_cqe_jitter_makes_send_stamps_earlier_still() -> None:
    base = dataclasses.replace(QUIET, cqe_jitter_ns=0.0)
    jit = dataclasses.replace(QUIET, cqe_jitter_ns=40.0)
    a = Simulator(FABRIC, SimConfig(load=0.0, seed=6, timestamps="cqe", model=base)).step(0, 0.5)
    b = Simulator(FABRIC, SimConfig(load=0.0, seed=6, timestamps="cqe", model=jit)).step(0, 0.5)
    d = b.true_fwd_ns - a.true_fwd_ns
    assert np.all(d >= 0) and np.mean(d) == pytest.approx(40.0, rel=0.15)


def test_bad_stamps_are_rare_gross_and_either_way() -> None:
    knobs = dataclasses.replace(QUIET, hw_bad_stamp_prob=0.01)
    sim = Simulator(FABRIC, SimConfig(load=0.0, seed=7, model=knobs))
    clean = Simulator(FABRIC, SimConfig(load=0.0, seed=7, model=QUIET))
    a, b = sim.step(0.0, 2.0), clean.step(0.0, 2.0)
    diff = np.concatenate(
        [np.asarray(getattr(a.batch, c), np.float64) - getattr(b.batch, c) for c in ("t1", "t2")]
    )
    bad = np.abs(diff) > 500.0
    assert bad.mean() == pytest.approx(0.01, rel=0.3)
    assert np.all(np.abs(diff[bad]) <= 50_007) and np.all(np.abs(diff[bad]) >= 990)
    assert (diff[bad] > 0).any() and (diff[bad] < 0).any()
    # the truth is untouched: a bad stamp is a stamp error, not a delay
    assert np.array_equal(a.true_fwd_ns, b.true_fwd_ns)
    with pytest.raises(ModelError):
        ModelKnobs(hw_bad_stamp_prob=2.0)


def test_a_scheduled_clock_step_moves_the_clock_from_its_instant_on() -> None:
    sim = Simulator(FABRIC, SimConfig(seed=8, model=QUIET))
    before = sim.true_offset_ns(np.array([0.5e9, 1.5e9]), np.array([3, 3]))
    sim.step_clock(3, 1.0, 5_000.0)
    after = sim.true_offset_ns(np.array([0.5e9, 1.5e9]), np.array([3, 3]))
    assert after[0] == before[0] and after[1] == pytest.approx(before[1] + 5_000.0)
    other = sim.true_offset_ns(1.5e9, np.array([4]))
    assert other[0] == Simulator(FABRIC, SimConfig(seed=8, model=QUIET)).true_offset_ns(1.5e9)[4]
    assert sim.clock_steps(2.0) == [(3, 1.0, 5_000.0)]
    # the stamps follow the stepped clock
    st = sim.step(1.0, 1.0)
    mine = np.asarray(st.batch.src) == 3
    _stamped_true(
        _clock_error(sim, st.true_t_ns[mine], np.asarray(st.batch.t1)[mine], st.batch.src[mine])
    )
    with pytest.raises(ValueError):
        sim.step_clock(len(FABRIC.nics), 1.0, 1.0)


def test_random_steps_come_at_their_rate_with_their_sizes_and_any_query_order() -> None:
    knobs = dataclasses.replace(QUIET, clock_step_per_h=36.0, clock_step_us=(1.0, 100.0))
    ev = ClockEvents(64, knobs, seed=9)
    steps = ev.steps(1000.0)  # 64 NICs x 1000 s x 0.01 / s = 640 expected
    assert 500 < len(steps) < 800
    sizes = np.abs([s for _, _, s in steps])
    assert sizes.min() >= 1_000 and sizes.max() <= 100_000
    # log-uniform: as many steps below 10 us as above
    assert 0.4 < np.mean(sizes < 10_000) < 0.6
    late_first = ClockEvents(64, knobs, seed=9)
    t = np.array([590e9, 10e9])  # (within STEP_HISTORY_S of each other: both held)
    idx = np.array([5, 5])
    assert np.array_equal(late_first.offset_ns(t, idx), ev.offset_ns(t, idx))


def test_random_steps_over_a_day_hold_minutes_not_the_day(monkeypatch: pytest.MonkeyPatch) -> None:
    # a day of steps at 6 per NIC-hour would hold ~9,000 steps one by one and loop over every
    # NIC that ever stepped at each query; the old ones are summed per NIC instead
    knobs = dataclasses.replace(QUIET, clock_step_per_h=6.0, clock_step_us=(1.0, 100.0))
    ev = ClockEvents(64, knobs, seed=12)
    idx = np.arange(64)
    held = []
    for t_s in range(0, 86_400, 300):
        ev.offset_ns(np.full(64, t_s * 1e9), idx)
        held.append(ev.steps_held)
    # 64 NICs x 6 / h over STEP_HISTORY_S plus a draw chunk ahead: ~75 expected
    assert max(held) < 64 * 6 * (STEP_HISTORY_S + 2 * clock_events.STEP_CHUNK_S) / 3600 * 2
    monkeypatch.setattr(clock_events, "STEP_HISTORY_S", float("inf"))
    every = ClockEvents(64, knobs, seed=12)  # the same steps, every one held
    at = np.full(64, 86_399e9)
    assert np.allclose(ev.offset_ns(at, idx), every.offset_ns(at, idx), rtol=0, atol=1e-6)
    assert every.steps_held > 8_000
    with pytest.raises(ValueError, match="no longer held"):
        ev.offset_ns(np.array([1e9]), np.array([0]))


def test_servo_steering_changes_the_frequency_at_each_update_and_nothing_without_noise() -> None:
    knobs = dataclasses.replace(QUIET, servo_interval_s=1.0, servo_noise_ns=20.0)
    ev = ClockEvents(8, knobs, seed=10)
    t = np.arange(0, 20e9, 0.25e9)
    off = np.stack([ev.offset_ns(t, np.full(len(t), k)) for k in range(8)])
    freq = np.diff(off, axis=1) / 0.25  # ns per s = ppb
    per_update = freq[:, ::4]
    assert np.all(np.abs(np.diff(freq, axis=1)[:, 1::4]) < 1e-6)  # constant within an update
    steps = np.abs(np.diff(per_update, axis=1))
    assert 5.0 < np.median(steps) < 40.0  # kp x noise: ~15 ppb
    assert np.max(np.abs(off)) < 200.0  # the servo keeps its own offset small
    quiet = ClockEvents(8, dataclasses.replace(knobs, servo_noise_ns=0.0), seed=10)
    assert np.all(quiet.offset_ns(t, np.zeros(len(t), np.int64)) == 0.0)


def test_servo_steering_holds_a_bounded_grid_over_a_day() -> None:
    # a simulated day queries ever later times: the servo's updates behind SERVO_HISTORY_S are
    # dropped, so its grid stays bounded (it grew by 2 x 8 B per NIC per update: issue 32's day)
    knobs = dataclasses.replace(QUIET, servo_interval_s=1.0)
    ev = ClockEvents(4, knobs, seed=11)
    idx = np.arange(4)
    widths = []
    for t_s in range(0, 86_400, 20):
        ev.offset_ns(np.full(4, t_s * 1e9), idx)
        widths.append(ev.servo_held)
    assert max(widths) <= SERVO_HISTORY_S + 2 * SERVO_CHUNK + 1
    # the values do not depend on the order of queries: one jump to the end gives the same
    at = np.array([86_399.5e9, 86_399.5e9 - (SERVO_HISTORY_S - 1) * 1e9, 86_380.25e9, 86_000e9])
    whole = ClockEvents(4, knobs, seed=11)
    assert np.array_equal(whole.offset_ns(at, idx), ev.offset_ns(at, idx))
    with pytest.raises(ValueError, match="no longer held"):
        ev.offset_ns(np.array([1e9]), np.array([0]))


def test_the_ideal_model_and_the_defaults_have_none_of_it() -> None:
    for knobs in (ModelKnobs(), ModelKnobs.ideal_model()):
        assert knobs.hw_bad_stamp_prob == knobs.clock_step_per_h == knobs.servo_interval_s == 0
        assert not ClockEvents(4, knobs, seed=1).active
