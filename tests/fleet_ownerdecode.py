"""What an edge owner's decoding of every worker's partial costs at 20,000 NICs (docs/scale.md,
"Edge owners on NATS"): one partition's partial of 64 at the full probe rate (the fleet
bench's worker stage), its `Partial.decode` and `split_partial` timed (process CPU, median of
7), times 64 partitions for one owner's window. Pure, ~10 s, 0.4 GB. Run:
``PYTHONPATH=. python tests/fleet_ownerdecode.py``."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from controller.fleet.codec import unpack
from controller.fleet.edges import split_partial
from controller.fleet.partial import MAGIC, VERSION, Partial
from testbed.sim.fleet_bench import _ingest

NICS, PARTITIONS, OWNERS = 20_000, 64, 4


def cpu_s(fn: Callable[[], object], n: int = 7) -> float:
    """Return the median process CPU seconds of ``n`` calls of ``fn``."""
    out = []
    for _ in range(n):
        t0 = time.process_time()
        fn()
        out.append(time.process_time() - t0)
    return statistics.median(out)


def main() -> None:
    """Print the figures."""
    fig, blobs, _ = _ingest(NICS, 32, 10.0, 1, 1, 1, lambda m: print(m, file=sys.stderr),
                            "owner", PARTITIONS)  # fmt: skip
    blob = blobs[0]
    p = Partial.decode(blob)
    bounds = np.linspace(0, fig["nics"], OWNERS + 1).astype(np.int64)
    dec = cpu_s(lambda: Partial.decode(blob))
    unp = cpu_s(lambda: unpack(blob, MAGIC, frozenset({VERSION})))
    spl = cpu_s(lambda: split_partial(p, bounds))
    _, _, cols = unpack(blob, MAGIC, frozenset({VERSION}))
    groups: dict[str, int] = {}
    for name, a in cols.items():
        groups[name.split(".")[0]] = groups.get(name.split(".")[0], 0) + a.nbytes
    print(f"one partition of {PARTITIONS} at 10 Hz: {len(blob) / 1e6:.2f} MB wire, "
          f"{sum(groups.values()) / 1e6:.2f} MB raw, {len(p.clock)} clock rows, "
          f"{fig['records']} records")  # fmt: skip
    print("raw MB by column group:", {k: round(v / 1e6, 2) for k, v in groups.items()})
    print(f"per partial CPU s: decode {dec:.4f} (unpack {unp:.4f}), split for {OWNERS} "
          f"owners {spl:.4f}")  # fmt: skip
    print(f"per owner per window (x{PARTITIONS}): decode {dec * PARTITIONS:.2f} s, "
          f"split {spl * PARTITIONS:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
