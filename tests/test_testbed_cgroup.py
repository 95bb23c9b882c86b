"""`testbed.cgroup`: v2 ``cpu.max`` or v1 CFS quota, picked from the mount table (pure), and a
real group on this machine when root may make one (a spinning child starved, then freed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.cgroup import (
    CgroupError,
    CpuGroup,
    Layout,
    find_layout,
    limit_files,
    machine_layout,
    own_v1_cpu_path,
    starved,
    sweep,
    unlimited_files,
)

HYBRID = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
UNIFIED = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
COMBINED = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"


def test_v2_wins_where_its_root_offers_cpu() -> None:
    assert find_layout(UNIFIED, "cpuset cpu io memory pids") == Layout(2, Path("/sys/fs/cgroup"))


def test_hybrid_without_a_v2_cpu_controller_takes_v1() -> None:
    # this machine's shape: the unified mount has no cpu controller (it is v1's)
    assert find_layout(HYBRID, "") == Layout(1, Path("/sys/fs/cgroup/cpu"))
    assert find_layout(HYBRID, "", "/docker/abc") == Layout(
        1, Path("/sys/fs/cgroup/cpu/docker/abc")
    )
    assert find_layout(COMBINED, "") == Layout(1, Path("/sys/fs/cgroup/cpu,cpuacct"))
    assert find_layout("cgroup /x cgroup rw,cpuacct 0 0\n", "") is None  # cpuacct is not cpu


def test_limit_files_per_version() -> None:
    assert limit_files(2, 0.05) == {"cpu.max": "5000 100000"}
    assert limit_files(1, 0.05) == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "5000"}
    assert limit_files(1, 0.001)["cpu.cfs_quota_us"] == "1000"  # the kernel's minimum
    assert unlimited_files(2) == {"cpu.max": "max"}
    assert unlimited_files(1) == {"cpu.cfs_quota_us": "-1"}
    for bad in (0.0, -1.0, 65.0):
        with pytest.raises(ValueError, match="share"):
            limit_files(1, bad)


def test_own_v1_cpu_path() -> None:
    text = "9:name=systemd:/\n4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n"
    assert own_v1_cpu_path(text) == "/docker/abc"
    assert own_v1_cpu_path("0::/\n") == "/"


def _layout_or_skip() -> Layout:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a cgroup")
    try:
        return machine_layout()
    except CgroupError as exc:
        pytest.skip(f"no cgroup cpu controller here: {exc}")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(60)
def test_a_spinning_process_is_starved_then_freed_and_the_group_removed() -> None:
    layout = _layout_or_skip()
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    tag = f"t{os.getpid()}"
    try:
        with starved([spin.pid], 0.02, tag, layout) as g:
            path = g.path
            assert path.name.startswith(f"qpmesh-{tag}-") and g.members() == [spin.pid]
            c0 = _cpu_s(spin.pid)
            time.sleep(3.0)
            used = _cpu_s(spin.pid) - c0
            periods, waited = g.throttled()
        # 2 % of one CPU: ~0.06 s in 3 s (a generous bound: tick accounting is coarse)
        assert used < 0.5, used
        assert periods > 0 and waited > 0
        assert not path.exists()  # removed, the process moved back
        assert spin.poll() is None
    finally:
        spin.kill()
        spin.wait()


@pytest.mark.timeout(60)
def test_groups_are_removed_on_failure_and_by_sweep() -> None:
    layout = _layout_or_skip()
    spin = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tag = f"f{os.getpid()}"
    try:
        with pytest.raises(RuntimeError), starved([spin.pid], 0.5, tag, layout) as g:
            path = g.path
            raise RuntimeError("the block failed")
        assert not path.exists()
        left = CpuGroup(layout, tag)  # as a crashed run leaves it, with a process inside
        left.add(spin.pid)
        assert sweep(layout, tag) == [left.path.name] and not left.path.exists()
    finally:
        spin.kill()
        spin.wait()
