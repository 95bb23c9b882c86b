"""Sizes of the clock bucket's large values (docs/scale.md, "A learned fabric"): the fabric
version and the models at 100,000 and 300,000 NICs x 32 peers, built synthetically and
encoded (pure; ~1 min, 2.9 GB). Run: ``PYTHONPATH=. python tests/fleet_kvsizes.py``."""

from __future__ import annotations

import numpy as np

from controller.clocksolve import ClockState
from controller.clocksync import ClockTrust
from controller.fleet.fabricwire import encode_fabric
from controller.fleet.partial import LearnedPaths
from controller.fleet.state import FleetState, encode_state
from controller.pathmap import PathRows
from mesh.fabric import build_fabric
from sync import ClockModels
from testbed.sim.fleet_bench import fleet_shape

PEERS, WIDTH = 32, 4


def state(rng: np.random.Generator, n: int, hosts: int, paths: int) -> FleetState:
    """Return a state of ``n`` NICs with random clock values and ``paths`` baselines."""

    def pos() -> np.ndarray:  # type: ignore[type-arg]
        return np.abs(rng.normal(0, 1e4, n))

    models = ClockModels(10**18, rng.normal(0, 1e6, n), rng.normal(0, 1e-5, n), pos(),
                         pos() * 1e-12, np.ones(n, bool), 1.0)  # fmt: skip
    none = np.zeros(0, np.int64)
    clock = ClockState(models, 5e8, 10**18, n * PEERS, n * PEERS * 20, "net", 10**9, 10**18,
                       1000, none, none, pos(), pos(), np.full(n, -1, np.int64))  # fmt: skip
    trust = ClockTrust(pos(), pos() * 1e-9, pos() * 1e5, pos() * 1e6, np.full(n, -1, np.int64))
    sig = rng.integers(0, 2**62, paths, dtype=np.int64)
    hops = rng.integers(0, 4 * n, (paths, WIDTH)).astype(np.int32)
    return FleetState(10**9, 10**9 - 1, paths > 0, clock, trust, 10**18, (),
                      np.zeros(hosts, np.int64), sig, hops, rng.normal(3000, 300, paths),
                      LearnedPaths.empty(WIDTH))  # fmt: skip


def main() -> None:
    """Print the sizes."""
    rng = np.random.default_rng(1)
    for n in (100_000, 300_000):
        fab = build_fabric(fleet_shape(n))
        nn, hosts, rows = len(fab.nics), len(fab.hosts), len(fab.nics) * PEERS
        paths = PathRows(rng.integers(0, nn, rows), rng.integers(0, nn, rows),
                         rng.integers(49152, 65536, rows),
                         rng.integers(0, fab.n_hops, (rows, WIDTH)).astype(np.int32))  # fmt: skip
        sizes = {
            "fabric": len(encode_fabric(fab)),
            f"fabric+{rows} paths": len(encode_fabric(fab, paths)),
            "models steady": len(encode_state(state(rng, nn, hosts, 0))),
            f"models {rows} baselines": len(encode_state(state(rng, nn, hosts, rows))),
        }
        print(f"{nn} NICs: " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sizes.items()))


if __name__ == "__main__":
    main()
