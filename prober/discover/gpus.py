"""Where this host's GPUs sit on the PCI tree: NVML bus ids resolved in sysfs (thin).

`read_gpu_locations(root, nvml)` asks NVML (``pynvml`` from nvidia-ml-py) for each GPU's PCI
bus id (``nvmlDeviceGetPciInfo(h).busId``, e.g. ``00000000:3B:00.0``), resolves
``<root>/bus/pci/devices/<bdf>`` to its place on the tree and reads its ``numa_node``. No GPU
(NVML missing, driver not loaded, count 0) is an empty tuple, never an error: the NICs then
serve no GPU. The mapping itself is pure (`prober.discover.pci.nearest_gpu`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from prober.discover.pci import GpuLocation, normalize_bus_id, pci_location
from prober.discover.sysfs import SYSFS


def gpu_location(index: int, bus_id: str, root: Path = SYSFS) -> GpuLocation:
    """Return the `GpuLocation` of GPU ``index`` with NVML bus id ``bus_id`` under ``root``.

    Raises ValueError on a malformed bus id; a bus id sysfs does not know gives a location
    with the device alone on an unknown host bridge (its level to any NIC is then ``SYS``).
    """
    bdf = normalize_bus_id(bus_id)
    dev = root / "bus" / "pci" / "devices" / bdf
    if not dev.exists():
        return GpuLocation(index, pci_location(""))
    real = os.path.realpath(dev)
    try:
        numa = int((Path(real) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        numa = -1
    return GpuLocation(index, pci_location(os.path.relpath(real, root)), numa)


def read_gpu_locations(root: Path = SYSFS, nvml: Any = None) -> tuple[GpuLocation, ...]:
    """Return every GPU NVML lists, located under ``root``; () when there is no GPU."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return ()
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return ()
    try:
        out = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            bus = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId
            text = bus.decode() if isinstance(bus, bytes) else str(bus)
            with contextlib.suppress(ValueError):
                out.append(gpu_location(i, text, root))
        return tuple(out)
    except nvml.NVMLError:
        return ()
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
