"""The staged fleet solve (`controller.fleet.edges.solve_blocks`): each edge owner runs the
per-edge stages on its own block, the solver only the network stages on what they return,
and the clock state is the one process's to the bit, with 1, 2 and 4 owners, on a window
with bad stamps and a clock step."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from controller.clocksolve import (
    ClockState,
    ClockSyncConfig,
    SampleWindow,
    compute_state,
    window_summary,
)
from controller.fleet.edges import EdgeStage, SummaryBlock, owner_bounds, solve_blocks, split_clock
from controller.fleet.stagewire import RemoteRange, StageCall, StageError, StageServer
from sync.edgestage import Candidates, EdgeFit, RangeStages, Residuals
from sync.excess import DirectionLows
from tests.edgewindow import NICS, STEPPED, stepped_window

I64 = np.ndarray
F64 = np.ndarray


class _Owner:
    """An owner's stages as the solver sees them over the wire: every call logged."""

    def __init__(self, inner: RangeStages, log: list[tuple[int, str]], owner: int) -> None:
        self.inner, self.log, self.owner = inner, log, owner

    @property
    def edges(self) -> I64:
        return self.inner.edges

    def _note(self, what: str) -> None:
        self.log.append((self.owner, what))

    def fit(self) -> EdgeFit:
        self._note("fit")
        return self.inner.fit()

    def drop_bad(self, drift: F64) -> bool:
        self._note("drop_bad")
        return self.inner.drop_bad(drift)

    def candidates(self, drift: F64, offset: F64, rtt_fractions: Sequence[float]) -> Candidates:
        self._note("candidates")
        return self.inner.candidates(drift, offset, rtt_fractions)

    def residuals(self, offset: F64, drift: F64) -> Residuals:
        self._note("residuals")
        return self.inner.residuals(offset, drift)

    def cut_nodes(self, nodes: I64) -> None:
        self._note("cut_nodes")
        self.inner.cut_nodes(nodes)

    def lows(self) -> DirectionLows:
        self._note("lows")
        return self.inner.lows()


def _blocks(w: SampleWindow, cfg: ClockSyncConfig, owners: int, t_ref: int) -> list[SummaryBlock]:
    """Each owner's block of the window's rows (its edges' rows summarized)."""
    none = (np.zeros((0, 2), np.int64), np.zeros(0))
    out = []
    for o, rows in enumerate(split_clock(w, owner_bounds(NICS, owners))):
        s = window_summary(SampleWindow(**rows.cols()), t_ref, cfg.coded_tol_hw_ns)
        lo, hi = int(rows.t1.min()), int(rows.t1.max())
        out.append(SummaryBlock(o, 3, len(rows), lo, hi, False, s, *none))
    return out


def _same_state(a: ClockState, b: ClockState) -> None:
    for f in ("offset_ns", "drift", "offset_std_ns", "drift_std", "known"):
        assert np.array_equal(getattr(a.models, f), getattr(b.models, f), equal_nan=True), f
    assert a.models.t_ref_ns == b.models.t_ref_ns
    assert np.array_equal(a.stepped, b.stepped) and np.array_equal(a.step_at_ns, b.step_at_ns)
    assert (a.estimator, a.n_pairs, a.n_samples, a.summary_points, a.span_ns) == (
        b.estimator, b.n_pairs, b.n_samples, b.summary_points, b.span_ns,
    )  # fmt: skip


@pytest.fixture(scope="module")
def one() -> tuple[SampleWindow, ClockSyncConfig, np.ndarray, ClockState, int]:
    w, cfg, leaf = stepped_window()
    t_lo, t_hi = int(w.t1.min()), int(w.t1.max())
    t_ref = t_lo + (t_hi - t_lo) // 2  # compute_state's
    st = compute_state(w, NICS, cfg, 7, leaf)
    assert st is not None and STEPPED in st.stepped
    return w, cfg, leaf, st, t_ref


@pytest.mark.parametrize("owners", [1, 2, 4])
def test_owners_stages_solve_as_one_process(
    one: tuple[SampleWindow, ClockSyncConfig, np.ndarray, ClockState, int], owners: int
) -> None:
    w, cfg, leaf, want, t_ref = one
    blocks = _blocks(w, cfg, owners, t_ref)
    log: list[tuple[int, str]] = []
    stages = [EdgeStage(NICS, cfg, b.owner).stages(b) for b in blocks]
    ranges = [_Owner(s, log, o) for o, s in enumerate(stages) if s is not None]
    # the shell hands the blocks in any order: the solver lays the owners' results in order
    got = solve_blocks(blocks[::-1], NICS, cfg, t_ref, 7, leaf=leaf, ranges=ranges[::-1])
    assert got is not None
    _same_state(got, want)
    calls = {what for _, what in log}
    assert {"fit", "drop_bad", "candidates", "residuals", "cut_nodes", "lows"} <= calls
    assert {o for o, _ in log} == set(range(owners))  # every owner ran its stages
    # the blocks' own stages (what a shell that ships summaries runs at the solver): the same
    plain = solve_blocks(blocks, NICS, cfg, t_ref, 7, leaf=leaf)
    assert plain is not None
    _same_state(plain, want)


def test_blocks_out_of_order_are_refused(
    one: tuple[SampleWindow, ClockSyncConfig, np.ndarray, ClockState, int],
) -> None:
    w, cfg, leaf, _, t_ref = one
    a, b = _blocks(w, cfg, 2, t_ref)
    b = SummaryBlock(0, b.window, b.rows, b.t_lo, b.t_hi, False, b.summary, b.raise_edges,
                     b.raised)  # fmt: skip
    a = SummaryBlock(1, a.window, a.rows, a.t_lo, a.t_hi, False, a.summary, a.raise_edges,
                     a.raised)  # fmt: skip
    with pytest.raises(ValueError, match="not disjoint"):
        solve_blocks([a, b], NICS, cfg, t_ref, 7, leaf=leaf)
    with pytest.raises(ValueError, match="one edge range per block"):
        solve_blocks([a, b], NICS, cfg, t_ref, 7, leaf=leaf, ranges=[None])


def test_the_rounds_over_bytes_solve_as_one_process_and_retries_are_answered_once(
    one: tuple[SampleWindow, ClockSyncConfig, np.ndarray, ClockState, int],
) -> None:
    w, cfg, leaf, want, t_ref = one
    blocks = _blocks(w, cfg, 4, t_ref)
    servers = [StageServer(3, s) for b in blocks if (s := EdgeStage(NICS, cfg, b.owner).stages(b))]

    def twice(server: StageServer) -> Callable[[bytes], bytes]:
        def send(call: bytes) -> bytes:  # every call sent again, as a retry after a time-out
            first = server.answer(call)
            assert server.answer(call) == first
            return first

        return send

    remote = [RemoteRange(3, b.summary.edges, twice(s))
              for b, s in zip(blocks, servers, strict=True) if b.summary is not None]  # fmt: skip
    got = solve_blocks(blocks, NICS, cfg, t_ref, 7, leaf=leaf, ranges=remote)
    assert got is not None
    _same_state(got, want)
    assert all(r.bytes_in > 0 for r in remote)


def test_stage_calls_that_cannot_be_answered_are_refused(
    one: tuple[SampleWindow, ClockSyncConfig, np.ndarray, ClockState, int],
) -> None:
    w, cfg, _, _, t_ref = one
    (b,) = _blocks(w, cfg, 1, t_ref)
    stages = EdgeStage(NICS, cfg, 0).stages(b)
    assert stages is not None
    server = StageServer(3, stages)
    z, no = np.zeros(0), np.zeros(0, np.int64)
    with pytest.raises(StageError, match="missed"):
        server.answer(StageCall(3, 1, "lows", z, z, no).encode())
    with pytest.raises(StageError, match="window"):
        server.answer(StageCall(4, 0, "fit", z, z, no).encode())
    with pytest.raises(StageError):
        server.answer(b"QPSC garbage")
    fit = StageCall(3, 0, "fit", z, z, no, (0.1,))
    assert StageCall.decode(fit.encode()).rtt_fractions == (0.1,)
    remote = RemoteRange(3, stages.edges, lambda _: server.answer(fit.encode()))
    remote.fit()  # call 0, answered
    with pytest.raises(StageError, match="not to call 1"):
        remote.lows()  # the transport answers call 0 again: not this call's reply
