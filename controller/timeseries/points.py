"""The time-series schema: controller values in, line-protocol points out (pure).

Measurements (metric names in VictoriaMetrics/Prometheus are ``<measurement>_<field>``;
full schema with units and series counts in docs/timeseries.md):

============== ======================================= ==================================
measurement    tags                                    fields
============== ======================================= ==================================
qpmesh_pair    src, dst, src_leaf, dst_leaf            owd_p50_ns, owd_p99_ns,
                                                       queue_p99_ns, samples
qpmesh_path    path, spine, src_leaf, dst_leaf         owd_p50_ns, owd_p99_ns, probes,
                                                       lost, loss_ratio
qpmesh_link    link, tier, leaf|nic, spine|super       state, worst_state, flaps, probes,
                                                       lost, loss_ratio, blamed_loss_ratio
qpmesh_nic     nic, host, leaf, group                  state, worst_state, worst_in_ns,
                                                       worst_out_ns
qpmesh_clock   nic, host                               offset_ns, uncertainty_ns
qpmesh_presence host                                   alive
qpmesh_gpu     host                                    ok, present
qpmesh_event   kind, target, severity                  count
qpmesh_remediation action, target, status              count
============== ======================================= ==================================

Tags are the fabric's low-cardinality identities; a probe's source port, flow label, QP
number and sequence never become tags. States are `mesh.snapshot.SEVERITY` codes
(0 up, 1 unknown, 2 degraded, 3 contended, 4 flapping, 5 down): ``state`` at the interval's
end, ``worst_state`` the worst of every tick in it (a NIC down for 3 s of a 10 s interval
shows). ``loss_ratio`` counts a lost probe against every link of its paths (not localized);
``blamed_loss_ratio`` is the same where the brain blamed the link for loss in the interval
(degraded, flapping or down at some tick) and 0 elsewhere: one flap lights one link.

`PointBuilder.render(state, summary, now_ns)` returns one interval's body (``pairs=False``
leaves out the per-pair series, the largest part at 10,000 NICs). It tracks prober
presence: the NICs of a host whose prober is gone (presence lost, or never seen) are not
written (their series stop and age out); the host's ``alive = 0`` is written for
``gone_after_ns`` after it left, then the host's series stop too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from controller.timeseries.lineproto import Point, to_line_protocol
from controller.timeseries.stats import IntervalSummary
from mesh.fabric import Fabric
from mesh.fabric.model import SWITCH_TIER
from mesh.snapshot import SEVERITY, GpuHealth, Health, MeshSnapshot

F64 = npt.NDArray[np.float64]
I8 = npt.NDArray[np.int8]
LOSS_VERDICTS = frozenset(SEVERITY[h] for h in (Health.DEGRADED, Health.FLAPPING, Health.DOWN))
"""The state codes that blame a link for loss."""

_ESC = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ "})


def _esc(s: str) -> str:
    return s.translate(_ESC)


@dataclass(frozen=True, slots=True)
class RemediationAction:
    """A remediation action as the time series records it: time, action kind, target (NIC or
    link), status (``issued``, or the policy's disposition: ``send``, ``would_have``,
    ``suppressed``). Other keys of an action document are ignored here."""

    t_ns: int
    action: str
    target: str
    status: str = "issued"

    def __post_init__(self) -> None:
        if not isinstance(self.t_ns, int) or isinstance(self.t_ns, bool) or self.t_ns < 0:
            raise ValueError("remediation action needs an integer t_ns >= 0")
        for name in ("action", "target", "status"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v or "\n" in v:
                raise ValueError(f"remediation action needs a one-line non-empty {name}")

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> RemediationAction:
        """Return the action of ``doc``; raises ValueError naming the missing or bad key.

        Takes the generic form (``t_ns``, ``action``, ``target``, ``status``) or the
        remediation policy's audit record (``controller.remediation.publish.audit_record``:
        ``t_ns``, ``kind`` = the action kind, ``nic`` or ``link``, ``disposition``)."""
        if not isinstance(doc, Mapping):
            raise ValueError("remediation action document must be an object")
        action = doc.get("action", doc.get("kind"))
        target = doc.get("target") or doc.get("nic") or doc.get("link")
        status = doc.get("status", doc.get("disposition", "issued"))
        if "t_ns" not in doc or action is None or target is None:
            missing = "t_ns" if "t_ns" not in doc else "action" if action is None else "target"
            raise ValueError(f"remediation action document lacks {missing!r}")
        return cls(doc["t_ns"], action, target, status)


@dataclass(frozen=True, eq=False)
class MeshState:
    """The controller values one interval writes (arrays indexed by NIC index)."""

    t_ns: int
    nic_health: tuple[Health, ...]
    worst_in_ns: F64
    worst_out_ns: F64
    clock_offset_ns: F64
    clock_uncertainty_ns: F64
    link_health: Mapping[str, Health] = field(default_factory=dict)
    flap_counts: Mapping[str, int] = field(default_factory=dict)
    gpu: Mapping[str, GpuHealth] = field(default_factory=dict)
    alive: Mapping[str, bool] = field(default_factory=dict)
    events: tuple[EventDoc, ...] = ()
    actions: tuple[RemediationAction, ...] = ()
    # the worst state code of each NIC / link (fabric order) over the interval's ticks, -1
    # where no tick judged it; None: not tracked (no worst_state, no blamed_loss_ratio)
    nic_worst: I8 | None = None
    link_worst: I8 | None = None

    @classmethod
    def from_snapshot(
        cls,
        snap: MeshSnapshot,
        alive: Mapping[str, bool],
        events: Sequence[EventDoc] = (),
        actions: Sequence[RemediationAction] = (),
        worst: tuple[I8, I8] | None = None,
    ) -> MeshState:
        """Return the state of ``snap`` with prober presence ``alive``, the new events and
        actions, and ``worst`` (NIC, link) state codes over the interval (`WorstStates`)."""
        return cls(
            snap.t_ns,
            snap.nic_health,
            snap.worst_in_ns,
            snap.worst_out_ns,
            snap.clock_offset_ns,
            snap.clock_uncertainty_ns,
            dict(snap.link_health),
            dict(snap.flap_counts),
            dict(snap.gpu),
            dict(alive),
            tuple(events),
            tuple(actions),
            None if worst is None else worst[0],
            None if worst is None else worst[1],
        )


def _num(v: float) -> str:
    """A delay in ns to 0.1 ns (short lines; the clock sync is not finer)."""
    return f"{v:.1f}"


def _ratio(v: float) -> str:
    return f"{v:.6g}"


class PointBuilder:
    """Renders intervals for one fabric; remembers when each host's prober left."""

    def __init__(
        self,
        fabric: Fabric,
        *,
        gone_after_ns: int = 300_000_000_000,
        pairs: bool = True,
        shift_ns: int = 0,
    ) -> None:
        if gone_after_ns < 0:
            raise ValueError("gone_after_ns must be >= 0")
        self.fabric = fabric
        self.pairs = pairs
        self.shift_ns = shift_ns  # added to every timestamp (the demo maps sim time to now)
        self.gone_after_ns = gone_after_ns
        self._left: dict[str, int] = {}
        f = fabric
        self._nic = [_esc(n.id) for n in f.nics]
        self._leaf = [_esc(n.leaf) for n in f.nics]
        self._nic_tags = [
            f"nic={_esc(n.id)},host={_esc(n.host)},leaf={_esc(n.leaf)},group={_esc(n.group)}"
            for n in f.nics
        ]
        self._clock_tags = [f"nic={_esc(n.id)},host={_esc(n.host)}" for n in f.nics]
        self._link_tags = [self._link_tag(i) for i in range(len(f.links))]
        self._link_nic = {int(lk): i for i, lk in enumerate(np.asarray(f.nic_link).tolist())}

    def _link_tag(self, i: int) -> str:
        f = self.fabric
        lk = f.links[i]
        lower = f.node_by_id.get(lk.lower)
        upper = f.node_by_id.get(lk.upper)
        lo_kind = lower.kind.value if lower is not None else "nic"
        if lk.lower in f.nic_index:
            lo_kind = "nic"
        up_kind = upper.kind.value if upper is not None else "switch"
        tier = f"{lo_kind}-{up_kind}"
        return f"link={_esc(lk.id)},tier={_esc(tier)},{_esc(lo_kind)}={_esc(lk.lower)},{_esc(up_kind)}={_esc(lk.upper)}"

    def present_hosts(self, alive: Mapping[str, bool], now_ns: int) -> tuple[set[str], set[str]]:
        """Return (hosts whose NICs are written, departed hosts whose ``alive=0`` is still
        written) and update the departure times."""
        present = {h for h, a in alive.items() if a}
        for h in present:
            self._left.pop(h, None)
        for h, a in alive.items():
            if not a:
                self._left.setdefault(h, now_ns)
        lingering = {h for h, t in self._left.items() if now_ns - t <= self.gone_after_ns}
        return present, lingering

    def render(
        self, state: MeshState, summary: IntervalSummary | None, now_ns: int | None = None
    ) -> bytes:
        """Return the line-protocol body of one interval: delays and loss of ``summary``
        (stamped with its end), states of ``state`` (stamped ``state.t_ns``), its events and
        actions (at their own times)."""
        now = state.t_ns if now_ns is None else now_ns
        f = self.fabric
        present, lingering = self.present_hosts(state.alive, now)
        nic_in = np.array([n.host in present for n in f.nics], dtype=bool)
        lines: list[str] = []
        if summary is not None:
            lines += self._delay_lines(summary, nic_in)
        lines += self._state_lines(state, nic_in, present, lingering, summary)
        pts = [
            Point("qpmesh_event", {"kind": e.kind, "target": e.target, "severity": e.severity},
                  {"count": 1}, e.t_ns + self.shift_ns)
            for e in state.events
        ]  # fmt: skip
        pts += [
            Point("qpmesh_remediation", {"action": a.action, "target": a.target,
                  "status": a.status}, {"count": 1}, a.t_ns + self.shift_ns)
            for a in state.actions
        ]  # fmt: skip
        body = ("\n".join(lines) + "\n").encode() if lines else b""
        return body + to_line_protocol(pts)

    def _delay_lines(self, s: IntervalSummary, nic_in: npt.NDArray[np.bool_]) -> list[str]:
        t = s.end_ns + self.shift_ns
        out: list[str] = []
        nic, leaf = self._nic, self._leaf
        keep = nic_in[s.pair_src] & nic_in[s.pair_dst] & self.pairs
        for a, b, p50, p99, q99, c in zip(
            s.pair_src[keep].tolist(), s.pair_dst[keep].tolist(),
            s.pair_p50_ns[keep].tolist(), s.pair_p99_ns[keep].tolist(),
            s.pair_queue_p99_ns[keep].tolist(), s.pair_samples[keep].tolist(), strict=True,
        ):  # fmt: skip
            q = f",queue_p99_ns={_num(q99)}" if not math.isnan(q99) else ""
            out.append(
                f"qpmesh_pair,dst={nic[b]},dst_leaf={leaf[b]},src={nic[a]},src_leaf={leaf[a]} "
                f"owd_p50_ns={_num(p50)},owd_p99_ns={_num(p99)}{q},samples={c}i {t}"
            )
        for lab, p50, p99, pr, lo in zip(
            s.path_label, s.path_p50_ns.tolist(), s.path_p99_ns.tolist(),
            s.path_probes.tolist(), s.path_lost.tolist(), strict=True,
        ):  # fmt: skip
            if not pr and math.isnan(p50):
                continue
            sw = lab.split(">")
            top = max(sw, key=lambda x: _tier(self.fabric, x))
            leaves = (
                f",dst_leaf={_esc(sw[-1])},src_leaf={_esc(sw[0])}"
                if _tier(self.fabric, sw[0]) == 1 and _tier(self.fabric, sw[-1]) == 1
                else ""
            )
            fields = [f"probes={pr}i", f"lost={lo}i"]
            if pr:
                fields.append(f"loss_ratio={_ratio(lo / pr)}")
            if not math.isnan(p50):
                fields += [f"owd_p50_ns={_num(p50)}", f"owd_p99_ns={_num(p99)}"]
            out.append(
                f"qpmesh_path,path={_esc(lab)},spine={_esc(top)}{leaves} {','.join(fields)} {t}"
            )
        return out

    def _state_lines(
        self,
        st: MeshState,
        nic_in: npt.NDArray[np.bool_],
        present: set[str],
        lingering: set[str],
        s: IntervalSummary | None,
    ) -> list[str]:
        t = st.t_ns + self.shift_ns
        f = self.fabric
        out: list[str] = []
        for i in np.flatnonzero(nic_in).tolist():
            fields = [f"state={SEVERITY[st.nic_health[i]]}i"]
            if st.nic_worst is not None:
                fields.append(
                    f"worst_state={max(int(st.nic_worst[i]), SEVERITY[st.nic_health[i]])}i"
                )
            for name, arr in (("worst_in_ns", st.worst_in_ns), ("worst_out_ns", st.worst_out_ns)):
                v = float(arr[i])
                if np.isfinite(v):
                    fields.append(f"{name}={_num(v)}")
            out.append(f"qpmesh_nic,{self._nic_tags[i]} {','.join(fields)} {t}")
            off, unc = float(st.clock_offset_ns[i]), float(st.clock_uncertainty_ns[i])
            if np.isfinite(off):
                u = f",uncertainty_ns={_num(unc)}" if np.isfinite(unc) else ""
                out.append(f"qpmesh_clock,{self._clock_tags[i]} offset_ns={_num(off)}{u} {t}")
        for i, lk in enumerate(f.links):
            nic = self._link_nic.get(i)
            if nic is not None and not nic_in[nic]:
                continue
            now_code = SEVERITY[st.link_health.get(lk.id, Health.UNKNOWN)]
            fields = [f"state={now_code}i", f"flaps={int(st.flap_counts.get(lk.id, 0))}i"]
            worst = None
            if st.link_worst is not None:
                worst = max(int(st.link_worst[i]), now_code)
                fields.append(f"worst_state={worst}i")
            if s is not None and i < len(s.link_probes):
                pr, lo = int(s.link_probes[i]), int(s.link_lost[i])
                fields += [f"probes={pr}i", f"lost={lo}i"]
                if pr:
                    fields.append(f"loss_ratio={_ratio(lo / pr)}")
                    if worst is not None:
                        blamed = lo / pr if worst in LOSS_VERDICTS else 0.0
                        fields.append(f"blamed_loss_ratio={_ratio(blamed)}")
            out.append(f"qpmesh_link,{self._link_tags[i]} {','.join(fields)} {t}")
        for h in sorted(present | lingering):
            out.append(f"qpmesh_presence,host={_esc(h)} alive={int(h in present)}i {t}")
        for h in sorted(present):
            g = st.gpu.get(h)
            if g is not None:
                out.append(
                    f"qpmesh_gpu,host={_esc(h)} ok={int(g.ok)}i,present={int(g.present)}i {t}"
                )
        return out


def _tier(fabric: Fabric, node: str) -> int:
    n = fabric.node_by_id.get(node)
    return SWITCH_TIER.get(n.kind, 0) if n is not None else 0
