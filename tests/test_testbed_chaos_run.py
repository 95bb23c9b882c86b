"""`qpmesh testbed chaos` end to end on the namespace fabric (root only, ~2.5 min): a prober
SIGKILLed and restarted, the controller's API process killed (its controller starts another),
a prober starved by a cgroup, while netns_small's faults repeat, on a broker that keeps its
sessions on disk; everything torn down and no CPU group left behind."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from testbed.cgroup import CgroupError, machine_layout
from tests.testbedcli import NETNS_MARKS
from tests.testbedcli import qpmesh as _qpmesh

pytestmark = NETNS_MARKS


def _groups(tag: str) -> list[str]:
    try:
        return [p.name for p in machine_layout().parent.glob(f"qpmesh-{tag}-*")]
    except CgroupError:
        return []


@pytest.mark.timeout(420)
def test_chaos_kills_restarts_and_starves_and_reports(tmp_path: Path) -> None:
    prefix = "k" + secrets.token_hex(2) + "-"
    try:
        out = _qpmesh("testbed", "chaos", "testbed/scenarios/netns_small.toml", "--seed", "2",
                      "--faults", "kill:prober,kill:api,starve:prober", "--duration", "80",
                      "--json", "--prefix", prefix, "--out", str(tmp_path), timeout=400)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        rep = json.loads(out.stdout)
        rows = {r["fault"].split(":")[0] + ":" + r["component"]: r for r in rep["component_faults"]}
        assert set(rows) == {"kill:prober", "kill:api", "starve:prober"}, rows
        assert all(r["recovered"] for r in rows.values()), rows
        assert rows["starve:prober"]["throttled_periods"] > 0  # the limit bit
        # the killed prober's host is prober_down, never one of its links
        host = rows["kill:prober"]["target"]
        nic = "nic" + host.removeprefix("host")  # netns_small: host k has nic k
        assert [e["target"] for e in rep["expected_findings"]] in ([host], [])
        assert not [e for e in rep["events"] if str(e.get("target", "")).startswith(f"{nic}-")]
        for key in ("lost_records", "spool_bound", "duplicate_actions", "lost_actions",
                    "self_inflicted_findings", "component_faults", "tsdb", "timeline"):  # fmt: skip
            assert key in rep, key
        assert rep["spool_bound"]["batches"] > 0
        est = rep["estimators"]["qpmesh"]
        assert est["recall"] >= 0.95, (est, rep["timeline"])
        assert rep["chaos_errors"] == [], rep["chaos_errors"]
        assert (tmp_path / "agent-rank0.jsonl").exists() and (tmp_path / "report.json").exists()
        # the broker kept its sessions on disk; the controller held a persistent session
        assert (tmp_path / "mosquitto-store" / "mosquitto.db").stat().st_size > 0
        assert f'session = "{prefix}controller"' in (tmp_path / "controller.toml").read_text()
        assert "Permission denied" not in (tmp_path / "mosquitto.log").read_text()
    finally:
        _qpmesh("testbed", "down", "--prefix", prefix, timeout=60)
        st = _qpmesh("testbed", "status", "--prefix", prefix, "--json", timeout=30)
        doc = json.loads(st.stdout)
        assert not doc["namespaces"] and not doc["root_links"]
    assert _groups(prefix.rstrip("-")) == []  # the run removed its CPU groups itself
