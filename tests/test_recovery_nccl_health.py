"""The NCCL move plan and env (no GPU needed), and the NIC health check for other frameworks."""

from __future__ import annotations

import threading

import pytest

from contract.remediation import ActionDoc
from recovery.health import NicUnhealthy, NicVerdicts, QpmeshNicHealthCheck
from recovery.nccl import NcclPlanError, abort_process_group, ib_hca, plan_move, restart_env

RANKS = {0: ("mlx5_0:1", "mlx5_1:1"), 1: ("mlx5_2:1", "mlx5_3:1"), 2: ("mlx5_2:1", "mlx5_4:1")}


def test_ib_hca_is_exact_so_mlx5_1_does_not_match_mlx5_10() -> None:
    assert ib_hca(["mlx5_1:1"]) == "=mlx5_1:1"
    assert ib_hca(["mlx5_1", "mlx5_3:2"], exclude=True) == "^=mlx5_1,mlx5_3:2"
    with pytest.raises(NcclPlanError):
        ib_hca([])
    with pytest.raises(NcclPlanError):
        ib_hca(["mlx5 1"])


def test_plan_restarts_the_ranks_on_the_failed_nic_and_heals_them_from_a_live_peer() -> None:
    plan = plan_move(RANKS, "mlx5_2:1")
    by = {s.rank: s for s in plan.steps}
    assert by[0].do == "reinit" and by[0].env == {}
    assert (
        by[1].do == "restart" and by[1].env == {"NCCL_IB_HCA": "=mlx5_3:1"} and by[1].heal_from == 0
    )
    assert by[2].do == "restart" and by[2].env == {"NCCL_IB_HCA": "=mlx5_4:1"}
    env = restart_env({"PATH": "/bin", "NCCL_IB_HCA": "=mlx5_2:1"}, by[1])
    assert env["NCCL_IB_HCA"] == "=mlx5_3:1" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert env["PATH"] == "/bin"


def test_merged_ports_leave_it_to_nccl_port_failover_and_name_the_port() -> None:
    plan = plan_move(RANKS, "mlx5_0:1", merged_ports=True)
    assert {s.do for s in plan.steps} == {"failover"} and "mlx5_0:1" in plan.note


def test_plan_refuses_what_cannot_work() -> None:
    with pytest.raises(NcclPlanError, match="no rank uses"):
        plan_move(RANKS, "mlx5_9:1")
    with pytest.raises(NcclPlanError, match="no IB device besides"):
        plan_move({0: ("a:1",), 1: ("b:1", "c:1")}, "a:1")
    with pytest.raises(NcclPlanError, match="no live peer"):
        plan_move({0: ("a:1", "b:1"), 1: ("a:1", "c:1")}, "a:1")


def test_abort_without_cuda_says_why() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the abort would act")
    with pytest.raises(RuntimeError, match="CUDA"):
        abort_process_group()


def _act(kind: str, nic: str) -> ActionDoc:
    return ActionDoc(f"{kind}-{nic}", kind, f"{nic} flapping", "f", 1, 2, nic=nic)


def test_health_check_follows_the_actions() -> None:
    v = NicVerdicts()
    check = QpmeshNicHealthCheck(v, ("nic0", "nic1"))
    assert check("state") == "state"
    v.apply(_act("move_off_nic", "nic0"))
    with pytest.raises(NicUnhealthy, match="nic0 is failing: nic0 flapping"):
        check("state")
    assert check.healthy_nics() == ("nic1",)
    v.apply(_act("move_off_nic", "nic7"))  # not ours
    v.apply(_act("may_move_back", "nic0"))
    assert check("s") == "s" and check.healthy_nics() == ("nic0", "nic1")


def test_verdicts_written_from_another_thread() -> None:
    v = NicVerdicts()
    t = threading.Thread(
        target=lambda: [v.apply(_act("move_off_nic", f"nic{k}")) for k in range(100)]
    )
    t.start()
    t.join()
    assert set(v.bad(("nic5", "nic99", "nic100"))) == {"nic5", "nic99"}
