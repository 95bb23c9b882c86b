"""The NCCL path of recovery: which rank restarts with which NIC list, and the env it gets.

NCCL reads ``NCCL_IB_HCA`` once per process (``ncclIbInitDevices`` behind an "initialised"
guard; ``ncclConfig_t`` has no per-communicator NIC list), so a rank cannot move to another
NIC by re-creating its communicator in the same process. The plan (`plan_move`), pure:

- the rank whose NIC failed gets a **fresh process** whose ``NCCL_IB_HCA`` names exactly its
  healthy NICs (``=mlx5_1:1``: ``=`` so ``mlx5_1`` does not also match ``mlx5_10..19``), and
  heals its state (parameters, optimizer, step, data position) from a live peer (``heal_from``)
  by broadcast once the new communicator is up;
- every other rank keeps its process and its state in memory: it aborts its communicator
  (``ncclCommAbort``, on a non-blocking communicator: ``config.blocking = 0``, polled with
  ``ncclCommGetAsyncError``; from PyTorch: ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` aborts the
  communicator without killing the process, then ``destroy_process_group`` and a new
  ``init_process_group`` on a fresh store prefix), then joins the new communicator;
- where the failed NIC is one port of a merged multi-port virtual NIC, NCCL 2.29.7+ can fail
  over by itself (``NCCL_IB_RESILIENCY_PORT_FAILOVER=1``; survives one failed device, port
  recovery since 2.30): the plan then restarts nothing and says which port died.

This is the pattern of torchft (heal from a live replica) and nvidia-resiliency-ext's
in-process restart. None of it was run on a GPU here (no GPU on this machine): the env and the
plan are tested; `abort_process_group` is the one call into PyTorch, guarded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_HCA = re.compile(r"^[A-Za-z0-9_.-]+(:[0-9]+)?$")


class NcclPlanError(ValueError):
    """The NIC map or the failed NIC cannot be planned for (one-line reason)."""


def ib_hca(hcas: Sequence[str], *, exclude: bool = False) -> str:
    """Return an exact ``NCCL_IB_HCA`` value: ``=a:1,b:1`` (or ``^=a:1`` to exclude).

    Raises `NcclPlanError` on an empty list or a malformed name (``<hca>[:<port>]``).
    """
    if not hcas:
        raise NcclPlanError("NCCL_IB_HCA needs at least one device")
    for h in hcas:
        if not _HCA.match(h):
            raise NcclPlanError(f"bad IB device {h!r}: want <hca>[:<port>]")
    return ("^=" if exclude else "=") + ",".join(hcas)


@dataclass(frozen=True, slots=True)
class RankStep:
    """What one rank does: ``restart`` (fresh process with ``env``), ``reinit`` (abort the
    communicator, keep state, join the new one) or ``failover`` (nothing: NCCL's port
    failover handles it)."""

    rank: int
    do: str
    env: Mapping[str, str]
    heal_from: int | None = None


@dataclass(frozen=True, slots=True)
class NcclPlan:
    """The steps of every rank, and a line for the operator (which port died)."""

    steps: tuple[RankStep, ...]
    note: str


def plan_move(
    rank_hcas: Mapping[int, Sequence[str]],
    failed: str,
    *,
    merged_ports: bool = False,
) -> NcclPlan:
    """Return the plan moving the ranks using IB device ``failed`` off it.

    ``rank_hcas``: rank -> its IB devices (``mlx5_0:1``), preferred first; ``merged_ports``:
    the devices are ports of one merged virtual NIC with NCCL's port failover on. Raises
    `NcclPlanError` when a rank would be left without a device or no live peer remains.
    """
    hit = sorted(r for r, hs in rank_hcas.items() if failed in hs)
    if not hit:
        raise NcclPlanError(f"no rank uses {failed!r}")
    if merged_ports:
        steps = tuple(RankStep(r, "failover", {}) for r in sorted(rank_hcas))
        return NcclPlan(steps, f"{failed} died inside a merged NIC: NCCL port failover carries "
                        f"ranks {hit}; replace the port's cable/transceiver")  # fmt: skip
    live = [r for r in sorted(rank_hcas) if r not in hit]
    if not live:
        raise NcclPlanError(f"every rank uses {failed!r}: no live peer to heal from")
    out = []
    for r in sorted(rank_hcas):
        if r in hit:
            rest = [h for h in rank_hcas[r] if h != failed]
            if not rest:
                raise NcclPlanError(f"rank {r} has no IB device besides {failed!r}")
            out.append(RankStep(r, "restart", {"NCCL_IB_HCA": ib_hca(rest)}, heal_from=live[0]))
        else:
            out.append(RankStep(r, "reinit", {}))
    return NcclPlan(tuple(out), f"ranks {hit} restart without {failed}, heal from rank {live[0]}")


def restart_env(base: Mapping[str, str], step: RankStep) -> dict[str, str]:
    """Return the environment of the fresh process for ``step`` (``base`` updated).

    Keeps ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (abort the communicator, keep the process) so
    the next failure is recoverable the same way.
    """
    env = dict(base)
    env.update(step.env)
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    return env


def abort_process_group(group: Any = None) -> None:
    """Abort the NCCL communicators of ``group`` (default group if None) without waiting.

    Uses PyTorch's ``_abort_process_group`` (experimental, NCCL only). Raises RuntimeError when
    torch or NCCL is missing (as on this machine).
    """
    try:
        import torch
        from torch.distributed import distributed_c10d as c10d
    except ImportError as exc:
        raise RuntimeError(f"torch is not installed: {exc}") from None
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        raise RuntimeError("NCCL abort needs CUDA and a NCCL build of torch")
    fn: Any = getattr(c10d, "_abort_process_group", None)
    if fn is None:
        raise RuntimeError("this torch has no _abort_process_group")
    fn(group) if group is not None else fn()
