"""RoCEv2 ECMP entropy: the IPv6 flow label of a UD address handle picks the UDP source port.

mlx5 derives the RoCEv2 UDP source port from a non-zero 20-bit flow label as
``sport = ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | 0xC000`` (rdma-core providers/mlx5), so the
port is always in 0xC000..0xFFFF and each of its 16 384 values has 64 flow labels. With flow
label 0 the port is random at address-handle creation (not reproducible, so not used).

To sweep ECMP paths the prober creates one address handle per wanted source port with
`flow_label_for_sport` and logs the port with every probe, exactly as the UDP transport does.
"""

from __future__ import annotations

FLOW_LABEL_MAX = 0xFFFFF
SPORT_MIN = 0xC000


def sport_of_flow_label(fl: int) -> int:
    """Return the RoCEv2 UDP source port mlx5 uses for flow label ``fl`` (1..2**20-1).

    Raises `ValueError` for 0 (random port) or a value outside 20 bits.
    """
    if not 0 < fl <= FLOW_LABEL_MAX:
        raise ValueError(f"flow label must be in 1..{FLOW_LABEL_MAX}, got {fl}")
    return ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | SPORT_MIN


def flow_label_for_sport(sport: int, high: int = 1) -> int:
    """Return a non-zero flow label whose mlx5 source port is ``sport`` (0xC000..0xFFFF).

    ``high`` (0..63) picks which of the 64 matching labels (bits 14..19); it is bumped when it
    would give label 0. Raises `ValueError` for a port outside the RoCEv2 range.
    """
    if not SPORT_MIN <= sport <= 0xFFFF:
        raise ValueError(f"RoCEv2 source port must be in {SPORT_MIN}..65535, got {sport}")
    if not 0 <= high <= 63:
        raise ValueError("high must be in 0..63")
    low14 = sport & 0x3FFF
    if low14 == 0 and high == 0:
        high = 1
    return (high << 14) | (low14 ^ high)


RXE_VENDOR_ID = 0xFFFFFF  # Soft-RoCE (rdma_rxe) reports this vendor id
_GOLDEN_RATIO_32 = 0x61C88647  # the kernel's hash_32 multiplier (include/linux/hash.h)


def rxe_sport_of_qpn(qpn: int) -> int:
    """Return the RoCEv2 UDP source port Soft-RoCE (rxe) uses for every packet of QP ``qpn``.

    rxe ignores the address handle's flow label: a QP's port is fixed at creation,
    ``0xC000 + hash_32(qpn, 14)`` (drivers/infiniband/sw/rxe/rxe_qp.c; seen on the wire with
    kernel 6.1: QPN 17 -> 57236). To sweep paths on rxe a NIC needs one QP per source port.
    Raises `ValueError` for a QPN outside 24 bits.
    """
    if not 0 <= qpn <= 0xFFFFFF:
        raise ValueError(f"QPN must be in 0..{0xFFFFFF}, got {qpn}")
    return SPORT_MIN + (((qpn * _GOLDEN_RATIO_32) & 0xFFFFFFFF) >> (32 - 14))
