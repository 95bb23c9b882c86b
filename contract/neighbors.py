"""The LLDP neighbours a prober sees on its NICs: ``<prefix>/neighbors/<host>``, retained JSON.

What the document is for: the controller learns which leaf each NIC is cabled to from it
(`mesh.fabric.learn`), with no fabric file. It is also the prober's NIC inventory (NIC id,
interface, address), so a controller knows the NICs of a prober nobody listed in a config.

Why a document of its own and not a section of `contract.documents.HealthDoc`: it is
*retained* (a controller started later gets every host's neighbours at once, as with
presence), it changes rarely (published when it changes, not every telemetry interval), and
its shape is fixed and checked (the health document's NIC sections are free-form telemetry the
contract does not fix). An empty payload (a cleared retained message: the host was removed)
decodes as a document with no NICs.

Shape::

    {"host": str, "t_ns": int,
     "nics": [{"nic": str, "ifname": str, "address": "a.b.c.d",
               "neighbors": [{"chassis_name": str, "chassis_id": str, "port_id": str,
                              "port_descr": str, "mgmt": [address, ...]}]}]}

Decoding raises only `DocumentError`; keys the document does not know are ignored.

What a neighbour means, agreed by the prober (its NICs' ECMP groups, its peers' groups) and
the controller (the fabric it learns): a NIC's **leaf** is its one LLDP neighbour's name as a
fabric id (`switch_id`; `leaf_of`, "" with none or several), and the NICs under a leaf form
one ECMP group, `leaf_group(leaf)`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from contract.jsondoc import DocumentError, check, decode_object, encode_json
from contract.jsondoc import field as read

_BAD_ID_CHARS = frozenset("/+# \t\n")


def switch_id(name: str) -> str:
    """Return ``name`` as a fabric id: characters ids may not hold (``/ + #`` and blanks)
    become ``_``; an empty name stays empty."""
    return "".join("_" if c in _BAD_ID_CHARS else c for c in name.strip())


def leaf_group(leaf: str) -> str:
    """Return the ECMP group id of the NICs under ``leaf`` (one group per leaf)."""
    return f"ecmp-{leaf}"


def leaf_of(neighbors: tuple[LldpNeighbor, ...]) -> str:
    """Return the leaf of a NIC with these LLDP neighbours: the one neighbour's name as a
    fabric id, "" with none or several."""
    names = {switch_id(n.name) for n in neighbors} - {""}
    return next(iter(names)) if len(names) == 1 else ""


@dataclass(frozen=True, slots=True)
class LldpNeighbor:
    """One LLDP neighbour of a NIC: the switch's system name and chassis id, the switch port
    (id and description) and its management addresses. Strings may be empty when the
    neighbour did not send that TLV, except ``chassis_name`` or ``chassis_id`` (one is needed)."""

    chassis_name: str
    chassis_id: str = ""
    port_id: str = ""
    port_descr: str = ""
    mgmt: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        w = "neighbor"
        for key in ("chassis_name", "chassis_id", "port_id", "port_descr"):
            value = getattr(self, key)
            check(isinstance(value, str), w, key, "a string", value)
        check(bool(self.chassis_name or self.chassis_id), w, "chassis_name", "a name or an id",
              self.chassis_name)  # fmt: skip
        ok = isinstance(self.mgmt, tuple | list) and all(isinstance(m, str) for m in self.mgmt)
        check(ok, w, "mgmt", "a list of addresses", self.mgmt)
        object.__setattr__(self, "mgmt", tuple(self.mgmt))

    @property
    def name(self) -> str:
        """The switch's name: its system name, else its chassis id."""
        return self.chassis_name or self.chassis_id

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of this neighbour."""
        return {"chassis_name": self.chassis_name, "chassis_id": self.chassis_id,
                "port_id": self.port_id, "port_descr": self.port_descr,
                "mgmt": list(self.mgmt)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class NicNeighbors:
    """A NIC the prober probes from (fabric ``nic`` id, ``ifname``, IPv4 ``address``) and the
    LLDP neighbours seen on it (one on a NIC cabled to a leaf; none when LLDP is silent)."""

    nic: str
    ifname: str
    address: str
    neighbors: tuple[LldpNeighbor, ...] = ()

    def __post_init__(self) -> None:
        w = "neighbors.nic"
        check(isinstance(self.nic, str) and bool(self.nic), w, "nic", "a NIC id", self.nic)
        check(isinstance(self.ifname, str), w, "ifname", "a string", self.ifname)
        check(_ipv4(self.address), w, "address", "an IPv4 address", self.address)
        ok = isinstance(self.neighbors, tuple | list) and all(
            isinstance(n, LldpNeighbor) for n in self.neighbors
        )
        check(ok, w, "neighbors", "a list of neighbours", self.neighbors)
        object.__setattr__(self, "neighbors", tuple(self.neighbors))

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of this NIC."""
        return {"nic": self.nic, "ifname": self.ifname, "address": self.address,
                "neighbors": [n.to_json() for n in self.neighbors]}  # fmt: skip


@dataclass(frozen=True, slots=True)
class NeighborsDoc:
    """The NICs of ``host`` and their LLDP neighbours at ``t_ns`` (the prober's clock)."""

    host: str
    t_ns: int = 0
    nics: tuple[NicNeighbors, ...] = ()

    def __post_init__(self) -> None:
        w = "neighbors"
        check(isinstance(self.host, str), w, "host", "a string", self.host)
        check(isinstance(self.t_ns, int) and not isinstance(self.t_ns, bool), w, "t_ns",
              "an integer", self.t_ns)  # fmt: skip
        ok = isinstance(self.nics, tuple | list) and all(
            isinstance(n, NicNeighbors) for n in self.nics
        )
        check(ok, w, "nics", "a list of NICs", self.nics)
        object.__setattr__(self, "nics", tuple(self.nics))
        ids = [n.nic for n in self.nics]
        if len(ids) != len(set(ids)):
            raise DocumentError(f"neighbors: nics: NIC ids repeat in {sorted(ids)}")

    def encode(self) -> bytes:
        """Return the JSON bytes of this document."""
        return encode_json(
            {"host": self.host, "t_ns": self.t_ns, "nics": [n.to_json() for n in self.nics]}
        )

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> NeighborsDoc:
        """Return the document in ``payload`` (empty: no NICs); raise `DocumentError`."""
        if not payload:
            return cls(host="")
        doc = decode_object(payload, "neighbors")
        nics = []
        for i, e in enumerate(read(doc, "nics", list, "neighbors", [])):
            w = f"neighbors.nics[{i}]"
            if not isinstance(e, dict):
                raise DocumentError(f"{w}: must be an object")
            seen = []
            for j, n in enumerate(read(e, "neighbors", list, w, [])):
                wn = f"{w}.neighbors[{j}]"
                if not isinstance(n, dict):
                    raise DocumentError(f"{wn}: must be an object")
                seen.append(_neighbor(n, wn))
            try:
                nics.append(NicNeighbors(read(e, "nic", str, w), read(e, "ifname", str, w, ""),
                                         read(e, "address", str, w), tuple(seen)))  # fmt: skip
            except DocumentError as exc:
                raise DocumentError(f"{w}: {exc}") from None
        return cls(read(doc, "host", str, "neighbors", ""), read(doc, "t_ns", int, "neighbors", 0),
                   tuple(nics))  # fmt: skip


def _neighbor(n: dict[str, Any], w: str) -> LldpNeighbor:
    try:
        return LldpNeighbor(
            read(n, "chassis_name", str, w, ""),
            read(n, "chassis_id", str, w, ""),
            read(n, "port_id", str, w, ""),
            read(n, "port_descr", str, w, ""),
            tuple(read(n, "mgmt", list, w, [])),
        )
    except DocumentError as exc:
        raise DocumentError(f"{w}: {exc}") from None


def _ipv4(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True
