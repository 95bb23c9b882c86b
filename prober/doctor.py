"""``qpmesh doctor``: can this host probe? Pure checks over facts a thin runner gathered.

`run_checks(facts)` returns one `Check` per question, each ``ok``, ``warn`` (probing works,
worse: software stamps, a clock daemon that may step the clock), ``fail`` (probing is blocked
or loses data: no NIC, a NIC down, a taken port, an unreachable broker, RDMA without a GID or
without locked memory) or ``skip`` (not asked: no config, so no broker). `blocking` is True
when any check failed: the command then exits 1.

What is checked, and why:

- ``nics``: the interfaces the prober would probe from (`prober.discover.nics`);
- per NIC: ``link`` (carrier), ``timestamping`` (``ETHTOOL_GET_TS_INFO``: hardware stamps
  give ns-level one-way delays, software ones tens of µs of noise), ``rdma`` (verbs device,
  port state, the RoCEv2 GID index of the NIC's address), ``mtu`` (NICs that disagree drop
  large frames on one side), ``lldp`` (the leaf the NIC is cabled to: the controller places
  NICs by it when it has no fabric file), ``port`` (the probe port free on the address);
- ``clock``: a daemon that may *step* the clock (chronyd with ``makestep ... -1``, ntpd,
  systemd-timesyncd, ptp4l, phc2sys) breaks the clock sync silently at each step: steps are
  reported so they can be turned into slews;
- ``broker``: a connection with the configured address, TLS and credentials;
- ``capabilities``: CAP_NET_RAW (``SO_BINDTODEVICE`` on kernels before 5.7), CAP_NET_ADMIN
  (switching hardware stamps on, ``SIOCSHWTSTAMP``), CAP_IPC_LOCK (verbs lock their queue
  memory; needed unless ``ulimit -l`` is unlimited).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract.neighbors import LldpNeighbor
from prober.discover.nics import DiscoveredNic

CAP_NET_ADMIN = 12
CAP_NET_RAW = 13
CAP_IPC_LOCK = 14
MIN_MTU = 576  # the IPv4 datagram every host must take; probes are far smaller
RDMA_MEMLOCK_BYTES = 64 << 20  # enough locked memory for the probe QPs without CAP_IPC_LOCK
ROCEV2_PORT = 4791
STEPPING_DAEMONS = {
    "ntpd": "ntpd steps the clock when it is off by more than 128 ms (run it with -x to slew)",
    "systemd-timesyncd": "systemd-timesyncd steps the clock when it is far off",
    "ptp4l": "ptp4l steps the clock past step_threshold (set step_threshold 0 after the start)",
    "phc2sys": "phc2sys steps the clock on start and past its step threshold (-S)",
    "timemaster": "timemaster runs ptp4l/phc2sys/chronyd, which may step the clock",
    "openntpd": "openntpd steps the clock at start (-s)",
}


class Status(enum.StrEnum):
    """How a check came out (see the module doc)."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Check:
    """One answer: ``name`` (``timestamping nic0``), ``status`` and a one-line ``detail``."""

    name: str
    status: Status
    detail: str

    def line(self) -> str:
        """Return the text line ``qpmesh doctor`` prints for this check."""
        return f"{self.status.value:<5} {self.name}: {self.detail}"

    def to_json(self) -> dict[str, str]:
        """Return ``{"name", "status", "detail"}``."""
        return {"name": self.name, "status": self.status.value, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class BrokerResult:
    """What a connection to the broker gave: ``ok`` and a one-line ``detail``."""

    ok: bool
    detail: str


@dataclass(frozen=True)
class HostFacts:
    """What the runner saw on this host (each field is a plain value; see `run_checks`).

    ``processes``: command names of running processes (``/proc/*/comm``); ``cap_eff``: the
    effective capability mask (None: unknown); ``memlock_bytes``: the soft RLIMIT_MEMLOCK
    (-1 unlimited); ``broker``: None when not checked; ``port_errors``: address -> why the
    probe port cannot be bound there (absent: free); ``lldp``: neighbours per interface, None
    when lldpcli could not be asked (``lldp_error`` says why); ``chrony_conf``: the text of
    chronyd's configuration ("" when none was read).
    """

    nics: tuple[DiscoveredNic, ...]
    transport: str = "udp"
    port: int = ROCEV2_PORT
    processes: tuple[str, ...] = ()
    cap_eff: int | None = None
    memlock_bytes: int = -1
    broker: BrokerResult | None = None
    port_errors: Mapping[str, str] = field(default_factory=dict)
    lldp: Mapping[str, tuple[LldpNeighbor, ...]] | None = None
    lldp_error: str = ""
    chrony_conf: str = ""


def chrony_steps(conf: str) -> str | None:
    """Return why chronyd may step the clock under configuration ``conf``, or None when it
    only slews (no ``makestep``, or a ``makestep`` limited to its first updates)."""
    for raw in conf.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) == 3 and words[0] == "makestep":
            try:
                threshold, limit = float(words[1]), int(words[2])
            except ValueError:
                continue
            if limit < 0:
                return f"chronyd steps the clock whenever it is off by more than {threshold:g} s (makestep {words[1]} -1)"  # fmt: skip
    return None


def _clock(f: HostFacts) -> Check:
    running = set(f.processes)
    why = [STEPPING_DAEMONS[p] for p in sorted(running & set(STEPPING_DAEMONS))]
    if "chronyd" in running:
        step = chrony_steps(f.chrony_conf)
        if step:
            why.insert(0, step)
    if why:
        return Check("clock", Status.WARN, "; ".join(why))
    slewing = sorted(running & {"chronyd"})
    if slewing:
        return Check("clock", Status.OK, "chronyd slews the clock (no makestep ... -1)")
    return Check("clock", Status.OK, "no clock daemon steps the clock")


def _has(cap_eff: int | None, cap: int) -> bool:
    return cap_eff is not None and bool(cap_eff >> cap & 1)


def _capabilities(f: HostFacts, selected: Sequence[DiscoveredNic]) -> Check:
    if f.cap_eff is None:
        return Check("capabilities", Status.WARN, "could not read the process's capabilities")
    missing, fail = [], False
    if not _has(f.cap_eff, CAP_NET_RAW):
        missing.append("CAP_NET_RAW (SO_BINDTODEVICE on kernels before 5.7)")
    if not _has(f.cap_eff, CAP_NET_ADMIN) and any(n.timestamping == "hardware" for n in selected):
        missing.append("CAP_NET_ADMIN (hardware stamps cannot be switched on)")
    locked_low = 0 <= f.memlock_bytes < RDMA_MEMLOCK_BYTES
    if f.transport == "rdma" and not _has(f.cap_eff, CAP_IPC_LOCK) and locked_low:
        fail = True
        missing.append(f"CAP_IPC_LOCK, and ulimit -l is {f.memlock_bytes >> 10} KiB: verbs cannot lock their queues")  # fmt: skip
    if not missing:
        return Check("capabilities", Status.OK, "what probing needs is there")
    return Check(
        "capabilities", Status.FAIL if fail else Status.WARN, "missing " + "; ".join(missing)
    )


def _nic_checks(f: HostFacts, n: DiscoveredNic, mtus: set[int]) -> list[Check]:
    out = []
    name = n.ifname
    out.append(
        Check(f"link {name}", Status.OK, f"up, {n.address}")
        if n.up
        else Check(f"link {name}", Status.FAIL, f"down ({n.address}): its probes are lost")
    )
    if n.timestamping == "hardware":
        out.append(
            Check(f"timestamping {name}", Status.OK, f"hardware (PHC /dev/ptp{n.phc_index})")
        )
    elif n.timestamping == "software":
        out.append(Check(f"timestamping {name}", Status.WARN,
                         "software only: tens of µs of stamp noise for the sync to filter"))  # fmt: skip
    else:
        out.append(Check(f"timestamping {name}", Status.WARN,
                         f"{n.timestamping}: no kernel TX stamps, user-space times are used"))  # fmt: skip
    rdma_needed = f.transport == "rdma"
    if n.rdma_device:
        where = f"{n.rdma_device} port {n.rdma_port} ({n.rdma_state}, {n.link_layer})"
        if n.gid_index is not None and n.rdma_state == "ACTIVE":
            out.append(Check(f"rdma {name}", Status.OK, f"{where}, RoCEv2 GID index {n.gid_index}"))
        else:
            why = "no RoCEv2 GID for " + n.address if n.gid_index is None else "port not active"
            bad = Status.FAIL if rdma_needed else Status.WARN
            out.append(Check(f"rdma {name}", bad, f"{where}: {why}"))
    elif rdma_needed:
        out.append(Check(f"rdma {name}", Status.FAIL, "no RDMA device (transport is rdma)"))
    else:
        out.append(Check(f"rdma {name}", Status.SKIP, "no RDMA device: UDP probes"))
    if n.mtu < MIN_MTU:
        out.append(Check(f"mtu {name}", Status.FAIL, f"{n.mtu} is below {MIN_MTU}"))
    elif len(mtus) > 1:
        out.append(Check(f"mtu {name}", Status.WARN,
                         f"{n.mtu}, but this host's NICs use {sorted(mtus)}: frames larger than the smallest are dropped on some paths"))  # fmt: skip
    else:
        out.append(Check(f"mtu {name}", Status.OK, str(n.mtu)))
    if f.lldp is not None:
        seen = f.lldp.get(name, ())
        if len(seen) == 1:
            s = seen[0]
            port = f" port {s.port_descr or s.port_id}" if (s.port_descr or s.port_id) else ""
            out.append(Check(f"lldp {name}", Status.OK, f"cabled to {s.name}{port}"))
        elif not seen:
            out.append(Check(f"lldp {name}", Status.WARN,
                             "no LLDP neighbour: without a fabric file the controller cannot place this NIC"))  # fmt: skip
        else:
            names = ", ".join(sorted({s.name for s in seen}))
            out.append(Check(f"lldp {name}", Status.WARN, f"several LLDP neighbours ({names})"))
    err = f.port_errors.get(n.address)
    if err:
        out.append(Check(f"port {name}", Status.FAIL, f"UDP {n.address}:{f.port}: {err}"))
    elif n.rdma_device and f.transport == "udp" and f.port == ROCEV2_PORT:
        out.append(Check(f"port {name}", Status.WARN,
                         f"UDP {f.port} on an RDMA NIC: its RoCEv2 engine may take the probes (set prober.port)"))  # fmt: skip
    else:
        out.append(Check(f"port {name}", Status.OK, f"UDP {n.address}:{f.port} is free"))
    return out


def run_checks(f: HostFacts) -> tuple[Check, ...]:
    """Return the checks of ``f``, in the order ``qpmesh doctor`` prints them."""
    selected = [n for n in f.nics if n.selected]
    out: list[Check] = []
    if selected:
        out.append(
            Check("nics", Status.OK, ", ".join(f"{n.ifname} ({n.address})" for n in selected))
        )
    else:
        left = "; ".join(f"{n.ifname}: {n.reason}" for n in f.nics) or "no interfaces"
        out.append(Check("nics", Status.FAIL, f"no NIC to probe from ({left})"))
    mtus = {n.mtu for n in selected}
    for n in selected:
        out += _nic_checks(f, n, mtus)
    if f.lldp is None and selected:
        out.append(Check("lldp", Status.WARN, f"{f.lldp_error or 'lldpcli unavailable'}: without a fabric file the controller cannot place this host's NICs"))  # fmt: skip
    out.append(_clock(f))
    if f.broker is None:
        out.append(Check("broker", Status.SKIP, "not checked (give --config)"))
    else:
        out.append(Check("broker", Status.OK if f.broker.ok else Status.FAIL, f.broker.detail))
    out.append(_capabilities(f, selected))
    return tuple(out)


def blocking(checks: Sequence[Check]) -> bool:
    """Return True when a check failed (probing is blocked or loses data: exit 1)."""
    return any(c.status == Status.FAIL for c in checks)


def report_json(checks: Sequence[Check], facts: HostFacts) -> dict[str, Any]:
    """Return the ``--json`` document: ``ok``, the checks, and every interface as found."""
    return {
        "ok": not blocking(checks),
        "checks": [c.to_json() for c in checks],
        "nics": [n.to_json() for n in facts.nics],
    }
