"""Build two- and three-tier Clos (leaf-spine) fabrics from a few shape numbers.

Naming (global numbering, stable across runs): ``nic{n}`` on ``host{h}`` attached to ``leaf{l}``;
``spine{s}``; ``super{k}``. Links are ``nic{n}-leaf{l}``, ``leaf{l}-spine{s}``,
``spine{s}-super{k}``. Each leaf is one ECMP group ``ecmp{l}``. NIC addresses are
``10.{l >> 8}.{l & 255}.{k+1}`` where ``k`` is the NIC's position under its leaf.

Three tiers: ``pods`` pods, each with ``leaves`` leaves and ``spines`` spines (full mesh inside
the pod); super-spines are split into ``spines`` planes and spine ``j`` of every pod connects to
every super-spine of plane ``j`` (the usual Clos plane wiring).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mesh.fabric.model import Fabric, FabricError, Link, Nic, Node, NodeKind

MAX_NICS_PER_LEAF = 250


@dataclass(frozen=True, slots=True)
class FabricShape:
    """Shape of a Clos fabric. ``superspines == 0`` means two tiers (then ``pods`` must be 1).

    Capacities in bits/s, propagation delays in ns (one way, per link).
    """

    leaves: int = 4
    hosts_per_leaf: int = 4
    nics_per_host: int = 1
    spines: int = 4
    pods: int = 1
    superspines: int = 0
    nic_capacity_bps: float = 400e9
    fabric_capacity_bps: float = 400e9
    nic_delay_ns: float = 25.0
    leaf_spine_delay_ns: float = 100.0
    spine_super_delay_ns: float = 250.0

    def __post_init__(self) -> None:
        for name in ("leaves", "hosts_per_leaf", "nics_per_host", "spines", "pods"):
            if getattr(self, name) < 1:
                raise FabricError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.superspines < 0:
            raise FabricError("superspines must be >= 0")
        if self.superspines == 0 and self.pods != 1:
            raise FabricError("more than one pod needs super-spines (a third tier)")
        if self.superspines and self.superspines % self.spines:
            raise FabricError("superspines must be a multiple of spines (one plane per pod spine)")
        if self.hosts_per_leaf * self.nics_per_host > MAX_NICS_PER_LEAF:
            raise FabricError(f"at most {MAX_NICS_PER_LEAF} NICs per leaf")

    @property
    def n_nics(self) -> int:
        """Total number of NICs."""
        return self.pods * self.leaves * self.hosts_per_leaf * self.nics_per_host

    @classmethod
    def for_nics(cls, nics: int, *, nics_per_leaf: int = 32, spines: int = 0) -> FabricShape:
        """Return a two-tier shape with at least ``nics`` NICs (one NIC per host).

        Spines default to one per 4 leaves (min 2, max 64). Raises `FabricError` if ``nics`` < 2.
        """
        if nics < 2:
            raise FabricError("need at least 2 NICs")
        per_leaf = max(1, min(nics_per_leaf, nics))
        leaves = -(-nics // per_leaf)
        if leaves > 1 and leaves * per_leaf - nics >= per_leaf:
            leaves -= 1
        spines = spines or max(2, min(64, leaves // 4 or 1))
        return cls(leaves=leaves, hosts_per_leaf=per_leaf, nics_per_host=1, spines=spines)


def build_fabric(shape: FabricShape) -> Fabric:
    """Return the `Fabric` for ``shape`` (deterministic: same shape, same ids and indices)."""
    nodes: list[Node] = []
    nics: list[Nic] = []
    links: list[Link] = []

    def add_link(lower: str, upper: str, cap: float, delay: float) -> None:
        links.append(Link(f"{lower}-{upper}", len(links), lower, upper, cap, delay))

    n_leaves = shape.pods * shape.leaves
    for leaf in range(n_leaves):
        nodes.append(Node(f"leaf{leaf}", NodeKind.LEAF, leaf, pod=leaf // shape.leaves))
    for s in range(shape.pods * shape.spines):
        nodes.append(Node(f"spine{s}", NodeKind.SPINE, s, pod=s // shape.spines))
    for k in range(shape.superspines):
        nodes.append(Node(f"super{k}", NodeKind.SUPERSPINE, k))

    host = 0
    for leaf in range(n_leaves):
        k = 0
        for _ in range(shape.hosts_per_leaf):
            hid = f"host{host}"
            nodes.append(Node(hid, NodeKind.HOST, host, pod=leaf // shape.leaves))
            for port in range(shape.nics_per_host):
                n = len(nics)
                addr = f"10.{leaf >> 8}.{leaf & 255}.{k + 1}"
                nics.append(Nic(f"nic{n}", n, hid, f"leaf{leaf}", addr, f"ecmp{leaf}", port))
                add_link(f"nic{n}", f"leaf{leaf}", shape.nic_capacity_bps, shape.nic_delay_ns)
                k += 1
            host += 1

    for pod in range(shape.pods):
        for li in range(shape.leaves):
            leaf = pod * shape.leaves + li
            for sj in range(shape.spines):
                spine = pod * shape.spines + sj
                add_link(
                    f"leaf{leaf}",
                    f"spine{spine}",
                    shape.fabric_capacity_bps,
                    shape.leaf_spine_delay_ns,
                )
    per_plane = shape.superspines // shape.spines if shape.superspines else 0
    for pod in range(shape.pods):
        for sj in range(shape.spines):
            spine = pod * shape.spines + sj
            for m in range(per_plane):
                add_link(
                    f"spine{spine}",
                    f"super{sj * per_plane + m}",
                    shape.fabric_capacity_bps,
                    shape.spine_super_delay_ns,
                )
    return Fabric(tuple(nodes), tuple(nics), tuple(links), shape=asdict(shape))
