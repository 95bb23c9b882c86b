"""Wire format: round trips, bounds checks, HMAC, and a decoder fuzz."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prober.wire import (
    BODY_LEN,
    MAX_T3S,
    T3_ENTRY_LEN,
    TAG_LEN,
    AuthError,
    BadFieldError,
    BadMagicError,
    BadTypeError,
    BadVersionError,
    Codec,
    Message,
    MsgType,
    TruncatedError,
    WireError,
    nic_hash,
)

KEY = b"k" * 32


def _reply() -> Message:
    return Message(MsgType.REPLY, nic_hash("b"), nic_hash("a"), 7, 3, 1, 1_000, 2_000, True)


def test_round_trip_all_types_plain_and_keyed() -> None:
    msgs = [
        Message(MsgType.PROBE, 1, 2, 0xFFFFFFFF, pad=100),
        _reply(),
        Message(MsgType.REPLY, 1, 2, 5, ta=123),
        Message(MsgType.FOLLOW_UP, 1, 2, 5, 9, 0, 123, 456),
        Message(MsgType.PROBE, 1, 2, 5, trace=True),
        Message(MsgType.REPLY, 1, 2, 5, ta=1, tb=2, t3_final=True, trace=True),
    ]
    for codec in (Codec(), Codec(KEY)):
        for m in msgs:
            data = codec.encode(m)
            assert len(data) == BODY_LEN + m.pad + codec.tag_len
            assert codec.decode(data) == m


def test_pack_probe_into_matches_encode() -> None:
    buf = bytearray(64)
    n = Codec().pack_probe_into(buf, 11, 22, 33, 4, 1)
    assert bytes(buf[:n]) == Codec().encode(Message(MsgType.PROBE, 11, 22, 33, 4, 1))
    n = Codec().pack_probe_into(buf, 11, 22, 33, trace=True)
    assert bytes(buf[:n]) == Codec().encode(Message(MsgType.PROBE, 11, 22, 33, trace=True))
    with pytest.raises(ValueError):
        Codec(KEY).pack_probe_into(buf, 1, 2, 3)


def test_network_byte_order_layout() -> None:
    data = Codec().encode(_reply())
    assert data[:2] == b"QP" and data[2] == 1 and data[3] == MsgType.REPLY
    assert struct.unpack_from("!I", data, 24)[0] == 7
    assert struct.unpack_from("!q", data, 32)[0] == 1_000


@pytest.mark.parametrize(
    ("mutate", "exc"),
    [
        (lambda b: b[:10], TruncatedError),
        (lambda b: b"XX" + b[2:], BadMagicError),
        (lambda b: b[:2] + b"\x09" + b[3:], BadVersionError),
        (lambda b: b[:3] + b"\x07" + b[4:], BadTypeError),
        (lambda b: b[:4] + b"\x80" + b[5:], BadFieldError),  # unknown flag
        (lambda b: b[:5] + b"\x05" + b[6:], BadFieldError),  # pair_pos 5
        (lambda b: b[:32] + b"\xff" * 8 + b[40:], BadFieldError),  # negative t2
        (lambda b: b + b"\x01", BadFieldError),  # non-zero padding
    ],
)
def test_malformed_raise_specific_wire_errors(mutate: object, exc: type[WireError]) -> None:
    data = Codec().encode(_reply())
    with pytest.raises(exc) as info:
        Codec().decode(mutate(data))  # type: ignore[operator]
    assert isinstance(info.value, WireError) and info.value.reason


def test_hmac_rejects_wrong_key_missing_tag_tamper() -> None:
    good = Codec(KEY).encode(_reply())
    with pytest.raises(AuthError):
        Codec(b"x" * 32).decode(good)
    with pytest.raises(AuthError):
        Codec(KEY).decode(Codec().encode(_reply()))  # untagged
    with pytest.raises(AuthError):
        Codec().decode(good)  # tagged but we have no key
    tampered = bytearray(good)
    tampered[25] ^= 1
    with pytest.raises(AuthError):
        Codec(KEY).decode(bytes(tampered))
    with pytest.raises(WireError):
        Codec(KEY).decode(good[: BODY_LEN + TAG_LEN - 1])
    with pytest.raises(ValueError):
        Codec(b"short")


def test_codec_keys_send_key_first_then_the_accepted_ones() -> None:
    old, new = b"o" * 32, b"n" * 32
    assert Codec().keys == ()
    assert Codec(new, (old, new)).keys == (new, old)  # the send key is not repeated
    assert Codec(KEY).keys == (KEY,)


def test_message_validation() -> None:
    with pytest.raises(BadFieldError):
        Message(MsgType.PROBE, 1, 2, 3, ta=5)
    with pytest.raises(BadFieldError):
        Message(MsgType.PROBE, 1, 2, 1 << 32)
    with pytest.raises(BadFieldError):
        Message(MsgType.PROBE, 1, 2, 3, pair_id=-1, pair_pos=1)
    with pytest.raises(BadFieldError):
        Message(MsgType.REPLY, 1, 2, 3, ta=1, tb=2)  # two-step reply with t3


def _carrying_reply(pad: int = 0) -> Message:
    return Message(MsgType.REPLY, 1, 2, 9, 4, 1, 500, pad=pad, t3s=((7, 600), (8, 2**63 - 1)))


def _held_follow_up(n: int = 3) -> Message:
    return Message(MsgType.FOLLOW_UP, 1, 2, 0, t3s=tuple((s, 1000 + s) for s in range(n)))


def test_deferred_follow_up_forms_round_trip_plain_and_keyed() -> None:
    msgs = [
        Message(MsgType.PROBE, 1, 2, 5, 3, 0, pad=16, defer_ok=True),
        _carrying_reply(),
        _carrying_reply(pad=20),
        _held_follow_up(1),
        _held_follow_up(MAX_T3S),
    ]
    for codec in (Codec(), Codec(KEY)):
        for m in msgs:
            data = codec.encode(m)
            listed = 1 + T3_ENTRY_LEN * len(m.t3s) if m.t3s else 0
            assert len(data) == BODY_LEN + listed + m.pad + codec.tag_len
            assert codec.decode(data) == m
    # the list sits after the body, before the padding: flag bit4, count, (seq, t3) entries
    data = Codec().encode(_carrying_reply(pad=4))
    assert data[4] == 0x10 and data[BODY_LEN] == 2
    assert struct.unpack("!Iq", data[BODY_LEN + 1 : BODY_LEN + 13]) == (7, 600)
    assert data[-4:] == bytes(4)
    assert Codec().encode(Message(MsgType.PROBE, 1, 2, 5, defer_ok=True))[4] == 0x08


def test_t3_list_inside_the_hmac() -> None:
    good = Codec(KEY).encode(_carrying_reply())
    tampered = bytearray(good)
    tampered[BODY_LEN + 12] ^= 1  # the last byte of the first entry's t3
    with pytest.raises(AuthError):
        Codec(KEY).decode(bytes(tampered))


@pytest.mark.parametrize(
    ("edit", "exc", "reason"),
    [
        (lambda d: d[:BODY_LEN], TruncatedError, "no t3 count"),
        (lambda d: d[: BODY_LEN + 1 + T3_ENTRY_LEN], TruncatedError, "needs"),
        (lambda d: d[:BODY_LEN] + b"\x00" + d[BODY_LEN + 1 :], BadFieldError, "t3 count 0"),
        (
            lambda d: d[:BODY_LEN] + bytes([MAX_T3S + 1]) + d[BODY_LEN + 1 :],
            BadFieldError,
            "t3 count",
        ),
        (lambda d: d[:BODY_LEN] + b"\x01" + d[BODY_LEN + 1 :], BadFieldError, "padding"),
        (lambda d: d[: BODY_LEN + 5] + b"\x80" + d[BODY_LEN + 6 :], BadFieldError, "out of range"),
        (lambda d: d[:3] + b"\x01" + d[4:], BadFieldError, "PROBE carries"),  # list on a PROBE
    ],
)
def test_malformed_t3_lists_raise_short_wire_errors(
    edit: object, exc: type[WireError], reason: str
) -> None:
    data = Codec().encode(_carrying_reply())
    with pytest.raises(exc, match=reason):
        Codec().decode(edit(data))  # type: ignore[operator]


def test_deferred_forms_validation() -> None:
    with pytest.raises(BadFieldError, match="only a PROBE"):
        Message(MsgType.REPLY, 1, 2, 3, ta=1, defer_ok=True)
    with pytest.raises(BadFieldError, match="empty body"):
        Message(MsgType.FOLLOW_UP, 1, 2, 3, ta=1, tb=2, t3s=((1, 2),))
    with pytest.raises(BadFieldError, match="entries"):
        _held_follow_up(MAX_T3S + 1)
    with pytest.raises(BadFieldError, match="out of range"):
        Message(MsgType.FOLLOW_UP, 1, 2, 0, t3s=((1 << 32, 2),))
    with pytest.raises(BadFieldError, match="trace"):
        Message(MsgType.REPLY, 1, 2, 3, ta=1, trace=True, t3s=((1, 2),))
    bad = bytearray(Codec().encode(Message(MsgType.PROBE, 1, 2, 5, defer_ok=True)))
    bad[3] = 2  # a REPLY with DEFER_OK
    with pytest.raises(BadFieldError):
        Codec().decode(bytes(bad))


_VALID = [
    Codec().encode(Message(MsgType.PROBE, 1, 2, 3, pad=8)),
    Codec().encode(_reply()),
    Codec().encode(Message(MsgType.FOLLOW_UP, 5, 6, 7, 1, 1, 10, 20)),
    Codec().encode(Message(MsgType.PROBE, 1, 2, 3, pad=8, defer_ok=True)),
    Codec().encode(_carrying_reply(pad=6)),
    Codec().encode(_held_follow_up()),
]
_KEYED = Codec(KEY)
_VALID_KEYED = [_KEYED.encode(_reply()), _KEYED.encode(_carrying_reply()),
                _KEYED.encode(_held_follow_up(2))]  # fmt: skip


def _decode_or_wire_error(codec: Codec, data: bytes) -> None:
    try:
        msg = codec.decode(data)
    except WireError:
        return
    assert codec.decode(codec.encode(msg)) == msg  # anything accepted re-encodes identically


@pytest.mark.slow
@settings(max_examples=20000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_only_wire_error(data: bytes) -> None:
    _decode_or_wire_error(Codec(), data)
    _decode_or_wire_error(_KEYED, data)


def test_fuzz_100k_seeded_mutations_of_valid_messages() -> None:
    """Cheap bulk mutation fuzz (bit flips, byte sets, truncation, extension) without hypothesis."""
    rng = random.Random(42)
    plain, keyed = Codec(), _KEYED
    bases = _VALID + _VALID_KEYED
    accepted = 0
    for _ in range(100_000):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(4)
            if op == 0 and data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            elif op == 1 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif op == 2:
                del data[rng.randrange(len(data) + 1) :]
            else:
                data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        for codec in (plain, keyed):
            try:
                codec.decode(bytes(data))
                accepted += 1
            except WireError:
                pass
    assert accepted > 0  # some mutations (e.g. of timestamps) stay valid: the decoder was reached


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(_VALID + _VALID_KEYED),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
    st.integers(0, 120),
    st.binary(max_size=16),
)
def test_fuzz_mutated_valid_messages(
    base: bytes, flips: list[tuple[int, int]], cut: int, tail: bytes
) -> None:
    data = bytearray(base)
    for pos, val in flips:
        if data:
            data[pos % len(data)] = val
    mutated = bytes(data[: max(0, len(data) - cut % 20)]) + (tail if cut > 100 else b"")
    _decode_or_wire_error(Codec(), mutated)
    _decode_or_wire_error(_KEYED, mutated)


def test_nic_hash_is_blake2b_64_and_memoized() -> None:
    """The wire hash of a NIC id is blake2b-64 of its UTF-8 bytes, big-endian; memoized (path
    discovery asks for it per trace probe and reply), the same value from the cache."""
    import hashlib

    for nic in ("nicA", "p3x7", "h0", "ü-nic"):
        want = int.from_bytes(hashlib.blake2b(nic.encode(), digest_size=8).digest(), "big")
        assert nic_hash(nic) == want and nic_hash(nic) == want
    hits = nic_hash.cache_info().hits
    nic_hash("p3x7")
    assert nic_hash.cache_info().hits == hits + 1
