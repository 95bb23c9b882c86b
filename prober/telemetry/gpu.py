"""GPU health from NVML (``pynvml``, shipped by nvidia-ml-py).

Two layers:

- `read_gpus(nvml)` (I/O): initialises NVML, reads raw values per GPU into plain dicts
  (`GpuRaw`), shuts NVML down. No GPU (library missing, driver not loaded, count 0) returns
  ``GpuReading(present=False, reason=...)``; a metric the GPU does not support is None.
- `gpu_health(reading, previous)` (pure): maps raw values to a `HostGpuHealth` record with
  ``ok`` and a one-line ``detail``; counter *increases* since ``previous`` (PCIe replays, NVLink
  CRC/replay) degrade health, absolute counts of fatal things (uncorrected ECC, XIDs) fail it.
  Tested on recorded values (fixtures as dicts), since this machine has no GPU.

Raw per-GPU dict keys: ``index, uuid, name, temperature_c, power_mw, ecc_uncorrected,
ecc_corrected`` (volatile counts), ``retired_sbe, retired_dbe`` (retired page counts),
``remapped_pending, remapped_failure`` (row remapping), ``pcie_replay``, ``nvlink`` (list of
dicts ``{link, active, replay, recovery, crc_flit, crc_data}``), ``xids`` (XIDs seen since the
last reading).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GpuRaw = Mapping[str, Any]

TEMP_LIMIT_C = 90
PCIE_REPLAY_LIMIT = 100  # replays between two readings before the link counts as degraded
# XIDs that mean the GPU (or its memory/links) needs attention (NVIDIA XID catalogue):
# 48 DBE ECC, 63/64 row remap, 74 NVLink, 79 fell off the bus, 92 high SBE rate,
# 94/95 contained/uncontained ECC, 119/120 GSP errors.
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What NVML said: ``present`` False with a ``reason`` when there is no GPU; ``present``
    True with a ``reason`` when GPUs exist but reading them failed."""

    present: bool
    gpus: tuple[GpuRaw, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """Health of one GPU: ``problems`` lists short reasons (empty = fine)."""

    index: int
    uuid: str
    ok: bool
    problems: tuple[str, ...] = ()
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True, slots=True)
class HostGpuHealth:
    """Health of all GPUs of a host. ``present`` False = no GPU (then ``ok`` is True)."""

    present: bool
    ok: bool
    detail: str
    gpus: tuple[GpuStatus, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready dict published on the health topic (``gpu`` key)."""
        return {
            "present": self.present,
            "ok": self.ok,
            "detail": self.detail,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "ok": g.ok,
                    "problems": list(g.problems),
                    "temperature_c": g.temperature_c,
                    "power_w": g.power_w,
                }
                for g in self.gpus
            ],
        }


def _num(raw: GpuRaw, key: str) -> float | None:
    v = raw.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _increase(cur: float | None, prev: float | None) -> float:
    if cur is None or prev is None or cur < prev:
        return 0.0
    return cur - prev


def _gpu_status(raw: GpuRaw, prev: GpuRaw | None) -> GpuStatus:
    problems: list[str] = []
    temp = _num(raw, "temperature_c")
    if temp is not None and temp >= TEMP_LIMIT_C:
        problems.append(f"temperature {temp:.0f}C")
    ecc_u = _num(raw, "ecc_uncorrected")
    if ecc_u:
        problems.append(f"uncorrected ECC {ecc_u:.0f}")
    dbe = _num(raw, "retired_dbe")
    if dbe:
        problems.append(f"retired pages (DBE) {dbe:.0f}")
    if raw.get("remapped_failure"):
        problems.append("row remapping failed")
    elif raw.get("remapped_pending"):
        problems.append("row remap pending (reset needed)")
    xids = [int(x) for x in raw.get("xids", ()) if isinstance(x, int)]
    crit = sorted({x for x in xids if x in CRITICAL_XIDS})
    if crit:
        problems.append("XID " + ",".join(str(x) for x in crit))
    if prev is not None:
        replays = _increase(_num(raw, "pcie_replay"), _num(prev, "pcie_replay"))
        if replays >= PCIE_REPLAY_LIMIT:
            problems.append(f"PCIe replays +{replays:.0f}")
    prev_links = {int(lk.get("link", -1)): lk for lk in (prev or {}).get("nvlink", ()) or ()}
    for lk in raw.get("nvlink", ()) or ():
        n = int(lk.get("link", -1))
        before = prev_links.get(n)
        if before is not None and before.get("active") and not lk.get("active"):
            problems.append(f"NVLink {n} down")
        if before is not None:
            errs = sum(
                _increase(_num(lk, k), _num(before, k))
                for k in ("replay", "recovery", "crc_flit", "crc_data")
            )
            if errs:
                problems.append(f"NVLink {n} errors +{errs:.0f}")
    power = _num(raw, "power_mw")
    return GpuStatus(
        index=int(raw.get("index", -1)),
        uuid=str(raw.get("uuid", "")),
        ok=not problems,
        problems=tuple(problems),
        temperature_c=temp,
        power_w=None if power is None else power / 1000.0,
    )


def gpu_health(reading: GpuReading, previous: GpuReading | None = None) -> HostGpuHealth:
    """Return the host's GPU health from ``reading`` (compared with ``previous`` if given).

    GPUs are matched to their previous values by uuid (index if no uuid). Pure; never raises
    on odd raw values (they are ignored).
    """
    if not reading.present:
        return HostGpuHealth(present=False, ok=True, detail=reading.reason or "no GPU")
    if reading.reason:  # GPUs exist but NVML failed to read them (e.g. "GPU is lost")
        return HostGpuHealth(present=True, ok=False, detail=reading.reason)
    prev_by: dict[str, GpuRaw] = {}
    if previous is not None and previous.present:
        prev_by = {str(g.get("uuid") or g.get("index")): g for g in previous.gpus}
    statuses = tuple(
        _gpu_status(g, prev_by.get(str(g.get("uuid") or g.get("index")))) for g in reading.gpus
    )
    bad = [s for s in statuses if not s.ok]
    if not bad:
        detail = f"{len(statuses)} GPU(s) ok"
    else:
        detail = "; ".join(f"gpu{s.index}: {', '.join(s.problems)}" for s in bad)
    return HostGpuHealth(present=True, ok=not bad, detail=detail, gpus=statuses)


# ---- NVML reader (I/O) ----------------------------------------------------------------------


def _try(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Return fn(*args) or None when NVML says the metric is unsupported or not permitted."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _read_one(nvml: Any, i: int, xids: Sequence[int]) -> dict[str, Any]:
    h = nvml.nvmlDeviceGetHandleByIndex(i)
    uuid = _try(nvml, lambda: nvml.nvmlDeviceGetUUID(h))
    raw: dict[str, Any] = {
        "index": i,
        "uuid": uuid.decode() if isinstance(uuid, bytes) else (uuid or ""),
        "temperature_c": _try(
            nvml, lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        ),
        "power_mw": _try(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(h)),
        "ecc_uncorrected": _try(
            nvml,
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        ),
        "ecc_corrected": _try(
            nvml,
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        ),
        "pcie_replay": _try(nvml, lambda: nvml.nvmlDeviceGetPcieReplayCounter(h)),
        "xids": list(xids),
    }
    for key, cause in (
        ("retired_sbe", nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        ("retired_dbe", nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    ):
        pages = _try(nvml, nvml.nvmlDeviceGetRetiredPages, h, cause)
        raw[key] = None if pages is None else len(pages)
    rows = _try(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(h))
    if rows is not None and len(rows) >= 4:
        raw["remapped_pending"], raw["remapped_failure"] = bool(rows[2]), bool(rows[3])
    links = []
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        state = _try(nvml, nvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            continue
        entry: dict[str, Any] = {"link": link, "active": bool(state)}
        for key, counter in (
            ("replay", nvml.NVML_NVLINK_ERROR_DL_REPLAY),
            ("recovery", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
            ("crc_flit", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            ("crc_data", nvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
        ):
            entry[key] = _try(nvml, nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
        links.append(entry)
    raw["nvlink"] = links
    return raw


def read_gpus(nvml: Any = None, xids: Mapping[int, Sequence[int]] | None = None) -> GpuReading:
    """Read every GPU through NVML module ``nvml`` (default: ``pynvml``).

    ``xids`` maps GPU index -> XIDs collected since the last reading (from an event set the
    caller keeps; optional). Returns ``GpuReading(present=False, reason)`` when there is no
    GPU or NVML is unusable; never raises an NVML error.
    """
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return GpuReading(False, reason="no GPU: nvidia-ml-py not installed")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        return GpuReading(False, reason="no GPU: NVML library not found")
    except nvml.NVMLError_DriverNotLoaded:
        return GpuReading(False, reason="no GPU: NVIDIA driver not loaded")
    except nvml.NVMLError as exc:
        return GpuReading(False, reason=f"no GPU: NVML init failed: {exc}")
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            return GpuReading(False, reason="no GPU: NVML reports 0 devices")
        gpus = tuple(_read_one(nvml, i, (xids or {}).get(i, ())) for i in range(count))
        return GpuReading(True, gpus)
    except nvml.NVMLError as exc:
        return GpuReading(True, (), reason=f"NVML error: {exc}")  # a GPU is there but failing
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
