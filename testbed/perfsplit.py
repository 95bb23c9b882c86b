"""Where a process's CPU goes, from ``perf record -g``: the split `qpmesh testbed prober-cpu
--perf` reports next to the ``/proc`` figure.

Shares of the samples (``cpu-clock``, call graphs) taken while the prober ran:

- ``kernel``: every sample in the kernel, of which
- ``kernel_net_rx_softirq``: samples under ``net_rx_action``, the network receive softirq run
  inside the prober's own system calls. On the namespace testbed a veth transmit queues the
  datagram to the receiving side's backlog and the softirq that processes it (IP, UDP demux,
  queueing to the peer's socket) runs when the sender's ``sendmmsg`` re-enables bottom halves:
  the peers' receive path of what the prober sent is charged to the prober. The prober's own
  receive of the peers' datagrams is charged to the peers the same way. With a real NIC that
  work runs in the NIC's interrupt/NAPI context on the receiving host;
- ``engine``: user time in the C engine (``prober/_fastpath.c``);
- ``python``: the interpreter and the extension modules it calls (numpy, heapq, ...);
- ``other``: libc and everything else in user space.

Pure parsing (`parse_dso_shares`, `parse_children_share`, `split`) and a thin shell
(`record`, `report`) that runs the ``perf`` binary.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^\s*([0-9.]+)%\s+(?:([0-9.]+)%\s+)?(\S.*?)\s*$")


def parse_dso_shares(text: str) -> dict[str, float]:
    """Return dso -> share of the samples (0..1) from ``perf report --no-children --sort dso
    -g none --stdio`` output; comment lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = _LINE.match(line)
        if m:
            out[m.group(3)] = out.get(m.group(3), 0.0) + float(m.group(1)) / 100
    return out


def parse_children_share(text: str, symbol: str) -> float:
    """Return the "children" share (0..1) of ``symbol`` from ``perf report --children --sort
    sym -g none --stdio`` output (0 when it does not appear)."""
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(2) is not None and m.group(3).split()[-1] == symbol:
            return float(m.group(1)) / 100
    return 0.0


def split(dso_shares: dict[str, float], net_rx_share: float) -> dict[str, float]:
    """Return the shares (rounded to 0.001) of kernel, kernel_net_rx_softirq, engine, python
    and other from the per-dso shares and ``net_rx_action``'s children share."""
    kernel = engine = python = other = 0.0
    for dso, share in dso_shares.items():
        if dso.startswith("[kernel"):
            kernel += share
        elif dso.startswith("_fastpath"):
            engine += share
        elif dso.startswith(("libpython", "python")) or ".cpython-" in dso:
            python += share
        else:
            other += share
    return {
        "kernel": round(kernel, 3),
        "kernel_net_rx_softirq": round(min(net_rx_share, kernel), 3),
        "engine": round(engine, 3),
        "python": round(python, 3),
        "other": round(other, 3),
    }


def available() -> bool:
    """Return True when a ``perf`` binary is on the PATH."""
    return shutil.which("perf") is not None


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """Start ``perf record -g`` on ``pid`` for ``seconds`` (writes ``out``); return the process
    (wait for it). Raises `OSError` when perf cannot be started."""
    argv = ["perf", "record", "-q", "-g", "-o", str(out), "-p", str(pid), "--",
            "sleep", f"{seconds:.3f}"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def report(data: Path) -> dict[str, Any]:
    """Return the split of a ``perf record`` file (`split`), or ``{"error": ...}`` when perf
    could not read it."""
    base = ["perf", "report", "-i", str(data), "--stdio", "-g", "none"]
    try:
        dsos = subprocess.run([*base, "--no-children", "--sort", "dso"], capture_output=True,
                              text=True, timeout=300, check=True).stdout  # fmt: skip
        syms = subprocess.run([*base, "--children", "--sort", "sym"], capture_output=True,
                              text=True, timeout=300, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"perf report failed: {exc}"}
    shares = parse_dso_shares(dsos)
    if not shares:
        return {"error": "perf recorded no samples"}
    return split(shares, parse_children_share(syms, "net_rx_action"))
