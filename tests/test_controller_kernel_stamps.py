"""Kernel (software) stamps: every delay carries the receiving host's stamp lateness less the
sending host's, per probe and larger on some hosts than on others. That jitter is no
contention on any hop, on a full mesh or when only a few NICs' delays are judged (a class of
NIC hops too small for a median); a 2 ms standing queue on one hop is still contention."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

from contract.documents import EventDoc
from controller.brain import Brain, BrainConfig
from controller.detect.queues import QueueParams
from tests.fullmesh import DST, FAB, FWD, REV, SRC, WIN, mesh_window

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
HOP = 2 * FAB.link_index["leaf0-spine2"]  # leaf0 -> spine2
CFG = BrainConfig(lateness_ns=0, queues=QueueParams(warmup_ns=0))  # no warm-up: see delay_tiers
N_NICS = len(FAB.nics)
# one NIC on each of leaf0, leaf1, leaf2, whose paths up leaf0 -> spine2 come down to both
# other leaves (so that their delays tell that hop from every other)
FEW = np.array([0, 5, 9])
CLOCK_ERR_NS = 700.0


@dataclass(frozen=True)
class Stamps:
    """Per NIC's host: mean lateness of its kernel receive and send stamps (ns), a constant
    per direction, and how far the clock solve placed its clock (ns) this second."""

    rx_scale: F64
    tx_scale: F64
    rx_bias: F64
    tx_bias: F64
    clock_err: F64

    def late(self, rng: np.random.Generator, a: I64, b: I64) -> F64:
        """Return what kernel stamps add to delays from NICs ``a`` to NICs ``b`` (ns): the
        receive stamp's lateness less the send stamp's, both Exp(the host's mean), and the
        two clocks' errors."""
        rx = rng.exponential(1.0, len(b)) * self.rx_scale[b] + self.rx_bias[b]
        tx = rng.exponential(1.0, len(a)) * self.tx_scale[a] + self.tx_bias[a]
        return np.asarray(rx - tx + self.clock_err[b] - self.clock_err[a], np.float64)


def owd(
    rng: np.random.Generator, hops: I32, a: I64, b: I64, standing_ns: float, st: Stamps | None
) -> F64:
    """Delays along ``hops``: 300 ns per hop, Exp(100 ns) of queueing per hop, ``standing_ns``
    more across ``HOP``, and kernel stamps' lateness (``st``; None: NIC stamps, exact)."""
    d = 1000.0 + 300.0 * (hops >= 0).sum(axis=1) + rng.exponential(100.0, hops.shape).sum(axis=1)
    d = d + np.where(np.equal(hops, HOP).any(axis=1), standing_ns, 0.0)
    return np.asarray(d if st is None else d + st.late(rng, a, b), np.float64)


def run(standing_ns: float, sw: bool = True, nics: I64 | None = None) -> list[EventDoc]:
    """30 windows of the full mesh (only the delays among ``nics``, if given: the others'
    clocks unknown); from window 10 every probe across ``HOP`` waits ``standing_ns`` more.
    Kernel stamps (``sw``) are late by Exp(mean) per stamp, the mean per host: 1-3 µs on
    receive and 0.25-0.75 µs on send (interrupt coalescing and scheduling differ by host),
    plus a constant per host and direction; each second a clock solve places every NIC's
    clock to N(0, ``CLOCK_ERR_NS``) (a solve on such stamps does no better). NIC stamps are
    exact."""
    rng = np.random.default_rng(5)
    scales = rng.uniform(1000.0, 3000.0, N_NICS), rng.uniform(250.0, 750.0, N_NICS)
    biases = rng.uniform(-500.0, 500.0, (2, N_NICS))
    src, dst = SRC.astype(np.int64), DST.astype(np.int64)
    keep = np.ones(len(src), bool) if nics is None else np.isin(src, nics) & np.isin(dst, nics)
    brain = Brain(FAB, CFG)
    out: list[EventDoc] = []
    n = len(src)
    st: Stamps | None = None
    for k in range(30):
        if sw and k % 10 == 0:
            st = Stamps(*scales, *biases, rng.normal(0.0, CLOCK_ERR_NS, N_NICS))
        q = standing_ns if k >= 10 else 0.0
        f = np.where(keep, owd(rng, FWD, src, dst, q, st), np.nan)
        r = np.where(keep, owd(rng, REV, dst, src, q, st), np.nan)
        brain.observe(mesh_window(k, rng, f, r, sw=np.full(n, sw)))
        out += brain.tick((k + 1) * WIN)
    return out


@pytest.mark.parametrize("nics", [None, FEW], ids=["full-mesh", "three-nics"])
def test_kernel_stamp_jitter_is_no_contention(nics: I64 | None) -> None:
    assert [(e.kind, e.target) for e in run(0.0, nics=nics)] == []


@pytest.mark.parametrize("nics", [None, FEW], ids=["full-mesh", "three-nics"])
@pytest.mark.parametrize("sw", [True, False], ids=["kernel", "nic"])
def test_a_2ms_standing_queue_is_contention_on_either_stamps(nics: I64 | None, sw: bool) -> None:
    ev = run(2_000_000.0, sw=sw, nics=nics)
    assert [(e.kind, e.target) for e in ev] == [("contention", "leaf0->spine2")]
