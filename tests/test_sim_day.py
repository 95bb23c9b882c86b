"""``qpmesh sim day`` on a short day (16 NICs, minutes-long "hours"; real simulator, real
controller): the report's shape, prober restarts seen as ``prober_down`` only, every fault
scored, and bad input refused in one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise

import pytest

from mesh.fabric import FabricShape, build_fabric
from qpmesh.cli import main
from testbed.scenario import FaultKind
from testbed.sim.day import RESTART_S, DayError, DayPlan, day_faults, prober_restarts, run_day

FAB16 = build_fabric(FabricShape.for_nics(16, nics_per_leaf=4, spines=4))


def _counter(values: list[float]) -> Iterator[float]:
    yield from values


@pytest.fixture(scope="module")
def short_day() -> dict[str, object]:
    """Two 50 s "hours" at 16 NICs: one random fault, one prober restart (~7 CPU-s)."""
    rss = _counter([100 * 2**20, 104 * 2**20])
    cpu = _counter([0.0, 1.0, 2.0])
    return run_day(
        FAB16,
        DayPlan(hours=2, hour_s=50, faults=1, restarts=1, seed=3),
        rss=lambda: int(next(rss)),
        cpu=lambda: next(cpu),
    )


def test_short_day_reports_each_hour_and_overall(short_day: dict[str, object]) -> None:
    hours = short_day["hours"]
    assert isinstance(hours, list) and [h["hour"] for h in hours] == [1, 2]
    assert [h["sim_s"] for h in hours] == [50.0, 100.0]
    assert [h["rss_mib"] for h in hours] == [100.0, 104.0]
    assert [h["cpu_s"] for h in hours] == [1.0, 2.0]
    for h in hours:
        assert set(h) >= {"faults", "found", "restarts", "restarts_found", "false_alerts"}
    assert short_day["rss_growth_after_hour1_pct"] == 4.0
    assert short_day["cpu_s_per_sim_s"] == 0.02
    assert sum(h["faults"] for h in hours) == short_day["n_faults"] == 1
    assert sum(h["restarts"] for h in hours) == short_day["n_restarts"] == 1
    assert sum(h["false_alerts"] for h in hours) == short_day["false_alerts"]
    met = short_day["met"]
    assert isinstance(met, dict) and met["memory"] is True
    json.dumps(short_day)  # the report is JSON as it is


def test_every_fault_and_restart_is_scored(short_day: dict[str, object]) -> None:
    faults = short_day["faults"]
    assert isinstance(faults, list) and len(faults) == 2
    assert all(isinstance(f["found"], bool) for f in faults)
    assert short_day["found"] == 1 and short_day["recall"] == 1.0
    assert short_day["false_alerts"] == 0


def test_a_prober_restart_is_prober_down_never_a_link(short_day: dict[str, object]) -> None:
    faults = short_day["faults"]
    assert isinstance(faults, list)
    (restart,) = [f for f in faults if f["kind"] == "prober_down"]
    assert RESTART_S[0] <= restart["end_s"] - restart["start_s"] <= RESTART_S[1]
    assert restart["found"] is True and short_day["restarts_found"] == 1
    assert short_day["restart_link_findings"] == 0
    assert short_day["met"]["restarts_prober_down_only"] is True  # type: ignore[index]


def test_a_day_spreads_its_faults_and_keeps_restarts_clear_of_them() -> None:
    fab = build_fabric(FabricShape.for_nics(1024, nics_per_leaf=32, spines=4))
    plan = DayPlan(seed=7)
    faults = day_faults(fab, plan)
    restarts = prober_restarts(fab, plan, faults)
    assert len(faults) == 30 and len(restarts) == 24
    slot = (plan.total_s - 5.0) / 30
    for i, f in enumerate(faults):
        assert 5.0 + i * slot <= f.start_s and f.end_s <= 5.0 + (i + 1) * slot
        assert f.kind in (FaultKind.FLAP, FaultKind.CONGEST, FaultKind.LOSS, FaultKind.NIC_DOWN)
    spans = sorted((f.start_s, f.end_s) for f in (*faults, *restarts))
    assert all(b < c for (_, b), (c, _) in pairwise(spans))
    assert all(r.kind == FaultKind.PROBER_DOWN for r in restarts)
    assert day_faults(fab, plan) == faults  # from the seed
    assert day_faults(fab, DayPlan(seed=8)) != faults


def test_a_day_too_short_for_its_events_is_refused() -> None:
    with pytest.raises(DayError, match="slot of 20 s"):
        day_faults(FAB16, DayPlan(hours=1, hour_s=100, faults=10))
    with pytest.raises(DayError, match="no room"):
        prober_restarts(FAB16, DayPlan(hours=1, hour_s=100, faults=0, restarts=5))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--hours", "0"], "--hours: must be > 0"),
        (["--hour-s", "x"], "--hour-s: not a number"),
        (["--faults", "-1"], "--faults: must be >= 0"),
        (["--hours", "1", "--hour-s", "10"], "too short"),
        (["--nics", "1"], "--nics must be >= 2"),
        (["--hours", "1", "--hour-s", "60", "--faults", "5"], "slot of 20 s"),
    ],
)
def test_sim_day_refuses_bad_input_in_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    try:
        code = main(["sim", "day", *args, "--json"])
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert says in err[-1] and captured.out == ""


@pytest.mark.slow
def test_the_same_day_through_the_wire_finds_the_same() -> None:
    """The live controller fed as the service is (per-host encoded batches, coalesced):
    the fault and the restart found, nothing false (~15 CPU-s)."""
    rss = _counter([100 * 2**20, 100 * 2**20])
    out = run_day(
        FAB16,
        DayPlan(hours=2, hour_s=50, faults=1, restarts=1, seed=3, pipeline="wire"),
        rss=lambda: int(next(rss)),
        cpu=lambda: 0.0,
    )
    assert out["found"] == 1 and out["restarts_found"] == 1
    assert out["restart_link_findings"] == 0 and out["false_alerts"] == 0
    assert out["rss_growth_after_hour1_pct"] == 0.0
