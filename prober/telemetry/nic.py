"""NIC link state and error counters from sysfs (``/sys/class/net/<dev>/``).

`read_nic_raw` reads the files (I/O); `nic_status` maps the raw strings to a `NicStatus`
(pure, tested on recorded values); `nic_status_delta` compares two readings to tell a NIC
that is flapping or erroring *now* from one with old counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SYSFS_NET = Path("/sys/class/net")
COUNTERS = (
    "rx_bytes",  # the controller's NIC throughput (controller.throughput)
    "tx_bytes",
    "rx_packets",
    "tx_packets",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "rx_crc_errors",
    "tx_carrier_errors",
)
_FILES = ("operstate", "carrier", "carrier_changes", "mtu")


class NicTelemetryError(OSError):
    """The NIC does not exist in sysfs."""


@dataclass(frozen=True, slots=True)
class NicStatus:
    """One NIC's link and counters. ``up``: carrier present and operstate not down.

    Counters are cumulative since the driver loaded; -1 = not available.
    """

    device: str
    operstate: str
    up: bool
    carrier_changes: int
    mtu: int
    counters: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        d = asdict(self)
        d["counters"] = dict(self.counters)
        return d


def _int(raw: Mapping[str, str], key: str) -> int:
    try:
        return int(raw.get(key, "").strip())
    except ValueError:
        return -1


def nic_status(device: str, raw: Mapping[str, str]) -> NicStatus:
    """Return the `NicStatus` of ``device`` from raw sysfs file contents (name -> text).

    Missing or unreadable files become -1 / "unknown"; never raises on odd values.
    """
    operstate = raw.get("operstate", "unknown").strip() or "unknown"
    carrier = _int(raw, "carrier")
    # veth/lo report operstate "unknown" while working: carrier decides then
    up = carrier == 1 and operstate not in ("down", "lowerlayerdown", "notpresent")
    return NicStatus(
        device=device,
        operstate=operstate,
        up=up,
        carrier_changes=_int(raw, "carrier_changes"),
        mtu=_int(raw, "mtu"),
        counters={k: _int(raw, f"statistics/{k}") for k in COUNTERS},
    )


def nic_status_delta(prev: NicStatus, cur: NicStatus) -> dict[str, int]:
    """Return counter increases from ``prev`` to ``cur`` (plus ``carrier_changes``).

    A counter that went backwards (driver reload) or is unavailable reports 0.
    """
    out = {"carrier_changes": max(0, cur.carrier_changes - prev.carrier_changes)}
    for k in COUNTERS:
        a, b = prev.counters.get(k, -1), cur.counters.get(k, -1)
        out[k] = b - a if a >= 0 and b >= a else 0
    if prev.carrier_changes < 0 or cur.carrier_changes < 0:
        out["carrier_changes"] = 0
    return out


def read_nic_raw(device: str, root: Path = SYSFS_NET) -> dict[str, str]:
    """Return the raw sysfs texts of ``device``; raise `NicTelemetryError` if it does not exist.

    Files the kernel refuses to read (e.g. ``speed`` on a down link) are left out.
    """
    base = root / device
    if not base.is_dir():
        raise NicTelemetryError(f"no network device {device!r} in {root}")
    raw: dict[str, str] = {}
    for name in (*_FILES, *(f"statistics/{k}" for k in COUNTERS)):
        try:
            raw[name] = (base / name).read_text()
        except OSError:
            continue
    return raw


def read_link_up(device: str, root: Path = SYSFS_NET) -> bool | None:
    """Return whether ``device``'s link is up (as `NicStatus.up`: two small sysfs reads),
    None if the device does not exist."""
    base = root / device
    if not base.is_dir():
        return None
    raw: dict[str, str] = {}
    for name in ("operstate", "carrier"):
        try:
            raw[name] = (base / name).read_text()
        except OSError:  # carrier of an administratively down device: EINVAL
            continue
    return nic_status(device, raw).up


def read_nic(device: str, root: Path = SYSFS_NET) -> NicStatus:
    """Return the current `NicStatus` of ``device`` (raises `NicTelemetryError`)."""
    return nic_status(device, read_nic_raw(device, root))
