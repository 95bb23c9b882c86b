"""lldpd in every namespace of the emulated fabric, as on real hosts and switch OSes (SONiC).

`lldpd_specs(plan, run_dir)` (pure) says, per namespace, how its lldpd runs: in the foreground
(``-d``, so the pid we record is the daemon's), with its own control socket (``-u``; every
testbed and every namespace has its own, under the testbed's state directory), announcing the
node id as its system name (a startup file given with ``-O``: ``configure system hostname``)
and, on hosts, only on the NIC interfaces (``-I nic*``: not on the management veth). LLDP
frames do not cross the management bridge (Linux bridges keep 01:80:c2:00:00:0e to
themselves), so a host's only neighbour per NIC is its leaf.

`start_lldpd(plan, run_dir)` (thin) writes the startup files, starts every daemon with
``ip netns exec`` and records each pid in the testbed state (role ``lldpd:<node>``), so
`testbed.netns.teardown` stops them by pid with the rest of the fabric and removes `lldp_dir`.
`lldp_socket(lldp_dir(prefix), node)` is where ``lldpcli -u`` finds a node's daemon.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.netns.plan import Plan
from testbed.netns.state import STATE_ROOT, record_process

LLDPD = "lldpd"
TX_INTERVAL_S = 5  # the first frame leaves at once; this only bounds how fast a change shows
TX_HOLD = 6  # neighbours expire after TX_INTERVAL_S * TX_HOLD without a frame


@dataclass(frozen=True, slots=True)
class LldpdSpec:
    """How one namespace's lldpd runs: its node, namespace, control socket, startup file
    (path and text) and command line."""

    node: str
    ns: str
    socket: str
    config_path: str
    config_text: str
    argv: tuple[str, ...]


def lldp_dir(prefix: str) -> Path:
    """Return where the lldpds of testbed ``prefix`` keep their sockets, startup files and
    logs: beside the state directory, not in it (whoever copies that directory, as
    ``testbed run`` does into its output, copies no sockets). No prefix starts with a dot."""
    return STATE_ROOT / ".lldpd" / prefix


def lldp_socket(run_dir: Path, node: str) -> str:
    """Return the control socket of ``node``'s lldpd under ``run_dir``."""
    return str(run_dir / f"{node}.sock")


def lldpd_specs(plan: Plan, run_dir: Path, lldpd: str = LLDPD) -> tuple[LldpdSpec, ...]:
    """Return one `LldpdSpec` per namespace of ``plan`` (hosts first, then switches)."""
    out = []
    node_of_ns = {ns: node for node, ns in plan.node_ns.items()}
    for ns in plan.namespaces:
        node = node_of_ns[ns]
        sock = lldp_socket(run_dir, node)
        conf = run_dir / f"{node}.conf"
        text = (
            f"configure system hostname {node}\n"
            f"configure lldp tx-interval {TX_INTERVAL_S}\n"
            f"configure lldp tx-hold {TX_HOLD}\n"
        )
        argv = ["ip", "netns", "exec", ns, lldpd, "-d", "-u", sock, "-O", str(conf)]
        if node.startswith("host"):
            argv += ["-I", "nic*"]
        out.append(LldpdSpec(node, ns, sock, str(conf), text, tuple(argv)))
    return tuple(out)


def lldpd_available() -> bool:
    """Return True when the lldpd binary is installed (Debian ``lldpd``)."""
    return shutil.which(LLDPD) is not None or Path("/usr/sbin/lldpd").exists()


def start_lldpd(plan: Plan, run_dir: Path) -> list[subprocess.Popen[bytes]]:
    """Start an lldpd in every namespace of ``plan`` and record their pids; return them.

    Raises OSError when lldpd cannot be started (the caller tears the testbed down).
    """
    lldpd = shutil.which(LLDPD) or "/usr/sbin/lldpd"
    run_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for spec in lldpd_specs(plan, run_dir, lldpd):
        Path(spec.config_path).write_text(spec.config_text)
        log = (run_dir / f"{spec.node}.log").open("ab")
        try:
            p = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        record_process(plan.prefix, f"lldpd:{spec.node}", p.pid)
        procs.append(p)
    return procs
