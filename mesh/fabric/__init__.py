"""The one fabric model shared by the simulator, the testbed, the controller and the TUI.

`Fabric` holds hosts, NICs, switches (leaf / spine / super-spine), physical links and ECMP groups;
`build` makes two- and three-tier Clos fabrics; `ecmp` computes the path a flow
(source NIC, destination NIC, UDP source port) takes through a deterministic hash model.
"""

from mesh.fabric.build import FabricShape, build_fabric
from mesh.fabric.ecmp import ecmp_hash, flow_path, flow_paths
from mesh.fabric.model import (
    Fabric,
    FabricError,
    Link,
    Nic,
    Node,
    NodeKind,
    hop_direction,
    hop_id,
    hop_link,
)

__all__ = [
    "Fabric",
    "FabricError",
    "FabricShape",
    "Link",
    "Nic",
    "Node",
    "NodeKind",
    "build_fabric",
    "ecmp_hash",
    "flow_path",
    "flow_paths",
    "hop_direction",
    "hop_id",
    "hop_link",
]
