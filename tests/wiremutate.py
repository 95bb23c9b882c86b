"""The wire fuzz tests' mutation: flip bytes of a valid datagram, then cut or extend it
(shared by the C parser's plain and keyed fuzz tests)."""

from __future__ import annotations


def mutated(base: bytes, flips: list[tuple[int, int]], cut: int, extra: bytes) -> bytes:
    """Return ``base`` with byte ``pos`` set to ``val`` for each (pos, val) of ``flips`` inside
    it, then cut to ``cut`` bytes (0 when negative) when shorter, else ``extra`` appended."""
    data = bytearray(base)
    for pos, val in flips:
        if pos < len(data):
            data[pos] = val
    return bytes(data[: max(0, cut)] if cut < len(data) else data + extra)
