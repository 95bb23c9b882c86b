"""`qpmesh testbed run` end to end on the namespace fabric (root only, ~55 s)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbedcli import qpmesh as _qpmesh

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
        reason="needs root and network namespaces",
    ),
]


@pytest.mark.timeout(150)
def test_run_localizes_flap_and_reports_sync(tmp_path: Path) -> None:
    prefix = "t" + secrets.token_hex(2) + "-"
    try:
        out = _qpmesh("testbed", "run", "testbed/scenarios/netns_small.toml", "--json",
                      "--prefix", prefix, "--out", str(tmp_path), timeout=140)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        rep = json.loads(out.stdout)
        loc = {x["fault"]: x for x in rep["localization"]}
        assert loc["flap"]["localized"], loc
        assert rep["sync"]["idle"]["p99_ns"] <= 1000
        assert rep["sync"]["congested"]["p99_ns"] <= 2000
        assert rep["paths"]["complete"] > 0
        assert (tmp_path / "controller.jsonl").exists() and (tmp_path / "report.json").exists()
        assert not loc["flap"]["other_events"], loc["flap"]  # no spurious loss elsewhere
        paths = rep["paths"]
        assert paths["complete"] >= 0.9 * paths["traced_flows"], paths  # no silent hops
        # contention localized to the congested link (discovered paths, not the model's hash);
        # three leaves make its hops identifiable from end-to-end delays
        assert loc["congest"]["localized"], loc["congest"]
        # nothing beside it either (kernel stamps: their jitter is no contention)
        assert not loc["congest"]["other_events"], loc["congest"]
        # the run's capture replays offline through a fresh controller to the same findings
        rp = _qpmesh("testbed", "replay", str(tmp_path), "--json", timeout=120)
        assert rp.returncode == 0, rp.stderr[-2000:]
        doc = json.loads(rp.stdout)
        assert doc["messages"]["probes"] == rep["probe_batches"], doc["messages"]
        found = {(e["kind"], e["target"]) for e in doc["events"]}
        assert {t for _, t in found} >= {"leaf0-spine1"}, found
        assert found & {("contention", "leaf1->spine0"), ("contention", "spine0->leaf1")}, found
        d = doc["delays"]  # most delays judged: the clocks were trusted most of the run
        assert d["fine"] + d["coarse"] > 0.7 * (d["fine"] + d["coarse"] + d["withheld"]), d
        # the live clock against the virtual clocks (the run's own check, and the offline
        # replay's over the spans the report keeps): no clock trusted beyond twice its tier's
        # bound (a fine one within half the 4 us floor findings are judged on, a coarse one
        # within it), and beyond the bound itself on a small share of the trusted NIC-ticks
        # only: kernel stamps on a busy host run one way late for seconds, which no two-way
        # sync can see (docs/benchmarks.md, "The live clock on kernel stamps trusted beyond
        # its tier": 1 NIC-tick in 29 replayed runs; 3 in one of 3 test runs, 1.4 %)
        for spans in (rep["live_clock"]["spans"], doc["clock_check"]):
            assert {"idle", "congested"} <= set(spans), spans
            assert all(s["worst_over_bound"] <= 2.0 for s in spans.values()), spans
            trusted = sum(s["fine"] + s["coarse"] for s in spans.values())
            assert sum(s["overconfident"] for s in spans.values()) <= 0.05 * trusted, spans
            assert spans["idle"]["fine"] > 0, spans  # the check saw trusted clocks at all
    finally:
        _qpmesh("testbed", "down", "--prefix", prefix, timeout=60)
        st = _qpmesh("testbed", "status", "--prefix", prefix, "--json", timeout=30)
        doc = json.loads(st.stdout)
        assert not doc["namespaces"] and not doc["root_links"]


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("lldpd") is None and not Path("/usr/sbin/lldpd").exists(),
                    reason="needs lldpd (.ci/setup installs it)")  # fmt: skip
def test_run_discover_learns_the_plan_and_localizes(tmp_path: Path) -> None:
    """Probers with no NIC or peer listed and a controller with no fabric: the learned fabric
    equals the plan before the faults start, stays so through them (a fault is not a
    recabling), and the random faults are localized as on the declared fabric."""
    prefix = "d" + secrets.token_hex(2) + "-"
    try:
        out = _qpmesh("testbed", "run", "testbed/scenarios/netns_small.toml", "--discover",
                      "--random-faults", "2", "--seed", "2", "--json", "--prefix", prefix,
                      "--out", str(tmp_path), timeout=280)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        rep = json.loads(out.stdout)
        topo = rep["topology"]
        assert topo["matches_plan"] and topo["differences"] == [], topo
        assert topo["changes_during_run"] == 0 and (topo["nics"], topo["links"]) == (6, 12)
        est = rep["estimators"]["qpmesh"]
        matched = {ev for x in rep["localization"] for ev in x["events"]}
        unexplained = [f"{e['kind']}:{e['target']}" for e in rep["events"]
                       if e["kind"] not in ("clear", "topology")
                       and f"{e['kind']}:{e['target']}" not in matched]  # fmt: skip
        # no false alert, contention on kernel stamps included
        assert not unexplained and est["precision"] >= 0.95, (est, rep["localization"], unexplained)
        assert est["recall"] >= 0.95, (est, rep["localization"])
        assert all(x["localized"] for x in rep["localization"]), rep["localization"]
        # nothing of the fabric was written for them
        cfg = (tmp_path / "prober-host0.toml").read_text()
        assert "[[nics]]" not in cfg and "[[peers]]" not in cfg and "[discover]" in cfg
        ctl = (tmp_path / "controller.toml").read_text()
        assert "leaves" not in ctl and "plan = " in ctl
        # the learned fabric's events name the plan's links (spines named by router id)
        assert any(e["kind"] == "topology" for e in rep["events"])
    finally:
        _qpmesh("testbed", "down", "--prefix", prefix, timeout=60)
        st = _qpmesh("testbed", "status", "--prefix", prefix, "--json", timeout=30)
        doc = json.loads(st.stdout)
        assert not doc["namespaces"] and not doc["root_links"]


@pytest.mark.timeout(150)
def test_a_run_stopped_by_sigterm_tears_down_and_still_reports(tmp_path: Path) -> None:
    """SIGTERM mid-run (twice: an impatient supervisor): the testbed is torn down and the
    JSON of what ran is printed with "interrupted": true, exit 130 (contract.interrupt)."""
    import signal
    import time

    prefix = "t" + secrets.token_hex(2) + "-"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qpmesh.cli", "testbed", "run", "testbed/scenarios/netns_small.toml",
         "--json", "--prefix", prefix, "--out", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # "... probers and the controller up after ...: running ..."
            if "running" in line:
                break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # counted, the teardown goes on
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-2000:]
        rep = json.loads(out)
        assert rep["interrupted"] is True and rep["prefix"] == prefix
        assert (tmp_path / "report.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        st = _qpmesh("testbed", "status", "--prefix", prefix, "--json", timeout=30)
        doc = json.loads(st.stdout)
        clean = not doc["namespaces"] and not doc["root_links"]
        _qpmesh("testbed", "down", "--prefix", prefix, timeout=60)
    assert clean, doc  # torn down by the run itself, not by this test's cleanup
