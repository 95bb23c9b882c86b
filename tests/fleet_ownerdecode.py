"""What an edge owner's decoding of every worker's partial costs at 20,000 NICs (docs/scale.md,
"Edge owners on NATS"): one partition's partial of 64 at the full probe rate (the fleet
bench's worker stage), its `Partial.decode` and `split_partial` timed (process CPU, median of
7), times 64 partitions for one owner's window; and the same with the owners' shares
(`controller.fleet.ownershare`): the worker's cut, one owner's `OwnerShare.decode` and
`OwnerCore.add_share`'s input, and the bytes on the wire (whole partial before; solver part
plus every share after). Pure, ~10 s, 0.4 GB. Run:
``PYTHONPATH=. python tests/fleet_ownerdecode.py``."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from controller.fleet.codec import unpack
from controller.fleet.edges import owner_bounds, split_partial
from controller.fleet.ownershare import OwnerCut, OwnerShare
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
    bounds = owner_bounds(fig["nics"], OWNERS)
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
    wire = OwnerCut(bounds)(p)
    cut = cpu_s(lambda: OwnerCut(bounds)(p))
    share = max(wire.shares, key=len)
    own = cpu_s(lambda: OwnerShare.decode(share).input())
    after = len(wire.part) + sum(len(x) for x in wire.shares)
    enc = cpu_s(p.encode)
    print(f"shares: worker encode {enc:.4f} s (before), cut {cut:.4f} s (after) per partial; "
          f"shares {[round(len(x) / 1e6, 2) for x in wire.shares]} MB, the largest's decode "
          f"{own:.4f} s; solver part {len(wire.part) / 1e6:.2f} MB")  # fmt: skip
    print(f"per owner per window (x{PARTITIONS}): before {(dec + spl) * PARTITIONS:.2f} s, "
          f"after {own * PARTITIONS:.2f} s; read per window by one owner "
          f"{len(blob) * PARTITIONS / 1e6:.1f} MB before, {len(share) * PARTITIONS / 1e6:.1f} MB "
          f"after, by the solver {len(blob) * PARTITIONS / 1e6:.1f} -> "
          f"{len(wire.part) * PARTITIONS / 1e6:.1f} MB; stored {len(blob) * PARTITIONS / 1e6:.1f}"
          f" -> {after * PARTITIONS / 1e6:.1f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
