"""The pure parts of ``qpmesh testbed run --discover``: prober configs with nothing of the
fabric in them, a controller config with no fabric (the plan to check against, spines named by
router id) that both load, and the report's ``topology`` from the controller's log."""

from __future__ import annotations

import json
from pathlib import Path

from controller.config import EMPTY_FABRIC
from controller.config import load_config as load_controller
from mesh.fabric import FabricShape, build_fabric
from prober.config import DiscoverConfig, parse_config
from prober.config import load_config as load_prober
from testbed.netns.plan import make_plan
from testbed.runner import (
    discover_prober_config,
    learned_controller_config,
    router_nodes,
    topology_report,
)

FABRIC = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, spines=2))


def test_a_discovering_prober_is_told_its_host_and_the_broker_only(tmp_path: Path) -> None:
    text = discover_prober_config("host3", ("198.19.0.1", 1883), "/run/l/host3.sock", 2)
    assert "[[nics]]" not in text and "[[peers]]" not in text and "10.0." not in text
    p = tmp_path / "p.toml"
    p.write_text(text)
    cfg = load_prober(p)
    assert cfg.host == "host3" and cfg.nics == () and cfg.peers == ()
    assert cfg.discover == DiscoverConfig(("nic*",), (), "{ifname}", "/run/l/host3.sock", 5.0)
    assert (cfg.mqtt.host, cfg.mqtt.port) == ("198.19.0.1", 1883)
    assert parse_config({"prober": {"host": "h"}}, "x").discover == DiscoverConfig()


def test_the_controller_learns_and_checks_against_the_plan(tmp_path: Path) -> None:
    plan = make_plan(FABRIC, "qpm-", router_ids=True)
    (tmp_path / "plan.json").write_text(json.dumps(FABRIC.to_dict()))
    (tmp_path / "c.toml").write_text(learned_controller_config(plan, "plan.json"))
    cfg = load_controller(tmp_path / "c.toml")
    assert cfg.fabric is EMPTY_FABRIC and cfg.learn is not None and cfg.learn.plan is not None
    assert cfg.learn.plan.to_dict() == FABRIC.to_dict()
    assert dict(cfg.learn.names) == {plan.router_ids["spine0"]: "spine0",
                                     plan.router_ids["spine1"]: "spine1"}  # fmt: skip
    assert cfg.learn.relearn_ns == 1_000_000_000 and cfg.model_paths is False
    # router ids name their switches for the run's own scoring (the voting baseline)
    assert {router_nodes(plan)[rid] for rid in plan.router_ids.values()} == {
        s.id for s in FABRIC.switches
    }


def test_topology_report_reads_the_last_change() -> None:
    log = [
        {"msg": "connected", "t_ns": 1},
        {"msg": "topology", "t_ns": 5, "matches_plan": False, "nics": 5, "links": 11,
         "plan_differences": ["nic5 (10.0.2.2, host5) was not seen"], "problems": []},
        {"msg": "topology", "t_ns": 9, "matches_plan": True, "nics": 6, "links": 12,
         "plan_differences": [], "problems": []},
    ]  # fmt: skip
    assert topology_report(log, t0_ns=8) == {
        "matches_plan": True, "differences": [], "changes": 2, "changes_during_run": 1,
        "nics": 6, "links": 12, "problems": [],
    }  # fmt: skip
    assert topology_report(log[:2])["matches_plan"] is False
    none = topology_report([])
    assert none["matches_plan"] is False and none["differences"] == ["no fabric was learned"]
