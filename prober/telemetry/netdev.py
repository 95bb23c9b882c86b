"""Kernel interface statistics of every network device, from one read of ``/proc/net/dev``.

`parse_proc_net_dev(text)` (pure) returns per device the catalogue's netdev counters
(``rx_bytes``, ``rx_packets``, ``rx_errors``, ``rx_dropped``, and the ``tx_`` ones).
`read_proc_net_dev()` reads the file of the *calling thread's* network namespace
(``/proc/thread-self/net/dev``), so a collector running inside a namespace (the testbed's)
sees that namespace's devices; sysfs would show the namespace it was mounted in.
"""

from __future__ import annotations

from pathlib import Path

# columns after "dev:": rx bytes packets errs drop fifo frame compressed multicast,
#                       tx bytes packets errs drop fifo colls carrier compressed
_COLS = {"rx_bytes": 0, "rx_packets": 1, "rx_errors": 2, "rx_dropped": 3,
         "tx_bytes": 8, "tx_packets": 9, "tx_errors": 10, "tx_dropped": 11}  # fmt: skip
THREAD_NET_DEV = Path("/proc/thread-self/net/dev")


def parse_proc_net_dev(text: str) -> dict[str, dict[str, int]]:
    """Return device -> netdev counters from the text of ``/proc/net/dev`` (lines that do not
    parse are skipped)."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or "|" in name:
            continue
        cols = rest.split()
        if len(cols) < 16:
            continue
        try:
            out[name.strip()] = {k: int(cols[i]) for k, i in _COLS.items()}
        except ValueError:
            continue
    return out


def read_proc_net_dev(path: Path = THREAD_NET_DEV) -> dict[str, dict[str, int]]:
    """Return `parse_proc_net_dev` of ``path`` (default: this thread's namespace); raises
    OSError when it cannot be read."""
    return parse_proc_net_dev(path.read_text())
