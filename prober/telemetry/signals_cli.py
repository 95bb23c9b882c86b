"""``qpmesh prober signals``: read this host's signals once, or measure the collector's cost.

``--nic ID=DEV[:RDMA/PORT]`` names the NICs to read (default: every device of
``/proc/net/dev`` but ``lo``, each under its own name). Without ``--bench`` it prints one
window (`contract.signals.SignalsDoc`, JSON) of ``--interval`` seconds. With ``--bench`` it
reads the sources back to back for ``--seconds`` and reports, per read, the CPU time of the
reading thread in total and per entity kind, and the document's size: the CPU share at one read per
``--interval`` and the bytes per second it would publish. `bench_report` is pure (the
figures in, the report out) so the arithmetic is tested apart from the clock.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from prober.telemetry.collector import Collector, CollectorConfig, NicSource, window
from prober.telemetry.netdev import read_proc_net_dev

CPU_SHARE_TARGET = 0.015  # "Reveal" (Chen et al. 2025): collector below 1.5 % of a core


def parse_nic(text: str) -> NicSource:
    """Return the `NicSource` of ``ID=DEV`` or ``ID=DEV:RDMA/PORT``; ValueError otherwise."""
    nic, sep, rest = text.partition("=")
    dev, _, rdma = rest.partition(":")
    if not sep or not nic or not dev:
        raise ValueError(f"--nic {text!r}: expected ID=DEV or ID=DEV:RDMA/PORT")
    if not rdma:
        return NicSource(nic, dev)
    name, _, port = rdma.partition("/")
    if not name or not port.isdigit():
        raise ValueError(f"--nic {text!r}: the RDMA part must be DEVICE/PORT")
    return NicSource(nic, dev, (name, int(port)))


def bench_report(
    *,
    reads: int,
    cpu_s: float,
    per_source_s: Mapping[str, float],
    doc_bytes: int,
    interval_s: float,
    nics: int,
    gpus: int,
    values: int,
) -> dict[str, Any]:
    """Return the benchmark's figures from its measurements (pure)."""
    per_read = cpu_s / reads if reads else float("nan")
    share = per_read / interval_s
    return {
        "reads": reads,
        "nics": nics,
        "gpus": gpus,
        "values_per_window": values,
        "cpu_us_per_read": round(per_read * 1e6, 1),
        "cpu_us_per_read_by_source": {
            k: round(v / reads * 1e6, 1) for k, v in per_source_s.items() if reads
        },
        "interval_s": interval_s,
        "cpu_share": round(share, 5),
        "cpu_share_target": CPU_SHARE_TARGET,
        "meets_cpu_target": share <= CPU_SHARE_TARGET,
        "bytes_per_window": doc_bytes,
        "bytes_per_s": round(doc_bytes / interval_s, 1),
    }


def run_bench(collector: Collector, seconds: float, interval_s: float) -> dict[str, Any]:
    """Read ``collector`` back to back for ``seconds`` (at least 3 reads); return
    `bench_report`'s figures (this thread's CPU time, `time.thread_time`)."""
    cfg = collector.config
    parts: dict[str, float] = {}
    first = last = collector.read(time.monotonic_ns())
    reads = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or reads < 3:
        last = collector.read(time.monotonic_ns(), parts)
        reads += 1
    doc = window(first, last, cfg.host).encode()
    n_values = sum(len(v) for ents in last.values.values() for v in ents.values())
    return bench_report(
        reads=reads, cpu_s=sum(parts.values()), per_source_s=parts, doc_bytes=len(doc),
        interval_s=interval_s, nics=len(cfg.nics),
        gpus=collector.nvml.count if collector.nvml else 0, values=n_values,
    )  # fmt: skip


def _signals(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.seconds <= 0:
        raise ValueError("--interval and --seconds must be positive")
    nics = tuple(parse_nic(t) for t in args.nic) or tuple(
        NicSource(d, d) for d in sorted(read_proc_net_dev()) if d != "lo"
    )
    collector = Collector.open(CollectorConfig(args.host, nics, gpus=not args.no_gpu))
    try:
        if args.bench:
            out = run_bench(collector, args.seconds, args.interval)
            out["gpu_reason"] = collector.gpu_reason
            if args.json:
                json.dump(out, sys.stdout, indent=1)
                sys.stdout.write("\n")
            else:
                print(f"{out['reads']} reads: {out['cpu_us_per_read']} us CPU per read, "
                      f"{out['cpu_share'] * 100:.3f} % of a core at one read per "
                      f"{args.interval:g} s (target {CPU_SHARE_TARGET * 100:g} %); "
                      f"{out['bytes_per_s']} B/s published")  # fmt: skip
            return 0
        a = collector.read(time.monotonic_ns())
        time.sleep(args.interval)
        doc = window(a, collector.read(time.monotonic_ns()), args.host)
        sys.stdout.write(json.dumps(json.loads(doc.encode()), indent=1 if args.json else None))
        sys.stdout.write("\n")
        return 0
    finally:
        collector.close()


def register_signals(sub: Any) -> None:
    """Register ``qpmesh prober signals`` under the prober's subcommands."""
    p = sub.add_parser(
        "signals",
        help="read this host's hardware signals once, or measure the collector (--bench)",
        description="Read NIC (netdev, ethtool, RDMA, PCIe AER), GPU (NVML) and host (procfs) "
        "signals; print one window, or the collector's CPU and bytes per second.",
    )
    p.add_argument("--host", default="localhost", help="host id for the document")
    p.add_argument("--nic", action="append", default=[], metavar="ID=DEV[:RDMA/PORT]",
                   help="a NIC to read (repeatable; default: every device but lo)")  # fmt: skip
    p.add_argument("--interval", type=float, default=3.0, help="window, s (default 3)")
    p.add_argument("--seconds", type=float, default=5.0, help="--bench duration (default 5)")
    p.add_argument("--no-gpu", action="store_true", help="do not open NVML")
    p.add_argument("--bench", action="store_true", help="measure CPU per read and bytes/s")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_signals)
