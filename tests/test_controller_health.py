"""The health state table, driven directly."""

from __future__ import annotations

import pytest

from controller.health import TABLE, EntityState, Finding, HealthParams, Signal, step
from mesh.snapshot import Health

P = HealthParams(raise_windows=2, clear_windows=3, flap_threshold=2, flap_hold_ns=1000)
MS = 1


def run(st: EntityState, signals: list[Signal], t0: int = 0) -> tuple[EntityState, list[Finding]]:
    out = []
    for i, s in enumerate(signals):
        st, f = step(st, s, t0 + i * 100 * MS, P)
        if f is not None:
            out.append(f)
    return st, out


def test_table_covers_every_state_and_signal() -> None:
    for h in Health:
        if h == Health.UNKNOWN:
            continue
        for s in Signal:
            assert (h, s) in TABLE


def test_dead_goes_down_at_once_and_revives_with_clear() -> None:
    st, f = step(EntityState(), Signal.DEAD, 5, P)
    assert st.state == Health.DOWN and f == Finding.DOWN and st.first_down_ns == 5
    st, f = step(st, Signal.LOSSY, 6, P)  # partial window: still down
    assert st.state == Health.DOWN and f is None
    st, f = step(st, Signal.CLEAN, 7, P)
    assert st.state == Health.UP and f == Finding.CLEAR


def test_second_down_in_window_is_a_flap_and_counts() -> None:
    st, fs = run(EntityState(), [Signal.DEAD, Signal.CLEAN, Signal.DEAD, Signal.CLEAN, Signal.DEAD])
    assert fs == [Finding.DOWN, Finding.CLEAR, Finding.FLAP]  # the third down: same flap
    assert st.state == Health.FLAPPING
    assert st.flap_count(400, P.flap_window_ns) == 3


def test_flapping_clears_after_hold() -> None:
    st, _ = run(EntityState(), [Signal.DEAD, Signal.CLEAN, Signal.DEAD])
    st, f = step(st, Signal.CLEAN, 200 + 500, P)
    assert st.state == Health.FLAPPING and f is None
    st, f = step(st, Signal.CLEAN, 200 + 1000, P)
    assert st.state == Health.UP and f == Finding.CLEAR
    st, f = step(st, Signal.DEAD, 200 + 1100, P)  # cleared: the next flap is raised again
    assert st.state == Health.FLAPPING and f == Finding.FLAP


def test_loss_needs_consecutive_windows_and_clear_needs_three() -> None:
    st, fs = run(EntityState(), [Signal.LOSSY, Signal.CLEAN, Signal.LOSSY])
    assert st.state == Health.UP and fs == []
    st, fs = run(st, [Signal.LOSSY])
    assert st.state == Health.DEGRADED and fs == [Finding.LOSS]
    st, fs = run(st, [Signal.CLEAN, Signal.CLEAN, Signal.NODATA, Signal.CLEAN])
    assert st.state == Health.UP and fs == [Finding.CLEAR]


def test_slow_windows_raise_contention() -> None:
    st, fs = run(EntityState(), [Signal.SLOW, Signal.SLOW])
    assert st.state == Health.CONTENDED and fs == [Finding.CONTENTION]
    st, fs = run(st, [Signal.DEAD])
    assert st.state == Health.DOWN and fs == [Finding.DOWN]


def test_bad_params_rejected() -> None:
    with pytest.raises(ValueError):
        HealthParams(raise_windows=0)


def test_consecutive_dead_windows_are_one_down() -> None:
    st, fs = run(EntityState(), [Signal.DEAD, Signal.CLEAN, Signal.DEAD, Signal.DEAD, Signal.DEAD])
    assert fs == [Finding.DOWN, Finding.CLEAR, Finding.FLAP]
    assert st.flap_count(500, P.flap_window_ns) == 2
    assert st.first_down_ns == 0  # the first down of the episode, not the latest
    st, fs = run(st, [Signal.LOSSY, Signal.CLEAN, Signal.DEAD], t0=500)
    assert fs == [] and st.flap_count(800, P.flap_window_ns) == 3  # counted, not raised again
    assert st.state == Health.FLAPPING
