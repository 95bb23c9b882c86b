"""Cause separation: network (link, NIC) versus host (prober silent) versus GPU.

A probe that is never reported cannot be lost on the network: a host whose prober went silent
(presence lost, or none of its NICs initiated a probe for a while) is a host fault, and the
losses on probes *to* its NICs are its own missing replies. The brain therefore

- excludes probes to and from NICs of hosts whose presence is down (`excluded_nics`);
- treats a NIC link that looks dead while its own NIC initiated nothing in the window as no
  evidence (the host is quiet), and reports the host once it has been silent for ``silent_ns``
  (`silent_hosts`);
- reports a NIC link that is dead while the NIC's prober keeps reporting (lost) probes as
  ``nic_down`` on the NIC (every path to and from it, across every spine, fails).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from mesh.fabric import Fabric


def excluded_nics(fabric: Fabric, hosts_down: Iterable[str]) -> npt.NDArray[np.bool_]:
    """Return a per-NIC mask: True for NICs on a host in ``hosts_down``."""
    down = set(hosts_down)
    return np.array([n.host in down for n in fabric.nics], dtype=bool)


def host_quiet(fabric: Fabric, src_count: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Per host (order of ``fabric.hosts``): True if none of its NICs initiated a probe."""
    per_host = np.bincount(fabric.nic_host_index, weights=src_count, minlength=len(fabric.hosts))
    return np.asarray(per_host == 0)


def silent_hosts(
    fabric: Fabric,
    last_src_ns: npt.NDArray[np.int64],
    now_ns: int,
    silent_ns: int,
) -> set[str]:
    """Return hosts that were heard before but whose NICs initiated nothing for ``silent_ns``.

    ``last_src_ns`` is per NIC the last time it initiated a probe (-1 = never).
    """
    last = np.full(len(fabric.hosts), -1, dtype=np.int64)
    np.maximum.at(last, fabric.nic_host_index, last_src_ns)
    idx = np.flatnonzero((last >= 0) & (now_ns - last >= silent_ns))
    return {fabric.hosts[i].id for i in idx}
