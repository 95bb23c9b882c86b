"""A learned fabric as the fleet passes it around: one version in the clock bucket (pure).

With a learned fabric (``[fabric]`` without shape keys or a file) the fleet's one learner is
the active solver: the controller service learns the fabric from the probers' neighbours
documents and traced paths (`controller.topology`), and the solver's shell publishes each
version it solves on as the clock bucket's ``fabric`` key (`FABRIC_KEY`); the workers watch
the key and build their cores on it (docs/scale.md, "A learned fabric").

- `encode_fabric` / `decode_fabric`: a version as it travels, the fabric's one description
  (`mesh.fabric.Fabric.to_dict`, the fabric files' JSON) behind a magic and the fabric's
  fingerprint (`controller.fleet.partial.fabric_id`, the id partials carry), zlib'd with the
  traced paths mapped onto it (`controller.pathmap.PathRows`: the path table one process
  refills at a change, `controller.topology.relearn_live`; paths traced later reach the
  workers in the solver's states, `controller.fleet.solver.FleetSolver.learn`);
- `FabricPublisher` (the solver's side): which version is due to be published;
- `FabricFollow` (a worker's side): the newest version taken, and which clock models may be
  installed on cores of it (models name no fabric: a version's models are those written
  after it, `fits`).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from controller.fleet.codec import CodecError
from controller.fleet.partial import fabric_id
from controller.pathmap import PathRows
from mesh.fabric import Fabric, FabricError

FABRIC_KEY = "fabric"
"""The clock bucket's key of the newest learned fabric (`encode_fabric`)."""

MAGIC = b"QPF1"
_ID_LEN = 16
_HEAD = struct.Struct("<III")  # fabric JSON bytes, path rows, hop width


def no_paths() -> PathRows:
    """Return no path rows."""
    z = np.zeros(0, np.int64)
    return PathRows(z, z.copy(), z.copy(), np.zeros((0, 0), np.int32))


class FabricWireError(CodecError):
    """A payload that is not a fabric version this release reads (the reason in one line)."""


def encode_fabric(fabric: Fabric, paths: PathRows | None = None) -> bytes:
    """Return ``fabric`` as it is published: `MAGIC`, its `fabric_id` (16 ASCII characters)
    and, zlib'd, its `Fabric.to_dict` description as JSON and ``paths`` (rows in its NIC
    indices and hop ids; None: none) as little-endian columns."""
    paths = paths if paths is not None else no_paths()
    body = json.dumps(fabric.to_dict(), separators=(",", ":"), sort_keys=True).encode()
    hops = np.ascontiguousarray(paths.hops, "<i4")
    n, width = (hops.shape[0], hops.shape[1]) if hops.ndim == 2 else (0, 0)
    cols = [np.ascontiguousarray(c, "<i8").tobytes() for c in paths[:3]]
    blob = _HEAD.pack(len(body), n, width) + body + b"".join(cols) + hops.tobytes()
    return MAGIC + fabric_id(fabric).encode() + zlib.compress(blob, 6)


def version_of(data: bytes) -> str:
    """Return the fabric id an encoded version names (no decoding of the fabric); raise
    `FabricWireError` if ``data`` is not one."""
    if len(data) < len(MAGIC) + _ID_LEN or not data.startswith(MAGIC):
        raise FabricWireError("not a fabric version (bad magic or too short)")
    try:
        return data[len(MAGIC) : len(MAGIC) + _ID_LEN].decode("ascii")
    except UnicodeDecodeError:
        raise FabricWireError("fabric version: id is not ASCII") from None


@dataclass(frozen=True, eq=False)
class FabricVersion:
    """A decoded version: the ``fabric`` and the traced ``paths`` mapped onto it."""

    fabric: Fabric
    paths: PathRows = field(default_factory=no_paths)


def decode_fabric(data: bytes) -> FabricVersion:
    """Return the version ``data`` encodes; raise `FabricWireError` (one line) when it is
    malformed, not a fabric, not the fabric its id names, or its paths do not fit it."""
    named = version_of(data)
    try:
        blob = zlib.decompress(data[len(MAGIC) + _ID_LEN :])
        size, n, width = _HEAD.unpack_from(blob)
        at = _HEAD.size + size
        fabric = Fabric.from_dict(json.loads(blob[_HEAD.size : at]))
        if len(blob) != at + n * (24 + 4 * width):
            raise ValueError(f"paths of {len(blob) - at} bytes, not {n} rows of width {width}")
        cols = [np.frombuffer(blob, "<i8", n, at + 8 * n * i).astype(np.int64) for i in range(3)]
        hops = np.frombuffer(blob, "<i4", n * width, at + 24 * n).astype(np.int32)
    except (zlib.error, struct.error, ValueError, TypeError, AttributeError, FabricError) as e:
        raise FabricWireError(f"fabric version {named}: {e}") from None
    if fabric_id(fabric) != named:
        raise FabricWireError(f"fabric version {named}: its fabric is {fabric_id(fabric)}")
    paths = PathRows(cols[0], cols[1], cols[2], hops.reshape(n, width))
    nics, n_hops = len(fabric.nics), fabric.n_hops
    for c in paths[:2]:
        if n and (c.min() < 0 or c.max() >= nics):
            raise FabricWireError(f"fabric version {named}: a path's NIC is not in the fabric")
    if n and (hops.min() < -1 or hops.max() >= n_hops):
        raise FabricWireError(f"fabric version {named}: a path's hop is not in the fabric")
    return FabricVersion(fabric, paths)


class FabricPublisher:
    """The solver's side: `due(fabric)` returns the encoded version to publish when
    ``fabric`` is not the one the bucket holds (`published`, or `seen` in the bucket when
    this solver became active), else None. A fabric with no NIC (nothing learned yet) is
    never due: workers wait for a fabric instead of building cores on an empty one."""

    def __init__(self) -> None:
        self.id = ""  # the bucket's version ("" none)
        self._last: Fabric | None = None  # the fabric object last compared (identity)
        self._refused: Fabric | None = None  # the last one the servers refused

    def seen(self, data: bytes) -> None:
        """Note the version the bucket holds (``data``; raises `FabricWireError`)."""
        self.id, self._last = version_of(data), None

    def due(self, fabric: Fabric) -> bool:
        """Return True if ``fabric`` is to be published (see the class doc; encode it with
        its paths: `encode_fabric`)."""
        if fabric is self._last or fabric is self._refused or not fabric.nics:
            return False
        if fabric_id(fabric) == self.id:
            self._last = fabric
            return False
        return True

    def refused(self, fabric: Fabric) -> None:
        """Note that the servers refused ``fabric`` (a bucket's limit; its size no longer:
        large values go in chunks): it is not due again (retrying cannot help); a later
        fabric is."""
        self._refused = fabric

    def published(self, fabric: Fabric) -> None:
        """Note that ``fabric`` is now the bucket's version."""
        self.id, self._last = fabric_id(fabric), fabric

    def current(self, fabric: Fabric) -> bool:
        """Return True when ``fabric`` is the version published (models solved on it may
        go out: they are written after it)."""
        return fabric is self._last or fabric_id(fabric) == self.id


@dataclass
class FabricFollow:
    """A worker's side: ``fabric`` (None until a version came), the traced ``paths`` mapped
    onto it, its ``id`` and the bucket ``revision`` it was written at. Clock models written
    before that revision are of an older fabric (the solver writes a version before any
    models solved on it), so they are not installed (`fits`)."""

    fabric: Fabric | None = None
    paths: PathRows = field(default_factory=no_paths)
    id: str = ""
    revision: int = 0

    def take(self, data: bytes, revision: int) -> bool:
        """Take the version ``data`` written at ``revision``; return True when it is another
        fabric (the cores are to be rebuilt on it). The same fabric written again (a standby
        that took over) changes nothing. Raises `FabricWireError` on a malformed version."""
        if version_of(data) == self.id:
            return False
        version = decode_fabric(data)
        self.fabric, self.paths = version.fabric, version.paths
        self.id, self.revision = fabric_id(self.fabric), revision
        return True

    def fits(self, models_revision: int) -> bool:
        """Return True when models written at ``models_revision`` may be installed on cores
        of this version (written after it; never before a version came)."""
        return self.fabric is not None and models_revision > self.revision


__all__ = [
    "FABRIC_KEY",
    "FabricFollow",
    "FabricPublisher",
    "FabricVersion",
    "FabricWireError",
    "decode_fabric",
    "encode_fabric",
    "no_paths",
    "version_of",
]
