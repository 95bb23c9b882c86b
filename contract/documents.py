"""The JSON documents probers and controllers exchange, as frozen validated values.

Each document validates on construction and has ``encode() -> bytes`` and
``decode(payload) -> document``; both raise only `DocumentError` (a ValueError), with a
one-line reason naming the document and the key. Decoding ignores keys it does not know.

- `PresenceDoc` on ``<prefix>/presence/<host>`` (retained; the last will is ``alive: false``):
  ``{"alive": bool, "t_ns": int[, "rdma": {nic: {"qpn", "gid", "qkey", "port"}}]}``. The
  ``rdma`` block (only in an alive document) is an object of objects here; what its entries
  mean is checked by the RDMA transport that reads them (`prober.rdma.peers`). An empty
  payload (a cleared retained message) decodes as not alive.
- `HealthDoc` on ``<prefix>/health/<host>``: GPU verdict (``gpu_ok``, ``gpu_present``,
  ``detail``) plus free-form telemetry sections (``gpu``, ``nics``, ``counters``).
- `PathsDoc` on ``<prefix>/paths/<host>``: a JSON list of `TracedPath` (``src``, ``dst``,
  ``sport``, ``hops``: router addresses by TTL, null where silent, ``reached``).
- `EventDoc` on ``<prefix>/events/<kind>``: a controller finding (``t_ns``, ``kind``,
  ``target``, ``severity``, ``detail``, ``flows``: the queue pairs it touched as
  ``{"src", "dst", "sport"}`` objects, ``related``). `EventDoc.to_json` is the one JSON form
  of a finding: the MQTT payload, the controller's JSON-lines log and the HTTP API (which adds
  its ``seq``) all carry it; `EventDoc.from_json` also reads the legacy flow triples
  ``[src, dst, sport]`` that older controllers published on MQTT.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from contract.jsondoc import DocumentError, check, decode_json, decode_object, encode_json
from contract.jsondoc import field as read

SEVERITIES = ("info", "warning", "critical")


def _frozen(doc: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise DocumentError(f"{what}: must be an object, got {type(doc).__name__}")
    return MappingProxyType(dict(doc))


def _plain(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in doc.items()}


# ---- presence -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PresenceDoc:
    """Whether the prober of a host runs; ``rdma``: its NICs' UD queue pairs (alive only)."""

    alive: bool
    t_ns: int = 0
    rdma: Mapping[str, Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        check(isinstance(self.alive, bool), "presence", "alive", "true or false", self.alive)
        check(_is_int(self.t_ns), "presence", "t_ns", "an integer", self.t_ns)
        if self.rdma is not None:
            if not self.alive:
                raise DocumentError("presence: rdma: only an alive prober announces queue pairs")
            block = _frozen(self.rdma, "presence: rdma")
            entries = {str(k): _frozen(v, f"presence: rdma.{k}") for k, v in block.items()}
            object.__setattr__(self, "rdma", MappingProxyType(entries) if entries else None)

    def encode(self) -> bytes:
        """Return the JSON bytes of this document."""
        doc: dict[str, Any] = {"alive": self.alive, "t_ns": self.t_ns}
        if self.rdma:
            doc["rdma"] = {nic: dict(entry) for nic, entry in self.rdma.items()}
        return encode_json(doc)

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> PresenceDoc:
        """Return the document in ``payload`` (empty: not alive); raise `DocumentError`."""
        if not payload:
            return cls(alive=False)
        doc = decode_object(payload, "presence")
        alive = read(doc, "alive", bool, "presence")
        rdma = doc.get("rdma") if alive else None
        return cls(alive, read(doc, "t_ns", int, "presence", 0), rdma)


# ---- health -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthDoc:
    """A host's health: the GPU verdict, plus free-form telemetry for people and dashboards.

    ``gpu_ok`` False: the GPUs reported errors (``detail`` says which); ``gpu_present`` False:
    the host has no GPU. ``gpu``, ``nics`` (per NIC id) and ``counters`` are JSON objects
    whose contents the contract does not fix, except one key the controller acts on: a NIC's
    ``up`` (true/false: carrier present and not administratively down), see `nic_links`.
    ``send_slip_ns``: the prober's own lateness, the most its sends slipped behind their
    planned times since its previous health document (0: on time; `prober.slip`): a late
    prober's batches cover less of a window, and its delays are its CPU's, not the fabric's.
    """

    gpu_ok: bool = True
    gpu_present: bool = True
    detail: str = ""
    host: str = ""
    t_ns: int = 0
    gpu: Mapping[str, Any] = field(default_factory=dict)
    nics: Mapping[str, Any] = field(default_factory=dict)
    counters: Mapping[str, Any] = field(default_factory=dict)
    send_slip_ns: int = 0

    def __post_init__(self) -> None:
        for key in ("gpu_ok", "gpu_present"):
            value = getattr(self, key)
            check(isinstance(value, bool), "health", key, "true or false", value)
        for key in ("detail", "host"):
            value = getattr(self, key)
            check(isinstance(value, str), "health", key, "a string", value)
        check(_is_int(self.t_ns), "health", "t_ns", "an integer", self.t_ns)
        slip = self.send_slip_ns
        check(_is_int(slip) and slip >= 0, "health", "send_slip_ns", "an integer >= 0", slip)
        for key in ("gpu", "nics", "counters"):
            object.__setattr__(self, key, _frozen(getattr(self, key), f"health: {key}"))

    def encode(self) -> bytes:
        """Return the JSON bytes of this document."""
        return encode_json(
            {
                "host": self.host,
                "t_ns": self.t_ns,
                "gpu_ok": self.gpu_ok,
                "gpu_present": self.gpu_present,
                "detail": self.detail,
                "gpu": _plain(self.gpu),
                "nics": _plain(self.nics),
                "counters": _plain(self.counters),
                "send_slip_ns": self.send_slip_ns,
            }
        )

    def nic_links(self) -> dict[str, bool]:
        """Return ``{nic id: up}`` for the NICs whose section has a boolean ``up``."""
        out: dict[str, bool] = {}
        for nic, sec in self.nics.items():
            up = sec.get("up") if isinstance(sec, Mapping) else None
            if isinstance(up, bool):
                out[str(nic)] = up
        return out

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> HealthDoc:
        """Return the document in ``payload``; raise `DocumentError`."""
        doc = decode_object(payload, "health")
        w = "health"
        return cls(
            gpu_ok=read(doc, "gpu_ok", bool, w, True),
            gpu_present=read(doc, "gpu_present", bool, w, True),
            detail=read(doc, "detail", str, w, ""),
            host=read(doc, "host", str, w, ""),
            t_ns=read(doc, "t_ns", int, w, 0),
            gpu=read(doc, "gpu", dict, w, {}),
            nics=read(doc, "nics", dict, w, {}),
            counters=read(doc, "counters", dict, w, {}),
            send_slip_ns=read(doc, "send_slip_ns", int, w, 0),
        )


# ---- discovered paths ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TracedPath:
    """The routers a flow (src NIC, dst NIC, UDP source port) crossed, by TTL (None: silent)."""

    src: str
    dst: str
    sport: int
    hops: tuple[str | None, ...]
    reached: bool

    def __post_init__(self) -> None:
        w = "path"
        for key in ("src", "dst"):
            value = getattr(self, key)
            check(isinstance(value, str) and bool(value), w, key, "a NIC id", value)
        check(_is_int(self.sport) and 0 <= self.sport <= 0xFFFF, w, "sport", "0..65535", self.sport)
        hops = self.hops
        ok = isinstance(hops, tuple | list) and all(h is None or isinstance(h, str) for h in hops)
        check(ok, w, "hops", "a list of addresses or null", hops)
        object.__setattr__(self, "hops", tuple(hops))
        check(isinstance(self.reached, bool), w, "reached", "true or false", self.reached)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of this path."""
        return {"src": self.src, "dst": self.dst, "sport": self.sport, "hops": list(self.hops),
                "reached": self.reached}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PathsDoc:
    """The paths a prober discovered since its last report (wire form: a JSON list)."""

    paths: tuple[TracedPath, ...]

    def encode(self) -> bytes:
        """Return the JSON bytes of this document."""
        return encode_json([p.to_json() for p in self.paths])

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> PathsDoc:
        """Return the document in ``payload``; raise `DocumentError` on any bad entry."""
        doc = decode_json(payload, "paths")
        if not isinstance(doc, list):
            raise DocumentError(f"paths: must be a JSON list, got {type(doc).__name__}")
        out = []
        for i, e in enumerate(doc):
            w = f"paths[{i}]"
            if not isinstance(e, dict):
                raise DocumentError(f"{w}: must be an object")
            src, dst = read(e, "src", str, w), read(e, "dst", str, w)
            sport, hops = read(e, "sport", int, w), read(e, "hops", list, w)
            try:
                out.append(
                    TracedPath(src, dst, sport, tuple(hops), read(e, "reached", bool, w, True))
                )
            except DocumentError as exc:
                raise DocumentError(f"{w}: {exc}") from None
        return cls(tuple(out))


# ---- events -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventDoc:
    """A controller finding: what (``kind``), where (``target``: a link, NIC or host id),
    when (``t_ns``, the controller's clock), how bad, the queue pairs it touched, and what it
    follows from (``related``: e.g. the down link whose flows ECMP moved onto a contended
    sibling; "" when it stands alone)."""

    t_ns: int
    kind: str
    target: str
    detail: str = ""
    severity: str = "warning"
    flows: tuple[tuple[str, str, int], ...] = ()
    related: str = ""

    def __post_init__(self) -> None:
        w = "event"
        check(_is_int(self.t_ns), w, "t_ns", "an integer", self.t_ns)
        for key in ("kind", "target"):
            value = getattr(self, key)
            check(isinstance(value, str) and bool(value), w, key, "a non-empty string", value)
        check(isinstance(self.detail, str), w, "detail", "a string", self.detail)
        check(isinstance(self.related, str), w, "related", "a string", self.related)
        check(self.severity in SEVERITIES, w, "severity", f"one of {SEVERITIES}", self.severity)
        ok = isinstance(self.flows, tuple | list) and all(
            isinstance(f, tuple | list) and len(f) == 3 and isinstance(f[0], str)
            and isinstance(f[1], str) and _is_int(f[2])
            for f in self.flows
        )  # fmt: skip
        check(ok, w, "flows", "a list of [src NIC, dst NIC, sport]", self.flows)
        object.__setattr__(self, "flows", tuple(tuple(f) for f in self.flows))

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of this finding (flows as ``{"src", "dst", "sport"}``)."""
        return {
            "t_ns": self.t_ns,
            "kind": self.kind,
            "target": self.target,
            "severity": self.severity,
            "detail": self.detail,
            "flows": [{"src": s, "dst": d, "sport": p} for s, d, p in self.flows],
            "related": self.related,
        }

    @classmethod
    def from_json(cls, obj: object, what: str = "event") -> EventDoc:
        """Return the finding in JSON object ``obj`` (`to_json`'s form; a flow may also be
        the legacy triple ``[src, dst, sport]``; unknown keys such as the API's ``seq`` are
        ignored). Raises `DocumentError` whose one-line reason starts with ``what``."""
        if not isinstance(obj, Mapping):
            raise DocumentError(f"{what}: must be a JSON object, got {type(obj).__name__}")
        t_ns = read(obj, "t_ns", int, what)
        kind, target = read(obj, "kind", str, what), read(obj, "target", str, what)
        check(bool(kind), what, "kind", "a non-empty string", kind)
        check(bool(target), what, "target", "a non-empty string", target)
        severity = read(obj, "severity", str, what, "warning")
        check(severity in SEVERITIES, what, "severity", f"one of {SEVERITIES}", severity)
        flows = read(obj, "flows", list, what, [])
        return cls(
            t_ns=t_ns,
            kind=kind,
            target=target,
            detail=read(obj, "detail", str, what, ""),
            severity=severity,
            flows=tuple(_flow(f, what, f"flows[{i}]") for i, f in enumerate(flows)),
            related=read(obj, "related", str, what, ""),
        )

    def encode(self) -> bytes:
        """Return the JSON bytes of `to_json`."""
        return encode_json(self.to_json())

    @classmethod
    def decode(cls, payload: bytes | bytearray) -> EventDoc:
        """Return the finding in ``payload`` (see `from_json`); raise `DocumentError`."""
        return cls.from_json(decode_object(payload, "event"), "event")


def _flow(f: object, what: str, key: str) -> tuple[str, str, int]:
    """Return (src, dst, sport) of a flow written as an object or as a legacy triple."""
    if isinstance(f, Mapping):
        w = f"{what}: {key}"
        return read(f, "src", str, w), read(f, "dst", str, w), read(f, "sport", int, w)
    if isinstance(f, list) and len(f) == 3:
        src, dst, sport = f
        if isinstance(src, str) and isinstance(dst, str) and _is_int(sport):
            return src, dst, sport
    want = '{"src", "dst", "sport"} or [src, dst, sport]'
    raise DocumentError(f"{what}: {key}: must be {want}, got {f!r:.60}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
