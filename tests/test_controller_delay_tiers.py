"""Queueing delay in two tiers: a hop whose typical probe waits a few µs is contended; a hop
where a minority of probes wait longer (incast bursts) or all wait a little is not."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.brain import Brain, BrainConfig
from controller.detect.queues import QueueParams
from tests.fullmesh import DST, FAB, FWD, REV, SRC, WIN, mesh_window

HOP = 2 * FAB.link_index["leaf0-spine2"]  # leaf0 -> spine2
# queues measured from the first window, no warm-up (tested apart below)
CFG = BrainConfig(lateness_ns=0, queues=QueueParams(warmup_ns=0))
LEAF0_NICS = {lk.lower for lk in FAB.links if lk.upper == "leaf0"}


def owd(
    hops: npt.NDArray[np.int32], rng: np.random.Generator, share: float, mean_ns: float
) -> npt.NDArray[np.float64]:
    """Delays: 300 ns per hop, Exp(100 ns) per hop of queueing, and on ``HOP`` a share of
    the probes waits Exp(mean_ns) more."""
    n = len(hops)
    on = np.equal(hops, HOP).any(axis=1) & (rng.random(n) < share)
    base = 1000.0 + 300.0 * (hops >= 0).sum(axis=1)
    q = rng.exponential(100.0, hops.shape).sum(axis=1)
    return np.asarray(base + q + np.where(on, rng.exponential(mean_ns, n), 0.0), np.float64)


def run(
    share: float,
    mean_ns: float,
    windows: int = 30,
    coarse: range = range(0),
    clock_err_ns: float = 0.0,
    cfg: BrainConfig = CFG,
) -> list[EventDoc]:
    """Windows 10.. carry the queue; in windows ``coarse`` every delay is coarse (clocks
    certain to 2 µs only) and the clock of the NICs on leaf0 reads ``clock_err_ns`` late."""
    rng = np.random.default_rng(7)
    brain = Brain(FAB, cfg)
    out: list[EventDoc] = []
    leaf0 = np.array([nic.id in LEAF0_NICS for nic in FAB.nics])
    assert leaf0.sum() == 4
    for k in range(windows):
        s, m = (share, mean_ns) if k >= 10 else (0.0, 1.0)
        n = len(SRC)
        f, r = owd(FWD, rng, s, m), owd(REV, rng, s, m)
        is_coarse = np.full(n, k in coarse)
        if k in coarse:  # a late initiator clock: its probes look fast, its replies slow
            f -= np.where(leaf0[SRC], clock_err_ns, 0.0)
            r += np.where(leaf0[SRC], clock_err_ns, 0.0)
        brain.observe(mesh_window(k, rng, f, r, coarse=is_coarse))
        out += brain.tick((k + 1) * WIN)
    return out


def test_a_3us_queue_is_contention_on_its_hop() -> None:
    ev = run(1.0, 3000.0)  # 26 % of its probes over the 4 µs floor, 61 % over 1.5 µs
    assert [(e.kind, e.target) for e in ev] == [("contention", "leaf0->spine2")]
    assert ev[0].flows


def test_no_contention_from_the_queue_estimate_in_the_first_seconds() -> None:
    """A controller's first 3 s of judged delays (`QueueParams.warmup_ns`) set its paths'
    baselines from a few samples each; the estimate reports nothing then, and the same queue
    is found once they are over."""
    default = BrainConfig(lateness_ns=0)
    assert run(1.0, 3000.0, cfg=default) == []  # queue from 1 s to 3 s: inside the warm-up
    ev = run(1.0, 3000.0, windows=50, cfg=default)
    assert [(e.kind, e.target) for e in ev] == [("contention", "leaf0->spine2")]
    assert ev[0].t_ns > 30 * WIN


def test_incast_like_minority_bursts_and_small_queues_are_not() -> None:
    assert run(0.2, 5000.0) == []  # a fifth of the probes, 5 µs mean
    assert run(1.0, 400.0) == []  # everyone, 0.4 µs mean (a hot but healthy hop)


def test_coarse_delays_find_a_large_queue_with_the_slow_tier() -> None:
    """Delays whose clocks are certain only to 2 µs still show a 20 µs queue: judged by the
    slow tier, whose 4 µs floor their clock error stays under."""
    ev = run(1.0, 20_000.0, coarse=range(10, 30), clock_err_ns=1_400.0)
    assert [(e.kind, e.target) for e in ev] == [("contention", "leaf0->spine2")]


def test_coarse_delays_are_not_judged_by_the_moderate_tier() -> None:
    """A 3 µs queue is found by the moderate tier on fine delays (above) but not on coarse
    ones: their clock error may be as large as the moderate floor."""
    assert run(1.0, 3000.0, coarse=range(10, 30)) == []
    assert run(0.0, 1.0, coarse=range(10, 30), clock_err_ns=1_900.0) == []


def test_coarse_delays_set_no_baseline() -> None:
    """Coarse delays that read 1.9 µs low (a late clock) must not lower the paths' baselines:
    the fine delays after them would look 1.9 µs queued, over the moderate floor."""
    assert run(0.0, 1.0, coarse=range(0, 10), clock_err_ns=1_900.0) == []


def test_the_moderate_tier_goes_on_from_the_slow_tiers_picks() -> None:
    """A 20 µs queue on leaf0->spine2, seen behind uncertain clocks: every exchange of a leaf0
    NIC is coarse but those with leaf1, whose probes up leaf0->spine2 all come down
    spine2->leaf1. The slow tier blames leaf0->spine2 from all its delays. The moderate tier
    (fine delays only) sees that queue only on paths that also cross spine2->leaf1, where a
    minority of other leaves' probes also wait 2.5 µs: on its own it blamed spine2->leaf1 for
    both, a second explanation of probes the slow tier's pick already explains (how the
    namespace testbed's congestion raised contention on a healthy hop next to it)."""
    rng = np.random.default_rng(11)
    down = 2 * FAB.link_index["leaf1-spine2"] + 1
    assert FAB.hop_name(down) == "spine2->leaf1"
    leaf_of = np.array([int(nic.id.removeprefix("nic")) // 4 for nic in FAB.nics])
    a, b = leaf_of[SRC], leaf_of[DST]
    coarse = ((a == 0) | (b == 0)) & ~(((a == 0) & (b == 1)) | ((a == 1) & (b == 0)))
    brain = Brain(FAB, CFG)
    events: list[EventDoc] = []
    for k in range(30):
        n = len(SRC)
        s = 1.0 if k >= 10 else 0.0
        f, r = owd(FWD, rng, s, 20_000.0), owd(REV, rng, s, 20_000.0)
        if k >= 10:  # a third of the other leaves' probes down spine2->leaf1 wait 2.5 µs
            f += np.where(np.equal(FWD, down).any(axis=1) & (a != 0) & (rng.random(n) < 0.35),
                          2_500.0, 0.0)  # fmt: skip
            r += np.where(np.equal(REV, down).any(axis=1) & (b != 0) & (rng.random(n) < 0.35),
                          2_500.0, 0.0)  # fmt: skip
        brain.observe(mesh_window(k, rng, f, r, coarse=coarse & (k >= 10)))
        events += brain.tick((k + 1) * WIN)
    assert [(e.kind, e.target) for e in events] == [("contention", "leaf0->spine2")]


def test_a_link_queued_both_ways_says_so() -> None:
    """A link congested in both directions (the namespace testbed's `congest` runs a generator
    each way) is one contention event, on the direction with more slow delays, whose detail
    names the other direction too."""
    rng = np.random.default_rng(3)
    both_ways = (HOP, HOP ^ 1)
    brain = Brain(FAB, CFG)
    events: list[EventDoc] = []
    for k in range(20):
        n = len(SRC)
        f, r = owd(FWD, rng, 0.0, 1.0), owd(REV, rng, 0.0, 1.0)
        if k >= 10:
            f += np.where(np.isin(FWD, both_ways).any(axis=1), rng.exponential(20_000.0, n), 0.0)
            r += np.where(np.isin(REV, both_ways).any(axis=1), rng.exponential(20_000.0, n), 0.0)
        brain.observe(mesh_window(k, rng, f, r, coarse=np.zeros(n, dtype=bool)))
        events += brain.tick((k + 1) * WIN)
    assert [(e.kind, e.target in ("leaf0->spine2", "spine2->leaf0")) for e in events] == [
        ("contention", True)
    ]
    assert events[0].detail.startswith(
        (
            "queueing delay on leaf0->spine2 and spine2->leaf0",
            "queueing delay on spine2->leaf0 and leaf0->spine2",
        )
    )
