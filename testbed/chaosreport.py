"""What ``qpmesh testbed chaos`` recorded, judged (pure: plain values in, the report out).

`Observed` holds what the harness saw, each with its wall-clock arrival time (ns): probe
batches and presences from the broker, the controller's log lines, polls of the API and of
the time-series server, the agents' logs, the controller's events, the remediation actions
on the broker and their acks, and when each component fault was applied and undone.
`judge(observed, ...)` returns the report's chaos part:

- per component fault, its time to recover (`RECOVERY`: what "back" means for each part),
  measured from the restart (kill) or the end of the starvation;
- ``lost_records``: probe batches that no subscriber got, by batch sequence (`lost_batches`:
  a prober's sequence goes up by one per batch; a restarted prober starts at its start time
  in ms, far above, so a jump of more than `NEW_PROCESS_GAP` is a new process, not a loss),
  beyond what the probers' spool bound allows for the outages that happened;
- ``duplicate_actions`` (an action id twice, or a second action of one (kind, target, job)
  within one network fault's occurrence) and ``lost_actions`` (a localized occurrence the
  policy acts on without its action, and NIC actions no agent acknowledged);
- ``self_inflicted_findings``: findings caused by qpmesh's own faults (`self_inflicted`),
  ``self_inflicted_kinds`` how many of each kind;
- ``estimators.qpmesh``: precision / recall of the network faults in the simulator's shape
  (`testbed.runscore.score_alerts`), the expected ``prober_down`` of a killed prober left out;
  ``occurrences``: the same recall per occurrence of a repeated fault (`occurrences_found`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.chaos import ComponentFault
from testbed.runscore import NOT_ALERTS, score_alerts
from testbed.scenario import Fault, FaultKind
from testbed.scoring import cause_ok

SEC = 1_000_000_000
NEW_PROCESS_GAP = 1000
"""A batch_seq jump above this is a restarted prober (its sequence starts at its start in ms)."""
SLACK_NS = 5 * SEC
"""How long after a part recovered a finding is still laid at that part's door."""
LAG_OK_S = 2.5
"""The API's snapshot is this close to the wall clock when the controller keeps up (1 s ticks)."""
AGE_OK_S = 1.5
"""A prober keeps up when its batches reach the broker this soon after their newest probe."""
CLEAR_MARGIN_NS = 10 * SEC
"""A network fault's findings and actions count for its occurrence until this after its end."""
NOT_FINDINGS = frozenset((*NOT_ALERTS, "remediation_ack"))

RECOVERY = {
    "kill:controller": "its log says connected again and the API's snapshot is whole (every "
    "NIC's health known) again",
    "kill:broker": "every prober's batches arrive again and the controller says connected again",
    "kill:prober": "its presence says alive again and its batches arrive again",
    "kill:api": "the API answers again (its controller started another API process)",
    "kill:tsdb": "VictoriaMetrics answers /health again (what the writer buffered meanwhile: "
    "tsdb.missing_intervals)",
    "kill:agent": "the agent is connected to the broker again (its log says ready)",
    "starve:controller": "the API's snapshot is within 2.5 s of the wall clock again, 3 polls "
    "in a row (the controller's ticks keep up)",
    "starve:prober": "its batches reach the broker within 1.5 s of their newest probe again",
}


@dataclass(frozen=True, slots=True)
class Applied:
    """A component fault as applied: when (``at_ns``), when it was undone (restart, end of
    the starvation, 0: never; the API process is restarted by its controller: ``at_ns``)
    and how much the CPU limit throttled (periods, seconds)."""

    fault: ComponentFault
    at_ns: int
    undone_ns: int
    throttled: tuple[int, float] = (0, 0.0)


@dataclass(frozen=True, slots=True)
class Batch:
    """A probe batch as the broker delivered it."""

    at_ns: int
    origin: str
    seq: int
    records: int
    newest_ns: int


@dataclass(frozen=True, slots=True)
class Poll:
    """One poll of the API: did it answer, its snapshot's time, NICs of unknown health and the
    links not ``up`` (id -> state)."""

    at_ns: int
    ok: bool
    snap_ns: int = 0
    unknown_nics: int = 0
    links: tuple[tuple[str, str], ...] = ()


@dataclass
class Observed:
    """What the harness saw (see the module docstring); times are wall-clock ns."""

    t0_ns: int
    hosts: tuple[str, ...]
    applied: list[Applied] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    presence: list[tuple[int, str, bool]] = field(default_factory=list)
    controller_log: list[tuple[int, str]] = field(default_factory=list)
    api: list[Poll] = field(default_factory=list)
    tsdb: list[tuple[int, bool]] = field(default_factory=list)
    agent_log: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    agent_nics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    events: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    actions: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    acks: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


def _first(times: Sequence[int], after: int) -> int | None:
    return min((t for t in times if t > after), default=None)


def _back_prober(target: str, since: int, obs: Observed) -> int | None:
    alive = _first([t for t, h, up in obs.presence if h == target and up], since)
    batch = _first([b.at_ns for b in obs.batches if b.origin == target], since)
    return None if alive is None or batch is None else max(alive, batch)


def _connected(obs: Observed, since: int) -> int | None:
    return _first([t for t, msg in obs.controller_log if msg == "connected"], since)


def _back_broker(target: str, since: int, obs: Observed) -> int | None:
    firsts = [_first([b.at_ns for b in obs.batches if b.origin == h], since) for h in obs.hosts]
    conn = _connected(obs, since)
    if conn is None or any(t is None for t in firsts):
        return None
    return max([conn, *(t for t in firsts if t is not None)])


def _back_controller(target: str, since: int, obs: Observed) -> int | None:
    conn = _connected(obs, since)
    whole = [p.at_ns for p in obs.api if p.ok and p.unknown_nics == 0]
    snap = _first(whole, since) if conn is not None else None
    return None if conn is None or snap is None else max(conn, snap)


def _caught_up(target: str, since: int, obs: Observed) -> int | None:
    polls = [p for p in obs.api if p.at_ns > since]
    for i in range(len(polls) - 2):
        run = polls[i : i + 3]
        if all(p.ok and (p.at_ns - p.snap_ns) / SEC < LAG_OK_S for p in run):
            return run[0].at_ns
    return None


def _fresh(b: Batch) -> bool:
    return (b.at_ns - b.newest_ns) / SEC < AGE_OK_S


_BACK: dict[str, Callable[[str, int, Observed], int | None]] = {
    "kill:prober": _back_prober,
    "kill:broker": _back_broker,
    "kill:controller": _back_controller,
    "kill:api": lambda _t, since, obs: _first([p.at_ns for p in obs.api if p.ok], since),
    "kill:tsdb": lambda _t, since, obs: _first([t for t, ok in obs.tsdb if ok], since),
    "kill:agent": lambda target, since, obs: _first(
        [t for t, m in obs.agent_log.get(target, []) if m == "ready"], since
    ),
    "starve:controller": _caught_up,
    "starve:prober": lambda target, since, obs: _first(
        [b.at_ns for b in obs.batches if b.origin == target and _fresh(b)], since
    ),
}


def recovered_ns(a: Applied, obs: Observed) -> int | None:
    """Return when the part of ``a`` was back (`RECOVERY`), None if it never was."""
    f = a.fault
    back = _BACK.get(f"{f.op}:{f.component}")
    return None if back is None else back(f.target, a.undone_ns or a.at_ns, obs)


def lost_batches(batches: Sequence[Batch]) -> dict[str, list[tuple[int, int, int]]]:
    """Return per origin its gaps: (arrival of the batch after the gap, first missing seq,
    how many) within each prober process (`NEW_PROCESS_GAP`)."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    first_at: dict[tuple[str, int], int] = {}
    for b in batches:
        key = (b.origin, b.seq)
        first_at[key] = min(first_at.get(key, b.at_ns), b.at_ns)
    by_origin: dict[str, list[int]] = {}
    for origin, seq in first_at:
        by_origin.setdefault(origin, []).append(seq)
    for origin, seqs in by_origin.items():
        seqs.sort()
        gaps = [(first_at[(origin, b)], a + 1, b - a - 1) for a, b in itertools.pairwise(seqs)
                if 1 < b - a <= NEW_PROCESS_GAP]  # fmt: skip
        if gaps:
            out[origin] = gaps
    return out


def _window(a: Applied, rec: int | None) -> tuple[int, int]:
    end = max(rec or 0, a.undone_ns, a.at_ns)
    return a.at_ns - SEC, end + SLACK_NS


def _occurrences(faults: Sequence[Fault], t0_ns: int) -> list[tuple[Fault, int, int]]:
    return [(f, t0_ns + round(f.start_s * SEC), t0_ns + round((f.start_s + f.duration_s) * SEC))
            for f in faults]  # fmt: skip


def _ends(name: str) -> frozenset[str]:
    for sep in ("->", "-"):
        if sep in name:
            return frozenset(name.replace(" ", "").split(sep)[:2])
    return frozenset((name,))


def self_inflicted(
    obs: Observed, faults: Sequence[Fault], windows: Mapping[str, tuple[int, int]]
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """Return (the findings qpmesh's own faults caused, the expected findings of them).

    A finding (an event other than `NOT_FINDINGS`) is expected when it is the ``prober_down``
    of a prober that was killed, inside that fault's window. It is self-inflicted when it
    is a ``prober_down`` of a prober nobody killed; a finding no network fault explains
    (target and cause, `testbed.scoring.cause_ok`) inside a component fault's window; a
    finding raised again while it was still open (a restarted controller re-raising what its
    predecessor had raised); or one open when the controller was killed that nobody ever
    cleared although no network fault on its target was on at the end (forgotten: the event
    stream keeps it open for good). Each carries ``cause``: the component fault whose window
    holds it (or "none"); for the last two, the controller's kill."""
    named = _applied_by_name(obs)
    killed = {
        a.fault.target: k
        for k, a in named.items()
        if a.fault.op == "kill" and a.fault.component == "prober"
    }
    kills = sorted((a.at_ns, k) for k, a in named.items()
                   if a.fault.op == "kill" and a.fault.component == "controller")  # fmt: skip
    out: list[dict[str, Any]] = []
    expected: list[tuple[int, dict[str, Any]]] = []
    open_: dict[tuple[str, str], str] = {}  # (kind, target) -> "" or the kill it outlived
    stream = [(at, 1, e) for at, e in obs.events] + [(t, 0, {"_kill": k}) for t, k in kills]

    def row(at: int, kind: str, target: str, why: str, cause: str) -> dict[str, Any]:
        return {"t_s": round((at - obs.t0_ns) / SEC, 2), "kind": kind, "target": target,
                "why": why, "cause": cause}  # fmt: skip

    for at, _, e in sorted(stream, key=lambda x: (x[0], x[1])):
        if "_kill" in e:
            open_ = {key: v or str(e["_kill"]) for key, v in open_.items()}
            continue
        kind, target = str(e.get("kind")), str(e.get("target", ""))
        if kind == "clear":
            for key in [k for k in open_ if _ends(k[1]) == _ends(target)]:
                del open_[key]
            continue
        if kind in NOT_FINDINGS or "action" in e:
            continue
        cause = next((k for k, (lo, hi) in windows.items() if lo <= at <= hi), "none")
        why = ""
        if kind == "prober_down":
            k = killed.get(target)
            if k is not None and windows[k][0] <= at <= windows[k][1]:
                expected.append((at, e))
            else:
                why = "prober_down of a prober nobody killed"
                if k is not None:
                    why += " (outside its kill's window)"
        elif (kind, target) in open_:
            if open_[(kind, target)]:
                cause = open_[(kind, target)]
                why = "raised again after the controller's restart (its predecessor raised it)"
            else:
                why = "raised again while open"
        elif cause != "none" and not any(
            _ends(target) == _ends(f.target) and cause_ok(f.kind, kind) for f in faults
        ):
            why = "explained by no network fault"
        open_[(kind, target)] = ""
        if why:
            out.append(row(at, kind, target, why, cause))
    end = max((b.at_ns for b in obs.batches), default=obs.t0_ns)
    on_at_end = [f.target for f, lo, hi in _occurrences(faults, obs.t0_ns) if lo <= end <= hi]
    for (kind, target), kill in sorted(open_.items()):
        if kill and not any(_ends(target) == _ends(t) for t in on_at_end):
            why = "open when the controller was killed, never cleared (forgotten)"
            out.append(row(end, kind, target, why, kill))
    return out, expected


def _applied_by_name(obs: Observed) -> dict[str, Applied]:
    out: dict[str, Applied] = {}
    for a in obs.applied:
        name = a.fault.name
        k, n = name, 2
        while k in out:
            k, n = f"{name}#{n}", n + 1
        out[k] = a
    return out


def judge_actions(obs: Observed, faults: Sequence[Fault]) -> dict[str, Any]:
    """Return the remediation part: actions sent, acked, ``duplicate_actions`` and
    ``lost_actions`` with their lists (see the module docstring)."""
    occ = _occurrences(faults, obs.t0_ns)
    ids: dict[str, int] = {}
    dup: list[dict[str, Any]] = []
    per_occ: dict[tuple[int, str, str, str], int] = {}
    spurious = []
    for at, a in sorted(obs.actions, key=lambda x: x[0]):
        aid = str(a.get("id"))
        ids[aid] = ids.get(aid, 0) + 1
        kind, target, job = str(a.get("kind")), str(a.get("target")), str(a.get("job", ""))
        if ids[aid] > 1:
            dup.append({"id": aid, "kind": kind, "target": target, "why": "id sent again"})
            continue
        hit = [i for i, (f, lo, hi) in enumerate(occ)
               if lo <= at <= hi + CLEAR_MARGIN_NS and _ends(target) & _ends(f.target)]  # fmt: skip
        if not hit:
            spurious.append({"t_s": round((at - obs.t0_ns) / SEC, 2), "id": aid, "kind": kind,
                             "target": target})  # fmt: skip
            continue
        key = (hit[0], kind, target, job)
        per_occ[key] = per_occ.get(key, 0) + 1
        if per_occ[key] > 1:
            dup.append({"id": aid, "kind": kind, "target": target, "job": job,
                        "why": "a second action in one fault occurrence"})  # fmt: skip
    lost: list[dict[str, Any]] = []
    found = {(i, str(e.get("target"))) for at, e in obs.events for i, (f, lo, hi) in enumerate(occ)
             if e.get("kind") == "contention" and lo <= at <= hi + CLEAR_MARGIN_NS
             and _ends(str(e.get("target"))) == _ends(f.target)}  # fmt: skip
    for i, target in sorted(found):
        if occ[i][0].kind == FaultKind.CONGEST and not any(
            k[0] == i and k[1] == "report_contention" for k in per_occ
        ):
            lost.append({"fault": f"congest {occ[i][0].target} at {occ[i][0].start_s:g} s",
                         "why": f"contention on {target} found, no report_contention sent"})  # fmt: skip
    acked = {str(k.get("action")) for _, k in obs.acks}
    nic_owner = {n: ag for ag, nics in obs.agent_nics.items() for n in nics}
    for _, a in obs.actions:
        if str(a.get("target")) in nic_owner and str(a.get("id")) not in acked:
            lost.append({"id": a.get("id"), "kind": a.get("kind"), "target": a.get("target"),
                         "why": f"not acknowledged by {nic_owner[str(a.get('target'))]}"})  # fmt: skip
    return {
        "sent": len(ids),
        "acked": len(acked & set(ids)),
        "duplicate_actions": len(dup),
        "lost_actions": len(lost),
        "duplicates": dup,
        "lost": lost,
        "outside_faults": spurious,
    }


def occurrences_found(obs: Observed, faults: Sequence[Fault]) -> dict[str, Any]:
    """Return each network fault occurrence's localization: found when a finding on its
    target with a right cause (`testbed.scoring.cause_ok`) was raised between its start and
    `CLEAR_MARGIN_NS` after its end, or was raised before and still open at its start (the
    estimators' P/R match findings to faults by target alone, whenever raised: a repeated
    fault missed once still counts found there). ``found``, ``of``, ``recall``, ``missed``."""
    found: list[bool] = []
    missed: list[str] = []
    stream = sorted(obs.events, key=lambda x: x[0])
    for f, lo, hi in _occurrences(faults, obs.t0_ns):
        open_at_lo = False
        hit = False
        for at, e in stream:
            kind, target = str(e.get("kind")), str(e.get("target", ""))
            if _ends(target) != _ends(f.target) or "action" in e:
                continue
            if at < lo:
                if kind == "clear":
                    open_at_lo = False
                elif kind not in NOT_FINDINGS and cause_ok(f.kind, kind):
                    open_at_lo = True
            elif at <= hi + CLEAR_MARGIN_NS and kind not in NOT_FINDINGS and cause_ok(f.kind, kind):
                hit = True
                break
        found.append(hit or open_at_lo)
        if not found[-1]:
            missed.append(f"{f.kind.value} {f.target} at {f.start_s:g} s")
    return {
        "found": sum(found),
        "of": len(found),
        "recall": round(sum(found) / len(found), 4) if found else 1.0,
        "missed": missed,
    }


def forgotten(obs: Observed, a: Applied, rec: int | None, faults: Sequence[Fault]) -> list[str]:
    """Return the links a killed controller had open (not ``up`` in the API's last answer
    before the kill) whose network fault was still on when it had recovered, and that its
    successor's first whole snapshot showed ``up``."""
    if rec is None:
        return []
    before = [p for p in obs.api if p.ok and p.at_ns < a.at_ns]
    after = [p for p in obs.api if p.ok and p.unknown_nics == 0 and p.at_ns >= rec]
    if not before or not after:
        return []
    was = dict(before[-1].links)
    now = dict(after[0].links)
    still = {f.target for f, lo, hi in _occurrences(faults, obs.t0_ns) if lo <= rec <= hi}
    return sorted(lk for lk in was if lk not in now and any(_ends(lk) == _ends(t) for t in still))


def judge(
    obs: Observed,
    faults: Sequence[Fault],
    *,
    spool_batches: int,
    batch_interval_s: float,
) -> dict[str, Any]:
    """Return the chaos part of the report (see the module docstring). ``faults``: the
    network faults (start times from the scenario's start); ``spool_batches`` and
    ``batch_interval_s``: the probers' spool bound and batch period."""
    rows = []
    windows: dict[str, tuple[int, int]] = {}
    allowed = 0
    gaps = lost_batches(obs.batches)
    for name, a in _applied_by_name(obs).items():
        rec = recovered_ns(a, obs)
        windows[name] = _window(a, rec)
        since = a.undone_ns or a.at_ns
        row: dict[str, Any] = {
            "fault": name,
            **a.fault.to_dict(),
            "applied_t_s": round((a.at_ns - obs.t0_ns) / SEC, 2),
            "recovered": rec is not None,
            "recover_s": None if rec is None else round((rec - since) / SEC, 2),
            "outage_s": None if rec is None else round((rec - a.at_ns) / SEC, 2),
            "recovery": RECOVERY[f"{a.fault.op}:{a.fault.component}"],
        }
        if a.fault.op == "starve":
            row["throttled_periods"], row["throttled_s"] = a.throttled[0], round(a.throttled[1], 2)
        lo, hi = windows[name]
        row["lost_batches"] = sum(n for g in gaps.values() for at, _, n in g if lo <= at <= hi)
        if a.fault.component == "controller" and a.fault.op == "kill":
            row["unjudged_batches"] = sum(
                1 for b in obs.batches if a.at_ns <= b.at_ns <= (rec or hi)
            )
            row["forgotten_findings"] = forgotten(obs, a, rec, faults)
        outage_batches = ((rec or hi) - a.at_ns) / SEC / batch_interval_s
        if a.fault.component == "broker":
            allowed += max(0, int(outage_batches) - spool_batches) * len(obs.hosts)
        rows.append(row)
    lost_n = sum(n for g in gaps.values() for _, _, n in g)
    per_batch = _records_per_batch(obs.batches)
    found, expected = self_inflicted(obs, faults, windows)
    acts = judge_actions(obs, faults)
    alerts = [(str(e.get("kind")), str(e.get("target", ""))) for at, e in obs.events
              if e.get("kind") not in NOT_FINDINGS and "action" not in e
              and not any(at == x and e is y for x, y in expected)]  # fmt: skip
    return {
        "t0_ns": obs.t0_ns,
        "timeline": [
            f"{(at - obs.t0_ns) / SEC:7.2f} s {e.get('kind')} {e.get('target')}"
            for at, e in sorted(obs.events, key=lambda x: x[0])
            if e.get("kind") not in ("remediation", "remediation_ack")
        ],
        "component_faults": rows,
        "lost_batches": lost_n,
        "lost_records": round(lost_n * per_batch),
        "lost_beyond_bound": max(0, lost_n - allowed),
        "lost_gaps": {
            o: [
                {"after_t_s": round((at - obs.t0_ns) / SEC, 2), "first_seq": s, "batches": n}
                for at, s, n in g
            ]
            for o, g in gaps.items()
        },
        "spool_bound": {
            "batches": spool_batches,
            "seconds": spool_batches * batch_interval_s,
            "note": "a prober keeps this many unacknowledged batches (oldest "
            "dropped beyond): a broker outage longer than that loses the excess",
        },
        "self_inflicted_findings": len(found),
        "self_inflicted_kinds": _count_kinds(found),
        "self_inflicted": found,
        "expected_findings": [
            {
                "t_s": round((at - obs.t0_ns) / SEC, 2),
                "kind": e.get("kind"),
                "target": e.get("target"),
            }
            for at, e in expected
        ],
        "estimators": {"qpmesh": score_alerts(faults, alerts)},
        "occurrences": occurrences_found(obs, faults),
        "duplicate_actions": acts["duplicate_actions"],
        "lost_actions": acts["lost_actions"],
        "actions": acts,
    }


def _count_kinds(found: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Return how many of ``found`` each finding kind has (e.g. the ``contention`` on a
    healthy hop apart from the rest: on the testbed's kernel stamps, another defect)."""
    out: dict[str, int] = {}
    for x in found:
        out[str(x["kind"])] = out.get(str(x["kind"]), 0) + 1
    return dict(sorted(out.items()))


def _records_per_batch(batches: Sequence[Batch]) -> float:
    sizes = sorted(b.records for b in batches)
    return float(sizes[len(sizes) // 2]) if sizes else 0.0
