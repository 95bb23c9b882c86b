"""A link's own loss is a finding only when it is more than chance: `loss_excess`
(`controller.detect.significance`), and the brain's use of it beside a down NIC."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from contract.documents import EventDoc
from controller.brain import Brain, BrainConfig
from controller.detect.queues import QueueParams
from controller.detect.significance import ProbedPairs, loss_excess
from controller.observations import Observations
from mesh.fabric import FabricShape, build_fabric
from mesh.fabric.ecmp import ROCEV2_PORT, flow_paths
from mesh.fabric.model import hop_id

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


def rows(*sets: tuple[int, ...]) -> I32:
    """Link sets as (m, K) rows, -1 padded."""
    width = max((len(s) for s in sets), default=1)
    return np.array([list(s) + [-1] * (width - len(s)) for s in sets], np.int32).reshape(-1, width)


def lost(times: int, links: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [links] * times


# links 0 (tested), 1 (a lossy switch egress), 2 (clean), 3 (dead: a NIC down)
OWN = np.array([0.0, 0.05, 0.0, 1.0])
NONE_GONE = np.zeros(4, bool)
GONE = np.array([False, False, False, True])


def test_the_expectation_is_over_every_probe_that_crossed_the_link() -> None:
    """200 probes cross link 0: 100 also cross link 1 (5 % of its own), 100 cross link 2
    (clean). Expected lost elsewhere: 100 x 0.05 = 5, plus the floor's 1 % of 200 = 2: 7. The
    lost probes (all on link 1's paths here) say nothing of the 100 that were not lost."""
    pairs, probes = rows((0, 1), (0, 2)), np.array([100, 100], np.int64)
    quiet = rows(*lost(12, (0, 1)))  # 12 lost: within 7 + 3 sqrt(7) = 14.9
    t = loss_excess(0, pairs, probes, quiet, OWN, NONE_GONE, floor=0.01, z=3.0)
    assert (t.probes, t.lost, t.expected) == (200, 12, pytest.approx(7.0))
    assert not t.significant
    found = rows(*lost(12, (0, 1)), *lost(4, (0, 2)))  # 16 lost: over it
    assert loss_excess(0, pairs, probes, found, OWN, NONE_GONE, floor=0.01, z=3.0).significant
    # a path of two lossy links loses 1 - (1 - 0.05)^2, not 0.1; the link itself not counted
    own = np.array([0.5, 0.05, 0.05, 0.0])
    t = loss_excess(0, rows((0, 1, 2)), np.array([100], np.int64), rows(), own, NONE_GONE,
                    floor=0.0, z=3.0)  # fmt: skip
    assert t.expected == pytest.approx(100 * (1 - 0.95**2))


def test_probes_through_a_dead_link_are_out_of_the_test() -> None:
    """Beside a dead link (a NIC down) whose 1,000 probes also cross link 0, all lost: link 0's
    own 10 % on its 100 other probes is found. Counted in (as expected lost, and as lost), they
    add ~1,000 to both sides, and the deviation the excess is measured in grows to ~32."""
    pairs, probes = rows((0, 2), (0, 3)), np.array([100, 1000], np.int64)
    sets = rows(*lost(10, (0, 2)), *lost(1000, (0, 3)))
    t = loss_excess(0, pairs, probes, sets, OWN, GONE, floor=0.005, z=3.0)
    assert (t.probes, t.lost, t.expected) == (100, 10, pytest.approx(0.5))
    assert t.significant
    counted = loss_excess(0, pairs, probes, sets, OWN, NONE_GONE, floor=0.005, z=3.0)
    assert not counted.significant  # what taking them out is for
    # the tested link itself dead elsewhere in the horizon does not take its own probes out
    assert loss_excess(0, pairs, probes, sets, OWN, ~NONE_GONE, floor=0.005, z=3.0).probes == 0
    only_self = np.array([True, False, False, False])
    assert loss_excess(0, pairs, probes, sets, OWN, only_self | GONE, floor=0.005, z=3.0) == t


def test_loss_excess_rejects_bad_input() -> None:
    pairs, probes = rows((0, 1)), np.array([10], np.int64)
    with pytest.raises(ValueError):
        loss_excess(4, pairs, probes, rows(), OWN, NONE_GONE, floor=0.01, z=3.0)
    with pytest.raises(ValueError):
        loss_excess(0, pairs, np.array([1, 2], np.int64), rows(), OWN, NONE_GONE, floor=0.01,
                    z=3.0)  # fmt: skip
    with pytest.raises(ValueError):
        loss_excess(0, pairs, probes, rows(), OWN, NONE_GONE[:2], floor=0.01, z=3.0)
    with pytest.raises(ValueError):
        loss_excess(0, pairs, probes, rows(), OWN, NONE_GONE, floor=0.01, z=-1.0)
    assert not loss_excess(2, pairs, probes, rows(), OWN, NONE_GONE, floor=0.0, z=0.0).significant


def test_probed_pairs_keep_the_horizon() -> None:
    held = ProbedPairs(1000)
    held.push(100, np.array([0, 1]), np.array([5, 6]))
    held.push(600, np.array([1]), np.array([7]))
    ids, n = held.pairs()
    assert ids.tolist() == [0, 1, 1] and n.tolist() == [5, 6, 7]
    held.push(1100, np.array([2]), np.array([1]))  # the window that ended at 100 is out
    assert held.pairs()[0].tolist() == [1, 2]
    with pytest.raises(ValueError):
        ProbedPairs(0)


# ---- the brain, in the namespace testbed's situation --------------------------------------
# `tests/test_testbed_run.py::test_run_discover_learns_the_plan_and_localizes` (seed 2): 3
# leaves x 2 NICs, 2 spines, 1 s windows; nic5 (under leaf2) down from 5.3 s, leaf0-spine1
# flapping from 5.6 s (1 s down, 2 s up): each down straddles two windows (40 % and 60 %
# of them), never a dead window, so the flap is found by its loss rate.
SMALL = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, spines=2))
SEC = 1_000_000_000
_N = len(SMALL.nics)
_S, _D = (a.ravel() for a in np.meshgrid(np.arange(_N), np.arange(_N), indexing="ij"))
_KEEP = _S != _D
_PORTS = np.arange(49152, 49152 + 8)
S_SRC = np.repeat(_S[_KEEP], len(_PORTS))
S_DST = np.repeat(_D[_KEEP], len(_PORTS))
S_SPORT = np.tile(_PORTS, int(_KEEP.sum()))
S_FWD = flow_paths(SMALL, S_SRC, S_DST, S_SPORT)
S_REV = flow_paths(SMALL, S_DST, S_SRC, ROCEV2_PORT, S_SPORT)


def crossing(link: str) -> npt.NDArray[np.bool_]:
    lk = SMALL.link_index[link]
    hops = np.concatenate([S_FWD, S_REV], axis=1)
    return np.asarray(np.isin(hops, (hop_id(lk, False), hop_id(lk, True))).any(axis=1))


def flap_down(t_ns: I64, start_s: float, down_s: float, up_s: float) -> npt.NDArray[np.bool_]:
    """True while a flap that started at ``start_s`` is in a down period."""
    phase = (t_ns / SEC - start_s) % (down_s + up_s)
    return (t_ns >= start_s * SEC) & (phase < down_s)


def small_window(
    k: int, rng: np.random.Generator, per_pair: int, *, nic_down: bool, flap: bool
) -> Observations:
    """Window ``k`` (1 s) of the small fabric's mesh, ``per_pair`` rounds of every pair's 8
    ports, sent at random times; nic5 down from 5.3 s, leaf0-spine1 flapping from 5.6 s."""
    reps = np.repeat(np.arange(len(S_SRC))[None, :], per_pair, axis=0).ravel()
    t = (k * SEC + rng.integers(0, SEC, len(reps))).astype(np.int64)
    lost = np.zeros(len(reps), bool)
    if nic_down:
        lost |= crossing("nic5-leaf2")[reps] & (t >= 5.3 * SEC)
    if flap:
        lost |= crossing("leaf0-spine1")[reps] & flap_down(t, 5.6, 1.0, 2.0)
    owd = 2000.0 + rng.exponential(100.0, len(reps))
    return Observations(
        t, S_SRC[reps].astype(np.int32), S_DST[reps].astype(np.int32),
        S_SPORT[reps].astype(np.int32), S_FWD[reps], S_REV[reps], lost,
        np.where(lost, np.nan, owd), np.where(lost, np.nan, owd), np.where(lost, np.nan, 2 * owd),
    )  # fmt: skip


def run_small(seed: int, *, report: bool) -> tuple[list[EventDoc], list[frozenset[str]]]:
    """Return the findings of 20 windows of the testbed's situation and each window's blamed
    links."""
    brain = Brain(SMALL, BrainConfig(lateness_ns=0, queues=QueueParams(warmup_ns=0)))
    rng = np.random.default_rng(seed)
    events: list[EventDoc] = []
    blamed = []
    for k in range(0, 20):
        if report and k >= 6:  # its host reads the carrier down (the testbed's prober does)
            brain.nic_links("host5", {"nic5": False}, k * SEC)
        brain.observe(small_window(k, rng, 1, nic_down=True, flap=True))
        events += brain.tick((k + 1) * SEC)
        blamed.append(brain.last_blamed)
    return events, blamed


@pytest.mark.parametrize("report", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_flapping_spine_link_beside_a_down_nic_is_found(seed: int, report: bool) -> None:
    """Lost probes cluster on paths through the dead NIC link; that link's losses explain none
    of the flapping link's on its other probes (the rule reverted in 85f10de read them as
    explained where a window held 40 % of a down). The flap is blamed in every window a down
    period overlaps, found, and nothing else is blamed but the NIC's link."""
    events, blamed = run_small(seed, report=report)
    targets = {e.target for e in events if e.kind != "clear"}
    assert "leaf0-spine1" in targets, [(e.t_ns / SEC, e.kind, e.target) for e in events]
    assert targets <= {"leaf0-spine1", "nic5-leaf2", "nic5", "host5"}, targets
    # downs 5.6-6.6, 8.6-9.6, ...: windows [5, 6) 40 %, [6, 7) 60 %, [8, 9) 40 %, ...
    downs = [k for k in range(20) if k % 3 in (2, 0) and k >= 5]
    missed = [k for k in downs if "leaf0-spine1" not in blamed[k]]
    assert not missed, missed
    first = min(e.t_ns for e in events if e.target == "leaf0-spine1")
    assert first <= 7 * SEC  # its first down (5.6-6.6 s) is found with the window ending at 7 s
