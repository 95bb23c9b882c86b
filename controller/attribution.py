"""Why is this job slow? A job's step times against the fabric's findings (pure).

`JobPerf` folds the ranks' `contract.remediation.PerfDoc` reports of one job: the job's step
time is its slowest rank's (collectives go at the pace of the slowest), its baseline the
smallest job step time seen since every rank reported, its timeouts the sum over ranks.

`attribute(job, perf, findings, now_ns, cfg)` returns an `Attribution` when the job is slow
(step time at least ``cfg.slow_ratio`` times its baseline, or new collective timeouts since
``perf.seen_timeouts``), None otherwise. It names a fabric cause when it can, in this order:

1. a NIC of the job down or flapping (a ``nic_down`` / ``link_down`` / ``link_flap`` finding
   on the NIC or its link, not cleared since): ``"step time 3.0x; rank 1's nic3 link
   nic3-leaf1 is flapping"``;
2. contention whose affected queue pairs join two NICs of the job, preferring the pairs of its
   ring (rank k -> rank k+1, either way): ``"step time 3.0x; its ring crosses contended link
   leaf2->spine1 on queue pairs nic5->nic9"``;
3. contention on the NIC link of a job NIC (``leaf1->nic3``);
otherwise ``cause`` is ``unknown`` ("no fabric finding on its NICs or their paths"). Findings
older than ``cfg.window_ns`` are ignored. Nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from contract.documents import EventDoc
from contract.remediation import PerfDoc
from controller.jobs import Job

DOWN = ("nic_down", "link_down", "link_flap")
WHAT = {"nic_down": "is down", "link_down": "is down", "link_flap": "is flapping"}


@dataclass(frozen=True, slots=True)
class AttributionConfig:
    """``slow_ratio``: step time / baseline that counts as slow; ``window_ns``: how old a
    finding may be and still explain a slowdown."""

    slow_ratio: float = 1.5
    window_ns: int = 120_000_000_000

    def __post_init__(self) -> None:
        if not self.slow_ratio > 1.0 or self.window_ns <= 0:
            raise ValueError("slow_ratio must be > 1 and window_ns > 0")


@dataclass(frozen=True)
class JobPerf:
    """The latest report of each rank, the job's baseline and timeouts already explained."""

    ranks: Mapping[int, PerfDoc] = field(default_factory=dict)
    baseline_s: float | None = None
    seen_timeouts: int = 0

    @property
    def step_s(self) -> float | None:
        """Return the job's step time now: its slowest rank's (None without reports)."""
        return max((d.step_s for d in self.ranks.values()), default=None)

    @property
    def timeouts(self) -> int:
        """Return the collective timeouts reported by all ranks."""
        return sum(d.timeouts for d in self.ranks.values())

    def with_report(self, doc: PerfDoc, world: int = 1) -> JobPerf:
        """Return the state with ``doc`` folded in. The baseline is taken only once every
        one of the job's ``world`` ranks reported (a fast rank alone is not the job's pace)
        and never rises."""
        ranks = {**self.ranks, doc.rank: doc}
        new = replace(self, ranks=ranks)
        s = new.step_s
        if s is not None and len(ranks) >= world:
            base = s if self.baseline_s is None else min(self.baseline_s, s)
            new = replace(new, baseline_s=base)
        return new


@dataclass(frozen=True, slots=True)
class Attribution:
    """Why a job is slow: the figures, the cause (``fabric`` or ``unknown``), what."""

    job: str
    step_s: float
    baseline_s: float
    slowdown: float
    timeouts: int
    cause: str
    text: str
    links: tuple[str, ...] = ()
    flows: tuple[tuple[str, str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the attribution as JSON-ready values."""
        return {"step_s": self.step_s, "baseline_s": self.baseline_s,
                "slowdown": round(self.slowdown, 2), "timeouts": self.timeouts,
                "cause": self.cause, "text": self.text, "links": list(self.links),
                "flows": [{"src": s, "dst": d, "sport": p} for s, d, p in self.flows]}  # fmt: skip


def _nic(target: str) -> str:
    head = target.split("-", 1)[0]
    return head if head.startswith("nic") and head[3:].isdigit() else ""


def ring_pairs(job: Job) -> set[tuple[str, str]]:
    """Return the NIC pairs of the job's ring (rank k's NICs -> rank k+1's, both ways)."""
    out: set[tuple[str, str]] = set()
    n = len(job.ranks)
    for k in range(n if n > 1 else 0):
        for a in job.ranks[k]:
            for b in job.ranks[(k + 1) % n]:
                if a != b:
                    out |= {(a, b), (b, a)}
    return out


def _rank_of(job: Job, nic: str) -> int:
    return next(k for k, r in enumerate(job.ranks) if nic in r)


def attribute(
    job: Job,
    perf: JobPerf,
    findings: Iterable[EventDoc],
    now_ns: int,
    cfg: AttributionConfig | None = None,
) -> Attribution | None:
    """Return why ``job`` is slow (see the module docstring), or None when it is not."""
    cfg = cfg or AttributionConfig()
    step, base = perf.step_s, perf.baseline_s
    if step is None or base is None or base <= 0:
        return None
    ratio = step / base
    new_timeouts = perf.timeouts > perf.seen_timeouts
    if ratio < cfg.slow_ratio and not new_timeouts:
        return None
    head = f"step time {ratio:.1f}x"
    if new_timeouts:
        head += f", {perf.timeouts} collective timeouts"
    recent = sorted((f for f in findings if now_ns - f.t_ns <= cfg.window_ns),
                    key=lambda f: f.t_ns)  # fmt: skip
    nics = job.nics
    down: dict[str, tuple[str, str]] = {}  # NIC -> (finding kind, target), cleared removed
    for f in recent:
        nic = _nic(f.target)
        if nic in nics and f.kind in DOWN:
            down[nic] = (f.kind, f.target)
        elif nic in nics and f.kind == "clear":
            down.pop(nic, None)

    def out(cause: str, text: str, links: tuple[str, ...] = (),
            flows: tuple[tuple[str, str, int], ...] = ()) -> Attribution:  # fmt: skip
        return Attribution(job.id, step, base, ratio, perf.timeouts, cause, f"{head}; {text}",
                           links, flows)  # fmt: skip

    if down:
        nic = sorted(down, key=lambda n: (_rank_of(job, n), n))[0]
        kind, target = down[nic]
        what = f"link {target}" if target != nic else "NIC"
        return out("fabric", f"rank {_rank_of(job, nic)}'s {nic} {what} {WHAT[kind]}",
                   (target,))  # fmt: skip
    ring = ring_pairs(job)
    best: tuple[int, str, tuple[tuple[str, str, int], ...]] | None = None
    for f in reversed(recent):  # the newest first
        if f.kind != "contention":
            continue
        on_ring = tuple(fl for fl in f.flows if (fl[0], fl[1]) in ring)
        on_job = tuple(fl for fl in f.flows if fl[0] in nics and fl[1] in nics)
        score, flows = (2, on_ring) if on_ring else (1, on_job) if on_job else (0, ())
        if not flows and any(n in nics for n in f.target.split("->")):
            score = 1  # the NIC link of a job NIC
        if score and (best is None or score > best[0]):
            best = (score, f.target, flows)
    if best is not None:
        score, link, flows = best
        pairs = ", ".join(dict.fromkeys(f"{s}->{d}" for s, d, _ in flows))
        where = "its ring crosses" if score == 2 else "its traffic crosses"
        text = f"{where} contended link {link}" + (f" on queue pairs {pairs}" if pairs else "")
        return out("fabric", text, (link,), flows)
    return out("unknown", "no fabric finding on its NICs or their paths (look at the hosts)")
