"""Where a device sits on the PCI tree, and which GPU is nearest to a NIC (pure).

A sysfs device path such as ``/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:08.0/
0000:3e:00.0/net/ens1`` names the host bridge (``pci0000:3a``) and the chain of PCI functions
from the root port down to the device (here ``0000:3e:00.0``, behind a PCIe switch whose
upstream port is ``0000:3b:00.0``). `pci_location` parses such a path into a `PciLocation`.

`affinity` says how far apart two devices are, with the names NVML and NCCL print
(``nvidia-smi topo -m``), worked out from the two chains the way NCCL reads sysfs:

- ``PIX``: both sit at most one bridge level below their deepest common PCI function (the
  usual NIC and GPU behind one PCIe switch);
- ``PXB``: they share a PCI function but more bridges lie between them (nested switches);
- ``PHB``: they share only the host bridge (the CPU's root complex);
- ``NODE``: different host bridges, same NUMA node;
- ``SYS``: different NUMA nodes (or either node unknown), across the CPU interconnect.

NVML's own ``nvmlDeviceGetTopologyCommonAncestor`` compares two *GPUs*; a NIC is not an NVML
device, so the NIC-to-GPU level comes from the PCI chains (GPU bus ids from NVML,
``nvmlDeviceGetPciInfo``, resolved in sysfs by `prober.discover.gpus`). `nearest_gpu` picks
the GPU with the closest level (ties: the lowest GPU index).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


@dataclass(frozen=True, slots=True)
class PciLocation:
    """A device's host bridge (``pci0000:3a``; "" when not on PCI) and its chain of PCI
    functions from the root port down to the device itself (empty when not on PCI)."""

    host_bridge: str = ""
    chain: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        """The device's own PCI address (``0000:3e:00.0``), "" when it is not a PCI device."""
        return self.chain[-1] if self.chain else ""


def normalize_bus_id(bus_id: str) -> str:
    """Return a PCI bus id in sysfs form: ``00000000:3B:00.0`` (NVML) -> ``0000:3b:00.0``.

    Raises ValueError when ``bus_id`` is not a PCI bus id.
    """
    text = bus_id.strip().lower()
    dom, sep, rest = text.partition(":")
    if sep and len(dom) > 4 and set(dom[:-4]) <= {"0"}:
        text = f"{dom[-4:]}:{rest}"
    if not _BDF.match(text):
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return text


def pci_location(device_path: str) -> PciLocation:
    """Return the `PciLocation` in a resolved sysfs device path (never raises).

    A virtual device (``/sys/devices/virtual/...``) or a path with no PCI function gives the
    empty location. Components after the last PCI function (``virtio2``, ``net/eth0``) are
    ignored: the device's PCI address is that of the function it hangs off.
    """
    parts = [p for p in device_path.split("/") if p]
    bridge = ""
    chain: list[str] = []
    for part in parts:
        if _HOST_BRIDGE.match(part):
            bridge, chain = part, []
        elif bridge and _BDF.match(part):
            chain.append(part)
    return PciLocation(bridge, tuple(chain)) if chain else PciLocation()


def affinity(a: PciLocation, a_numa: int, b: PciLocation, b_numa: int) -> str:
    """Return the topology level between two devices, one of `LEVELS` (see the module doc).

    ``*_numa`` is the device's NUMA node, -1 when unknown (then different host bridges are
    ``SYS``). A device not on PCI is ``SYS`` from everything.
    """
    if not a.chain or not b.chain:
        return "SYS"
    if a.host_bridge != b.host_bridge:
        return "NODE" if a_numa >= 0 and a_numa == b_numa else "SYS"
    common = 0
    for x, y in zip(a.chain, b.chain, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB"
    below = max(len(a.chain), len(b.chain)) - common
    return "PIX" if below <= 2 else "PXB"


@dataclass(frozen=True, slots=True)
class GpuLocation:
    """A GPU: its NVML index, where it sits on the PCI tree and its NUMA node (-1: unknown)."""

    index: int
    location: PciLocation
    numa_node: int = -1


@dataclass(frozen=True, slots=True)
class GpuAffinity:
    """The GPU a NIC serves: its NVML ``index`` and the topology ``level`` between them."""

    index: int
    level: str


def nearest_gpu(nic: PciLocation, nic_numa: int, gpus: Sequence[GpuLocation]) -> GpuAffinity | None:
    """Return the GPU nearest to a NIC (best level of `LEVELS`, ties: lowest index), or None
    when there is no GPU or the nearest is across NUMA nodes (``SYS``: it serves no GPU)."""
    best: GpuAffinity | None = None
    for gpu in sorted(gpus, key=lambda g: g.index):
        level = affinity(nic, nic_numa, gpu.location, gpu.numa_node)
        if best is None or LEVELS.index(level) < LEVELS.index(best.level):
            best = GpuAffinity(gpu.index, level)
    return best if best is not None and best.level != "SYS" else None
