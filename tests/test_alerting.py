"""The alerting rules of docs/alerting/, for real: Debian's ``promtool check rules`` and
``promtool test rules``, then a flap in a simulated run written to a real victoria-metrics,
evaluated by a real ``vmalert`` into a real ``prometheus-alertmanager``, whose webhook reaches
the qpmesh API's Alertmanager intake (issue 33 item 5)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from controller.api.app import PREFIX, make_app
from controller.api.auth import Principal, TokenTable
from controller.api.hub import ApiHub
from controller.api.server import ApiThread
from controller.remediation.runtime import RemediationRuntime
from controller.timeseries.recorder import TimeseriesRecorder
from controller.timeseries.writer import TsdbWriter
from testbed.sim.demo_runner import DemoRunner, demo_scenario
from testbed.sim.engine import EPOCH_NS
from tests.alertservers import ALERTMANAGER, PROMTOOL, VMALERT, Alertmanager, VmAlert
from tests.test_timeseries_vm import VM, VictoriaMetrics, vm  # noqa: F401  (the fixture)

RULES_DIR = Path(__file__).parents[1] / "docs" / "alerting"
RULES = RULES_DIR / "qpmesh-rules.yml"
TOKEN = "alerting-operator-token"
FLAP = "leaf1-spine2"  # the demo scenario's flapping link (4 s to 13 s)

needs = pytest.mark.skipif(
    not all(Path(p).exists() for p in (PROMTOOL, VMALERT, ALERTMANAGER, VM)),
    reason="promtool, vmalert, prometheus-alertmanager and victoria-metrics (.ci/setup)",
)


@needs
def test_promtool_checks_the_rules() -> None:
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 14 rules found" in out.stdout


@needs
def test_promtool_unit_tests_pass() -> None:
    out = subprocess.run([PROMTOOL, "test", "rules", "qpmesh-rules.test.yml"], cwd=RULES_DIR,
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@needs
def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests are not blind: a flap rule that waits 5 minutes fails them."""
    flap = "expr: max_over_time((qpmesh_link_worst_state == 4)[1m:10s]) == 4"
    assert flap in RULES.read_text()
    broken = RULES.read_text().replace(flap, flap + "\n        for: 5m")
    (tmp_path / "qpmesh-rules.yml").write_text(broken)
    (tmp_path / "t.yml").write_text((RULES_DIR / "qpmesh-rules.test.yml").read_text())
    out = subprocess.run([PROMTOOL, "test", "rules", "t.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode != 0 and "QpmeshLinkFlapping" in out.stdout + out.stderr


def _write_a_flap_ending_now(vm: VictoriaMetrics, seconds: float) -> DemoRunner:  # noqa: F811
    """Play the demo scenario (its flap from 4 s on) for ``seconds``, its time series stamped
    so that the run ends now (1 s intervals), into ``vm``."""
    runner = DemoRunner(demo_scenario(None, nics=None, seed=7), step_s=0.5)
    shift = time.time_ns() - (EPOCH_NS + round(seconds * 1e9))
    w = TsdbWriter(vm.url)
    try:
        runner.record_to(TimeseriesRecorder(runner.fabric, w.offer, interval_ns=1_000_000_000,
                                            shift_ns=shift))  # fmt: skip
        while runner.t_s < seconds - 1e-9:
            runner.step()
        assert w.flush(60.0), w.stats()
    finally:
        w.close(5.0)
    vm.flush()
    return runner


@needs
@pytest.mark.slow
def test_vmalert_fires_a_flap_into_a_real_alertmanager_and_on_to_qpmesh(
    vm: VictoriaMetrics,  # noqa: F811  (the fixture)
    tmp_path: Path,
) -> None:
    runner = _write_a_flap_ending_now(vm, 20.0)
    assert any(e.kind == "link_flap" and e.target == FLAP for e in runner.events)
    # the qpmesh API's intake is the Alertmanager's webhook receiver
    rt = RemediationRuntime()
    asked: list[Any] = []

    def ask(payload: Any, now_ns: int) -> Any:
        asked.append(payload)
        return rt.ask(payload, now_ns)

    app = make_app(ApiHub(runner.controller.snapshot()),
                   TokenTable({TOKEN: Principal("operator", "alertmanager")}),
                   control=rt.control, actions=rt.log, ask=ask)  # fmt: skip
    api = ApiThread(app, "127.0.0.1", 0)
    port = api.start()
    am = Alertmanager(tmp_path / "am", webhook=(f"http://127.0.0.1:{port}{PREFIX}/alertmanager",
                                                 TOKEN))  # fmt: skip
    try:
        with am, VmAlert(tmp_path / "vmalert", RULES, vm.url, am.url) as vmalert:
            flapping: list[dict[str, Any]] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not (flapping and asked):
                flapping = [a for a in am.alerts(active="true")
                            if a["labels"]["alertname"] == "QpmeshLinkFlapping"]  # fmt: skip
                time.sleep(0.5)
            fired = {a["name"] for a in vmalert.alerts()}
            links = {a["labels"].get("link") for a in am.alerts(active="true")
                     if a["labels"]["alertname"] == "QpmeshLinkFlapping"}  # fmt: skip
    finally:
        api.stop()
    assert flapping, f"no QpmeshLinkFlapping at the Alertmanager; vmalert had {fired}"
    (alert,) = flapping
    assert alert["labels"]["link"] == FLAP and alert["labels"]["severity"] == "critical"
    assert alert["labels"]["source"] == "qpmesh-rules"
    assert alert["annotations"]["summary"] == f"link {FLAP} is flapping"
    assert links == {FLAP}  # only the flapping link: the others were up the whole run
    hooked = [a for p in asked for a in p["alerts"]
              if a["labels"]["alertname"] == "QpmeshLinkFlapping"]  # fmt: skip
    assert hooked and hooked[0]["labels"]["link"] == FLAP and hooked[0]["status"] == "firing"
