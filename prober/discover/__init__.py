"""What a prober finds on its host instead of being told: NICs, and their LLDP neighbours.

- `prober.discover.nics`: the interfaces, which to probe from (`NicFilter`), and per NIC its
  address, RDMA port and RoCEv2 GID index, PCI address, NUMA node, GPU, timestamping;
- `prober.discover.sysfs`, `ipaddr`, `tsinfo`, `gpus`: the readers it joins (sysfs, ``ip -j
  addr``, the ``ETHTOOL_GET_TS_INFO`` ioctl, NVML), `prober.discover.pci` the PCI-tree math;
- `prober.discover.lldp`: the switch each interface is cabled to, from lldpd
  (``lldpcli -f json0 show neighbors``), as `contract.neighbors.LldpNeighbor`;
- `prober.discover.resolve`: the NICs to probe from (found ones, ``[[nics]]`` over them,
  groups from the LLDP leaf) and the neighbours document the prober publishes;
- `prober.discover.peers` and `prober.discover.follow`: the peers, learned from the other
  probers' neighbours documents (``<prefix>/neighbors/#``).

Readers are thin and take their roots (a sysfs tree, an NVML module, an lldpd socket) as
parameters; everything that decides is pure and tested on recorded values.
"""
