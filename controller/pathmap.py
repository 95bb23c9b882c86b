"""Map the probers' discovered paths (``paths/<host>`` documents) onto fabric hops (pure).

A discovered path names routers by the address that answered each TTL; ``router_nodes`` maps
those addresses to fabric nodes. `path_hops` turns one path into directed hop ids
(`mesh.fabric.model.hop_id`), `path_rows` a whole document into rows for
`controller.live.LiveController.learn_paths` (which also sets the replies' mirror hops). A
document that is not a list of objects raises `PathDocError`; entries that cannot be mapped
are left out.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

import numpy as np
import numpy.typing as npt

from contract.jsondoc import DocumentError
from mesh.fabric import Fabric
from mesh.fabric.model import hop_id


class PathDocError(DocumentError):
    """A ``paths/<host>`` document is not a list of objects (one-line reason)."""


class PathRows(NamedTuple):
    """Flows (src NIC index, dst NIC index, sport) and their forward hops (-1 padded rows)."""

    src: npt.NDArray[np.int64]
    dst: npt.NDArray[np.int64]
    sport: npt.NDArray[np.int64]
    hops: npt.NDArray[np.int32]


def path_hops(
    fabric: Fabric, router_nodes: Mapping[str, str], src: str, dst: str, hops: list[Any]
) -> list[int] | None:
    """Return the directed hop ids of a discovered path, or None if it cannot be mapped.

    The node sequence is ``src`` NIC, the fabric node owning each router address (from
    ``router_nodes``, address -> node id), ``dst`` NIC; each consecutive pair must be a fabric
    link (up if the pair is (lower, upper), down if reversed). Silent hops, unknown addresses
    or NICs and non-adjacent nodes give None (the ingest then keeps the model path).
    """
    if src not in fabric.nic_index or dst not in fabric.nic_index:
        return None
    nodes = [src]
    for h in hops:
        node = router_nodes.get(h) if isinstance(h, str) else None
        if node is None:
            return None
        nodes.append(node)
    nodes.append(dst)
    pair = fabric.link_between
    out = []
    for u, v in itertools.pairwise(nodes):
        if (u, v) in pair:
            out.append(hop_id(pair[(u, v)], down=False))
        elif (v, u) in pair:
            out.append(hop_id(pair[(v, u)], down=True))
        else:
            return None
    return out


def path_rows(fabric: Fabric, router_nodes: Mapping[str, str], doc: Any, max_hops: int) -> PathRows:
    """Return the mappable paths of a ``paths/<host>`` document (pure): flows and their
    forward hop rows (``(n, max_hops)``, -1 padded) for `LiveController.learn_paths`.

    Each reached, fully answered path sets the forward hops of its flow (src, dst, sport) and,
    as its mirror image (same links, opposite directions, reverse order), the hops of the
    replies to that flow: Linux's L4 multipath hash is symmetric in (address, port) pairs, so
    the reply (dst -> src, 4791 -> sport) takes the same spine as the probe. Entries of the
    wrong types (a ``sport`` that is not a port number included) are left out. Raises
    `PathDocError` if ``doc`` is not a list of objects.
    """
    if not isinstance(doc, list):
        raise PathDocError("paths payload must be a JSON list")
    f = fabric
    rows: list[tuple[int, int, int, list[int]]] = []
    for e in doc:
        if not isinstance(e, dict):
            raise PathDocError("paths entries must be objects")
        if not e.get("reached", True):
            continue
        src, dst, sport, hops = e.get("src"), e.get("dst"), e.get("sport"), e.get("hops")
        if not (isinstance(src, str) and isinstance(dst, str) and _is_port(sport)
                and isinstance(hops, list)):  # fmt: skip
            continue
        ids = path_hops(f, router_nodes, src, dst, hops)
        if ids is None or len(ids) > max_hops:
            continue
        rows.append((f.nic_index[src], f.nic_index[dst], sport, ids))
    fwd = np.full((len(rows), max_hops), -1, np.int32)
    for i, (_, _, _, ids) in enumerate(rows):
        fwd[i, : len(ids)] = ids
    return PathRows(
        np.array([r[0] for r in rows], np.int64),
        np.array([r[1] for r in rows], np.int64),
        np.array([r[2] for r in rows], np.int64),
        fwd,
    )


def _is_port(value: object) -> TypeGuard[int]:
    """Return True if ``value`` is a UDP port number (an int in 0..65535, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFF
