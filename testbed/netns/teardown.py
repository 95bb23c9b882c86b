"""Remove everything a testbed made: its processes, namespaces, root links and state file.

Idempotent, and works after a crash: besides the state file it scans ``ip netns list`` and
``ip link`` for names the prefix's pattern matches (`plan.names_pattern`), so names of other
testbeds (other prefixes) are never touched. Processes are ended by pid: recorded ones (checked
against their start time) and whatever runs inside the prefix's namespaces (only we start
processes there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable

from testbed.netns.apply import TestbedEnvError, run
from testbed.netns.lldp import lldp_dir
from testbed.netns.plan import names_pattern
from testbed.netns.state import alive, load_state, state_dir


def list_namespaces(prefix: str) -> list[str]:
    """Return the namespaces that belong to the testbed with ``prefix``."""
    pat = names_pattern(prefix)
    out = run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if pat.match(n))


def list_root_links(prefix: str) -> list[str]:
    """Return root-namespace links (management bridge and veths) of the testbed ``prefix``."""
    pat = names_pattern(prefix)
    out = run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return sorted(n for n in names if pat.match(n))


def namespace_pids(ns: str) -> list[int]:
    """Return the pids of processes running inside namespace ``ns``."""
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a child of ours is reaped here, not left a zombie)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    return not os.path.exists(f"/proc/{pid}")


def _end(pids: list[int], grace_s: float = 2.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = list(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if not _gone(p)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # a child of ours: reap it


def tear_down(prefix: str, progress: Callable[[str], None] = lambda _: None) -> dict[str, int]:
    """Remove the testbed ``prefix``; return counts of what was removed.

    Raises `TestbedEnvError` only if something could not be removed.
    """
    state = load_state(prefix) or {}
    recorded = [int(p["pid"]) for p in state.get("processes", []) if alive(p)]
    namespaces = list_namespaces(prefix)
    inner = sorted({pid for ns in namespaces for pid in namespace_pids(ns)} - {os.getpid()})
    pids = sorted(set(recorded) | set(inner))
    if pids:
        progress(f"stopping {len(pids)} processes")
        _end(pids)
    progress(f"deleting {len(namespaces)} namespaces")
    if namespaces:
        run(
            ["ip", "-force", "-batch", "-"],
            stdin="".join(f"netns del {n}\n" for n in namespaces),
            check=False,
        )
    links = list_root_links(prefix)
    if links:
        run(
            ["ip", "-force", "-batch", "-"],
            stdin="".join(f"link del {n}\n" for n in links),
            check=False,
        )
    left_ns, left_links = list_namespaces(prefix), list_root_links(prefix)
    if left_ns or left_links:
        raise TestbedEnvError(f"could not remove {left_ns + left_links}")
    shutil.rmtree(state_dir(prefix), ignore_errors=True)
    shutil.rmtree(lldp_dir(prefix), ignore_errors=True)
    return {"processes": len(pids), "namespaces": len(namespaces), "links": len(links)}
