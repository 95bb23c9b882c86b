"""NIC self-discovery: sysfs trees, ``ip -j addr``, the ethtool timestamping ioctl, the NIC ->
GPU mapping, the NIC filter and lldpcli's JSON.

The sysfs trees and GPU placements here are HAND-WRITTEN values shaped like a two-socket GPU
server (mlx5 NICs and GPUs behind PCIe switches), not readings of real hardware: this machine
has no RDMA device and no GPU. What is read for real is this host's own ``ip -j addr``, its
interfaces' ``ETHTOOL_GET_TS_INFO`` answers, and lldpcli output recorded from lldpd 1.0.16 in
two namespaces (`tests/test_testbed_lldp.py` reads it live)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contract.neighbors import LldpNeighbor
from prober.discover.gpus import gpu_location, read_gpu_locations
from prober.discover.ipaddr import parse_ip_addr, read_ip_addr
from prober.discover.lldp import lldpcli_argv, parse_lldp
from prober.discover.nics import NicFilter, assemble, nic_id
from prober.discover.pci import (
    GpuLocation,
    PciLocation,
    affinity,
    nearest_gpu,
    normalize_bus_id,
    pci_location,
)
from prober.discover.sysfs import read_netdevs, read_rdma_ports, roce_v2_gid_index
from prober.discover.tsinfo import decode_ts_info, read_ts_info
from tests.lldprecord import LLDP_JSON0

# socket 0: root port 3a:00.0 -> PCIe switch 3b:00.0 -> ports 3c:00.0 (GPU 0) and 3c:08.0 (NIC)
NIC0 = "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:08.0/0000:3e:00.0"
GPU0 = "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0/0000:3d:00.0"
# socket 1: the NIC on one root port, GPU 1 on another of the same host bridge
NIC1 = "devices/pci0000:b0/0000:b0:00.0/0000:b1:00.0"
GPU1 = "devices/pci0000:b0/0000:b0:02.0/0000:b2:00.0"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(root: Path, link: str, target: str) -> None:
    """A relative symlink ``root/link`` -> ``root/target``, as sysfs has them."""
    path = root / link
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(root / target, path.parent))


def _netdev(root: Path, devpath: str, name: str, mtu: int, numa: int | None) -> None:
    d = root / devpath / "net" / name
    for f, v in {"mtu": str(mtu), "address": "02:00:00:00:00:01", "operstate": "up",
                 "carrier": "1", "type": "1"}.items():  # fmt: skip
        _write(d / f, v)
    if numa is not None and not devpath.startswith("devices/virtual"):
        _write(root / devpath / "numa_node", str(numa))
    _link(root, f"class/net/{name}", f"{devpath}/net/{name}")
    if not devpath.startswith("devices/virtual"):
        _link(root, f"{devpath}/net/{name}/device", devpath)


def _rdma(root: Path, devpath: str, dev: str, ndev: str, gids: dict[int, tuple[str, str]]) -> None:
    port = root / devpath / "infiniband" / dev / "ports" / "1"
    _write(port / "state", "4: ACTIVE")
    _write(port / "link_layer", "Ethernet")
    for i in range(max(gids) + 2):
        gid, kind = gids.get(i, ("0000:0000:0000:0000:0000:0000:0000:0000", ""))
        _write(port / "gids" / str(i), gid)
        _write(port / "gid_attrs" / "types" / str(i), kind)
        _write(port / "gid_attrs" / "ndevs" / str(i), ndev if kind else "")
    _link(root, f"class/infiniband/{dev}", f"{devpath}/infiniband/{dev}")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A hand-written sysfs: two mlx5 RoCE NICs, two GPUs, a veth and the loopback."""
    root = tmp_path / "sys"
    _netdev(root, NIC0, "ens1f0np0", 4200, 0)
    _rdma(root, NIC0, "mlx5_0", "ens1f0np0", {
        0: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
        1: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2"),
        2: ("0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1"),
        3: ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"),
    })  # fmt: skip
    _netdev(root, NIC1, "ens2np0", 4200, 1)
    _rdma(root, NIC1, "mlx5_1", "ens2np0", {
        0: ("fe80:0000:0000:0000:0000:00ff:fe00:0002", "IB/RoCE v1"),
        1: ("0000:0000:0000:0000:0000:ffff:0a00:0102", "RoCE v2"),
    })  # fmt: skip
    _netdev(root, "devices/virtual/net", "veth0", 1500, None)
    _netdev(root, "devices/virtual/net", "lo", 65536, None)
    for gpu, numa in ((GPU0, 0), (GPU1, 1)):
        _write(root / gpu / "numa_node", str(numa))
        _link(root, f"bus/pci/devices/{gpu.rsplit('/', 1)[1]}", gpu)
    return root


ADDRS = {"ens1f0np0": ("10.0.0.1",), "ens2np0": ("10.0.1.2",), "veth0": ("192.168.7.1",), "lo": ()}


class FakeNvml:
    """NVML with two GPUs at hand-written bus ids (NVML's upper-case, 8-digit-domain form)."""

    class NVMLError(Exception):
        pass

    def __init__(self, bus_ids: list[str]) -> None:
        self.bus_ids = bus_ids

    def nvmlInit(self) -> None:
        if not self.bus_ids:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.bus_ids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.bus_ids[h].encode())


def test_sysfs_reader_finds_netdevs_rdma_ports_and_gids(sysfs: Path) -> None:
    nds = {n.name: n for n in read_netdevs(sysfs)}
    assert set(nds) == {"ens1f0np0", "ens2np0", "veth0", "lo"}
    e = nds["ens1f0np0"]
    assert (e.mtu, e.up, e.virtual, e.location.address, e.numa_node) == (
        4200,
        True,
        False,
        "0000:3e:00.0",
        0,
    )
    assert e.location.host_bridge == "pci0000:3a" and len(e.location.chain) == 4
    assert nds["veth0"].virtual and nds["veth0"].location == PciLocation()
    ports = {p.device: p for p in read_rdma_ports(sysfs)}
    p0 = ports["mlx5_0"]
    assert (p0.port, p0.state, p0.link_layer, p0.location.address) == (
        1,
        "ACTIVE",
        "Ethernet",
        "0000:3e:00.0",
    )
    assert [g.index for g in p0.gids] == [0, 1, 2, 3]  # the all-zero entries are skipped
    assert roce_v2_gid_index(p0, "ens1f0np0", "10.0.0.1") == 3  # not 2: that one is RoCE v1
    assert roce_v2_gid_index(p0, "ens1f0np0", "10.0.0.9") is None
    assert roce_v2_gid_index(p0, "other", "10.0.0.1") is None
    assert read_netdevs(sysfs / "missing") == () and read_rdma_ports(sysfs / "missing") == ()


def test_assemble_selects_rdma_nics_with_their_gid_gpu_and_stamps(sysfs: Path) -> None:
    gpus = read_gpu_locations(sysfs, FakeNvml(["00000000:3D:00.0", "00000000:B2:00.0"]))
    assert [(g.index, g.location.address, g.numa_node) for g in gpus] == [
        (0, "0000:3d:00.0", 0), (1, "0000:b2:00.0", 1)]  # fmt: skip
    hw = decode_ts_info(struct.pack("=IIiI3II3I", 0x41, 0x45, 2, 0b11, 0, 0, 0, 0b11, 0, 0, 0))
    sw = decode_ts_info(struct.pack("=IIiI3II3I", 0x41, 0x1A, -1, 0, 0, 0, 0, 0, 0, 0, 0))
    nics = assemble(read_netdevs(sysfs), ADDRS, read_rdma_ports(sysfs),
                    {"ens1f0np0": hw, "ens2np0": sw}, gpus, NicFilter())  # fmt: skip
    by = {n.ifname: n for n in nics}
    a, b = by["ens1f0np0"], by["ens2np0"]
    assert (a.selected, a.rdma_device, a.gid_index, a.gpu, a.gpu_level) == (
        True,
        "mlx5_0",
        3,
        0,
        "PIX",
    )
    assert (a.timestamping, a.phc_index, a.pci, a.numa_node) == ("hardware", 2, "0000:3e:00.0", 0)
    assert (b.selected, b.rdma_device, b.gid_index, b.gpu, b.gpu_level) == (
        True,
        "mlx5_1",
        1,
        1,
        "PHB",
    )
    assert b.timestamping == "software"
    assert (by["veth0"].selected, by["veth0"].timestamping) == (False, "unknown")
    assert "no RDMA port" in by["veth0"].reason and by["lo"].reason == "loopback"
    # a filter picks the veth (UDP probes) and drops an RDMA NIC; never the loopback
    flt = NicFilter(include=("veth*", "ens*", "lo"), exclude=("ens2*",))
    picked = {
        n.ifname
        for n in assemble(read_netdevs(sysfs), ADDRS, read_rdma_ports(sysfs), {}, gpus, flt)
        if n.selected
    }
    assert picked == {"veth0", "ens1f0np0"}
    no_addr = assemble(read_netdevs(sysfs), {}, read_rdma_ports(sysfs), {}, (), NicFilter())
    assert {n.reason for n in no_addr if n.rdma_device} == {"no IPv4 address"}
    assert json.loads(json.dumps(a.to_json()))["addresses"] == ["10.0.0.1"]


def test_no_gpu_means_no_mapping(sysfs: Path) -> None:
    assert read_gpu_locations(sysfs, FakeNvml([])) == ()
    assert gpu_location(0, "0000:99:00.0", sysfs).location == PciLocation()


@pytest.mark.parametrize(
    ("a", "b", "numa", "level"),
    [
        (NIC0, GPU0, (0, 0), "PIX"),  # one PCIe switch
        ("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:08.0/0000:3e:00.0",
         "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0/0000:3d:00.0/0000:3f:00.0/0000:40:00.0",
         (0, 0), "PXB"),  # a second switch under the first
        (NIC1, GPU1, (1, 1), "PHB"),  # only the host bridge in common
        (NIC0, GPU1, (0, 0), "NODE"),  # other host bridge, same NUMA node
        (NIC0, GPU1, (0, 1), "SYS"),
        (NIC0, GPU1, (-1, -1), "SYS"),  # unknown nodes are not the same node
        ("devices/virtual/net/veth0", GPU0, (0, 0), "SYS"),
    ],
)  # fmt: skip
def test_topology_levels(a: str, b: str, numa: tuple[int, int], level: str) -> None:
    assert affinity(pci_location(a), numa[0], pci_location(b), numa[1]) == level


def test_nearest_gpu_prefers_the_closest_then_the_lowest_index() -> None:
    nic = pci_location(NIC0)
    far = GpuLocation(0, pci_location(GPU1), 1)
    near = GpuLocation(5, pci_location(GPU0), 0)
    twin = GpuLocation(7, pci_location(GPU0.replace("3d:00.0", "3d:00.1")), 0)
    got = nearest_gpu(nic, 0, [far, twin, near])
    assert got is not None and (got.index, got.level) == (5, "PIX")
    assert nearest_gpu(nic, 0, [far]) is None  # across sockets: serves no GPU
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_bus_id("GPU-1234")


def test_timestamping_capability_of_this_hosts_interfaces() -> None:
    """A real ``ETHTOOL_GET_TS_INFO``: the loopback stamps in software, no PHC."""
    lo = read_ts_info("lo")
    assert lo.software and not lo.hardware and lo.phc_index == -1 and lo.mode == "software"
    with pytest.raises(OSError):
        read_ts_info("nosuchdev0")
    rx_only = decode_ts_info(struct.pack("=IIiI3II3I", 0x41, 0x18, -1, 0, 0, 0, 0, 0, 0, 0, 0))
    assert rx_only.mode == "none"
    no_rx_all = decode_ts_info(
        struct.pack("=IIiI3II3I", 0x41, 0x45, 0, 0b11, 0, 0, 0, 0b1100, 0, 0, 0)
    )
    assert no_rx_all.mode == "none"  # hardware stamps, but not of every packet
    with pytest.raises(ValueError):
        decode_ts_info(b"\0" * 10)


IP_J = """[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"}]},
 {"ifindex":2,"ifname":"nic0","addr_info":[{"family":"inet","local":"10.0.0.1","prefixlen":32,"scope":"global"},
   {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"},
   {"family":"inet","local":"10.0.0.9","prefixlen":32,"scope":"global"}]},
 {"ifindex":3,"ifname":"mgmt","addr_info":[]}]"""  # fmt: skip


def test_ip_addr_parse_and_a_real_reading() -> None:
    assert parse_ip_addr(IP_J) == {"lo": (), "nic0": ("10.0.0.1", "10.0.0.9"), "mgmt": ()}
    for bad in ("{", '{"a": 1}', '[{"x": 1}]'):
        with pytest.raises(ValueError, match="ip -j addr"):
            parse_ip_addr(bad)
    here = read_ip_addr()
    assert here.get("lo") == ()  # 127.0.0.1 is host scope: never a probe address


def test_lldp_json0_parse() -> None:
    got = parse_lldp(LLDP_JSON0)
    assert got == {"va": (LldpNeighbor("leaf0", "fe:56:f5:7d:0e:9e", "fe:56:f5:7d:0e:9e", "vb",
                                       ("10.0.0.254", "fe80::fc56:f5ff:fe7d:e9e")),)}  # fmt: skip
    assert parse_lldp('{"lldp": [{}]}') == {}  # no neighbour at all (recorded)
    # two switches on one interface (a hub, or a NIC port in a breakout): two entries
    doc = json.loads(LLDP_JSON0)
    second = json.loads(json.dumps(doc["lldp"][0]["interface"][0]))
    second["chassis"][0]["name"] = [{"value": "leaf9"}]
    doc["lldp"][0]["interface"].append(second)
    assert [n.name for n in parse_lldp(json.dumps(doc))["va"]] == ["leaf0", "leaf9"]
    for bad in ("nope", "[]", '{"x": 1}'):
        with pytest.raises(ValueError, match="lldpcli"):
            parse_lldp(bad)
    assert lldpcli_argv("/run/x.sock") == [
        "lldpcli",
        "-u",
        "/run/x.sock",
        "-f",
        "json0",
        "show",
        "neighbors",
    ]


def test_nic_ids_and_filters() -> None:
    assert nic_id("{host}.{ifname}", "gpu17", "ens1f0np0") == "gpu17.ens1f0np0"
    assert nic_id("{ifname}", "host3", "nic3") == "nic3"
    for bad in ("{nope}", "{host} {ifname}", "{host}/{ifname}", ""):
        with pytest.raises(ValueError):
            nic_id(bad, "h", "i")
    with pytest.raises(ValueError, match="non-empty"):
        NicFilter(include=("",))
