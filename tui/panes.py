"""Pure text for the screen's panes: header, status line, legend, NIC detail and events.

Each function takes a snapshot (and the view state or selected NIC) and returns a Rich `Text`;
nothing reads a clock: times are shown relative to the snapshot's ``t_ns``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from rich.style import Style
from rich.text import Text

from contract.documents import EventDoc
from mesh.snapshot import Health, MeshSnapshot, PairPaths
from tui.render import (
    HEALTH_BG,
    HEAT_CHARS,
    HEAT_STYLES,
    fmt_bps,
    fmt_ns,
    heat_row,
    sparkline,
    tile_look,
)
from tui.view import Mode, ViewState, job_name

BOLD = Style(bold=True)
UNKNOWN_COLOUR = HEALTH_BG[Health.UNKNOWN]  # the unknown tile's colour
DIM = Style(dim=True)


def header_text(snap: MeshSnapshot) -> Text:
    """Return the header: healthy/total NICs, then how many are unknown (nothing measured
    them lately) and unhealthy, average throughput, Control, running jobs."""
    n = len(snap.nic_health)
    healthy, unknown, bad = snap.healthy_count, snap.unknown_count, snap.unhealthy_count
    t = Text()
    t.append("Healthy NICs ", DIM)
    t.append(f"{healthy}/{n}", Style(bold=True, color="green" if healthy == n else "red"))
    t.append(" · ", DIM)
    t.append(f"{unknown} unknown", Style(bold=bool(unknown), color=UNKNOWN_COLOUR))
    t.append(" · ", DIM)
    t.append(f"{bad} unhealthy", Style(bold=bool(bad), color="red" if bad else None))
    t.append("  Avg NIC throughput ", DIM)
    t.append(fmt_bps(snap.throughput_bps), BOLD)
    t.append("  Control ", DIM)
    if snap.control_enabled is None:
        t.append("unavailable", Style(italic=True))
    else:
        t.append("Enabled" if snap.control_enabled else "Disabled", BOLD)
    t.append("  Running jobs ", DIM)
    t.append("unavailable" if snap.jobs is None else str(len(snap.jobs)), BOLD)
    return t


@dataclass(frozen=True, slots=True)
class Connection:
    """A remote source's link to its controller: ``url``, ``connected``; when it is not,
    ``reason``, when the next attempt starts (``retry_at_s``) and when the data on screen
    arrived (``since_s``), both on the caller's monotonic clock in s."""

    url: str
    connected: bool
    reason: str = ""
    retry_at_s: float | None = None
    since_s: float | None = None


def connection_text(conn: Connection, now_s: float) -> Text:
    """Return the connection state: ``live <url>``, or ``DISCONNECTED, retrying in N s``
    with the reason and how old the data on screen is."""
    t = Text()
    if conn.connected:
        t.append("● live ", Style(color="green", bold=True))
        t.append(conn.url, DIM)
        return t
    t.append("✖ DISCONNECTED, retrying", Style(color="red", bold=True, reverse=True))
    if conn.retry_at_s is not None:
        t.append(f" in {max(0.0, conn.retry_at_s - now_s):.0f} s", Style(color="red", bold=True))
    t.append(f"  {conn.url}", DIM)
    if conn.reason:
        t.append(f"  ({conn.reason})", DIM)
    if conn.since_s is not None:
        t.append(f"  data shown is {max(0.0, now_s - conn.since_s):.0f} s old", Style(bold=True))
    return t


def status_text(
    snap: MeshSnapshot,
    view: ViewState,
    *,
    conn: Connection | None = None,
    now_s: float = 0.0,
    note: str = "",
) -> Text:
    """Return the mode / alerts / window / threshold line with the key that changes each,
    then the connection state of a remote source (``conn`` at ``now_s``) and ``note`` (the
    last refusal, e.g. of Control), if any."""
    t = Text()
    t.append("[m] Mode ", DIM)
    if view.mode == Mode.WORKLOAD and snap.jobs:
        t.append(f"Workload: {job_name(snap.jobs[view.job], view.job)}", BOLD)
    else:
        t.append("Fleet", BOLD)
        if snap.jobs is None:
            t.append(" (Workload unavailable)", DIM)
    t.append("  [a] Alerts ", DIM)
    t.append(str(view.alerts), BOLD)
    t.append("  [w] Window ", DIM)
    t.append(view.window_label, BOLD)
    t.append("  Threshold ", DIM)
    t.append(fmt_ns(view.threshold_ns), BOLD)
    if conn is not None:
        t.append("\n")
        t.append_text(connection_text(conn, now_s))
    if note:
        t.append("\n" if conn is None else "  ")
        t.append(note, Style(color="yellow", bold=True))
    return t


def legend_text(threshold_ns: float) -> Text:
    """Return the legend: tile kinds with their markers and the delay threshold split."""
    t = Text()
    thr = fmt_ns(threshold_ns)
    items = [
        ("NIC", tile_look(Health.UP, 0.0, threshold_ns)),
        (f">{thr}", tile_look(Health.UP, threshold_ns * 2, threshold_ns)),
        ("down", tile_look(Health.DOWN, 0.0, threshold_ns)),
        ("unknown", tile_look(Health.UNKNOWN, 0.0, threshold_ns)),
        ("flapping", tile_look(Health.FLAPPING, 0.0, threshold_ns)),
        ("contended", tile_look(Health.CONTENDED, 0.0, threshold_ns)),
        ("NCCL job member", tile_look(Health.UP, 0.0, threshold_ns, job_member=True)),
    ]
    for label, look in items:
        t.append(f"  {look.mark}", look.style)
        t.append(f" {label} ")
    t.append("  delay ")
    t.append(HEAT_CHARS[1], HEAT_STYLES[1])
    t.append(f"<={thr} ")
    t.append(HEAT_CHARS[3], HEAT_STYLES[3])
    t.append(f">{thr}")
    return t


def pair_vectors(
    snap: MeshSnapshot, nic: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Return (row, column) of the one-way delay matrix for ``nic``: delays to each NIC and
    from each NIC, NaN where no pair was probed."""
    n = len(snap.nic_health)
    row = np.full(n, np.nan)
    col = np.full(n, np.nan)
    out = snap.owd_src == nic
    row[snap.owd_dst[out]] = snap.owd_ns[out]
    inn = snap.owd_dst == nic
    col[snap.owd_src[inn]] = snap.owd_ns[inn]
    return row, col


def path_breakdown(snap: MeshSnapshot, nic: int) -> dict[str, tuple[float, float]]:
    """Return per spine/path: (worst outbound delay, worst inbound delay) of ``nic`` (NaN = none)."""
    out: dict[str, list[float]] = defaultdict(lambda: [np.nan, np.nan])
    po = snap.path_owd
    items = po.touching(nic) if isinstance(po, PairPaths) else po.items()
    for (s, d), per in items:
        if nic not in (s, d):
            continue
        k = 0 if s == nic else 1
        for path, v in per.items():
            cur = out[path][k]
            out[path][k] = v if np.isnan(cur) else max(cur, v)
    return {p: (v[0], v[1]) for p, v in sorted(out.items())}


def detail_text(
    snap: MeshSnapshot,
    nic: int | None,
    history: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None,
    view: ViewState,
    width: int,
) -> Text:
    """Return the selected NIC's detail: identity, health, clock, GPU, heat row/column,
    per-path delays and a sparkline of its worst delay over the window."""
    t = Text()
    if nic is None or not 0 <= nic < len(snap.nic_health):
        t.append("No NIC selected: move with arrows/hjkl, Enter or click selects.", DIM)
        return t
    info = snap.fabric.nics[nic]
    health = snap.nic_health[nic]
    look = tile_look(health, 0.0, view.threshold_ns)
    t.append(f"{info.id}", BOLD)
    t.append(f"  {info.host}  {info.address}  {info.group}/{info.leaf}  ")
    t.append(f"{look.mark.strip() or '+'} {health}", look.style)
    t.append("\n")
    t.append("worst in ", DIM)
    t.append(fmt_ns(float(snap.worst_in_ns[nic])))
    t.append("  out ", DIM)
    t.append(fmt_ns(float(snap.worst_out_ns[nic])))
    t.append("\nclock offset ", DIM)
    unc = float(snap.clock_uncertainty_ns[nic])
    # an infinite uncertainty: the clock is not yet confirmed by two agreeing solves, and
    # its one-way delays are held back (controller.clocksync)
    unc_txt = "not yet confirmed" if math.isinf(unc) else f"± {fmt_ns(unc)}"
    t.append(f"{fmt_ns(float(snap.clock_offset_ns[nic]))} {unc_txt}")
    gpu = snap.gpu.get(info.host)
    t.append("  GPU ", DIM)
    if gpu is None:
        t.append("unknown", DIM)
    elif not gpu.present:
        t.append("none")
    elif gpu.ok:
        t.append("ok", Style(color="green"))
    else:
        t.append(f"FAULT {gpu.detail}".rstrip(), Style(color="red", bold=True))
    row, col = pair_vectors(snap, nic)
    cells = max(8, width - 8)
    t.append("\nout→ ", DIM)
    t.append_text(heat_row(row, cells, view.threshold_ns))
    t.append("\nin ← ", DIM)
    t.append_text(heat_row(col, cells, view.threshold_ns))
    paths = path_breakdown(snap, nic)
    if paths:
        t.append("\npath        out        in", DIM)
        for p, (o, i) in paths.items():
            t.append(f"\n{p:<9} {fmt_ns(o):>10} {fmt_ns(i):>10}")
    t.append(f"\nworst delay, last {view.window_label}: ", DIM)
    if history is None or not len(history[1]):
        t.append("no history", DIM)
    else:
        vals = history[1]
        t.append(fmt_ns(float(np.nanmax(vals))) if not np.all(np.isnan(vals)) else "n/a")
        t.append("\n")
        t.append_text(sparkline(vals, max(8, width - 2), view.threshold_ns))
    return t


_KIND_STYLE = {
    "link_flap": Style(color="magenta", bold=True),
    "contention": Style(color="orange1", bold=True),
    "nic_down": Style(color="red", bold=True),
    "remediation": Style(color="cyan", bold=True),
    "remediation_ack": Style(color="cyan"),
    "clear": Style(color="green"),
}


def remediation_verdict(ev: EventDoc, control: bool | None) -> str:
    """Return whether a remediation event's action ran: from the status the controller puts
    first in its detail (``sent: ...``, ``would have: ...``, ``suppressed: ...``), else from
    the Control state ``control``."""
    status = ev.detail.split(":", 1)[0] if ":" in ev.detail else ""
    if status == "sent":
        return "Control ran it"
    if status == "would have":
        return "advice only: Control off"
    if status == "suppressed":
        return "suppressed: rate limit"
    return "Control ran it" if control else "advice only: Control off"


def event_line(ev: EventDoc, snap: MeshSnapshot) -> Text:
    """Return one event as a line: age, kind, target, flap count, Control verdict, detail."""
    t = Text()
    age = (snap.t_ns - ev.t_ns) / 1e9
    t.append(f"{-age:7.1f}s ", DIM)
    t.append(ev.kind, _KIND_STYLE.get(ev.kind, Style(bold=ev.severity == "critical")))
    t.append(f" {ev.target}")
    if ev.kind == "link_flap" and ev.target in snap.flap_counts:
        t.append(f" flaps={snap.flap_counts[ev.target]}", BOLD)
    if ev.kind == "remediation":
        t.append(f" [{remediation_verdict(ev, snap.control_enabled)}]", BOLD)
    if ev.detail:
        t.append(f"  {ev.detail}", DIM)
    return t


def events_text(snap: MeshSnapshot, window_s: float, limit: int = 200) -> Text:
    """Return the events of the last ``window_s`` seconds, newest first, at most ``limit``."""
    lo = snap.t_ns - int(window_s * 1e9)
    evs = [e for e in snap.events if e.t_ns >= lo][::-1][:limit]
    t = Text()
    flapping = {k: v for k, v in snap.flap_counts.items() if v}
    if flapping:
        t.append("flap counts: ", DIM)
        t.append(", ".join(f"{k}={v}" for k, v in sorted(flapping.items())))
        t.append("\n")
    if not evs:
        t.append(f"no events in the last {int(window_s // 60)} min", DIM)
    for k, e in enumerate(evs):
        if k:
            t.append("\n")
        t.append_text(event_line(e, snap))
    return t
