"""Brain on a two-NIC host (the recovery demo's shape): one NIC's link dies, its sibling lives.

Guards what the recovery demo needs from detection (docs/recovery.md): the dead NIC is
``nic_down`` on the NIC, never a silent host (its sibling keeps probing), whether its own
probes come back as losses or not at all, and its ``clear`` comes with the first window whose
probes cross its link again (a short flap must not look long to the remediation hold).
"""

from __future__ import annotations

import numpy as np
import pytest

from controller.brain import Brain, BrainConfig
from controller.observations import Observations
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths

FAB = build_fabric(FabricShape(leaves=2, hosts_per_leaf=1, nics_per_host=2, spines=1))
WIN = 1_000_000_000
N = len(FAB.nics)
_S, _D = (a.ravel() for a in np.meshgrid(np.arange(N), np.arange(N), indexing="ij"))
_KEEP = _S != _D
SRC = np.repeat(_S[_KEEP], 10)
DST = np.repeat(_D[_KEEP], 10)
SPORT = np.tile(np.arange(49152, 49162), int(_KEEP.sum()))
FWD = flow_paths(FAB, SRC, DST, SPORT)
REV = flow_paths(FAB, DST, SRC, ROCEV2_PORT, SPORT)


def window(k: int, dead: int | None, own: str) -> Observations:
    """Window ``k``: every NIC probes every other; NIC ``dead``'s link drops everything.
    ``own``: its own probes come back ``lost`` or not at all (``none``)."""
    n = len(SRC)
    lost = np.zeros(n, dtype=bool)
    keep = np.ones(n, dtype=bool)
    if dead is not None:
        lost = np.equal(SRC, dead) | np.equal(DST, dead)
        if own == "none":
            keep = np.not_equal(SRC, dead)
    t = k * WIN + np.random.default_rng(k).integers(0, WIN, n)
    owd = np.where(lost, np.nan, 2000.0)
    return Observations(
        t.astype(np.int64), SRC.astype(np.int32), DST.astype(np.int32), SPORT.astype(np.int32),
        FWD, REV, lost, owd, owd.copy(), 2 * owd,
    ).select(keep)  # fmt: skip


@pytest.mark.parametrize("own", ["lost", "none"])
def test_one_dead_nic_of_two_is_nic_down_then_clear_not_a_silent_host(own: str) -> None:
    assert [n.host for n in FAB.nics[:2]] == ["host0", "host0"]
    brain = Brain(FAB, BrainConfig(lateness_ns=0))
    events = []
    for k in range(20):
        brain.observe(window(k, 0 if 5 <= k < 11 else None, own))
        events += [(k, e.kind, e.target) for e in brain.tick((k + 1) * WIN)]
    assert events == [(5, "nic_down", "nic0"), (11, "clear", "nic0")]
    assert brain.hosts_down() == frozenset()
