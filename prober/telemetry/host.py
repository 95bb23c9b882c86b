"""Host signals from procfs: CPU time shares, run queue, pressure stall, softnet, memory.

`host_values(texts, user_hz)` (pure) maps the texts of ``/proc/stat``, ``/proc/loadavg``,
``/proc/pressure/{cpu,memory,io}``, ``/proc/net/softnet_stat`` and ``/proc/meminfo`` to the
host signals of `contract.signals` in raw form: counters cumulative (CPU times in seconds per
CPU, so their rate is the share of all CPUs; pressure totals in seconds, so their rate is the
share of time stalled), gauges as read. A file that is missing or unparsable leaves its
signals out (not available). `read_host_texts(root)` is the one read (I/O).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

FILES = (
    "stat",
    "loadavg",
    "pressure/cpu",
    "pressure/memory",
    "pressure/io",
    "net/softnet_stat",
    "meminfo",
)
# /proc/stat "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice
_CPU_FIELDS = {"cpu_user": (0, 1), "cpu_system": (2,), "cpu_iowait": (4,), "cpu_irq": (5,),
               "cpu_softirq": (6,), "cpu_steal": (7,)}  # fmt: skip


def parse_stat(text: str) -> dict[str, float]:
    """Return from ``/proc/stat``: ``cpu_*`` jiffies summed over CPUs, ``ncpu``, ``ctxt``,
    ``procs_running``, ``procs_blocked`` (keys missing when their line is)."""
    out: dict[str, float] = {}
    ncpu = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        head = parts[0]
        try:
            if head == "cpu":
                vals = [float(x) for x in parts[1:]]
                for name, idx in _CPU_FIELDS.items():
                    if max(idx) < len(vals):
                        out[name] = sum(vals[i] for i in idx)
            elif head.startswith("cpu") and head[3:].isdigit():
                ncpu += 1
            elif head in ("ctxt", "procs_running", "procs_blocked") and len(parts) > 1:
                out[head] = float(parts[1])
        except ValueError:
            continue
    if ncpu:
        out["ncpu"] = float(ncpu)
    return out


def parse_psi(text: str) -> dict[str, float]:
    """Return ``{"some": total_s, "full": total_s}`` from a ``/proc/pressure/*`` file."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        for kv in parts[1:]:
            key, _, val = kv.partition("=")
            if key == "total":
                with contextlib.suppress(ValueError):
                    out[parts[0]] = float(val) / 1e6  # microseconds
    return out


def parse_softnet(text: str) -> dict[str, float]:
    """Return ``softnet_dropped`` and ``softnet_squeezed`` summed over CPUs (hex columns 2, 3
    of ``/proc/net/softnet_stat``)."""
    dropped = squeezed = 0
    seen = False
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 3:
            continue
        try:
            dropped += int(cols[1], 16)
            squeezed += int(cols[2], 16)
            seen = True
        except ValueError:
            continue
    return {"softnet_dropped": float(dropped), "softnet_squeezed": float(squeezed)} if seen else {}


def parse_meminfo(text: str) -> dict[str, float]:
    """Return ``mem_available`` (MemAvailable / MemTotal) from ``/proc/meminfo``."""
    kv: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            try:
                kv[key] = float(parts[0])
            except ValueError:
                continue
    total, avail = kv.get("MemTotal"), kv.get("MemAvailable")
    return {"mem_available": avail / total} if total and avail is not None else {}


def host_values(texts: Mapping[str, str], user_hz: float = 100.0) -> dict[str, float]:
    """Return the host signals (raw: counters cumulative) from procfs ``texts`` (file name
    relative to /proc -> text); signals whose file is missing or unparsable are left out."""
    out: dict[str, float] = {}
    stat = parse_stat(texts.get("stat", ""))
    ncpu = stat.get("ncpu")
    if ncpu:
        for name in _CPU_FIELDS:
            if name in stat:
                out[name] = stat[name] / user_hz / ncpu
        if "procs_running" in stat:
            out["runq_per_cpu"] = stat["procs_running"] / ncpu
    for key in ("procs_blocked", "ctxt"):
        if key in stat:
            out[key] = stat[key]
    load = texts.get("loadavg", "").split()
    if load:
        with contextlib.suppress(ValueError):
            out["load1"] = float(load[0])
    psi_names = (
        ("cpu", "psi_cpu_some", None),
        ("memory", "psi_mem_some", "psi_mem_full"),
        ("io", "psi_io_some", "psi_io_full"),
    )
    for res, some, full in psi_names:
        psi = parse_psi(texts.get(f"pressure/{res}", ""))
        if "some" in psi:
            out[some] = psi["some"]
        if full and "full" in psi:
            out[full] = psi["full"]
    out.update(parse_softnet(texts.get("net/softnet_stat", "")))
    out.update(parse_meminfo(texts.get("meminfo", "")))
    return out


def read_host_texts(root: Path = Path("/proc")) -> dict[str, str]:
    """Return the texts of `FILES` under ``root`` (those that cannot be read are left out)."""
    out: dict[str, str] = {}
    for name in FILES:
        try:
            out[name] = (root / name).read_text()
        except OSError:
            continue
    return out
