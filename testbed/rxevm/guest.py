"""Shell text that turns a fresh virtme-ng guest into a two-NIC Soft-RoCE (rxe) host, pure.

The guest gets one veth pair ``<a>``/``<b>`` with ``10.9.0.1/24`` and ``10.9.0.2/24`` and an rxe
device on each end (``rxe0`` on ``<a>``, ``rxe1`` on ``<b>``). Both addresses are local to the
one network stack, so by default the kernel routes traffic between them through ``lo`` and rxe
cannot create address handles ("Failed to create AH"). Policy routing forces it onto the wire
(the recipe of ``../shared/FIELD-NOTES.md``): a table per destination used for locally generated
packets (``iif lo``), ``accept_local`` and no reverse-path filter, and the ``local`` table moved
behind those rules. The two neighbour entries are permanent (no ARP re-resolution, which
queues or drops packets, in the middle of a run). A qdisc on either veth end (``sch_netem``) then acts on the RDMA traffic.

GID index 1 of each rxe device is the IPv4-mapped RoCE v2 GID (``::ffff:10.9.0.x``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RxePair:
    """Two rxe devices on the ends of one veth pair; validated (ValueError)."""

    veth_a: str = "qpva"
    veth_b: str = "qpvb"
    addr_a: str = "10.9.0.1"
    addr_b: str = "10.9.0.2"
    rxe_a: str = "rxe0"
    rxe_b: str = "rxe1"

    def __post_init__(self) -> None:
        for name in (self.veth_a, self.veth_b, self.rxe_a, self.rxe_b):
            if not name or len(name) > 15 or not name.replace("_", "").isalnum():
                raise ValueError(f"interface name {name!r} must be 1..15 alphanumerics")
        if self.addr_a == self.addr_b:
            raise ValueError("the two ends need different addresses")


def setup_script(pair: RxePair = RxePair()) -> str:
    """Return the ``sh`` commands that load rxe, build the veth pair and the two rxe devices.

    The script stops at the first failing command (``set -e``) and ends with ``rdma link``
    output, so a failed setup names its step in the guest's stderr.
    """
    a, b = shlex.quote(pair.veth_a), shlex.quote(pair.veth_b)
    ia, ib = pair.addr_a, pair.addr_b
    lines = [
        "set -e",
        "modprobe rdma_rxe",
        "modprobe sch_netem",
        "ip link set lo up",
        f"ip link add {a} type veth peer name {b}",
        f"ip addr add {ia}/24 dev {a}",
        f"ip addr add {ib}/24 dev {b}",
        f"ip link set {a} up",
        f"ip link set {b} up",
    ]
    for dev in ("all", "default", pair.veth_a, pair.veth_b):
        lines.append(
            f"sysctl -qw net.ipv4.conf.{dev}.rp_filter=0 net.ipv4.conf.{dev}.accept_local=1"
        )
    lines += [
        f"ip rule add pref 10 to {ib} iif lo lookup 100",
        f"ip route add {ib} dev {a} src {ia} table 100",
        f"ip rule add pref 11 to {ia} iif lo lookup 101",
        f"ip route add {ia} dev {b} src {ib} table 101",
        "ip rule add pref 100 lookup local",
        "ip rule del pref 0 lookup local",
        # permanent neighbours: no ARP re-resolution (which queues or drops packets) mid-run
        f"ip neigh replace {ib} dev {a} lladdr $(cat /sys/class/net/{b}/address) nud permanent",
        f"ip neigh replace {ia} dev {b} lladdr $(cat /sys/class/net/{a}/address) nud permanent",
        f"rdma link add {shlex.quote(pair.rxe_a)} type rxe netdev {a}",
        f"rdma link add {shlex.quote(pair.rxe_b)} type rxe netdev {b}",
        "rdma link show",
    ]
    return "\n".join(lines) + "\n"
