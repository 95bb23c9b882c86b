"""``qpmesh sim run``: a scenario file replayed on the simulator finds its faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpmesh.cli import main
from testbed.sim.model import ModelKnobs
from testbed.sim.run_cmd import run_scenario

DEMO = Path(__file__).parents[1] / "testbed" / "scenarios" / "demo.toml"


def test_demo_scenario_faults_are_found_without_false_alerts_on_the_ideal_model() -> None:
    rep = run_scenario(str(DEMO), model=ModelKnobs.ideal_model())
    assert rep["model"]["ideal"] is True
    assert [f["found"] for f in rep["fault_results"]] == [True, True, True]
    assert all(f["latency_s"] <= 2.0 for f in rep["fault_results"])
    assert rep["false_alerts"] == 0


def test_cli_json_and_bad_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'duration_s = 5\n[[faults]]\nkind = "flap"\ntarget = "leaf9-spine9"\nstart_s = 1\nduration_s = 2\n'
    )
    assert main(["sim", "run", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown link 'leaf9-spine9'" in err[0]
    good = tmp_path / "good.toml"
    good.write_text(
        'duration_s = 6\n[fabric]\nleaves = 2\nspines = 2\n[[faults]]\nkind = "nic_down"\ntarget = "nic1"\nstart_s = 2\nduration_s = 3\n'
    )
    assert main(["sim", "run", str(good), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["nics"] == 8 and rep["fault_results"][0]["found"]
