"""UD receive-buffer layout: a 40-byte GRH area, then the probe message.

On a UD QP every receive buffer starts with 40 bytes for the Global Routing Header. On
InfiniBand it is the IB GRH (source GID at bytes 8..24, destination GID at 24..40). On RoCEv2
over IPv4 the first 20 bytes are undefined and bytes 20..40 hold the IPv4 header (source
address at 32..36). The probe payload (`prober.wire` message) follows at offset 40.
"""

from __future__ import annotations

import ipaddress

GRH_SIZE = 40


class PacketError(ValueError):
    """A receive buffer is too short or its GRH is not what it claims to be."""


def split_grh(buf: bytes | bytearray | memoryview, byte_len: int) -> tuple[bytes, bytes]:
    """Return (grh, payload) of a UD receive buffer that got ``byte_len`` bytes (GRH included).

    Raises `PacketError` if the completion is shorter than the GRH or longer than the buffer.
    """
    if byte_len < GRH_SIZE or byte_len > len(buf):
        raise PacketError(f"UD completion of {byte_len} bytes in a {len(buf)}-byte buffer")
    data = bytes(buf[:byte_len])
    return data[:GRH_SIZE], data[GRH_SIZE:]


def grh_source(grh: bytes) -> str:
    """Return the sender's address from a GRH: IPv4 dotted for RoCEv2/IPv4, else the GID.

    Raises `PacketError` on a wrong-sized GRH.
    """
    if len(grh) != GRH_SIZE:
        raise PacketError(f"GRH must be {GRH_SIZE} bytes, got {len(grh)}")
    ip4 = grh[20:40]
    if ip4[0] >> 4 == 4 and (ip4[0] & 0x0F) == 5:
        return str(ipaddress.IPv4Address(ip4[12:16]))
    return str(ipaddress.IPv6Address(grh[8:24]))


def build_grh_ipv4(src: str, dst: str) -> bytes:
    """Return a RoCEv2/IPv4 GRH area as a NIC writes it (for tests and fake links)."""
    hdr = bytearray(20)
    hdr[0] = 0x45
    hdr[8] = 64
    hdr[9] = 17
    hdr[12:16] = ipaddress.IPv4Address(src).packed
    hdr[16:20] = ipaddress.IPv4Address(dst).packed
    return bytes(20) + bytes(hdr)


def build_grh_ib(sgid: str, dgid: str) -> bytes:
    """Return an InfiniBand GRH (version 6, next header 0x1B) for tests and fake links."""
    grh = bytearray(GRH_SIZE)
    grh[0] = 0x60
    grh[6] = 0x1B
    grh[7] = 64
    grh[8:24] = ipaddress.IPv6Address(sgid).packed
    grh[24:40] = ipaddress.IPv6Address(dgid).packed
    return bytes(grh)
