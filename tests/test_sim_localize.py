"""The localize benchmark on short simulated runs (real simulator, real brain)."""

from __future__ import annotations

import argparse
import json

import pytest

from contract.documents import EventDoc
from controller.brain import Brain, BrainConfig
from controller.detect.queues import QueueParams
from mesh.fabric import FabricShape, build_fabric
from qpmesh.cli import main
from testbed.scenario import Fault, FaultKind
from testbed.sim.localize_bench import (
    normalize,
    register_localize,
    reroute_targets,
    run_once,
    three_tier_shape,
)
from testbed.sim.model import ModelKnobs

FAB = build_fabric(FabricShape())
# faults from 2 s on: the queue estimate's warm-up (3 s of judged delays) off
NO_WARMUP = BrainConfig(lateness_ns=0, queues=QueueParams(warmup_ns=0))


def test_flap_and_nic_down_found_without_false_alerts() -> None:
    faults = (
        Fault(FaultKind.FLAP, "leaf1-spine2", 2.0, 6.0, down_s=1.0, up_s=2.0),
        Fault(FaultKind.NIC_DOWN, "nic9", 3.0, 4.0),
    )
    r = run_once(FAB, faults, duration_s=9.0, load=0.4, seed=3, step_s=0.1)
    q = r["estimators"]["qpmesh"]  # type: ignore[index]
    assert q["recall"] == 1.0 and q["precision"] == 1.0 and r["false_alerts"] == 0
    lat = [f["latency_s"] for f in r["faults"]]  # type: ignore[attr-defined]
    assert all(x is not None and x <= 0.5 for x in lat)


def test_healthy_short_run_is_quiet() -> None:
    r = run_once(FAB, (), duration_s=20.0, load=0.4, seed=2, step_s=0.2)
    assert r["false_alerts"] == 0


def test_normalize_and_cli_registration() -> None:
    assert normalize(FAB, "spine2->leaf1") == "leaf1-spine2"
    p = argparse.ArgumentParser()
    register_localize(p.add_subparsers())
    a = p.parse_args(["localize", "--json", "--random-faults", "2", "--seed", "4"])
    assert a.random_faults == 2 and a.json and a.seed == 4


def test_real_ingest_pipeline_localizes_loss_and_contention_on_the_ideal_model() -> None:
    faults = (
        Fault(FaultKind.LOSS, "leaf2-spine0", 3.0, 5.0, magnitude=20.0),
        Fault(FaultKind.CONGEST, "leaf0-spine3", 3.5, 5.0, magnitude=20.0),
    )
    r = run_once(
        FAB,
        faults,
        duration_s=10.0,
        load=0.4,
        seed=5,
        step_s=0.1,
        pipeline="ingest",
        model=ModelKnobs.ideal_model(),
    )
    q = r["estimators"]["qpmesh"]  # type: ignore[index]
    assert q["recall"] == 1.0 and q["precision"] == 1.0 and r["false_alerts"] == 0


def test_localize_cli_reports_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    cap = capsys
    args = ["sim", "localize", "--random-faults", "0", "--duration", "1", "--json"]
    assert main([*args, "--pipeline", "truth-clocks"]) == 0
    model = json.loads(cap.readouterr().out)["model"]
    assert model["ideal"] is False and model["background_loss"] > 0
    assert main([*args, "--ideal", "--model-knob", "util_spread=0.1"]) == 0
    model = json.loads(cap.readouterr().out)["model"]
    assert model["ideal"] is True and model["util_spread"] == 0.1
    assert main([*args, "--model-knob", "nope=1"]) == 2
    assert "unknown model knob" in cap.readouterr().err
    assert main([*args, "--kinds", "flap,bogus"]) == 2
    err = cap.readouterr().err
    assert (
        "unknown fault kind 'bogus'" in err and "prober_down" in err and len(err.splitlines()) == 1
    )


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--flap-down-ms", "abc", "not a number: 'abc'"),
        ("--queue-us", "1", "must be > 1"),
        ("--loss-percent", "200", "a percent in (0, 100]"),
        ("--loss-percent", "0", "must be > 0"),
    ],
)
def test_localize_fault_sizes_refuse_bad_values_in_one_line(
    capsys: pytest.CaptureFixture[str], option: str, value: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "localize", option, value, "--json"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and option in err[-1]


def test_an_alert_on_a_real_loss_burst_is_not_a_false_alert() -> None:
    from testbed.sim.localize_score import Alert, CongestionTruth, Scorer

    li = FAB.link("leaf2-spine1").index
    alerts = [
        Alert(5.1, "leaf2-spine1", "loss"),
        Alert(5.1, "leaf0-spine0", "loss"),
        Alert(9.0, "leaf2-spine1", "loss"),
    ]
    truth = CongestionTruth(FAB.n_hops)
    s = Scorer(FAB, (), truth, [(li, 5.0, 5.05)]).evaluate(alerts)
    assert s["burst_alerts"] == 1 and s["false_alerts"] == 2


def test_clock_error_summary_counts_judged_delays_and_their_error() -> None:
    import numpy as np

    from testbed.sim.localize_bench import ClockError

    ce = ClockError()
    true = np.array([1000.0, 1000.0, 1000.0, 1000.0, np.nan])
    ce.add(0.1, np.array([np.nan, np.nan, np.nan, np.nan, np.nan]), true)  # all withheld
    ce.add(0.2, np.array([1010.0, 990.0, 3000.0, np.nan, np.nan]), true)
    d = ce.to_dict()
    assert d["judged_frac"] == 3 / 8 and d["first_judged_s"] == 0.2
    assert d["owd_err_max_ns"] == 2000.0 and d["over_1us"] == 1 and d["over_4us"] == 0
    assert 10.0 <= d["owd_err_p50_ns"] <= 10.0 * 1.06  # type: ignore[operator]


def test_real_ingest_pipeline_on_the_realistic_model_judges_only_certain_delays() -> None:
    faults = (Fault(FaultKind.CONGEST, "leaf1-spine2", 3.0, 3.0, magnitude=20.0),)
    r = run_once(FAB, faults, duration_s=7.0, load=0.4, seed=2, step_s=0.1, pipeline="ingest")
    q = r["estimators"]["qpmesh"]  # type: ignore[index]
    assert q["recall"] == 1.0 and r["false_alerts"] == 0
    clock = r["clock"]
    assert clock["over_1us"] == 0 and clock["judged_frac"] > 0.5  # type: ignore[index]
    assert clock["first_judged_s"] <= 2.0  # type: ignore[index]


def test_three_tiers_a_flapping_spine_to_super_spine_link_is_found(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shape = three_tier_shape(32, 2, 8)
    assert (shape.pods, shape.superspines, shape.n_nics) == (2, 8, 32)
    fab = build_fabric(shape)
    faults = (Fault(FaultKind.FLAP, "spine1-super3", 2.0, 5.0, down_s=1.0, up_s=2.0),)
    r = run_once(fab, faults, duration_s=8.0, load=0.4, seed=3, step_s=0.1, brain_config=NO_WARMUP)
    q = r["estimators"]["qpmesh"]  # type: ignore[index]
    assert q["recall"] == 1.0 and q["precision"] == 1.0 and r["false_alerts"] == 0
    # ECMP re-hashes the down link's flows (after 10 ms at spine1, 300 ms elsewhere): each
    # down loses probes only while routing converges, and shows as a loss; spine1's other
    # uplink in its plane carries both loads and really queues (over the contention
    # threshold both ways): found as congestion, on both directions, not false
    kinds = [(a["target"], a["kind"]) for a in r["alerts"]]  # type: ignore[attr-defined]
    assert kinds[0] == ("spine1-super3", "loss") and kinds.count(kinds[0]) == 2
    assert ("super2->spine1", "contention") in kinds
    assert q["congestion_recall"] == 1.0 and q["congestion_precision"] == 1.0
    # without the load moving, the same alert would be counted false
    assert reroute_targets(fab, faults, False)(3.0) == {}
    assert reroute_targets(fab, faults, True)(3.0) == {"spine1-super2": ("spine1-super3",)}
    # the CLI draws random faults on a three-tier fabric and says which fabric it scored
    args = ["sim", "localize", "--pods", "2", "--nics", "16", "--random-faults", "0"]
    assert main([*args, "--duration", "1", "--pipeline", "truth-clocks", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["unidentifiable"]) == 8  # two pods: each super-spine's two links
    fabric = report["fabric"]
    assert fabric == {"nics": 16, "tiers": 3, "links": 16 + 8 * 4 + 8 * 2}  # NIC, leaf, spine
    assert main([*args, "--superspines", "6", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "multiple of spines" in err[0]
    assert main(["sim", "localize", "x.toml", "--pods", "2", "--json"]) == 2
    assert "a scenario has its own [fabric]" in capsys.readouterr().err


def test_an_event_on_a_link_no_path_tells_apart_names_its_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fab = build_fabric(three_tier_shape(32, 2, 8))
    details: list[str] = []
    tick = Brain.tick

    def spy(self: Brain, now_ns: int) -> list[EventDoc]:
        events = tick(self, now_ns)
        details.extend(f"{e.kind} {e.target}: {e.detail}" for e in events if e.kind != "clear")
        return events

    monkeypatch.setattr(Brain, "tick", spy)
    faults = (Fault(FaultKind.FLAP, "spine1-super3", 2.0, 5.0, down_s=1.0, up_s=2.0),)
    run_once(fab, faults, duration_s=8.0, load=0.4, seed=3, step_s=0.1, brain_config=NO_WARMUP)
    down = [d for d in details if d.startswith("loss spine1-super3")]
    assert down and "or spine5-super3: every known path" in down[0], details
    moved = [d for d in details if d.startswith("contention")]
    assert moved and "re-hashed here from spine1-super3, which went down" in moved[0], details


def test_the_report_gives_false_alerts_summed_over_seeds_beside_their_median(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # two pods: seed 5 blames two faults on their aliases (2 false alerts), seed 6 none
    args = ["sim", "localize", "--pods", "2", "--nics", "64", "--random-faults", "3"]
    assert main([*args, "--seed", "5", "--seeds", "2", "--duration", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    q = report["estimators"]["qpmesh"]
    per_seed = [r["estimators"]["qpmesh"]["false_alerts"] for r in report["runs"]]
    assert q["false_alerts_total"] == sum(per_seed) == report["false_alerts"] >= 1
    assert q["false_alerts"] == sum(per_seed) / 2  # the median of two seeds
    precision = [r["estimators"]["qpmesh"]["precision"] for r in report["runs"]]
    assert q["precision_mean"] == round(sum(precision) / 2, 4) < 1
