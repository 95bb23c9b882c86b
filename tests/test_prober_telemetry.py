"""Telemetry: NVML values -> GPU health on recorded values; no-GPU paths; sysfs NIC counters."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pynvml
import pytest

from prober.telemetry.gpu import GpuReading, gpu_health, read_gpus
from prober.telemetry.nic import NicTelemetryError, nic_status, nic_status_delta, read_nic

# Recorded from an A100 node (values as nvidia-ml-py returns them, mapped by _read_one).
A100_OK: dict[str, Any] = {
    "index": 0, "uuid": "GPU-5f2a", "temperature_c": 41, "power_mw": 61_234,
    "ecc_uncorrected": 0, "ecc_corrected": 3, "retired_sbe": 0, "retired_dbe": 0,
    "remapped_pending": False, "remapped_failure": False, "pcie_replay": 12,
    "nvlink": [{"link": i, "active": True, "replay": 0, "recovery": 0, "crc_flit": 4,
                "crc_data": 0} for i in range(12)],
    "xids": [],
}  # fmt: skip
# Same GPU a minute later after an uncorrectable ECC event (XID 48, then 94 contained).
A100_ECC: dict[str, Any] = {
    **A100_OK, "temperature_c": 44, "ecc_uncorrected": 1, "retired_dbe": 1, "xids": [48, 94],
    "remapped_pending": True,
}  # fmt: skip
# NVLink 3 dropped and link 5 took CRC errors; PCIe replays jumped.
A100_LINKS: dict[str, Any] = {
    **A100_OK, "pcie_replay": 512,
    "nvlink": [{**lk, "active": lk["link"] != 3, "crc_flit": lk["crc_flit"] + (9 if lk["link"] == 5 else 0)}
               for lk in A100_OK["nvlink"]],
}  # fmt: skip
# A consumer card: NVML returns NotSupported for ECC, NVLink, retired pages (-> None / absent).
RTX_HOT: dict[str, Any] = {
    "index": 1, "uuid": "GPU-77c1", "temperature_c": 93, "power_mw": 350_000,
    "ecc_uncorrected": None, "ecc_corrected": None, "retired_sbe": None, "retired_dbe": None,
    "pcie_replay": None, "nvlink": [], "xids": [13],
}  # fmt: skip


def reading(*gpus: dict[str, Any]) -> GpuReading:
    return GpuReading(True, tuple(gpus))


def test_healthy_gpu() -> None:
    h = gpu_health(reading(A100_OK), reading(A100_OK))
    assert h.present and h.ok and h.detail == "1 GPU(s) ok"
    assert h.gpus[0].power_w == pytest.approx(61.234)


def test_uncorrected_ecc_and_critical_xids_fail() -> None:
    h = gpu_health(reading(A100_ECC), reading(A100_OK))
    assert not h.ok
    probs = h.gpus[0].problems
    assert "uncorrected ECC 1" in probs and "retired pages (DBE) 1" in probs
    assert "XID 48,94" in probs and "row remap pending (reset needed)" in probs
    assert h.detail.startswith("gpu0: ")


def test_nvlink_down_errors_and_pcie_replays_need_previous() -> None:
    h = gpu_health(reading(A100_LINKS), reading(A100_OK))
    assert set(h.gpus[0].problems) == {"PCIe replays +500", "NVLink 3 down", "NVLink 5 errors +9"}
    # without a previous reading, cumulative counters alone do not fail a GPU
    assert gpu_health(reading(A100_LINKS)).ok


def test_unsupported_metrics_and_noncritical_xid() -> None:
    h = gpu_health(reading(A100_OK, RTX_HOT), reading(A100_OK, {**RTX_HOT, "temperature_c": 70}))
    assert not h.ok
    assert h.gpus[0].ok
    assert h.gpus[1].problems == ("temperature 93C",)  # XID 13 (app error) is not critical
    assert "gpu1: temperature 93C" in h.detail


def test_counter_reset_is_not_an_error() -> None:
    assert gpu_health(
        reading({**A100_OK, "pcie_replay": 0}), reading({**A100_OK, "pcie_replay": 9000})
    ).ok


def test_no_gpu_and_failing_nvml() -> None:
    h = gpu_health(GpuReading(False, reason="no GPU: NVML library not found"))
    assert (h.present, h.ok, h.detail) == (False, True, "no GPU: NVML library not found")
    assert h.to_json() == {"present": False, "ok": True, "detail": h.detail, "gpus": []}
    lost = gpu_health(GpuReading(True, (), reason="NVML error: GPU is lost"))
    assert lost.present and not lost.ok and "GPU is lost" in lost.detail


def test_read_gpus_on_this_machine_reports_no_gpu_cleanly() -> None:
    r = read_gpus()
    assert r.present is False and r.reason.startswith("no GPU")


def fake_nvml(init_error: type[Exception] | None = None, count: int = 0, fail_at: str = "") -> Any:
    m = types.SimpleNamespace(
        **{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("NVML_", "NVMLError"))}
    )
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error is not None:
            raise init_error(None)

    def nvml_call(name: str, value: Any) -> Any:
        def f(*args: Any) -> Any:
            if name == fail_at:
                raise pynvml.NVMLError_GpuIsLost(None)
            if name in ("ecc", "nvlink_state"):
                raise pynvml.NVMLError_NotSupported(None)
            return value

        return f

    m.nvmlInit = init
    m.nvmlShutdown = lambda: calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = nvml_call("handle", object())
    m.nvmlDeviceGetUUID = nvml_call("uuid", "GPU-x")
    m.nvmlDeviceGetTemperature = nvml_call("temp", 50)
    m.nvmlDeviceGetPowerUsage = nvml_call("power", 100_000)
    m.nvmlDeviceGetTotalEccErrors = nvml_call("ecc", 0)
    m.nvmlDeviceGetPcieReplayCounter = nvml_call("pcie", 7)
    m.nvmlDeviceGetRetiredPages = nvml_call("pages", [1, 2])
    m.nvmlDeviceGetRemappedRows = nvml_call("rows", (0, 0, 0, 0))
    m.nvmlDeviceGetNvLinkState = nvml_call("nvlink_state", 1)
    m.nvmlDeviceGetNvLinkErrorCounter = nvml_call("nvlink_err", 0)
    m.calls = calls
    return m


@pytest.mark.parametrize(
    ("err", "reason"),
    [(pynvml.NVMLError_LibraryNotFound, "library not found"),
     (pynvml.NVMLError_DriverNotLoaded, "driver not loaded")],
)  # fmt: skip
def test_read_gpus_no_driver(err: type[Exception], reason: str) -> None:
    r = read_gpus(fake_nvml(init_error=err))
    assert not r.present and reason in r.reason


def test_read_gpus_zero_devices_then_shutdown() -> None:
    m = fake_nvml(count=0)
    r = read_gpus(m)
    assert not r.present and "0 devices" in r.reason
    assert m.calls == ["init", "shutdown"]


def test_read_gpus_maps_values_and_unsupported() -> None:
    r = read_gpus(fake_nvml(count=2), xids={1: [79]})
    assert r.present and len(r.gpus) == 2
    g = r.gpus[1]
    assert (g["uuid"], g["temperature_c"], g["pcie_replay"], g["retired_dbe"]) == (
        "GPU-x",
        50,
        7,
        2,
    )
    assert g["ecc_uncorrected"] is None and g["nvlink"] == [] and g["xids"] == [79]
    h = gpu_health(r)
    assert not h.ok and "XID 79" in h.detail and "retired pages (DBE) 2" in h.detail


def test_read_gpus_gpu_lost_midway() -> None:
    r = read_gpus(fake_nvml(count=1, fail_at="handle"))
    assert r.present and "NVML error" in r.reason
    assert not gpu_health(r).ok


# ---- NIC ------------------------------------------------------------------------------------

VETH_RAW = {
    "operstate": "up\n", "carrier": "1\n", "carrier_changes": "2\n", "mtu": "1500\n",
    "statistics/rx_packets": "1043\n", "statistics/tx_packets": "998\n",
    "statistics/rx_errors": "0\n", "statistics/tx_errors": "0\n",
    "statistics/rx_dropped": "3\n", "statistics/tx_dropped": "0\n",
}  # fmt: skip


def test_nic_status_recorded_veth() -> None:
    s = nic_status("veth0", VETH_RAW)
    assert s.up and s.operstate == "up" and s.carrier_changes == 2 and s.mtu == 1500
    assert s.counters["rx_dropped"] == 3
    assert s.counters["rx_crc_errors"] == -1  # file absent on veth
    down = nic_status("veth0", {**VETH_RAW, "operstate": "down\n", "carrier": "0\n"})
    assert not down.up
    assert nic_status("lo", {"operstate": "unknown", "carrier": "1"}).up  # lo, veth: unknown
    assert not nic_status("x", {"carrier": "garbage"}).up


def test_nic_delta_flap_and_errors() -> None:
    a = nic_status("veth0", VETH_RAW)
    b = nic_status("veth0", {**VETH_RAW, "carrier_changes": "6", "statistics/rx_errors": "5"})
    d = nic_status_delta(a, b)
    assert d["carrier_changes"] == 4 and d["rx_errors"] == 5 and d["rx_crc_errors"] == 0
    assert nic_status_delta(b, a)["carrier_changes"] == 0  # counter reset: no negative


def test_read_nic_real_sysfs() -> None:
    s = read_nic("lo")
    assert s.up and s.counters["rx_packets"] >= 0 and s.carrier_changes >= 0
    assert s.to_json()["device"] == "lo"
    with pytest.raises(NicTelemetryError, match="no network device"):
        read_nic("qpmesh-nonexistent0")


def test_read_nic_fake_root(tmp_path: Path) -> None:
    d = tmp_path / "veth9" / "statistics"
    d.mkdir(parents=True)
    for k, v in VETH_RAW.items():
        (tmp_path / "veth9" / k).write_text(v)
    assert read_nic("veth9", root=tmp_path) == nic_status("veth9", VETH_RAW)
