"""Probe wire format: versioned, fixed-layout, network byte order, optionally HMAC-tagged.

Pure bytes <-> values; no I/O, no clocks. Every datagram has the same 48-byte body::

    offset size field
         0    2 magic      0x5150 ("QP")
         2    1 version    1
         3    1 type       MsgType (PROBE=1, REPLY=2, FOLLOW_UP=3)
         4    1 flags      bit0 AUTH (16-byte HMAC-SHA256 tag at the end),
                           bit1 T3_FINAL (REPLY already carries the final t3),
                           bit2 TRACE (path-discovery probe / its reply, see `prober.pathdisc`),
                           bit3 DEFER_OK (PROBE: the initiator takes deferred t3s, below),
                           bit4 CARRIES_T3 (REPLY/FOLLOW_UP: a t3 list follows the body)
         5    1 pair_pos   position in a coded pair (0 or 1; 0 when not coded)
         6    2 reserved   must be 0
         8    8 sender     `nic_hash` of the sending NIC id
        16    8 peer       PROBE: hash of the target NIC; REPLY/FOLLOW_UP: hash of the initiator
        24    4 seq        initiator sequence number (wraps at 2**32)
        28    4 pair_id    int32 coded-pair id, -1 when not coded
        32    8 ta         int64 ns: PROBE 0; REPLY/FOLLOW_UP t2 (responder receive)
        40    8 tb         int64 ns: PROBE 0; REPLY t3 if T3_FINAL else 0; FOLLOW_UP t3
        48    L t3 list    only with CARRIES_T3: count (1 byte, 1..MAX_T3S), then count x
                           (seq uint32, t3 int64): L = 1 + 12 * count
      48+L    n padding    zero bytes (lets probes be sized like real traffic)
    48+L+n   16 tag        HMAC-SHA256(key, everything before the tag)[:16], only with AUTH

Two-step transmit stamps (as PTP does): t3, the responder's send time, is only known after the
reply leaves (kernel TX stamp from the error queue), so the responder sends a FOLLOW_UP with the
same seq carrying t2 and t3. A responder without TX stamps sends a one-step REPLY (T3_FINAL set,
t3 = its best user-space estimate) and no FOLLOW_UP. t1 never travels: the initiator keeps it.

Deferred follow-ups (fewer datagrams per probe): an initiator that sets DEFER_OK on its PROBE
lets the responder keep the reply's (seq, t3) instead of sending a FOLLOW_UP per reply. The
responder carries what it holds for that initiator NIC (keyed by the PROBE's sender hash, sent
to any of its source ports) as the t3 list of its next REPLY to it, and after a hold time
sends whatever is still held as ONE FOLLOW_UP whose body is empty (seq 0, pair_id -1, ta = tb
= 0) and whose list carries all of it; also on close. The t3 list sits before the padding, so
with AUTH the tag covers it. The initiator completes a probe when its t3 arrives by either
route (its t2 comes with the REPLY as always); its probe timeout must exceed the responder's
hold time plus a round trip. A PROBE without DEFER_OK gets a FOLLOW_UP per reply, and a
responder may ignore DEFER_OK (the Python paths do): the flag only permits deferral. A lost
REPLY that carried a list leaves those probes without t3: they end ``incomplete`` (counted,
not reported as lost), as a lost FOLLOW_UP does.

`Codec.decode` raises only `WireError` subclasses; each has a short ``reason`` used as a
counter key by the session.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import struct
from typing import NamedTuple

from contract.keys import HMAC, KeySet

MAGIC = 0x5150
VERSION = 1
TAG_LEN = 16
MAX_PAD = 8192
FLAG_AUTH = 0x01
FLAG_T3_FINAL = 0x02
FLAG_TRACE = 0x04
FLAG_DEFER_OK = 0x08
FLAG_CARRIES_T3 = 0x10
_KNOWN_FLAGS = FLAG_AUTH | FLAG_T3_FINAL | FLAG_TRACE | FLAG_DEFER_OK | FLAG_CARRIES_T3
_BODY = struct.Struct("!HBBBBHQQIiqq")
BODY_LEN = _BODY.size  # 48
_T3 = struct.Struct("!Iq")
T3_ENTRY_LEN = _T3.size  # 12
MAX_T3S = 64
"""Most (seq, t3) entries one message may carry (the decoder rejects more)."""
_U64 = (1 << 64) - 1
_I64 = (1 << 63) - 1


class MsgType(enum.IntEnum):
    """Message types on the wire."""

    PROBE = 1
    REPLY = 2
    FOLLOW_UP = 3


_TYPES = (MsgType.PROBE, MsgType.PROBE, MsgType.REPLY, MsgType.FOLLOW_UP)  # [0] unused


class WireError(ValueError):
    """A datagram is not a valid probe message; ``reason`` is a short counter key."""

    reason = "malformed"


class TruncatedError(WireError):
    """The datagram is shorter than the fixed body (plus tag when authenticated)."""

    reason = "truncated"


class BadMagicError(WireError):
    """The datagram does not start with the qpmesh magic."""

    reason = "bad_magic"


class BadVersionError(WireError):
    """The datagram carries a protocol version this decoder does not speak."""

    reason = "bad_version"


class BadTypeError(WireError):
    """Unknown message type."""

    reason = "bad_type"


class BadFieldError(WireError):
    """A field is out of range or inconsistent with the message type."""

    reason = "bad_field"


class AuthError(WireError):
    """Missing, unexpected or wrong HMAC tag."""

    reason = "bad_auth"


WIRE_ERROR_REASONS: tuple[str, ...] = (
    "malformed",
    "truncated",
    "bad_magic",
    "bad_version",
    "bad_type",
    "bad_field",
    "bad_auth",
)


@functools.lru_cache(maxsize=1 << 16)
def nic_hash(nic_id: str) -> int:
    """Return the stable 64-bit hash of a NIC id (blake2b-64) used as sender/peer on the wire.

    Memoized (a pure function of the id; a fleet has far fewer NIC ids than the cache holds):
    path discovery asks for it for every trace probe and every trace reply, and a blake2b per
    call was ~1 % of the compiled prober's Python time."""
    return int.from_bytes(hashlib.blake2b(nic_id.encode(), digest_size=8).digest(), "big")


class _MessageFields(NamedTuple):
    mtype: MsgType
    sender: int
    peer: int
    seq: int
    pair_id: int = -1
    pair_pos: int = 0
    ta: int = 0
    tb: int = 0
    t3_final: bool = False
    pad: int = 0
    trace: bool = False
    defer_ok: bool = False
    t3s: tuple[tuple[int, int], ...] = ()


class Message(_MessageFields):
    """One probe message (an immutable named tuple); validated on construction.

    Raises `BadFieldError` when a field is out of range or does not fit the type. A NamedTuple
    rather than a frozen dataclass: several are built per probe and this is ~10x cheaper.
    """

    __slots__ = ()

    def __new__(  # type: ignore[misc]
        cls,
        mtype: MsgType,
        sender: int,
        peer: int,
        seq: int,
        pair_id: int = -1,
        pair_pos: int = 0,
        ta: int = 0,
        tb: int = 0,
        t3_final: bool = False,
        pad: int = 0,
        trace: bool = False,
        defer_ok: bool = False,
        t3s: tuple[tuple[int, int], ...] = (),
    ) -> Message:
        if not (
            0 <= sender <= _U64
            and 0 <= peer <= _U64
            and 0 <= seq <= 0xFFFFFFFF
            and -1 <= pair_id <= 0x7FFFFFFF
            and 0 <= ta <= _I64
            and 0 <= tb <= _I64
            and 0 <= pad <= MAX_PAD
        ):
            raise BadFieldError(
                f"field out of range: sender={sender} peer={peer} seq={seq} pair_id={pair_id} "
                f"ta={ta} tb={tb} pad={pad}"
            )
        if pair_pos not in (0, 1) or (pair_id == -1 and pair_pos):
            raise BadFieldError(f"pair_pos {pair_pos} invalid for pair_id {pair_id}")
        if t3s:
            if len(t3s) > MAX_T3S:
                raise BadFieldError(f"{len(t3s)} t3 entries > {MAX_T3S}")
            for s, t in t3s:
                if not (0 <= s <= 0xFFFFFFFF and 0 <= t <= _I64):
                    raise BadFieldError(f"t3 entry out of range: seq={s} t3={t}")
        if mtype is MsgType.PROBE:
            if ta or tb or t3_final or t3s:
                raise BadFieldError("PROBE carries no timestamps")
        elif defer_ok:
            raise BadFieldError("only a PROBE sets DEFER_OK")
        elif mtype is MsgType.REPLY:
            if tb and not t3_final:
                raise BadFieldError("two-step REPLY must not carry t3")
            if t3s and trace:
                raise BadFieldError("a trace REPLY carries no t3 list")
        elif mtype is MsgType.FOLLOW_UP:
            if t3_final or trace:
                raise BadFieldError("FOLLOW_UP uses neither T3_FINAL nor TRACE")
            if t3s and (seq or pair_id != -1 or ta or tb):
                raise BadFieldError("a FOLLOW_UP with a t3 list has an empty body")
        else:
            raise BadTypeError(f"type {mtype!r}")
        return tuple.__new__(cls, (mtype, sender, peer, seq, pair_id, pair_pos, ta, tb,
                                   t3_final, pad, trace, defer_ok, tuple(t3s)))  # fmt: skip


class Codec:
    """Encode/decode probe messages, with an optional shared HMAC key.

    With a key, every encoded message is tagged and `decode` rejects untagged or badly tagged
    datagrams with `AuthError`. Without a key, tagged datagrams are rejected too (the two ends
    disagree on configuration, which must be visible rather than silently accepted).
    ``accept``: further keys whose tags `decode` also takes (a key rotation: the old key still
    verifies while ``key``, the new one, tags what is sent). The datagram names no key, so a
    tag is checked against ``key`` first and the others only when it does not match.
    """

    __slots__ = ("_accept", "_key", "tag_len")

    def __init__(self, key: bytes | None = None, accept: tuple[bytes, ...] = ()) -> None:
        if key is not None and len(key) < 16:
            raise ValueError("HMAC key must be at least 16 bytes")
        if accept and key is None:
            raise ValueError("accepted keys need a sending key")
        if any(len(k) < 16 for k in accept):
            raise ValueError("HMAC key must be at least 16 bytes")
        self._key = key
        self._accept = tuple(k for k in accept if k != key)
        self.tag_len = TAG_LEN if key is not None else 0

    @property
    def authenticated(self) -> bool:
        """Return True when this codec tags and verifies messages."""
        return self._key is not None

    @property
    def keys(self) -> tuple[bytes, ...]:
        """Return the HMAC keys, the sending key first, then the others it accepts; empty for
        an unauthenticated codec (for the compiled engine, which tags and verifies alike)."""
        return () if self._key is None else (self._key, *self._accept)

    def _tag(self, data: bytes | memoryview, key: bytes | None = None) -> bytes:
        k = key if key is not None else self._key
        assert k is not None
        return hmac.digest(k, data, "sha256")[:TAG_LEN]

    def _verify(self, body: memoryview, tag: bytes) -> bool:
        if hmac.compare_digest(self._tag(body), tag):
            return True
        return any(hmac.compare_digest(self._tag(body, k), tag) for k in self._accept)

    def encode(self, msg: Message) -> bytes:
        """Return the wire bytes of ``msg`` (body, zero padding, tag when keyed)."""
        flags = (
            (FLAG_T3_FINAL if msg.t3_final else 0)
            | (FLAG_TRACE if msg.trace else 0)
            | (FLAG_DEFER_OK if msg.defer_ok else 0)
        )
        return self.encode_fields(
            int(msg.mtype), flags, msg.sender, msg.peer, msg.seq, msg.pair_id, msg.pair_pos,
            msg.ta, msg.tb, msg.pad, msg.t3s,
        )  # fmt: skip

    def encode_fields(
        self,
        mtype: int,
        flags: int,
        sender: int,
        peer: int,
        seq: int,
        pair_id: int = -1,
        pair_pos: int = 0,
        ta: int = 0,
        tb: int = 0,
        pad: int = 0,
        t3s: tuple[tuple[int, int], ...] = (),
    ) -> bytes:
        """Return the wire bytes of a message given field by field: `encode` without building
        (and so without validating) a `Message`. For fields already known to be valid: taken
        from a decoded message, or range-checked by the caller (`prober.session` builds its
        replies and follow-ups so). ``flags``: T3_FINAL, TRACE, DEFER_OK; the codec adds AUTH
        (and the tag) when keyed and CARRIES_T3 when ``t3s`` is not empty.
        """
        if self._key is not None:
            flags |= FLAG_AUTH
        if t3s:
            flags |= FLAG_CARRIES_T3
        body = _BODY.pack(
            MAGIC, VERSION, mtype, flags, pair_pos, 0, sender, peer, seq, pair_id, ta, tb
        )
        if t3s:
            body += bytes((len(t3s),)) + b"".join(_T3.pack(s, t) for s, t in t3s)
        if pad:
            body += bytes(pad)
        if self._key is not None:
            body += self._tag(body)
        return body

    def pack_probe_into(
        self,
        buf: bytearray,
        sender: int,
        peer: int,
        seq: int,
        pair_id: int = -1,
        pair_pos: int = 0,
        trace: bool = False,
    ) -> int:
        """Write an untagged PROBE into ``buf`` (hot path, no allocation); return its length.

        Raises `ValueError` if the codec is keyed (use `encode`, the tag needs the bytes).
        """
        if self._key is not None:
            raise ValueError("pack_probe_into is only for unauthenticated codecs")
        flags = FLAG_TRACE if trace else 0
        _BODY.pack_into(
            buf, 0, MAGIC, VERSION, 1, flags, pair_pos, 0, sender, peer, seq, pair_id, 0, 0
        )
        return BODY_LEN

    def decode(self, data: bytes | bytearray | memoryview) -> Message:
        """Return the `Message` in ``data``; raise a `WireError` subclass if it is invalid."""
        n = len(data)
        if n < BODY_LEN:
            raise TruncatedError(f"{n} bytes < {BODY_LEN}")
        try:
            magic, ver, mtype, flags, pos, rsv, sender, peer, seq, pair, ta, tb = _BODY.unpack_from(
                data, 0
            )
        except struct.error as exc:  # pragma: no cover - guarded by the length check
            raise TruncatedError(str(exc)) from None
        if magic != MAGIC:
            raise BadMagicError(f"magic {magic:#06x}")
        if ver != VERSION:
            raise BadVersionError(f"version {ver}")
        if mtype not in (1, 2, 3):
            raise BadTypeError(f"type {mtype}")
        if flags & ~_KNOWN_FLAGS or rsv:
            raise BadFieldError(f"unknown flags {flags:#x} or reserved {rsv}")
        tagged = bool(flags & FLAG_AUTH)
        if tagged != (self._key is not None):
            raise AuthError("tag missing" if self._key is not None else "unexpected tag")
        end = n - self.tag_len
        if end < BODY_LEN:
            raise TruncatedError("no room for the tag")
        if self._key is not None:
            view = memoryview(data)
            if not self._verify(view[:end], bytes(view[end:])):
                raise AuthError("tag mismatch")
        at = BODY_LEN
        t3s: tuple[tuple[int, int], ...] = ()
        if flags & FLAG_CARRIES_T3:
            if end < BODY_LEN + 1:
                raise TruncatedError("no t3 count")
            count = data[BODY_LEN]
            if not 1 <= count <= MAX_T3S:
                raise BadFieldError(f"t3 count {count}")
            at = BODY_LEN + 1 + count * T3_ENTRY_LEN
            if at > end:
                raise TruncatedError(f"t3 list of {count} needs {at} bytes, {end} there")
            t3s = tuple(_T3.iter_unpack(bytes(data[BODY_LEN + 1 : at])))
        pad = end - at
        if pad > MAX_PAD:
            raise BadFieldError(f"pad {pad} too long")
        if pad and any(bytes(data[at:end])):
            raise BadFieldError("non-zero padding")
        return Message(
            _TYPES[mtype], sender, peer, seq, pair, pos, ta, tb,
            bool(flags & FLAG_T3_FINAL), pad, bool(flags & FLAG_TRACE),
            bool(flags & FLAG_DEFER_OK), t3s,
        )  # fmt: skip


def codec_for(keys: KeySet | None) -> Codec:
    """Return the codec of a probe key set (`contract.keys`): the ``send`` key tags, every
    key verifies; None: an unauthenticated codec. Raises ValueError for non-HMAC keys."""
    if keys is None:
        return Codec()
    if keys.type != HMAC:
        raise ValueError(f"{keys.source}: probe keys must be {HMAC}, got {keys.type}")
    return Codec(keys.send.material, tuple(k.material for k in keys.others()))
