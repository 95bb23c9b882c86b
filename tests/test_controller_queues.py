"""The per-hop queue estimate (additive tomography on medians), overflow read from a
standing queue, each link's own loss, and loss concentrated on a few flows."""

from __future__ import annotations

import numpy as np
import pytest

from controller.detect.congestion import CongestionParams, link_queue_ns, own_loss_rates
from controller.detect.flowloss import FlowLoss, FlowLossParams, poisson_tail
from controller.detect.queues import (
    QueueEstimate,
    QueueParams,
    class_table,
    hop_classes,
    hop_ends,
    sign_tail,
)
from controller.detect.queues import estimate_queues as _estimate
from mesh.fabric import Fabric, FabricShape, build_fabric
from mesh.fabric.ecmp import flow_paths
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


def _small_leaf_mesh() -> tuple[Fabric, np.ndarray, np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    """`netns_small`'s fabric (3 leaves x 2 NICs, 2 spines): every NIC to every other on 8
    source ports, 6 probes each; returns the fabric, each probe's directed hops, source and
    destination leaf."""
    fab = build_fabric(FabricShape(leaves=3, hosts_per_leaf=2, spines=2, nics_per_host=1))
    n = len(fab.nics)
    s, d = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    keep = s != d
    src, dst = np.repeat(s[keep], 8), np.repeat(d[keep], 8)
    sport = np.tile(49152 + 997 * np.arange(8), int(keep.sum()))
    hops = np.repeat(flow_paths(fab, src, dst, sport).astype(np.int32), 6, axis=0)
    return fab, hops, np.repeat(src // 2, 6), np.repeat(dst // 2, 6)


def _split_queue(
    fab: Fabric,
    hops: np.ndarray,  # type: ignore[type-arg]
    sl: np.ndarray,  # type: ignore[type-arg]
    dl: np.ndarray,  # type: ignore[type-arg]
    seed: int,
    kept: float = 0.2,
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:  # type: ignore[type-arg]
    """leaf1-spine0 queued 7 ms both ways; a share ``kept`` of the delays from or to leaf0
    kept (its NICs' clocks mostly not trusted). Returns the kept hops, their queueing and
    the hop ids."""
    hid = {fab.hop_name(h): h for h in range(fab.n_hops)}
    rng = np.random.default_rng(seed)
    keep = ((sl != 0) & (dl != 0)) | (rng.random(len(hops)) < kept)
    h = hops[keep]
    ex = _excess(h, {}, rng) + 7e6 * np.isin(h, [hid["leaf1->spine0"], hid["spine0->leaf1"]]).any(
        axis=1
    )
    return h, ex, hid


def test_a_queue_the_sweeps_split_onto_a_partner_hop_is_moved_back() -> None:
    """The fresh-clone failure of 55d1110 (`netns_small`, leaf1-spine0 congested 7 ms both
    ways, leaf0's NICs' clocks mostly not trusted): spine0 -> leaf1 crossed almost all of
    leaf2 -> spine0's delays, and the sweeps, started from the last window's split of a
    growing queue, left 1.7 ms of it on leaf2 -> spine0: its delays to leaf0, which show none,
    are outvoted in its median, as leaf0's delays to leaf1 are in spine0 -> leaf1's. Those
    are the pair's separating delays: the step between sweeps moves the queue back."""
    fab, hops, sl, dl = _small_leaf_mesh()
    h, ex, hid = _split_queue(fab, hops, sl, dl, 7)
    up, down, wrong = hid["leaf1->spine0"], hid["spine0->leaf1"], hid["leaf2->spine0"]
    cls, tab, ends = hop_classes(fab), class_table(h, hop_classes(fab)), hop_ends(fab)
    warm = np.zeros(fab.n_hops)
    warm[[up, down, wrong]] = 7e6, 5.3e6, 1.7e6  # the last window's split of a rising queue
    for start in (warm, None):  # a cold start put all of it on leaf2 -> spine0 (class first)
        est = _estimate(np.arange(len(h)), ex, tab, cls, QueueParams(), start, hop_ends=ends)
        assert est.queue_ns[down] == pytest.approx(7e6, rel=0.01)
        assert est.queue_ns[wrong] < 2000
        assert wrong not in est.contended().tolist() and up in est.contended().tolist()


def test_a_split_the_sweeps_keep_is_not_placed_on_the_hop() -> None:
    """With one sweep (no step between sweeps) the warm split stays: leaf2 -> spine0 is over
    its threshold, but its delays that avoid spine0 -> leaf1 show no queue: not contended."""
    fab, hops, sl, dl = _small_leaf_mesh()
    h, ex, hid = _split_queue(fab, hops, sl, dl, 7, kept=0.1)
    up, down, wrong = hid["leaf1->spine0"], hid["spine0->leaf1"], hid["leaf2->spine0"]
    cls = hop_classes(fab)
    warm = np.zeros(fab.n_hops)
    warm[[up, down, wrong]] = 7e6, 5.3e6, 1.7e6
    est = _estimate(np.arange(len(h)), ex, class_table(h, cls), cls, QueueParams(sweeps=1),
                    warm, hop_ends=hop_ends(fab))  # fmt: skip
    assert est.queue_ns[wrong] > 1e6 and est.over()[wrong]
    assert not est.placed()[wrong] and wrong not in est.contended().tolist()
    assert up in est.contended().tolist()


def test_a_hop_whose_own_delays_show_its_queue_stays_contended() -> None:
    """Neither step touches a queue that is the hop's own: leaf2 -> spine0 queues 3 ms, and
    its few delays to leaf0 show it as its delays to leaf1 do."""
    fab, hops, sl, dl = _small_leaf_mesh()
    hid = {fab.hop_name(h): h for h in range(fab.n_hops)}
    hot = hid["leaf2->spine0"]
    rng = np.random.default_rng(8)
    keep = ((sl != 0) & (dl != 0)) | (rng.random(len(hops)) < 0.2)
    hops = hops[keep]
    ex = _excess(hops, {}, rng) + 3e6 * (hops == hot).any(axis=1)
    cls = hop_classes(fab)
    est = _estimate(np.arange(len(hops)), ex, class_table(hops, cls), cls, QueueParams(),
                    hop_ends=hop_ends(fab))  # fmt: skip
    assert est.contended().tolist() == [hot]
    assert est.queue_ns[hot] == pytest.approx(3e6, rel=0.01)
    assert est.placed().all()


def test_a_queue_on_hops_every_path_crosses_together_stays_on_the_first() -> None:
    """Aliases (every path that crosses one crosses the other) are no partners: their queue,
    put on the group's first hop, is contended there though no delay separates them."""
    rng = np.random.default_rng(9)
    hops = np.concatenate([FWD, REV]).astype(np.int32)
    hot = 2 * FAB.link_index["leaf1-spine2"]
    hops = np.where(hops == 2 * FAB.link_index["leaf0-spine0"], -1, hops)  # a free hop id
    twin = 2 * FAB.link_index["leaf0-spine0"]
    hops = np.concatenate([hops, np.where((hops == hot).any(axis=1), twin, -1)[:, None]], axis=1)
    ex = _excess(hops, {}, rng) + 5e6 * (hops == hot).any(axis=1)
    cls = hop_classes(FAB)
    cls[twin] = 6  # a class of its own: a path crosses each class at most once
    est = _estimate(np.arange(len(hops)), ex, class_table(hops, cls), cls, QueueParams(),
                    aliases=[(min(hot, twin), max(hot, twin))])  # fmt: skip
    first = min(hot, twin)
    assert est.contended().tolist() == [first]
    assert est.queue_ns[first] == pytest.approx(5e6, rel=0.001)


def test_sign_tail() -> None:
    assert sign_tail(6, 6) == pytest.approx(1 / 64)
    assert sign_tail(6, 0) == 1.0
    assert sign_tail(6, 7) == 0.0
    assert sign_tail(10, 5) == pytest.approx(638 / 1024)
    assert sign_tail(400, 230) == pytest.approx(0.0015, rel=0.15)  # normal approximation
