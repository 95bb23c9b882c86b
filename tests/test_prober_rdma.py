"""RDMA transport: the parts that run without hardware (flow label <-> RoCEv2 sport, HCA
clock conversion, UD buffer layout, discovery, CLI without a device). Hardware: skipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prober.rdma.clock import HcaClock
from prober.rdma.discover import RdmaUnavailable, list_rdma_devices, require_rdma
from prober.rdma.flowlabel import flow_label_for_sport, sport_of_flow_label
from prober.rdma.packet import (
    GRH_SIZE,
    PacketError,
    build_grh_ib,
    build_grh_ipv4,
    grh_source,
    split_grh,
)
from prober.wire import Codec, Message, MsgType, nic_hash

# ---- flow label -> sport ------------------------------------------------------------------


def test_mlx5_formula_known_values() -> None:
    # fl = 1 -> 1 | 0xC000; high bits fold into the low ones
    assert sport_of_flow_label(1) == 0xC001
    assert sport_of_flow_label(0x3FFF) == 0xFFFF
    assert sport_of_flow_label(0x4000) == 0xC001  # (0) ^ (1) = 1
    assert sport_of_flow_label(0xFFFFF) == ((0x3FFF ^ 0x3F) | 0xC000)
    for bad in (0, -1, 1 << 20):
        with pytest.raises(ValueError):
            sport_of_flow_label(bad)


def test_every_roce_sport_reachable() -> None:
    """All 16384 RoCEv2 source ports have a non-zero flow label mapping exactly to them."""
    sports = np.arange(0xC000, 0x10000)
    labels = [flow_label_for_sport(int(s)) for s in sports]
    assert all(0 < fl <= 0xFFFFF for fl in labels)
    assert [sport_of_flow_label(fl) for fl in labels] == sports.tolist()
    assert len(set(labels)) == len(labels)
    for bad in (0xBFFF, 0x10000, 4791):
        with pytest.raises(ValueError):
            flow_label_for_sport(bad)


@given(sport=st.integers(0xC000, 0xFFFF), high=st.integers(0, 63))
def test_flow_label_choices_roundtrip(sport: int, high: int) -> None:
    fl = flow_label_for_sport(sport, high)
    assert fl != 0 and sport_of_flow_label(fl) == sport


# ---- HCA clock ----------------------------------------------------------------------------


def test_clock_linear_conversion() -> None:
    c = HcaClock(khz=156_250, ref_cycles=1_000_000, ref_ns=1_700_000_000_000_000_000)  # 156.25 MHz
    assert c.to_ns(1_000_000) == c.ref_ns
    assert c.to_ns(1_000_000 + 156_250_000) == c.ref_ns + 1_000_000_000  # one second later
    assert c.to_ns(1_000_000 - 15_625) == c.ref_ns - 100_000  # before the anchor
    arr = c.to_ns_array([1_000_000, 1_000_000 + 156])
    assert arr.dtype == np.int64 and arr.tolist() == [c.ref_ns, c.ref_ns + 998]


def test_clock_wraps_with_mask() -> None:
    mask = (1 << 48) - 1
    c = HcaClock(khz=1_000_000, ref_cycles=mask - 10, ref_ns=0, mask=mask)  # 1 GHz: 1 cycle = 1 ns
    assert c.to_ns(5) == 16  # wrapped past the mask
    assert c.to_ns(mask - 20) == -10
    assert c.wrap_ns == 1 << 48
    r = c.reanchor(5)
    assert r.ref_cycles == 5 and r.ref_ns == 16 and r.to_ns(105) == 116


@given(khz=st.integers(1_000, 2_000_000), d=st.integers(-(10**12), 10**12))
def test_clock_monotone_and_rate(khz: int, d: int) -> None:
    c = HcaClock(khz=khz, ref_cycles=1 << 40, ref_ns=10**18)
    ns = c.to_ns((1 << 40) + d)
    assert abs((ns - 10**18) - d * 1_000_000 / khz) <= 1
    assert c.to_ns((1 << 40) + d + 1) >= ns


def test_clock_validation() -> None:
    for kw in ({"khz": 0}, {"mask": 5}, {"ref_cycles": -1}):
        with pytest.raises(ValueError):
            HcaClock(**{"khz": 1000, "ref_cycles": 0, "ref_ns": 0, **kw})  # type: ignore[arg-type]


# ---- UD buffer layout -----------------------------------------------------------------------


def test_ud_receive_buffer_roce_ipv4() -> None:
    msg = Message(MsgType.PROBE, nic_hash("nic0"), nic_hash("nic1"), 7, -1, 0)
    payload = Codec().encode(msg)
    buf = bytearray(4096)
    wire = build_grh_ipv4("10.0.0.1", "10.0.0.2") + payload
    buf[: len(wire)] = wire
    grh, got = split_grh(buf, len(wire))
    assert len(grh) == GRH_SIZE and got == payload
    assert grh_source(grh) == "10.0.0.1"
    assert Codec().decode(got).seq == 7


def test_ud_receive_buffer_ib_grh() -> None:
    grh = build_grh_ib("fe80::1", "fe80::2")
    assert grh_source(grh) == "fe80::1"


def test_ud_buffer_errors() -> None:
    with pytest.raises(PacketError):
        split_grh(bytes(30), 30)
    with pytest.raises(PacketError):
        split_grh(bytes(50), 60)
    with pytest.raises(PacketError):
        grh_source(bytes(39))


# ---- discovery and CLI ----------------------------------------------------------------------


def test_discovery_here_finds_nothing(tmp_path: Path) -> None:
    assert list_rdma_devices(tmp_path / "missing") == []
    (tmp_path / "mlx5_1").mkdir()
    (tmp_path / "mlx5_0").mkdir()
    assert list_rdma_devices(tmp_path) == ["mlx5_0", "mlx5_1"]
    with pytest.raises(RdmaUnavailable, match="mlx5_7"):
        require_rdma(["mlx5_7"], tmp_path)
    with pytest.raises(RdmaUnavailable, match="no RDMA device"):
        require_rdma([], tmp_path / "missing")


def test_cli_rdma_without_device_one_line_exit_1(tmp_path: Path) -> None:
    if list_rdma_devices():
        pytest.skip("this host has RDMA devices")
    cfg = tmp_path / "p.toml"
    cfg.write_text('[prober]\nhost = "h"\n[[nics]]\nid = "nic0"\naddress = "10.0.0.1"\n'
                   'rdma_device = "mlx5_0"\n')  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "qpmesh.cli", "prober", "--config", str(cfg), "--transport", "rdma"],
        check=False, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "no RDMA device" in r.stderr, r.stderr


async def test_ud_pingpong_on_hardware() -> None:
    """Two UD endpoints on the first device exchange a probe with completion timestamps."""
    import asyncio

    devs = list_rdma_devices()
    if not devs:
        pytest.skip("no RDMA device (/sys/class/infiniband missing): hardware test")
    pytest.importorskip("pyverbs", reason="pyverbs not installed (extra 'rdma')")
    from prober.config import NicConfig
    from prober.events import ProbeEvent, ProbeResult
    from prober.rdma.transport import RdmaEndpoint
    from prober.session import ProbeSession

    events: list[ProbeEvent] = []
    a = RdmaEndpoint(ProbeSession("nicA"), NicConfig("nicA", "0.0.0.0", rdma_device=devs[0]),
                     on_events=events.extend)  # fmt: skip
    b = RdmaEndpoint(ProbeSession("nicB"), NicConfig("nicB", "0.0.0.0", rdma_device=devs[0]))
    a.open()
    b.open()
    try:
        gid = str(a._v["ctx"].query_gid(1, a.nic.gid_index))
        a.session.queue_probe("nicB", (gid, b.qpn), 0xC123, a.now_ns())
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        for _ in range(200):
            if events:
                break
            await asyncio.sleep(0.01)
        a.close()
        b.close()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        a.close()
        b.close()
    res = [e for e in events if isinstance(e, ProbeResult)]
    assert res and res[0].sport == 0xC123 and 0 < res[0].rtt_ns < 10_000_000


async def test_ud_probe_via_learnt_peer_on_hardware() -> None:
    """Endpoint A learns B's QP from B's presence block (table), creates AHs, probes B."""
    import asyncio

    devs = list_rdma_devices()
    if not devs:
        pytest.skip("no RDMA device (/sys/class/infiniband missing): hardware test")
    pytest.importorskip("pyverbs", reason="pyverbs not installed (extra 'rdma')")
    from prober.config import NicConfig
    from prober.events import ProbeEvent, ProbeResult
    from prober.rdma.peers import RdmaPeerTable, presence_rdma
    from prober.rdma.transport import RdmaEndpoint
    from prober.session import ProbeSession

    table = RdmaPeerTable()
    events: list[ProbeEvent] = []
    nic_a = NicConfig("nicA", "0.0.0.0", rdma_device=devs[0])
    nic_b = NicConfig("nicB", "0.0.0.0", rdma_device=devs[0])
    a = RdmaEndpoint(ProbeSession("nicA"), nic_a, sports=(0xC123,), on_events=events.extend,
                     peers=table)  # fmt: skip
    b = RdmaEndpoint(ProbeSession("nicB"), nic_b, peers=table)
    a.open()
    b.open()
    try:
        assert a.resolve("nicB") is None
        changed = table.update(
            "hB", {"alive": True, "rdma": presence_rdma([b.local_address("hB")])}
        )
        assert changed == {"nicB"} and a.refresh_peer("nicB") == (0, 1)
        dest = a.resolve("nicB")
        assert dest is not None
        a.session.queue_probe("nicB", dest, 0xC123, a.now_ns())
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        for _ in range(200):
            if events:
                break
            await asyncio.sleep(0.01)
        a.close()
        b.close()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        a.close()
        b.close()
    res = [e for e in events if isinstance(e, ProbeResult)]
    assert res and res[0].sport == 0xC123
