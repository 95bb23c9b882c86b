"""Which RDMA (verbs) devices this host has: sysfs first, pyverbs if importable."""

from __future__ import annotations

from pathlib import Path

SYSFS_IB = Path("/sys/class/infiniband")


class RdmaUnavailable(OSError):
    """No usable RDMA device or no pyverbs (an environment problem: the CLI exits 1)."""


def list_rdma_devices(root: Path = SYSFS_IB) -> list[str]:
    """Return the sorted verbs device names (e.g. ``["mlx5_0", "mlx5_1"]``); [] when none.

    Reads ``root`` (no RDMA subsystem -> the directory is missing -> []). Never raises.
    """
    try:
        return sorted(p.name for p in root.iterdir())
    except OSError:
        return []


def require_rdma(wanted: list[str], root: Path = SYSFS_IB) -> None:
    """Raise `RdmaUnavailable` unless pyverbs imports and every device in ``wanted`` exists.

    An empty ``wanted`` means "any device": at least one must exist.
    """
    have = list_rdma_devices(root)
    if not have:
        raise RdmaUnavailable(f"no RDMA device found ({root} is empty or missing)")
    missing = [d for d in wanted if d and d not in have]
    if missing:
        raise RdmaUnavailable(f"RDMA device(s) {', '.join(missing)} not found (have {have})")
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        raise RdmaUnavailable("pyverbs is not installed (pip install 'qpmesh[rdma]')") from None
