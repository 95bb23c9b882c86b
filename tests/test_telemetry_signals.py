"""The signal catalogue, the collectors' pure parsers and the window of rates.

Recorded inputs: the procfs texts are this machine's (2026-11-28); the sysfs, ethtool and
AER values are written by hand in the shapes the kernel prints (names from the drivers'
sources); the NVML values are hand-written in the shapes NVML documents (`c_nvmlUtilization_t`,
MHz, mW, a throttle bitmask, KB/s): they are NOT readings of a real GPU (this machine has none).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pynvml
import pytest

from contract.jsondoc import DocumentError
from contract.origin import signals_origin_error
from contract.signals import (
    BY_NAME,
    CATALOGUE,
    Entity,
    Kind,
    SignalGroup,
    SignalsDoc,
    gpu_id,
    names_of,
)
from prober.telemetry.collector import Collector, CollectorConfig, NicSource, Reading, window
from prober.telemetry.ethtool import (
    EthtoolError,
    EthtoolReader,
    catalogue_name,
    ethtool_values,
    parse_gstrings,
)
from prober.telemetry.gpuperf import NvmlPerf, gpu_perf_values
from prober.telemetry.host import host_values, parse_psi, parse_softnet, parse_stat
from prober.telemetry.netdev import parse_proc_net_dev
from prober.telemetry.pcie import aer_values
from prober.telemetry.rates import counter_rate, counter_rates
from prober.telemetry.rdma import rdma_netdev, rdma_values, read_rdma_port
from prober.telemetry.signals_cli import bench_report, parse_nic

STAT = """cpu  21564 13133 12243 108346 380 0 1111 10 0 0
cpu0 7732 7020 5319 57799 34 0 484 3 0 0
cpu1 13832 6112 6924 50547 345 0 626 6 0 0
intr 1 2 3
ctxt 9123456
btime 1764300000
processes 7523
procs_running 2
procs_blocked 1
"""
PSI = """some avg10=3.48 avg60=2.62 avg300=2.22 total=18620750
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
"""
SOFTNET = """004d0cde 00000002 00000010 00000000 00000000 00000000 00000000 00000000
005eca4e 00000001 00000005 00000000 00000000 00000000 00000000 00000000
"""
NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 1306239797 11260316    0    0    0     0          0         0 1306239797 11260316    0    0    0     0       0          0
  eth0: 500 4 1 2 0 0 0 0 700 6 3 4 0 0 0 0
"""


def test_catalogue_names_kinds_and_entities() -> None:
    assert len(BY_NAME) == len(CATALOGUE) >= 100  # ~150 metric types per host in "Reveal"
    for ent in Entity:
        assert names_of(ent), ent
    assert BY_NAME["pfc_rx_p3"].entity == Entity.NIC and BY_NAME["pfc_rx_p3"].kind == Kind.COUNTER
    assert BY_NAME["mtu"].config and BY_NAME["temperature_c"].kind == Kind.GAUGE
    assert BY_NAME["rdma_symbol_errors"].saturates and BY_NAME["gpu_pcie_replay"].width == 32


def test_counter_rate_rules() -> None:
    assert counter_rate(100, 400, 3.0) == 100.0
    assert counter_rate(None, 5, 1.0) is None and counter_rate(5, None, 1.0) is None
    assert counter_rate(5, 10, 0.0) is None
    top = 2**32
    assert counter_rate(top - 10, 20, 1.0, width=32) == 30.0  # one wrap
    assert counter_rate(top - 10, 20, 1.0, width=64) is None  # a 64-bit counter reset
    assert counter_rate(3e9, 1e9, 1.0, width=32) is None  # more than one wrap explains: reset
    assert counter_rate(top - 10, top - 1, 1.0, width=32, saturates=True) is None  # stuck
    assert counter_rate(top - 10, 5, 1.0, width=32, saturates=True) is None  # cleared


def test_vector_rates_equal_scalar_rates() -> None:
    rng = np.random.default_rng(3)
    n = 4000
    widths = rng.choice([32, 64], n)
    sat = rng.random(n) < 0.3
    top = np.ldexp(1.0, widths)
    prev = np.floor(rng.random(n) * top * rng.choice([1.0, 1e-9], n))
    step = np.floor(rng.random(n) * 1e6)
    cur = np.where(rng.random(n) < 0.2, np.floor(rng.random(n) * 1e5), prev + step)
    cur = np.where(rng.random(n) < 0.1, (prev + step) % top, cur)  # wraps
    cur = np.where(rng.random(n) < 0.05, top - 1, cur)  # saturated
    prev[rng.random(n) < 0.05] = np.nan
    got = counter_rates(prev, cur, 2.0, widths, sat)
    for i in range(n):
        p = None if np.isnan(prev[i]) else float(prev[i])
        want = counter_rate(p, float(cur[i]), 2.0, int(widths[i]), bool(sat[i]))
        assert (np.isnan(got[i]) and want is None) or got[i] == pytest.approx(want), i


def test_host_values_from_procfs_texts() -> None:
    stat = parse_stat(STAT)
    assert stat["ncpu"] == 2 and stat["procs_running"] == 2 and stat["cpu_softirq"] == 1111
    assert parse_psi(PSI) == {"some": 18.62075, "full": 0.0}
    assert parse_softnet(SOFTNET) == {"softnet_dropped": 3.0, "softnet_squeezed": 21.0}
    vals = host_values({"stat": STAT, "loadavg": "1.07 0.81 0.46 2/102 7523\n",
                        "pressure/cpu": PSI, "pressure/io": PSI, "net/softnet_stat": SOFTNET,
                        "meminfo": "MemTotal: 1000 kB\nMemAvailable: 250 kB\n"}, user_hz=100)  # fmt: skip
    assert vals["cpu_softirq"] == pytest.approx(1111 / 100 / 2)  # seconds per CPU
    assert vals["cpu_user"] == pytest.approx((21564 + 13133) / 100 / 2)  # user + nice
    assert vals["runq_per_cpu"] == 1.0 and vals["procs_blocked"] == 1 and vals["load1"] == 1.07
    assert vals["psi_cpu_some"] == pytest.approx(18.62075) and "psi_mem_some" not in vals
    assert vals["mem_available"] == 0.25
    assert host_values({}) == {}  # nothing readable: nothing, not zeros


def test_netdev_parse() -> None:
    got = parse_proc_net_dev(NET_DEV)
    assert got["eth0"] == {"rx_bytes": 500, "rx_packets": 4, "rx_errors": 1, "rx_dropped": 2,
                           "tx_bytes": 700, "tx_packets": 6, "tx_errors": 3, "tx_dropped": 4}  # fmt: skip
    assert set(got) == {"lo", "eth0"}


@pytest.mark.parametrize(
    ("driver_name", "signal"),
    [
        ("rx_prio3_pause", "pfc_rx_p3"),  # mlx5
        ("tx_pause_ctrl_phy", "pause_tx"),
        ("rx_corrected_bits_phy", "fec_corrected_bits"),
        ("link_down_events_phy", "link_down_events"),
        ("tx_pci_signal_integrity", "pcie_si_tx"),
        ("rx_pfc_ena_frames_pri3", "pfc_rx_p3"),  # bnxt_en
        ("rx_fec_uncorrectable_blocks", "fec_uncorrectable_blocks"),
        ("rx_priority_5_xoff.nic", "pfc_rx_p5"),  # ice
        ("link_xoff_rx.nic", "pause_rx"),
        ("port.tx_priority_2_xoff_tx", "pfc_tx_p2"),  # i40e, both spellings
        ("port.tx_priority_2_xoff", "pfc_tx_p2"),
        ("rx_queue_0_drops", None),  # veth: nothing of the catalogue
        ("rx_prio9_pause", None),
    ],
)
def test_ethtool_names_by_driver(driver_name: str, signal: str | None) -> None:
    assert catalogue_name(driver_name) == signal
    if signal is not None:
        assert signal in BY_NAME


def test_ethtool_values_and_gstrings() -> None:
    vals = ethtool_values({"rx_prio3_pause": 7, "peer_ifindex": 4, "rx_pause_ctrl_phy": 9})
    assert vals == {"pfc_rx_p3": 7.0, "pause_rx": 9.0}  # fec etc. absent: not available
    raw = b"rx_a".ljust(32, b"\0") + b"tx_b".ljust(32, b"\0")
    assert parse_gstrings(raw, 2) == ("rx_a", "tx_b")


def test_ethtool_ioctls_on_this_machine() -> None:
    r = EthtoolReader()
    try:
        assert r.stats("lo") == {}  # lo has no ethtool statistics: none, not zeros
        assert r.mtu("lo") == 65536
        with pytest.raises(EthtoolError):
            r.stats("qpmesh-none0")
    finally:
        r.close()


def _sysfs(root: Path, dev: str, files: dict[str, dict[str, str]]) -> None:
    for sub, entries in files.items():
        d = root / dev / "ports" / "1" / sub
        d.mkdir(parents=True, exist_ok=True)
        for name, text in entries.items():
            (d / name).write_text(text)


def test_rdma_counters_of_mlx5_and_rxe(tmp_path: Path) -> None:
    _sysfs(tmp_path, "mlx5_0", {
        "counters": {"port_rcv_data": "1000\n", "port_xmit_data": "250\n", "symbol_error": "3\n",
                     "port_xmit_wait": "77\n"},
        "hw_counters": {"np_cnp_sent": "11\n", "rp_cnp_handled": "12\n", "lifespan": "10\n",
                        "np_ecn_marked_roce_packets": "13\n", "out_of_sequence": "4\n"},
        "gid_attrs/ndevs": {"0": "ens1f0np0\n"},
    })  # fmt: skip
    counters, hw = read_rdma_port("mlx5_0", 1, tmp_path)
    vals = rdma_values(counters, hw)
    assert vals["rdma_rx_bytes"] == 4000.0 and vals["rdma_tx_bytes"] == 1000.0  # 4-byte words
    assert (vals["cnp_sent"], vals["cnp_handled"], vals["ecn_marked"]) == (11.0, 12.0, 13.0)
    assert vals["rdma_symbol_errors"] == 3.0 and "local_ack_timeout" not in vals
    assert rdma_netdev("mlx5_0", 1, tmp_path) == "ens1f0np0"
    _sysfs(tmp_path, "rxe0", {"hw_counters": {"sent_pkts": "50\n", "rcvd_pkts": "40\n",
                                              "rcvd_seq_err": "2\n", "completer_retry_err": "5\n",
                                              "ack_deferred": "9\n"}})  # fmt: skip
    vals = rdma_values(*read_rdma_port("rxe0", 1, tmp_path))
    assert vals == {"rdma_tx_packets": 50.0, "rdma_rx_packets": 40.0, "packet_seq_err": 2.0,
                    "local_ack_timeout": 5.0}  # fmt: skip
    with pytest.raises(FileNotFoundError):
        read_rdma_port("mlx5_9", 1, tmp_path)
    _sysfs(tmp_path, "bnxt_re0", {"hw_counters": {"tx_cnp_pkts": "7\n", "rx_cnp_pkts": "8\n",
                                                  "rx_ecn_marked_pkts": "9\n"}})  # fmt: skip
    assert rdma_values(*read_rdma_port("bnxt_re0", 1, tmp_path)) == {
        "cnp_sent": 7.0, "cnp_handled": 8.0, "ecn_marked": 9.0}  # fmt: skip


def test_aer_correctable_errors() -> None:
    text = ("RxErr 1\nBadTLP 2\nBadDLLP 3\nRollover 4\nTimeout 5\nNonFatalErr 0\n"
            "CorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 15\n")  # fmt: skip
    assert aer_values(text) == {"pcie_rx_err": 1.0, "pcie_bad_tlp": 2.0, "pcie_bad_dllp": 3.0,
                                "pcie_replay_rollover": 4.0, "pcie_replay_timeout": 5.0}  # fmt: skip


# Hand-written in NVML's documented shapes; NOT a real GPU's readings.
NVML_FIXTURE = {"index": 0, "util_gpu": 97, "util_mem": 41, "sm_clock": 1980, "mem_clock": 2619,
                "power_mw": 612_000, "power_limit_mw": 700_000, "temperature_c": 71,
                "throttle_reasons": 0x20 | 0x4, "pcie_tx_kbps": 1_000_000, "pcie_rx_kbps": None,
                "pcie_replay": 3, "ecc_corrected": 0}  # fmt: skip


def test_gpu_perf_values_from_nvml_shapes() -> None:
    vals = gpu_perf_values(NVML_FIXTURE)
    assert vals["power_w"] == 612.0 and vals["power_limit_w"] == 700.0
    assert (vals["throttle_thermal"], vals["throttle_power"], vals["throttle_hw"]) == (
        1.0,
        1.0,
        0.0,
    )
    assert vals["pcie_tx_bytes"] == 1_024_000_000 and "pcie_rx_bytes" not in vals
    assert vals["sm_clock_mhz"] == 1980 and vals["gpu_pcie_replay"] == 3
    assert set(vals) <= set(names_of(Entity.GPU))


def _fake_nvml(count: int) -> Any:
    m = types.SimpleNamespace(
        **{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("NVML_", "NVMLError"))}
    )

    def unsupported(*_: Any) -> Any:
        raise pynvml.NVMLError_NotSupported(None)

    m.calls = []
    m.nvmlInit = lambda: m.calls.append("init")
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUtilizationRates = lambda h: pynvml.c_nvmlUtilization_t(gpu=90, memory=30)
    m.nvmlDeviceGetClockInfo = lambda h, c: 1980 if c == pynvml.NVML_CLOCK_SM else 2619
    m.nvmlDeviceGetPowerUsage = lambda h: 500_000
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    m.nvmlDeviceGetTemperature = lambda h, s: 65
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x40
    m.nvmlDeviceGetPcieThroughput = unsupported  # some GPUs refuse it
    m.nvmlDeviceGetPcieReplayCounter = lambda h: 5
    m.nvmlDeviceGetTotalEccErrors = unsupported
    return m


def test_nvml_perf_reader_with_a_fake_nvml() -> None:
    assert NvmlPerf.open(_fake_nvml(0)) == "no GPU: NVML reports 0 devices"
    nvml = _fake_nvml(2)
    perf = NvmlPerf.open(nvml)
    assert isinstance(perf, NvmlPerf) and perf.count == 2
    raw = perf.read()
    vals = gpu_perf_values(raw[1])
    assert vals["gpu_util"] == 90 and vals["throttle_thermal"] == 1.0
    assert "pcie_tx_bytes" not in vals and "ecc_corrected" not in vals  # refused: absent
    perf.close()
    assert nvml.calls == ["init", "shutdown"]  # one init for the collector's life
    assert NvmlPerf.open().startswith("no GPU")  # type: ignore[union-attr]  # this machine


def test_window_rates_gauges_and_missing() -> None:
    a = Reading(0, {"nic": {"nic1": {"rx_bytes": 1000.0, "mtu": 9000.0, "pfc_rx_p3": 5.0},
                            "nic2": {"rx_bytes": 2000.0, "mtu": 9000.0}},
                    "host": {"h1": {"cpu_softirq": 1.0, "load1": 2.0}}})  # fmt: skip
    b = Reading(2_000_000_000, {"nic": {"nic1": {"rx_bytes": 3000.0, "mtu": 1500.0, "pfc_rx_p3": 9.0},
                                        "nic2": {"rx_bytes": 1.0, "mtu": 9000.0}},
                                "host": {"h1": {"cpu_softirq": 1.5, "load1": 3.0}}})  # fmt: skip
    doc = window(a, b, "h1")
    assert doc.interval_s == 2.0
    assert doc.get("nic", "nic1", "rx_bytes") == 1000.0 and doc.get("nic", "nic1", "mtu") == 1500
    assert doc.get("nic", "nic1", "pfc_rx_p3") == 2.0
    assert doc.get("nic", "nic2", "rx_bytes") is None  # went backwards: a reset, not a rate
    assert doc.get("nic", "nic2", "pfc_rx_p3") is None  # its driver has none: null, not 0
    assert "fec_corrected_bits" not in doc.groups["nic"].signals  # nobody has it
    assert doc.get("host", "h1", "cpu_softirq") == 0.25
    assert SignalsDoc.decode(doc.encode()) == doc
    with pytest.raises(ValueError, match="after"):
        window(b, a, "h1")


def test_collector_reads_this_host(tmp_path: Path) -> None:
    c = Collector.open(CollectorConfig("hx", (NicSource("nic0", "lo"),
                                              NicSource("nic1", "qpmesh-none0", ("mlx5_7", 1))),
                                       sysfs_ib=tmp_path))  # fmt: skip
    try:
        assert c.gpu_reason.startswith("no GPU")
        r1 = c.read(1_000_000_000)
        r2 = c.read(2_000_000_000)
    finally:
        c.close()
    assert r1.values["nic"]["nic0"]["mtu"] == 65536
    assert r1.values["nic"]["nic1"] == {}  # neither device exists: nothing, not zeros
    assert set(c.errors) == {"ethtool:qpmesh-none0", "rdma:mlx5_7"}
    assert "cpu_user" in r1.values["host"]["hx"]
    doc = window(r1, r2, "hx")
    assert (
        doc.get("nic", "nic1", "rx_bytes") is None
        and doc.get("nic", "nic0", "rx_bytes") is not None
    )


def test_signals_doc_validation() -> None:
    ok = SignalGroup(("rx_bytes", "mtu"), {"nic1": (1.0, None)})
    SignalsDoc("h1", 1, 3.0, {"nic": ok})
    bad = [
        ({"nic": SignalGroup(("rx_bytes",), {"nic1": (float("nan"),)})}, "finite"),
        ({"nic": SignalGroup(("rx_bytes",), {"nic1": (True,)})}, "finite"),  # type: ignore[dict-item]
        ({"nic": SignalGroup(("rx_bytes",), {"nic1": (1.0, 2.0)})}, "1 finite"),
        ({"nic": SignalGroup(("temperature_c",), {})}, "catalogue"),  # a GPU signal under nic
        ({"disk": SignalGroup((), {})}, "host, nic or gpu"),
        ({"nic": SignalGroup(("mtu", "mtu"), {})}, "distinct"),
    ]
    for groups, msg in bad:
        with pytest.raises(DocumentError, match=msg):
            SignalsDoc("h1", 1, 3.0, groups)
    with pytest.raises(DocumentError, match="interval_s"):
        SignalsDoc("h1", 1, 0.0, {})
    payload = (b'{"host":"h1","t_ns":1,"interval_s":3,"groups":{"nic":{"signals":["rx_bytes",'
               b'"future_thing"],"values":{"nic1":[5,6]}},"disk":{}}}')  # fmt: skip
    doc = SignalsDoc.decode(payload)  # a newer prober's extra name and kind are dropped
    assert doc.groups["nic"].signals == ("rx_bytes",) and doc.get("nic", "nic1", "rx_bytes") == 5
    for junk in (b"[]", b'{"host":"h1","t_ns":1,"interval_s":3,"groups":{"nic":{"signals":'
                 b'["rx_bytes"],"values":{"nic1":[1,2]}}}}', b'{"host":"h/1","t_ns":1,"interval_s":1}'):  # fmt: skip
        with pytest.raises(DocumentError):
            SignalsDoc.decode(junk)


def test_signals_origin() -> None:
    nic_host = {"nic1": "h1", "nic2": "h2"}
    g = {"nic": SignalGroup(("rx_bytes",), {"nic1": (1.0,)}),
         "gpu": SignalGroup(("gpu_util",), {gpu_id("h1", 0): (5.0,)}),
         "host": SignalGroup(("load1",), {"h1": (1.0,)})}  # fmt: skip
    assert signals_origin_error(SignalsDoc("h1", 1, 1.0, g), "h1", nic_host) is None
    assert "published on the topic" in str(
        signals_origin_error(SignalsDoc("h1", 1, 1.0, g), "h2", nic_host)
    )
    cases = [
        {"nic": SignalGroup(("rx_bytes",), {"nic2": (1.0,)})},
        {"gpu": SignalGroup(("gpu_util",), {gpu_id("h2", 0): (1.0,)})},
        {"gpu": SignalGroup(("gpu_util",), {"h1.gpux": (1.0,)})},
        {"host": SignalGroup(("load1",), {"h2": (1.0,)})},
    ]
    for groups in cases:
        assert str(
            signals_origin_error(SignalsDoc("h1", 1, 1.0, groups), "h1", nic_host)
        ).startswith("untrusted")
    assert "not in the fabric" in str(
        signals_origin_error(SignalsDoc("h9", 1, 1.0, {}), "h9", nic_host)
    )


def test_bench_report_and_nic_arguments() -> None:
    r = bench_report(reads=100, cpu_s=0.05, per_source_s={"nic": 0.03, "host": 0.02},
                     doc_bytes=3000, interval_s=3.0, nics=8, gpus=0, values=400)  # fmt: skip
    assert r["cpu_us_per_read"] == 500.0 and r["cpu_share"] == pytest.approx(0.5e-3 / 3, abs=1e-5)
    assert r["meets_cpu_target"] and r["bytes_per_s"] == 1000.0
    assert r["cpu_us_per_read_by_source"] == {"nic": 300.0, "host": 200.0}
    assert parse_nic("nic3=eth1") == NicSource("nic3", "eth1")
    assert parse_nic("nic3=eth1:mlx5_1/1") == NicSource("nic3", "eth1", ("mlx5_1", 1))
    for bad in ("nic3", "=eth1", "nic3=eth1:mlx5_1", "nic3=eth1:mlx5_1/x"):
        with pytest.raises(ValueError):
            parse_nic(bad)
