"""The embedded demo: scripted scenario detected and localized headless; CLI JSON; keys inject
faults into the running simulator."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from dataclasses import replace
from typing import Any

import pytest

from contract.documents import EventDoc
from qpmesh.cli import main
from testbed.scenario import FaultKind
from testbed.sim.demo_runner import DemoError, DemoRunner, demo_scenario, run_headless
from tui.demo_app import DemoApp
from tui.grid import MeshGrid


@pytest.fixture(scope="module")
def headless() -> dict[str, Any]:
    runner = DemoRunner(demo_scenario(None, nics=None, seed=None))
    return run_headless(runner, 30.0)


def test_scripted_faults_are_detected_and_localized(headless: dict[str, Any]) -> None:
    ev = headless["events"]
    assert headless["nics"] == 32 and headless["duration_s"] == 30.0

    def first(kind: str, target: str) -> float:
        return min(e["t_s"] for e in ev if e["kind"] == kind and e["target"] == target)

    # flap on leaf1-spine2 from 4 s, congestion on leaf2-spine1 from 12 s, nic27 down from 20 s
    assert 4.0 <= first("link_flap", "leaf1-spine2") <= 13.0
    assert (
        12.0
        <= min(
            e["t_s"]
            for e in ev
            if e["kind"] == "contention" and "leaf2" in e["target"] and "spine1" in e["target"]
        )
        <= 16.0
    )
    assert 20.0 <= first("nic_down", "nic27") <= 22.0
    assert headless["flap_counts"]["leaf1-spine2"] >= 2
    # nothing blamed on healthy links
    blamed = {e["target"] for e in ev if e["kind"] in ("link_flap", "link_down")}
    assert blamed <= {"leaf1-spine2"}


def test_demo_runs_the_remediation_policy_for_its_job(headless: dict[str, Any]) -> None:
    # Control starts off: the policy's actions for the demo job are "would have", each once
    acts = [e for e in headless["events"] if e["kind"] == "remediation"]
    moves = [e for e in acts if "move_off_nic" in e["detail"]]
    assert len(moves) == 1 and moves[0]["target"] == "nic27"
    assert moves[0]["detail"].startswith("would have: move_off_nic job demo-train")
    assert any("report_contention" in e["detail"] for e in acts)
    assert all(e["detail"].startswith("would have") for e in acts)


def test_demo_header_has_control_and_the_running_job() -> None:
    runner = DemoRunner(demo_scenario(None, nics=None, seed=None))
    snap = runner.controller.snapshot()
    assert snap.control_enabled is False
    assert snap.jobs is not None and [j["name"] for j in snap.jobs] == ["demo-train"]
    nics = snap.jobs[0]["nics"]
    assert isinstance(nics, list) and "nic27" in nics and len(nics) == 16
    runner.controller.set_control(True)  # the TUI's `c`
    assert runner.controller.snapshot().control_enabled is True
    assert runner.remediation.control.audit()[-1].actor == "demo operator"
    runner.inject("nic_down")
    sent = [e for _ in range(8) for e in runner.step() if e.kind == "remediation"]
    assert sent and sent[0].detail.startswith("sent: move_off_nic job demo-train")


def test_cli_headless_json_small_run() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["demo", "--headless", "--duration", "8", "--json"])
    assert rc == 0
    doc = json.loads(out.getvalue())
    assert set(doc) >= {"events", "faults", "nics", "duration_s"}
    assert doc["duration_s"] == 8.0
    for e in doc["events"]:  # the one event encoding, plus the demo's own seconds
        assert EventDoc.from_json({k: v for k, v in e.items() if k != "t_s"}).kind == e["kind"]
        assert isinstance(e["t_s"], float)
    assert any(e["kind"] in ("link_down", "link_flap") for e in doc["events"])


def test_rescaled_scenario_and_bad_options() -> None:
    sc = demo_scenario(None, nics=16, seed=3)
    assert len(sc.fabric().nics) == 16 and sc.seed == 3
    assert all(f.target != "nic27" for f in sc.faults)  # dropped: no such NIC any more
    with pytest.raises(DemoError):
        demo_scenario(None, nics=1, seed=None)
    with pytest.raises(DemoError):
        DemoRunner(sc, step_s=0)
    assert main(["demo", "--headless", "--nics", "1"]) == 2


def test_injected_faults_reach_simulator_and_clear() -> None:
    runner = DemoRunner(replace(demo_scenario(None, nics=None, seed=None), faults=()))
    for _ in range(4):
        runner.step()
    kinds = [runner.inject(k).kind for k in ("flap", "contention", "nic_down")]
    assert kinds == [FaultKind.FLAP, FaultKind.CONGEST, FaultKind.NIC_DOWN]
    assert all(f.start_s == 2.0 for f in runner.sim.faults)
    for _ in range(8):
        runner.step()
    assert any(e.kind in ("link_down", "link_flap") for e in runner.events)
    assert any(e.kind == "nic_down" for e in runner.events)
    runner.clear()
    assert all(f.end_s <= runner.t_s + 1e-9 for f in runner.sim.faults)


async def test_demo_app_keys_inject_and_screen_updates() -> None:
    runner = DemoRunner(replace(demo_scenario(None, nics=None, seed=None), faults=()), step_s=0.5)
    app = DemoApp(runner)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("n")
        assert [f.kind for f in runner.sim.faults] == [FaultKind.NIC_DOWN]
        for _ in range(3):  # step the demo directly: simulated time, no wall-clock waits
            app.demo.advance()
        app.poll()
        await pilot.pause()
        assert app.snap.t_ns > 0
        target = runner.sim.faults[0].target
        assert any(e.kind == "nic_down" and e.target == target for e in app.snap.events)
        assert "nic_down" in str(app.query_one("#events").render())
        await pilot.press("x")
        assert all(f.end_s <= runner.t_s + 1e-9 for f in runner.sim.faults)
        assert app.query_one(MeshGrid).layout_.pos
