"""CPU starvation for the testbed's processes: one small cgroup adapter, v2 or v1.

Where the machine's unified hierarchy (cgroup v2) has the ``cpu`` controller, a group's limit
is its ``cpu.max`` (``"QUOTA PERIOD"``); otherwise, on a v1 ``cpu`` hierarchy (hybrid
machines: the unified mount without a cpu controller), the CFS quota (``cpu.cfs_quota_us`` and
``cpu.cfs_period_us``). Pure: `find_layout` (the mount table and the root's controllers in,
a `Layout` out) and `limit_files` (a share of one CPU in, the files to write out). Thin shell:
`CpuGroup` makes a uniquely named group, limits it, moves processes into it by pid and, on
`remove` (also after a failure: `starved` is a context manager), moves what is left back to
the parent group and removes the directory. `sweep(tag)` removes groups a crashed run left.

Raises `CgroupError` (an OSError: an environment problem) when no cpu controller can be
used or a group cannot be made.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

NAME_PREFIX = "qpmesh-"
"""Every group this module makes is named ``qpmesh-<tag>-<random>``."""
PERIOD_US = 100_000


class CgroupError(OSError):
    """No usable cpu controller, or a group could not be made, limited or removed."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where groups are made: cgroup ``version`` (1 or 2) and the ``parent`` directory."""

    version: int
    parent: Path

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ValueError(f"cgroup version must be 1 or 2, got {self.version}")


def find_layout(mounts: str, v2_controllers: str, own_v1_path: str = "/") -> Layout | None:
    """Return where CPU-limited groups can be made, or None.

    ``mounts``: the text of ``/proc/self/mounts``; ``v2_controllers``: the text of the
    unified root's ``cgroup.controllers`` ("" when there is none); ``own_v1_path``: this
    process's path in the v1 cpu hierarchy (``/proc/self/cgroup``). v2 wins where its root
    offers ``cpu``; else a v1 mount whose options name ``cpu`` (alone or as ``cpu,cpuacct``).
    """
    v2_root = v1_root = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        where, kind, opts = parts[1], parts[2], parts[3].split(",")
        if kind == "cgroup2" and v2_root is None:
            v2_root = where
        elif kind == "cgroup" and "cpu" in opts and v1_root is None:
            v1_root = where
    if v2_root is not None and "cpu" in v2_controllers.split():
        return Layout(2, Path(v2_root))
    if v1_root is not None:
        return Layout(1, Path(v1_root) / own_v1_path.strip("/"))
    return None


def limit_files(version: int, share: float, period_us: int = PERIOD_US) -> dict[str, str]:
    """Return file name -> text that limit a group to ``share`` of one CPU (0 < share <= 64;
    at least 1 ms per period, the kernel's minimum quota). Raises ValueError otherwise."""
    if not 0 < share <= 64:
        raise ValueError(f"CPU share must be in (0, 64], got {share}")
    if not 1_000 <= period_us <= 1_000_000:
        raise ValueError(f"period must be in [1000, 1000000] us, got {period_us}")
    quota = max(1_000, round(share * period_us))
    if version == 2:
        return {"cpu.max": f"{quota} {period_us}"}
    return {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota)}


def unlimited_files(version: int) -> dict[str, str]:
    """Return file name -> text that lift a group's limit."""
    return {"cpu.max": "max"} if version == 2 else {"cpu.cfs_quota_us": "-1"}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def own_v1_cpu_path(proc_cgroup: str) -> str:
    """Return the v1 cpu hierarchy path in a ``/proc/<pid>/cgroup`` text ("/" if none)."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "cpu" in parts[1].split(","):
            return parts[2] or "/"
    return "/"


def machine_layout() -> Layout:
    """Return this machine's `Layout`; raises `CgroupError` when it has no cpu controller.
    On v2 the root's ``cgroup.subtree_control`` gains ``+cpu`` if it lacks it."""
    mounts = _read("/proc/self/mounts")
    layout = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            layout = find_layout(
                mounts,
                _read(os.path.join(parts[1], "cgroup.controllers")),
                own_v1_cpu_path(_read("/proc/self/cgroup")),
            )
            break
    else:
        layout = find_layout(mounts, "", own_v1_cpu_path(_read("/proc/self/cgroup")))
    if layout is None:
        raise CgroupError(errno.ENOTSUP, "no cgroup cpu controller (v2 cpu.max or v1 CFS quota)")
    if layout.version == 2:
        ctl = layout.parent / "cgroup.subtree_control"
        if "cpu" not in _read(str(ctl)).split():
            try:
                ctl.write_text("+cpu\n")
            except OSError as exc:
                raise CgroupError(exc.errno or errno.EPERM, f"cannot enable cpu in {ctl}") from None
    return layout


class CpuGroup:
    """One uniquely named CPU-limited group (see the module docstring)."""

    def __init__(self, layout: Layout, tag: str) -> None:
        """Make the group ``qpmesh-<tag>-<random>`` under ``layout.parent``; raises
        `CgroupError` if it cannot."""
        self.layout = layout
        self.path = layout.parent / f"{NAME_PREFIX}{tag}-{secrets.token_hex(3)}"
        try:
            self.path.mkdir()
        except OSError as exc:
            raise CgroupError(exc.errno or errno.EIO, f"cannot make {self.path}: {exc}") from None
        self.pids: list[int] = []

    def _write(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            try:
                (self.path / name).write_text(text + "\n")
            except OSError as exc:
                raise CgroupError(exc.errno or errno.EIO, f"cannot write {name}: {exc}") from None

    def limit(self, share: float) -> None:
        """Limit the group to ``share`` of one CPU (`limit_files`)."""
        self._write(limit_files(self.layout.version, share))

    def unlimit(self) -> None:
        """Lift the limit (the processes stay in the group)."""
        self._write(unlimited_files(self.layout.version))

    def add(self, pid: int) -> bool:
        """Move process ``pid`` (all its threads) into the group; return False if it is gone."""
        try:
            (self.path / "cgroup.procs").write_text(f"{pid}\n")
        except ProcessLookupError:
            return False
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return False
            raise CgroupError(exc.errno or errno.EIO, f"cannot move {pid}: {exc}") from None
        self.pids.append(pid)
        return True

    def members(self) -> list[int]:
        """Return the pids in the group now."""
        return [int(x) for x in _read(str(self.path / "cgroup.procs")).split() if x.isdigit()]

    def throttled(self) -> tuple[int, float]:
        """Return (periods the group was throttled in, seconds it waited throttled) from its
        ``cpu.stat`` ((0, 0.0) when unreadable): evidence that the limit bit."""
        stat = {}
        for line in _read(str(self.path / "cpu.stat")).splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                stat[k] = int(v)
        waited = stat.get("throttled_usec", 0) / 1e6 or stat.get("throttled_time", 0) / 1e9
        return stat.get("nr_throttled", 0), waited

    def remove(self, timeout_s: float = 5.0) -> None:
        """Move every process left back to the parent group and remove the group (a group
        already gone is fine); raises `CgroupError` if it is still busy after ``timeout_s``."""
        remove_group(self.path, timeout_s)


def remove_group(path: Path, timeout_s: float = 5.0) -> None:
    """Empty the group at ``path`` into its parent and remove it (see `CpuGroup.remove`)."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        for pid in [int(x) for x in _read(str(path / "cgroup.procs")).split() if x.isdigit()]:
            with contextlib.suppress(OSError):  # gone meanwhile
                (path.parent / "cgroup.procs").write_text(f"{pid}\n")
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise CgroupError(
                    exc.errno or errno.EBUSY, f"cannot remove {path}: {exc}"
                ) from None
            time.sleep(0.05)


def sweep(layout: Layout, tag: str) -> list[str]:
    """Remove the groups named ``qpmesh-<tag>-*`` under ``layout.parent`` (left by a run
    that crashed); return their names."""
    out = []
    with contextlib.suppress(OSError):
        for p in sorted(layout.parent.glob(f"{NAME_PREFIX}{tag}-*")):
            if p.is_dir():
                remove_group(p)
                out.append(p.name)
    return out


@contextlib.contextmanager
def starved(pids: Iterable[int], share: float, tag: str, layout: Layout | None = None
            ) -> Iterator[CpuGroup]:  # fmt: skip
    """Hold ``pids`` in a new group limited to ``share`` of one CPU for the ``with`` block;
    the group is removed when it ends, also on an exception."""
    group = CpuGroup(layout or machine_layout(), tag)
    try:
        group.limit(share)
        for pid in pids:
            group.add(pid)
        yield group
    finally:
        group.remove()
