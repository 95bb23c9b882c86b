"""What survives when the live controller's fabric is replaced (pure helpers of its one door).

`controller.live.LiveController.replace_fabric` swaps the fabric under a running controller
(a learned fabric that changed: a new host, a recabled NIC, a spine gone). Everything indexed
by the fabric's dense NIC, link or host numbers is rebuilt for the new fabric; these helpers
carry what is keyed by id across:

- `remap_columns`: per-NIC columns (the worst-delay history) moved to the NICs' new indices
  by NIC id; new NICs start empty (NaN), NICs that left are dropped;
- `host_times`: a per-host array (since when each prober has been alive) rebuilt by host id;
- `topology_event`: the ``topology`` finding that says what changed
  (`mesh.fabric.plancheck.fabric_changes`) and what restarted.

What restarts, and why (the door's docstring says the same): the clock sync (its windows and
models are per NIC index, and a solve of the old window is refused once the fabric changed),
the flow store (delays per flow), the detection brain (health per link and NIC, its windows)
and the ingest's path tables (refilled by the caller from the traced paths it keeps). A
restarted clock sync withholds delays until its first trusted solve, a few seconds at the
default window, so a change costs that much of delay detection; loss detection resumes with
the next detection window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from contract.documents import EventDoc
from mesh.fabric import Fabric

RESTARTED = "clock sync, flows and detection restarted on the new fabric"
"""What a fabric change restarts, as the ``topology`` event's detail ends."""

TOPOLOGY = "topology"
"""The event kind of a fabric change."""

SHOWN = 12
"""Changes a ``topology`` event spells out; more are counted ("... and 40 more")."""


def remap_columns(
    old: Fabric, new: Fabric, cols: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Return ``cols`` (rows x old NICs) with its columns moved to ``new``'s NIC indices by
    NIC id; NICs only ``new`` has are NaN."""
    out = np.full((cols.shape[0], len(new.nics)), np.nan, cols.dtype)
    take = [(i, old.nic_index[n.id]) for i, n in enumerate(new.nics) if n.id in old.nic_index]
    if take:
        dst, src = (np.array(x, np.int64) for x in zip(*take, strict=True))
        out[:, dst] = cols[:, src]
    return out


def host_times(fabric: Fabric, by_host: Mapping[str, int]) -> npt.NDArray[np.int64]:
    """Return per host index of ``fabric`` its time in ``by_host`` (0 where absent)."""
    return np.array([by_host.get(h.id, 0) for h in fabric.hosts], np.int64)


def shorten(sentences: Sequence[str], shown: int = SHOWN) -> str:
    """Return the first ``shown`` sentences joined by "; ", and how many more there are."""
    out = list(sentences[:shown])
    if len(sentences) > shown:
        out.append(f"... and {len(sentences) - shown} more")
    return "; ".join(out)


def summary(fabric: Fabric) -> str:
    """Return a fabric's size in words: NICs, hosts, and switches and links per tier."""
    kinds = Counter(str(n.kind) for n in fabric.nodes)
    tiers = ", ".join(f"{kinds[k]} {k if kinds[k] == 1 else many}" for k, many in
                      (("leaf", "leaves"), ("spine", "spines"), ("superspine", "superspines"))
                      if kinds[k])  # fmt: skip
    return (f"{len(fabric.nics)} NICs on {kinds['host']} hosts, {tiers or 'no switch'}, "
            f"{len(fabric.links)} links")  # fmt: skip


def topology_event(
    now_ns: int, changes: Sequence[str], note: str = "", new: Fabric | None = None,
    first: bool = False,
) -> EventDoc:  # fmt: skip
    """Return the ``topology`` finding of a fabric change: ``changes`` (sentences, the first
    `SHOWN`; with ``first``, the first fabric, its `summary` of ``new`` instead), then
    ``note`` (e.g. how the new fabric compares with a cabling plan), then `RESTARTED`."""
    if first and new is not None:
        what = f"first fabric: {summary(new)}"
    else:
        what = shorten(changes) or "the fabric was replaced by an equal one"
        if new is not None:
            what += f" (now {summary(new)})"
    detail = "; ".join(x for x in (what, note, RESTARTED) if x)
    return EventDoc(now_ns, TOPOLOGY, "fabric", detail, "info")
