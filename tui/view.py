"""What the grid shows: the view state (mode, alerts direction, filter, window) and the pure
selection of visible NICs and their tile looks from a snapshot.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric
from mesh.snapshot import MeshSnapshot
from tui.render import DEFAULT_THRESHOLD_NS, TileLook, tile_looks


class Mode(enum.StrEnum):
    """Monitoring mode: the whole fleet, or only the NICs of one job."""

    FLEET = "Fleet"
    WORKLOAD = "Workload"


class Alerts(enum.StrEnum):
    """Which delays colour a NIC: those into it (inbound) or out of it (outbound)."""

    INBOUND = "Inbound"
    OUTBOUND = "Outbound"


WINDOWS: tuple[tuple[str, float], ...] = (("2m", 120.0), ("15m", 900.0), ("1h", 3600.0))


@dataclass(frozen=True, slots=True)
class ViewState:
    """The operator's choices. ``window`` indexes `WINDOWS`; ``job`` indexes snapshot.jobs."""

    mode: Mode = Mode.FLEET
    alerts: Alerts = Alerts.INBOUND
    query: str = ""
    window: int = 0
    threshold_ns: float = DEFAULT_THRESHOLD_NS
    job: int = 0

    @property
    def window_label(self) -> str:
        """Return the window's short label, e.g. ``2m``."""
        return WINDOWS[self.window][0]

    @property
    def window_s(self) -> float:
        """Return the window length in seconds."""
        return WINDOWS[self.window][1]


def job_nics(fabric: Fabric, job: Mapping[str, object]) -> tuple[int, ...]:
    """Return the NIC indices of a job (``job["nics"]``: NIC ids in rank order; unknown ids skipped)."""
    ids = job.get("nics", ())
    if not isinstance(ids, Sequence) or isinstance(ids, str):
        return ()
    table = fabric.nic_index
    return tuple(table[i] for i in ids if isinstance(i, str) and i in table)


def job_name(job: Mapping[str, object], k: int) -> str:
    """Return a job's display name (``name`` or ``id`` key, else ``job{k}``)."""
    return str(job.get("name") or job.get("id") or f"job{k}")


def match_nics(fabric: Fabric, query: str) -> set[int] | None:
    """Return the NIC indices matching every whitespace-separated token of ``query``.

    A token matches a NIC if it equals (case-insensitive) its id, host, address, group or leaf,
    or - when no NIC has such a field - is a substring of one, or a glob (``*``, ``?``) matching
    one. Returns None for an empty query (no filtering).
    """
    tokens = query.lower().split()
    if not tokens:
        return None
    fields = [(n.index, (n.id, n.host, n.address, n.group, n.leaf)) for n in fabric.nics]
    everything = {f.lower() for _, fs in fields for f in fs}
    keep = {i for i, _ in fields}
    for tok in tokens:
        if any(c in tok for c in "*?["):
            ok = {i for i, fs in fields if any(fnmatch.fnmatchcase(f.lower(), tok) for f in fs)}
        elif tok in everything:
            ok = {i for i, fs in fields if any(f.lower() == tok for f in fs)}
        else:
            ok = {i for i, fs in fields if any(tok in f.lower() for f in fs)}
        keep &= ok
    return keep


def visible_nics(snap: MeshSnapshot, view: ViewState) -> tuple[set[int] | None, frozenset[int]]:
    """Return (NICs to show or None for all, job members to highlight) for ``view``."""
    shown = match_nics(snap.fabric, view.query)
    members: frozenset[int] = frozenset()
    if view.mode == Mode.WORKLOAD and snap.jobs and view.job < len(snap.jobs):
        members = frozenset(job_nics(snap.fabric, snap.jobs[view.job]))
        shown = set(members) if shown is None else shown & members
    return shown, members


def visible_groups(fabric: Fabric, shown: set[int] | None) -> list[tuple[str, tuple[int, ...]]]:
    """Return (group, NICs) in fabric group order, keeping only ``shown`` NICs (all if None)."""
    out = []
    for g, members in fabric.groups.items():
        keep = members if shown is None else tuple(i for i in members if i in shown)
        out.append((g, keep))
    return out


def alert_delays(snap: MeshSnapshot, alerts: Alerts) -> npt.NDArray[np.float64]:
    """Return the per-NIC worst delay that colours tiles: inbound or outbound."""
    return snap.worst_in_ns if alerts == Alerts.INBOUND else snap.worst_out_ns


def looks_for(snap: MeshSnapshot, view: ViewState, members: frozenset[int]) -> list[TileLook]:
    """Return the tile look of every NIC of ``snap`` under ``view``."""
    return tile_looks(snap.nic_health, alert_delays(snap, view.alerts), view.threshold_ns, members)
