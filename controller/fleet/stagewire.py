"""The rounds of the staged clock solve as bytes: what the solver sends an edge owner and what
comes back (`controller.fleet.edges.solve_blocks`, `sync.summarysolve.solve_ranges`).

The solver's side is `RemoteRange`, a `sync.edgestage.RangeStages` whose every stage is a
call (`StageCall`: the solve window, the call's number in that window's solve, the stage and
the node vectors it needs) handed to a transport (bytes in, bytes out) and answered by the
owner's `StageServer`, which runs the stage on its `sync.edgestage.EdgeRange` and encodes the
per-edge arrays it returns. A call repeated (the same number: a retry) is answered from the
server's last reply, not run again (`drop_bad` and `cut_nodes` change the range); a call
that skips a number is refused (`StageError`: the owner missed one and cannot answer). All
frames are the fleet's columnar frame (`controller.fleet.codec`); decoded arrays have the
dtypes they were sent with, so a solve over bytes is the solve in one process to the bit
(tests/test_fleet_edgefit.py). The NATS shell would carry these frames by request and reply
(docs/scale.md, "The rounds on NATS"): not wired. Pure: bytes in, bytes out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.fleet.codec import CodecError, pack, unpack
from sync.edgestage import Candidates, EdgeFit, RangeStages, Residuals
from sync.excess import DirectionLows
from sync.pairfit import PairFits

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
CALL_MAGIC, REPLY_MAGIC, WIRE_VERSION = b"QPSC", b"QPSR", 1
STAGES = ("fit", "drop_bad", "candidates", "residuals", "cut_nodes", "lows")
_FITS = ("offset_ns", "drift", "offset_std_ns", "drift_std", "floor_ns", "n_fwd", "n_rev")


class StageError(CodecError):
    """A stage frame this version cannot read or a call the owner cannot answer (one line)."""


@dataclass(frozen=True, eq=False)
class StageCall:
    """One stage asked of one owner: solve ``window``, call number ``seq`` of that solve,
    ``stage`` (one of `STAGES`), and what it needs (``drift``/``offset`` per NIC, ``nodes``
    for ``cut_nodes``, ``rtt_fractions`` for ``candidates``; empty where unused)."""

    window: int
    seq: int
    stage: str
    drift: F64
    offset: F64
    nodes: I64
    rtt_fractions: tuple[float, ...] = ()

    def encode(self) -> bytes:
        """Return the call as bytes (`decode` reads them back)."""
        head = {"window": self.window, "seq": self.seq, "stage": self.stage,
                "rtt_fractions": list(self.rtt_fractions)}  # fmt: skip
        return pack(CALL_MAGIC, WIRE_VERSION, head,
                    {"drift": self.drift, "offset": self.offset, "nodes": self.nodes})  # fmt: skip

    @classmethod
    def decode(cls, data: bytes) -> StageCall:
        """Return the call of ``data``. Raises `StageError` on a malformed frame."""
        head, cols = _unpack(data, CALL_MAGIC)
        window, seq, stage = head.get("window"), head.get("seq"), head.get("stage")
        fr = head.get("rtt_fractions")
        if not (_is_int(window) and _is_int(seq) and stage in STAGES and isinstance(fr, list)
                and all(isinstance(q, float) for q in fr)):  # fmt: skip
            raise StageError("call head needs integer window and seq, a known stage, fractions")
        assert isinstance(window, int) and isinstance(seq, int) and isinstance(stage, str)
        return cls(window, seq, stage, _take(cols, "drift", "<f8"), _take(cols, "offset", "<f8"),
                   _take(cols, "nodes", "<i8"), tuple(fr))  # fmt: skip


class StageServer:
    """An owner's side of one solve window's rounds: its range's stages run on calls, each
    reply kept so that a repeated call gets it again. Not thread-safe."""

    def __init__(self, window: int, stages: RangeStages) -> None:
        self.window, self.stages = window, stages
        self._seq = -1
        self._last = b""

    def answer(self, data: bytes) -> bytes:
        """Return the reply to the call ``data``. Raises `StageError` on a malformed call,
        one of another window, or one that skips a number."""
        call = StageCall.decode(data)
        if call.window != self.window:
            raise StageError(f"call of window {call.window}, this range is of {self.window}")
        if call.seq == self._seq:
            return self._last
        if call.seq != self._seq + 1:
            raise StageError(f"call {call.seq} after {self._seq}: a call was missed")
        cols: dict[str, npt.NDArray[Any]] = {}
        head: dict[str, Any] = {"stage": call.stage, "seq": call.seq}
        r = self.stages
        if call.stage == "fit":
            cols = _fit_cols(r.fit())
        elif call.stage == "drop_bad":
            head["dropped"] = r.drop_bad(call.drift)
        elif call.stage == "candidates":
            c = r.candidates(call.drift, call.offset, call.rtt_fractions)
            head["n"] = len(c.cands)
            cols = {"usable": c.usable, "shift_term": c.shift_term, "env_floor": c.env_floor}
            cols |= {f"cand{i}": a for i, a in enumerate(c.cands)}
            cols |= {f"excess{i}": a for i, a in enumerate(c.excess)}
        elif call.stage == "residuals":
            cols = dict(r.residuals(call.offset, call.drift)._asdict())
        elif call.stage == "cut_nodes":
            r.cut_nodes(call.nodes)
        else:
            cols = dict(r.lows()._asdict())
        self._seq, self._last = call.seq, pack(REPLY_MAGIC, WIRE_VERSION, head, cols)
        return self._last


class RemoteRange:
    """The solver's side: a `sync.edgestage.RangeStages` for one owner's range of ``edges``
    whose stages are calls through ``send`` (a call's bytes in, the reply's bytes out).
    Raises `StageError` from a stage whose reply is malformed or not its own."""

    def __init__(self, window: int, edges: I64, send: Callable[[bytes], bytes]) -> None:
        self.window, self._edges, self.send = window, edges, send
        self._seq = 0
        self.bytes_in = 0  # the replies' bytes so far

    @property
    def edges(self) -> I64:
        return self._edges

    def _call(
        self, stage: str, drift: F64 | None = None, offset: F64 | None = None,
        nodes: I64 | None = None, rtt_fractions: Sequence[float] = (),
    ) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:  # fmt: skip
        z = np.zeros(0)
        call = StageCall(self.window, self._seq, stage, z if drift is None else drift,
                         z if offset is None else offset,
                         np.zeros(0, np.int64) if nodes is None else nodes,
                         tuple(float(q) for q in rtt_fractions))  # fmt: skip
        reply = self.send(call.encode())
        self.bytes_in += len(reply)
        head, cols = _unpack(reply, REPLY_MAGIC)
        if head.get("stage") != stage or head.get("seq") != self._seq:
            raise StageError(f"reply is not to call {self._seq} ({stage})")
        self._seq += 1
        return head, cols

    def fit(self) -> EdgeFit:
        _, cols = self._call("fit")
        kw = {k: _take(cols, k) for k in _FITS}
        fits = PairFits(**kw, status=_take(cols, "status", "|u1").astype(np.int8))
        return EdgeFit(fits, _take(cols, "line", "<f8"))

    def drop_bad(self, drift: F64) -> bool:
        head, _ = self._call("drop_bad", drift=drift)
        if not isinstance(head.get("dropped"), bool):
            raise StageError("drop_bad reply without a boolean 'dropped'")
        return bool(head["dropped"])

    def candidates(self, drift: F64, offset: F64, rtt_fractions: Sequence[float]) -> Candidates:
        head, cols = self._call("candidates", drift, offset, rtt_fractions=rtt_fractions)
        n = head.get("n")
        if not _is_int(n):
            raise StageError("candidates reply without a count")
        assert isinstance(n, int)
        return Candidates(_take(cols, "usable", "|b1"), _take(cols, "shift_term", "<f8"),
                          [_take(cols, f"cand{i}", "<f8") for i in range(n)],
                          [_take(cols, f"excess{i}", "<f8") for i in range(n)],
                          _take(cols, "env_floor", "<f8"))  # fmt: skip

    def residuals(self, offset: F64, drift: F64) -> Residuals:
        _, cols = self._call("residuals", drift, offset)
        return Residuals(*(_take(cols, k) for k in Residuals._fields))

    def cut_nodes(self, nodes: I64) -> None:
        self._call("cut_nodes", nodes=np.asarray(nodes, np.int64))

    def lows(self) -> DirectionLows:
        _, cols = self._call("lows")
        return DirectionLows(*(_take(cols, k) for k in DirectionLows._fields))


def _fit_cols(f: EdgeFit) -> dict[str, npt.NDArray[Any]]:
    cols: dict[str, npt.NDArray[Any]] = {k: getattr(f.fits, k) for k in _FITS}
    cols["status"] = f.fits.status.astype(np.uint8)  # statuses are small and >= 0
    cols["line"] = f.line
    return cols


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _unpack(data: bytes, magic: bytes) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    try:
        _, head, cols = unpack(data, magic, frozenset({WIRE_VERSION}))
    except CodecError as exc:
        raise StageError(str(exc)) from None
    return head, cols


def _take(cols: dict[str, npt.NDArray[Any]], name: str, dt: str | None = None) -> Any:
    """Column ``name`` as a writable array (of dtype ``dt`` when given). Raises `StageError`
    when it is missing or of another dtype or not 1-d."""
    a = cols.get(name)
    if a is None or a.ndim != 1 or (dt is not None and a.dtype.str != dt):
        raise StageError(f"column {name} missing or not {dt or 'an array'} 1-d")
    return np.array(a)
