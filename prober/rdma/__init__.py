"""RDMA transport (optional extra ``rdma``: pyverbs from rdma-core).

- `prober.rdma.flowlabel`: RoCEv2 flow label <-> UDP source port (mlx5 formula), pure.
- `prober.rdma.clock`: HCA cycle counter -> ns conversion, pure and vectorized.
- `prober.rdma.packet`: UD receive-buffer layout (40-byte GRH + probe message), pure.
- `prober.rdma.discover`: which verbs devices exist (sysfs or pyverbs).
- `prober.rdma.peers`: peers' (qpn, gid, qkey) from presence documents, pure `RdmaPeerTable`.
- `prober.rdma.presence`: follows ``<prefix>/presence/+`` into the table (MQTT shell).
- `prober.rdma.transport`: UD QP per NIC with completion-timestamped CQs (needs hardware).
"""

from prober.rdma.discover import RdmaUnavailable, list_rdma_devices

__all__ = ["RdmaUnavailable", "list_rdma_devices"]
