"""PCIe correctable errors of a NIC's function, from AER (``aer_dev_correctable`` in sysfs).

The kernel's AER driver counts each correctable error kind of a PCIe function since boot and
shows them as ``<name> <count>`` lines (``RxErr``, ``BadTLP``, ``BadDLLP``, ``Rollover``,
``Timeout``, ..., ``TOTAL_ERR_COR``). Replays are what a bad slot or riser costs: a bad TLP
or DLLP is replayed, ``Rollover`` (REPLAY_NUM) and ``Timeout`` (replay timer) count replays
that went wrong. `aer_values(text)` (pure) maps them to catalogue signals;
`read_aer(netdev, root)` reads ``/sys/class/net/<netdev>/device/aer_dev_correctable``
(None when the device has no AER: a virtual device, or AER off).
"""

from __future__ import annotations

from pathlib import Path

AER_MAP = {
    "Rollover": "pcie_replay_rollover",
    "Timeout": "pcie_replay_timeout",
    "BadTLP": "pcie_bad_tlp",
    "BadDLLP": "pcie_bad_dllp",
    "RxErr": "pcie_rx_err",
}


def aer_values(text: str) -> dict[str, float]:
    """Return catalogue signal -> count from the text of ``aer_dev_correctable``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in AER_MAP:
            try:
                out[AER_MAP[parts[0]]] = float(int(parts[1]))
            except ValueError:
                continue
    return out


def read_aer(netdev: str, root: Path = Path("/sys/class/net")) -> str | None:
    """Return the AER correctable-error text of ``netdev``'s PCIe function, or None."""
    try:
        return (root / netdev / "device" / "aer_dev_correctable").read_text()
    except OSError:
        return None
