"""The per-hop queue estimate (additive tomography on medians), overflow read from a
standing queue, each link's own loss, and loss concentrated on a few flows."""

from __future__ import annotations

import numpy as np
import pytest

from controller.detect.congestion import CongestionParams, link_queue_ns, own_loss_rates
from controller.detect.flowloss import FlowLoss, FlowLossParams, poisson_tail
from controller.detect.queues import QueueEstimate, QueueParams, class_table, hop_classes, hop_ends
from controller.detect.queues import estimate_queues as _estimate
from tests.fullmesh import FAB, FWD, REV


def estimate_queues(
    hops: np.ndarray,  # type: ignore[type-arg]
    excess: np.ndarray,  # type: ignore[type-arg]
    cls: np.ndarray,  # type: ignore[type-arg]
    p: QueueParams,
) -> QueueEstimate:
    """One measurement per row of ``hops``: each row its own path."""
    return _estimate(np.arange(len(hops)), excess, class_table(hops, cls), cls, p)


def _excess(hops: np.ndarray, waits: dict[int, float], rng: np.random.Generator) -> np.ndarray:
    """Queueing per measurement: Exp(200 ns) on every hop, and Exp(mean) more on the hops of
    ``waits``."""
    q = rng.exponential(200.0, hops.shape) * (hops >= 0)
    for h, mean in waits.items():
        q += (hops == h) * rng.exponential(mean, hops.shape)
    return np.asarray(q.sum(axis=1), np.float64)


def test_a_hot_hop_is_found_and_its_neighbours_are_not() -> None:
    rng = np.random.default_rng(1)
    hops = np.concatenate([FWD, REV]).astype(np.int32)
    hot = 2 * FAB.link_index["leaf1-spine2"]  # leaf1 -> spine2
    cls = hop_classes(FAB)
    est = estimate_queues(hops, _excess(hops, {hot: 4000.0}, rng), cls, QueueParams())
    # the hot hop's median wait: Exp(4 µs) over Exp(200 ns): ~2.8 µs; the rest a few 100 ns
    assert est.queue_ns[hot] == pytest.approx(2900, rel=0.25)
    assert list(est.contended()) == [hot]
    others = np.delete(est.queue_ns, hot)
    assert np.nanmax(others) < 700


@pytest.mark.parametrize("standing_ns", [2e6, 6e6])
def test_a_standing_queue_of_milliseconds_stays_on_its_hop(standing_ns: float) -> None:
    """A queue of a few ms (a software-shaped link, a deep buffer) on one hop, on half the
    paths of its neighbours: its estimate is exact, not capped at the histogram's end or
    placed in a 5 % bin, so none of it is left for the neighbours to explain (a 6 ms queue read
    as 1 ms put the rest on the links beside it)."""
    rng = np.random.default_rng(4)
    hops = np.concatenate([FWD, REV]).astype(np.int32)
    hot = 2 * FAB.link_index["leaf1-spine2"]  # leaf1 -> spine2
    ex = _excess(hops, {}, rng) + np.where((hops == hot).any(axis=1), standing_ns, 0.0)
    est = estimate_queues(hops, ex, hop_classes(FAB), QueueParams())
    assert est.queue_ns[hot] == pytest.approx(standing_ns, rel=0.001)
    assert list(est.contended()) == [hot]
    assert np.nanmax(np.delete(est.queue_ns, hot)) < 700


def test_a_busy_fabric_is_not_contended_and_a_minority_of_bursts_is_not() -> None:
    """Every hop waits ~0.8 µs (load 0.9): no hop is contended although every path's queueing
    is over 1.5 µs; a fifth of one hop's probes waiting 20 µs (incast) is no standing queue."""
    rng = np.random.default_rng(2)
    hops = np.concatenate([FWD, REV]).astype(np.int32)
    ex = _excess(hops, {}, rng) * 4.0
    burst = 2 * FAB.link_index["nic5-leaf1"] + 1
    on = (hops == burst).any(axis=1) & (rng.random(len(hops)) < 0.2)
    ex[on] += rng.exponential(20_000.0, int(on.sum()))
    assert np.median(ex) > 1500
    est = estimate_queues(hops, ex, hop_classes(FAB), QueueParams())
    assert len(est.contended()) == 0


def test_hop_classes_are_crossed_at_most_once_per_path() -> None:
    cls = hop_classes(FAB)
    for hops in (FWD, REV):
        c = np.where(hops >= 0, cls[np.maximum(hops, 0)], -1)
        for row in c:
            seen = row[row >= 0]
            assert len(seen) == len(set(seen.tolist()))


def test_own_loss_takes_out_what_other_links_lose() -> None:
    """Link 0 loses 20 % of its probes itself; links 1 and 2 lose only what crosses link 0,
    and link 3 a background shared by everyone."""
    rng = np.random.default_rng(3)
    n = 20_000
    sets = np.stack([rng.integers(0, 3, n), np.full(n, 3)], axis=1)  # one of 0..2, and 3
    lost = (rng.random(n) < np.where(sets[:, 0] == 0, 0.2, 0.0)) | (rng.random(n) < 0.01)
    totals = np.bincount(sets.ravel(), minlength=4)
    own = own_loss_rates(totals, sets[lost].astype(np.int32), 30)
    assert own[0] == pytest.approx(0.2, abs=0.02)
    assert own[1] < 0.005 and own[2] < 0.005  # their share of the background is tiny
    assert own[3] == pytest.approx(0.01, abs=0.005)


def test_link_queue_adds_both_directions_and_nan_when_unmeasured() -> None:
    q = np.array([100.0, 200.0, np.nan, 50.0, np.nan, np.nan])
    lq = link_queue_ns(q)
    assert lq[0] == 300 and lq[1] == 50 and np.isnan(lq[2])
    with pytest.raises(ValueError):
        CongestionParams(max_loss=2.0)


def test_a_loss_concentrated_on_a_few_flows_is_told_from_a_spread_one() -> None:
    n_nics, n_flows, link = 64, 400, 7
    rng = np.random.default_rng(4)
    src = rng.integers(0, n_nics, n_flows).astype(np.int32)
    dst = ((src + 1 + rng.integers(0, n_nics - 1, n_flows)) % n_nics).astype(np.int32)
    sport = np.arange(n_flows, dtype=np.int32)
    path_links = np.array([[link, 1], [2, 3]], dtype=np.int32)  # path 0 crosses the link
    fwd, rev = np.zeros(n_flows, np.int64), np.ones(n_flows, np.int64)

    def run(rate: np.ndarray) -> FlowLoss:  # type: ignore[type-arg]
        fl = FlowLoss(n_nics, FlowLossParams())
        for _ in range(40):  # 4 s of probes, one per flow per window
            fl.add(src, dst, sport, fwd, rev, rng.random(n_flows) < rate)
            fl.decay(0.1)
        return fl

    spread = run(np.full(n_flows, 0.02)).spread(link, path_links)
    assert spread is not None and not spread.concentrated
    gray = np.where(np.arange(n_flows) < 20, 1.0, 0.0)  # 5 % of the flows, all dropped
    conc = run(gray).spread(link, path_links)
    assert conc is not None and conc.concentrated and conc.heavy == 20
    assert run(np.zeros(n_flows)).spread(link, path_links) is None  # nothing lost


def test_poisson_tail() -> None:
    assert poisson_tail(np.array([0.0]), 1)[0] == 0
    assert poisson_tail(np.array([2.0]), 1)[0] == pytest.approx(1 - np.exp(-2.0))
    assert poisson_tail(np.array([2.0]), 3)[0] == pytest.approx(1 - 5 * np.exp(-2.0))


def test_a_leaf_whose_every_uplink_queues_is_not_read_as_its_nics_links() -> None:
    """Every uplink of leaf0 queues 5 ms both ways (a testbed leaf with all uplinks congested):
    each of its NICs' paths but the few to the NICs beside it crosses one, so the NICs' own
    hops explain almost the same delays, and a cold start's first sweep put the queue there
    (the NIC hops come first). Only the paths inside the leaf tell the two apart: the lift
    (`hop_ends`) moves what all of a leaf's NIC hops share onto its uplinks when those paths
    show none of it."""
    rng = np.random.default_rng(5)
    hops = np.concatenate([FWD, REV]).astype(np.int32)
    ups = [lk.index for lk in FAB.links if lk.lower == "leaf0"]
    hot = np.array([2 * i for i in ups] + [2 * i + 1 for i in ups])
    ex = _excess(hops, {}, rng) + 5e6 * np.isin(hops, hot).any(axis=1)
    cls = hop_classes(FAB)
    ends = hop_ends(FAB)
    est = _estimate(np.arange(len(hops)), ex, class_table(hops, cls), cls, QueueParams(),
                    hop_ends=ends)  # fmt: skip
    assert sorted(est.contended()) == sorted(hot.tolist())
    nic_hops = [
        h for lk in FAB.links if lk.upper == "leaf0" for h in (2 * lk.index, 2 * lk.index + 1)
    ]
    assert np.nanmax(est.queue_ns[nic_hops]) < 700
    # without the lift the same data blame the leaf's NIC links
    plain = estimate_queues(hops, ex, cls, QueueParams())
    assert set(plain.contended().tolist()) & set(nic_hops)


def test_the_lift_leaves_a_nic_links_own_queue_on_it() -> None:
    """A queue on one NIC's uplink is seen by its paths inside the leaf too: nothing moves."""
    rng = np.random.default_rng(6)
    hops = np.concatenate([FWD, REV]).astype(np.int32)
    hot = 2 * FAB.link_index["nic1-leaf0"]
    ex = _excess(hops, {}, rng) + 5e6 * (hops == hot).any(axis=1)
    cls = hop_classes(FAB)
    est = _estimate(np.arange(len(hops)), ex, class_table(hops, cls), cls, QueueParams(),
                    hop_ends=hop_ends(FAB))  # fmt: skip
    assert list(est.contended()) == [hot]
    assert est.queue_ns[hot] == pytest.approx(5e6, rel=0.001)
