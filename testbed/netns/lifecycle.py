"""Bring a testbed up or rebuild its plan from the state file (thin shell over plan + apply)."""

from __future__ import annotations

from dataclasses import asdict

from mesh.fabric import Fabric, FabricShape, build_fabric
from testbed.netns.apply import (
    Progress,
    TestbedEnvError,
    bring_up,
    check_environment,
    pick_mgmt_index,
)
from testbed.netns.lldp import lldpd_available
from testbed.netns.plan import Plan, PlanError, check_prefix, make_plan
from testbed.netns.state import load_state
from testbed.netns.teardown import list_namespaces, tear_down


def up(
    shape: FabricShape,
    prefix: str = "qpm-",
    *,
    fabric_rate_mbit: float = 100.0,
    nic_rate_mbit: float = 1000.0,
    latency_ms: float = 20.0,
    progress: Progress = lambda _: None,
    lldp: bool | None = None,
    router_ids: bool = False,
) -> tuple[Fabric, Plan]:
    """Build the testbed; return its fabric and plan.

    ``lldp``: an lldpd in every namespace (None: when lldpd is installed); ``router_ids``:
    switches answer TTL probes from one router id each (`testbed.netns.plan`).

    Raises `PlanError` (bad shape/prefix), `TestbedEnvError` (not root, no namespaces, a
    testbed with this prefix already exists, or a command failed: then all is removed again).
    """
    check_prefix(prefix)
    check_environment()
    if list_namespaces(prefix):
        raise TestbedEnvError(
            f"a testbed with prefix {prefix!r} exists: 'qpmesh testbed down --prefix {prefix}' first"
        )
    fabric = build_fabric(shape)
    options = {
        "fabric_rate_mbit": fabric_rate_mbit,
        "nic_rate_mbit": nic_rate_mbit,
        "latency_ms": latency_ms,
        "mgmt_index": pick_mgmt_index(prefix),
        "router_ids": router_ids,
        "lldp": lldpd_available() if lldp is None else lldp,
    }
    plan = make_plan(fabric, prefix, **options)  # type: ignore[arg-type]
    state = {"shape": asdict(shape), "options": options, "broker_addr": plan.broker_addr}
    try:
        bring_up(plan, state, progress)
    except BaseException:
        progress("bring-up failed: removing what was created")
        tear_down(prefix)
        raise
    return fabric, plan


def plan_from_state(prefix: str) -> tuple[Fabric, Plan]:
    """Return the fabric and plan of the running testbed ``prefix``.

    Raises `TestbedEnvError` if no testbed with that prefix is recorded.
    """
    check_prefix(prefix)
    state = load_state(prefix)
    if not state or "shape" not in state:
        raise TestbedEnvError(f"no testbed with prefix {prefix!r} (run 'qpmesh testbed up')")
    try:
        fabric = build_fabric(FabricShape(**state["shape"]))
        plan = make_plan(fabric, prefix, **state.get("options", {}))
    except (TypeError, ValueError) as exc:
        raise PlanError(f"state of {prefix!r} is unusable: {exc}") from None
    return fabric, plan
