"""RDMA peer discovery, pure: who answers on which UD queue pair, learnt from presence.

A UD send needs the peer NIC's QP number, GID and qkey, known only once the peer's prober
has opened its QP. Every RDMA prober therefore puts them in its retained presence document
(``<prefix>/presence/<host>``, see `prober.publish.presence_payload`)::

    {"alive": true, "t_ns": ..., "rdma": {"nic6": {"qpn": 4711, "gid": "fe80::...",
                                              "qkey": 286331153, "port": 1}}}

and follows ``<prefix>/presence/+`` (`prober.rdma.presence`), feeding each document to an
`RdmaPeerTable`:

- ``alive: true`` with ``rdma``: the host's NICs are (re)placed by the document's;
- ``alive: true`` without ``rdma`` (a UDP prober), ``alive: false`` (clean stop or last
  will) or an empty payload (retained message cleared): the host's NICs are removed;
- anything malformed (not JSON, wrong types, out-of-range values, a NIC id claimed by another
  live host) is counted and ignored: the host keeps what it had. `PeerDocError` carries a
  one-line reason (also kept as ``last_error``).

`RdmaPeerTable.update` returns the NIC ids whose address changed (new, different QPN, GID,
qkey or port, or gone): the transport refreshes those NICs' address handles (`ah_plan`).
Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import ipaddress
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

QPN_MAX = 0xFFFFFF  # 24-bit QP numbers
QKEY_CONTROLLED = 0x80000000  # qkeys with bit 31 set are privileged (controlled) qkeys
NIC_ID_MAX = 64


class PeerDocError(ValueError):
    """A presence document (or one of its fields) is not a valid RDMA peer description."""


def normalize_gid(gid: object) -> str:
    """Return ``gid`` as compressed IPv6 text; accepts IPv6 text or 32 hex digits.

    Raises `PeerDocError` for other types, bad text or the all-zero GID.
    """
    if not isinstance(gid, str):
        raise PeerDocError(f"gid must be a string, got {type(gid).__name__}")
    text = gid.strip()
    if len(text) == 32 and all(c in "0123456789abcdefABCDEF" for c in text):
        addr = ipaddress.IPv6Address(bytes.fromhex(text))
    else:
        try:
            addr = ipaddress.IPv6Address(text)
        except ValueError:
            raise PeerDocError(f"gid {gid[:60]!r} is neither IPv6 text nor 32 hex digits") from None
    if int(addr) == 0:
        raise PeerDocError("gid is all zeros (no GID at that index)")
    return addr.compressed


def _int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PeerDocError(f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise PeerDocError(f"{name} {value} outside {lo}..{hi}")
    return value


def _check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > NIC_ID_MAX:
        raise PeerDocError(f"{what} must be a non-empty string of <= {NIC_ID_MAX} chars")
    if any(c in "/+#\x00" or c.isspace() for c in value):
        raise PeerDocError(f"{what} {value!r} contains / + # NUL or whitespace")
    return value


@dataclass(frozen=True, slots=True)
class PeerAddress:
    """Where NIC ``nic_id`` of ``host`` receives UD probes; validated (`PeerDocError`).

    ``qpn`` 2..2**24-1 (0 and 1 are the special SMI/GSI QPs), ``gid`` compressed IPv6 text,
    ``qkey`` 0..2**31-1 (non-controlled), ``port`` the peer's HCA port 1..255.
    """

    host: str
    nic_id: str
    qpn: int
    gid: str
    qkey: int
    port: int = 1

    def __post_init__(self) -> None:
        _check_id(self.host, "host")
        _check_id(self.nic_id, "nic id")
        _int(self.qpn, "qpn", 2, QPN_MAX)
        if normalize_gid(self.gid) != self.gid:
            raise PeerDocError(f"gid {self.gid!r} is not in compressed IPv6 form")
        _int(self.qkey, "qkey", 0, QKEY_CONTROLLED - 1)
        _int(self.port, "port", 1, 255)

    @property
    def dest(self) -> tuple[str, int]:
        """Return the transport address of this peer: (gid, qpn)."""
        return (self.gid, self.qpn)

    def to_json(self) -> dict[str, Any]:
        """Return the presence-document entry of this NIC (without host and NIC id)."""
        return {"qpn": self.qpn, "gid": self.gid, "qkey": self.qkey, "port": self.port}


def local_address(host: str, nic_id: str, qpn: int, gid: str, qkey: int, port: int) -> PeerAddress:
    """Return a validated `PeerAddress` of a local NIC (``gid`` in any accepted form)."""
    return PeerAddress(host, nic_id, qpn, normalize_gid(gid), qkey, port)


def presence_rdma(addrs: Iterable[PeerAddress]) -> dict[str, dict[str, Any]]:
    """Return the ``rdma`` block of a presence document: NIC id -> {qpn, gid, qkey, port}.

    Raises `PeerDocError` on a duplicate NIC id.
    """
    out: dict[str, dict[str, Any]] = {}
    for a in addrs:
        if a.nic_id in out:
            raise PeerDocError(f"duplicate local NIC id {a.nic_id!r}")
        out[a.nic_id] = a.to_json()
    return out


def parse_presence(host: str, doc: object) -> dict[str, PeerAddress] | None:
    """Return NIC id -> `PeerAddress` announced by ``doc``; None if the host has no RDMA NICs.

    None means: ``alive`` false, or alive without an ``rdma`` block. Unknown keys are ignored
    (forward compatibility). Raises `PeerDocError` with a one-line reason otherwise.
    """
    _check_id(host, "host")
    if not isinstance(doc, Mapping):
        raise PeerDocError(f"presence of {host} is not a JSON object")
    alive = doc.get("alive")
    if not isinstance(alive, bool):
        raise PeerDocError(f"presence of {host}: alive must be true or false")
    if not alive or doc.get("rdma") is None:
        return None
    block = doc["rdma"]
    if not isinstance(block, Mapping):
        raise PeerDocError(f"presence of {host}: rdma must be an object of NIC id -> address")
    out: dict[str, PeerAddress] = {}
    for nic, entry in block.items():
        where = f"presence of {host}: rdma.{str(nic)[:40]}"
        try:
            _check_id(nic, "nic id")
            if not isinstance(entry, Mapping):
                raise PeerDocError("entry must be an object")
            missing = [k for k in ("qpn", "gid", "qkey") if k not in entry]
            if missing:
                raise PeerDocError(f"missing {', '.join(missing)}")
            out[nic] = PeerAddress(
                host,
                nic,
                _int(entry["qpn"], "qpn", 2, QPN_MAX),
                normalize_gid(entry["gid"]),
                _int(entry["qkey"], "qkey", 0, QKEY_CONTROLLED - 1),
                _int(entry.get("port", 1), "port", 1, 255),
            )
        except PeerDocError as exc:
            raise PeerDocError(f"{where}: {exc}") from None
    return out


class RdmaPeerTable:
    """NIC id -> `PeerAddress` of every live RDMA peer, from presence documents.

    ``counters``: ``updates``, ``malformed``, ``conflicts``, ``removed_hosts``;
    ``last_error`` is the reason of the last ignored document.
    """

    def __init__(self) -> None:
        self._by_nic: dict[str, PeerAddress] = {}
        self._by_host: dict[str, frozenset[str]] = {}
        self.counters: Counter[str] = Counter()
        self.last_error = ""

    def __len__(self) -> int:
        return len(self._by_nic)

    def lookup(self, nic_id: str) -> PeerAddress | None:
        """Return the address of ``nic_id``, or None while it is unknown."""
        return self._by_nic.get(nic_id)

    def hosts(self) -> dict[str, frozenset[str]]:
        """Return host -> its announced NIC ids."""
        return dict(self._by_host)

    def update(self, host: str, doc: object) -> frozenset[str]:
        """Apply the presence document ``doc`` of ``host``; return the NIC ids that changed.

        Changed = added, removed, or with a different qpn/gid/qkey/port. A malformed document
        is counted (``malformed``, or ``conflicts`` for a NIC id another host announces) and
        ignored: returns an empty set and the host keeps its previous NICs. Never raises.
        """
        try:
            new = parse_presence(host, doc)
        except PeerDocError as exc:
            self._reject("malformed", str(exc))
            return frozenset()
        if new is None:
            return self.remove(host)
        for nic in new:
            owner = self._by_nic.get(nic)
            if owner is not None and owner.host != host:
                self._reject("conflicts", f"{host} announces {nic}, already held by {owner.host}")
                return frozenset()
        self.counters["updates"] += 1
        old = self._by_host.get(host, frozenset())
        changed = {n for n in old if n not in new}
        for n in changed:
            del self._by_nic[n]
        for n, addr in new.items():
            if self._by_nic.get(n) != addr:
                self._by_nic[n] = addr
                changed.add(n)
        self._by_host[host] = frozenset(new)
        return frozenset(changed)

    def update_payload(self, host: str, payload: bytes | bytearray) -> frozenset[str]:
        """Like `update` for a raw MQTT payload (JSON); empty payload = host removed."""
        if not payload:
            return self.remove(host)
        try:
            doc = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._reject("malformed", f"presence of {host} is not JSON: {exc}")
            return frozenset()
        except RecursionError:
            self._reject("malformed", f"presence of {host} is nested too deeply")
            return frozenset()
        return self.update(host, doc)

    def remove(self, host: str) -> frozenset[str]:
        """Forget every NIC of ``host``; return their ids (empty if it had none)."""
        gone = self._by_host.pop(host, frozenset())
        for n in gone:
            self._by_nic.pop(n, None)
        if gone:
            self.counters["removed_hosts"] += 1
        return gone

    def _reject(self, counter: str, reason: str) -> None:
        self.counters[counter] += 1
        self.last_error = reason


AhKey = tuple[str, int]  # (gid, source port); source port 0 = flow label 0 (replies)


def ah_plan(
    old: PeerAddress | None, new: PeerAddress | None, sports: Sequence[int]
) -> tuple[list[AhKey], list[AhKey]]:
    """Return (address handles to retire, address handles to create) after a peer changed.

    One AH per (peer GID, source port) of ``sports``. An AH holds the GID and flow label but
    not the QPN or qkey (those travel in every send request), so a QPN/qkey-only change keeps
    the AHs; a new GID replaces them all; a vanished peer retires them.
    """
    old_keys = [(old.gid, s) for s in sports] if old is not None else []
    new_keys = [(new.gid, s) for s in sports] if new is not None else []
    keep = set(new_keys)
    have = set(old_keys)
    return [k for k in old_keys if k not in keep], [k for k in new_keys if k not in have]
