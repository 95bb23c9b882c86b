"""A learned fabric as the fleet passes it around: one version in the clock bucket (pure).

With a learned fabric (``[fabric]`` without shape keys or a file) the fleet's one learner is
the active solver: the controller service learns the fabric from the probers' neighbours
documents and traced paths (`controller.topology`), and the solver's shell publishes each
version it solves on as the clock bucket's ``fabric`` key (`FABRIC_KEY`); the workers watch
the key and build their cores on it (docs/scale.md, "A learned fabric").

- `encode_fabric` / `decode_fabric`: a version as it travels, the fabric's one description
  (`mesh.fabric.Fabric.to_dict`, the fabric files' JSON) behind a magic and the fabric's
  fingerprint (`controller.fleet.partial.fabric_id`, the id partials carry), zlib'd;
- `FabricPublisher` (the solver's side): which version is due to be published;
- `FabricFollow` (a worker's side): the newest version taken, and which clock models may be
  installed on cores of it (models name no fabric: a version's models are those written
  after it, `fits`).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from controller.fleet.codec import CodecError
from controller.fleet.partial import fabric_id
from mesh.fabric import Fabric, FabricError

FABRIC_KEY = "fabric"
"""The clock bucket's key of the newest learned fabric (`encode_fabric`)."""

MAGIC = b"QPF1"
_ID_LEN = 16


class FabricWireError(CodecError):
    """A payload that is not a fabric version this release reads (the reason in one line)."""


def encode_fabric(fabric: Fabric) -> bytes:
    """Return ``fabric`` as it is published: `MAGIC`, its `fabric_id` (16 ASCII characters)
    and its `Fabric.to_dict` description as zlib'd JSON."""
    body = json.dumps(fabric.to_dict(), separators=(",", ":"), sort_keys=True).encode()
    return MAGIC + fabric_id(fabric).encode() + zlib.compress(body, 6)


def version_of(data: bytes) -> str:
    """Return the fabric id an encoded version names (no decoding of the fabric); raise
    `FabricWireError` if ``data`` is not one."""
    if len(data) < len(MAGIC) + _ID_LEN or not data.startswith(MAGIC):
        raise FabricWireError("not a fabric version (bad magic or too short)")
    try:
        return data[len(MAGIC) : len(MAGIC) + _ID_LEN].decode("ascii")
    except UnicodeDecodeError:
        raise FabricWireError("fabric version: id is not ASCII") from None


def decode_fabric(data: bytes) -> Fabric:
    """Return the fabric of an encoded version; raise `FabricWireError` (one line) when it
    is malformed, not a fabric, or not the fabric its id names."""
    named = version_of(data)
    try:
        doc = json.loads(zlib.decompress(data[len(MAGIC) + _ID_LEN :]))
        fabric = Fabric.from_dict(doc)
    except (zlib.error, ValueError, TypeError, AttributeError, FabricError) as exc:
        raise FabricWireError(f"fabric version {named}: {exc}") from None
    if fabric_id(fabric) != named:
        raise FabricWireError(f"fabric version {named}: its fabric is {fabric_id(fabric)}")
    return fabric


class FabricPublisher:
    """The solver's side: `due(fabric)` returns the encoded version to publish when
    ``fabric`` is not the one the bucket holds (`published`, or `seen` in the bucket when
    this solver became active), else None. A fabric with no NIC (nothing learned yet) is
    never due: workers wait for a fabric instead of building cores on an empty one."""

    def __init__(self) -> None:
        self.id = ""  # the bucket's version ("" none)
        self._last: Fabric | None = None  # the fabric object last compared (identity)

    def seen(self, data: bytes) -> None:
        """Note the version the bucket holds (``data``; raises `FabricWireError`)."""
        self.id, self._last = version_of(data), None

    def due(self, fabric: Fabric) -> bytes | None:
        """Return ``fabric`` encoded if it is to be published (see the class doc)."""
        if fabric is self._last or not fabric.nics:
            return None
        if fabric_id(fabric) == self.id:
            self._last = fabric
            return None
        return encode_fabric(fabric)

    def published(self, fabric: Fabric) -> None:
        """Note that ``fabric`` is now the bucket's version."""
        self.id, self._last = fabric_id(fabric), fabric

    def current(self, fabric: Fabric) -> bool:
        """Return True when ``fabric`` is the version published (models solved on it may
        go out: they are written after it)."""
        return fabric is self._last or fabric_id(fabric) == self.id


@dataclass
class FabricFollow:
    """A worker's side: ``fabric`` (None until a version came), its ``id`` and the
    bucket ``revision`` it was written at. Clock models written before that revision are
    of an older fabric (the solver writes a version before any models solved on it), so
    they are not installed (`fits`)."""

    fabric: Fabric | None = None
    id: str = ""
    revision: int = 0

    def take(self, data: bytes, revision: int) -> bool:
        """Take the version ``data`` written at ``revision``; return True when it is another
        fabric (the cores are to be rebuilt on it). The same fabric written again (a standby
        that took over) changes nothing. Raises `FabricWireError` on a malformed version."""
        if version_of(data) == self.id:
            return False
        self.fabric = decode_fabric(data)
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
    "FabricWireError",
    "decode_fabric",
    "encode_fabric",
    "version_of",
]
