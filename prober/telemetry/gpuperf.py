"""GPU performance signals from NVML, beside the health verdict of `prober.telemetry.gpu`.

- `gpu_perf_values(raw)` (pure): one GPU's raw NVML readings (a dict, keys below) -> the
  catalogue's GPU signals. The throttle reasons bitmask is split into three 0/1 signals with
  NVML's bit values (``nvmlClocksThrottleReason*``: SwPowerCap 0x4, HwSlowdown 0x8,
  SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80); PCIe
  throughput comes in KB/s (NVML's unit) and leaves in B/s; power in mW leaves in W. A
  reading NVML refused (None) leaves its signal out.
- `NvmlPerf` (I/O): NVML initialised once for a collector's life, `read()` per window (NVML's
  init costs far more than a read), `close()` at the end. ``NvmlPerf.open`` returns the
  reason instead when there is no GPU (the same reasons as `prober.telemetry.gpu.read_gpus`).

Raw keys: ``index``, ``util_gpu``, ``util_mem`` (%), ``sm_clock``, ``mem_clock`` (MHz),
``power_mw``, ``power_limit_mw``, ``temperature_c``, ``throttle_reasons`` (bitmask),
``pcie_tx_kbps``, ``pcie_rx_kbps``, ``pcie_replay`` and ``ecc_corrected`` (counters).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

THERMAL_BITS = 0x20 | 0x40
POWER_BITS = 0x04 | 0x80
HW_SLOWDOWN_BIT = 0x08


def _num(raw: Mapping[str, Any], key: str) -> float | None:
    v = raw.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def gpu_perf_values(raw: Mapping[str, Any]) -> dict[str, float]:
    """Return catalogue signal -> value (counters raw) of one GPU's NVML readings."""
    out: dict[str, float] = {}
    plain = {"util_gpu": "gpu_util", "util_mem": "mem_util", "sm_clock": "sm_clock_mhz",
             "mem_clock": "mem_clock_mhz", "temperature_c": "temperature_c",
             "pcie_replay": "gpu_pcie_replay", "ecc_corrected": "ecc_corrected"}  # fmt: skip
    for key, name in plain.items():
        v = _num(raw, key)
        if v is not None:
            out[name] = v
    for key, name, factor in (("power_mw", "power_w", 1e-3),
                              ("power_limit_mw", "power_limit_w", 1e-3),
                              ("pcie_tx_kbps", "pcie_tx_bytes", 1024.0),
                              ("pcie_rx_kbps", "pcie_rx_bytes", 1024.0)):  # fmt: skip
        v = _num(raw, key)
        if v is not None:
            out[name] = v * factor
    bits = raw.get("throttle_reasons")
    if isinstance(bits, int) and not isinstance(bits, bool):
        out["throttle_thermal"] = float(bool(bits & THERMAL_BITS))
        out["throttle_power"] = float(bool(bits & POWER_BITS))
        out["throttle_hw"] = float(bool(bits & HW_SLOWDOWN_BIT))
    return out


def _try(nvml: Any, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except nvml.NVMLError:
        return None


def read_one(nvml: Any, handle: Any, index: int) -> dict[str, Any]:
    """Return the raw performance readings of one GPU (None where NVML refused)."""
    h = handle
    util = _try(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(h))
    # nvidia-ml-py 12.535+ names it "event reasons"; older bindings only "throttle reasons"
    if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
        reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons
    else:
        reasons = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return {
        "index": index,
        "util_gpu": None if util is None else util.gpu,
        "util_mem": None if util is None else util.memory,
        "sm_clock": _try(nvml, lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
        "mem_clock": _try(nvml, lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
        "power_mw": _try(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(h)),
        "power_limit_mw": _try(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h)),
        "temperature_c": _try(
            nvml, lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        ),
        "throttle_reasons": _try(nvml, lambda: reasons(h)),
        "pcie_tx_kbps": _try(
            nvml, lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)
        ),
        "pcie_rx_kbps": _try(
            nvml, lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)
        ),
        "pcie_replay": _try(nvml, lambda: nvml.nvmlDeviceGetPcieReplayCounter(h)),
        "ecc_corrected": _try(
            nvml,
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        ),
    }


class NvmlPerf:
    """An initialised NVML and the handles of its GPUs (use `open`)."""

    def __init__(self, nvml: Any, handles: tuple[Any, ...]) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls, nvml: Any = None) -> NvmlPerf | str:
        """Return an open `NvmlPerf`, or the reason there is none (no GPU, no NVML)."""
        if nvml is None:
            try:
                import pynvml
            except ImportError:
                return "no GPU: nvidia-ml-py not installed"
            nvml = pynvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return f"no GPU: NVML init failed: {exc}"
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = tuple(nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count))
        except nvml.NVMLError as exc:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            return f"NVML error: {exc}"
        if not handles:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            return "no GPU: NVML reports 0 devices"
        return cls(nvml, handles)

    @property
    def count(self) -> int:
        """Return the number of GPUs."""
        return len(self._handles)

    def read(self) -> tuple[dict[str, Any], ...]:
        """Return every GPU's raw readings (None where NVML refused one)."""
        return tuple(read_one(self._nvml, h, i) for i, h in enumerate(self._handles))

    def close(self) -> None:
        """Shut NVML down."""
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
