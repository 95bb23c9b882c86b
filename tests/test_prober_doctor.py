"""``qpmesh doctor``: the pure checks on hand-made facts, and the command on this host (no RDMA,
no GPU) against a real mosquitto that wants a password. The namespace run is in
tests/test_testbed_lldp.py (it shares that testbed)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.neighbors import LldpNeighbor
from prober.discover.ipaddr import read_ip_addr
from prober.discover.nics import DiscoveredNic
from prober.doctor import (
    CAP_IPC_LOCK,
    CAP_NET_ADMIN,
    CAP_NET_RAW,
    BrokerResult,
    HostFacts,
    Status,
    blocking,
    chrony_steps,
    run_checks,
)
from prober.doctor_cli import port_error
from qpmesh.cli import main
from tests.conftest import _wait_listening
from tests.servers import free_port

ALL_CAPS = (1 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW) | (1 << CAP_IPC_LOCK)
RDMA_NIC = DiscoveredNic("ens1", True, "has an RDMA port", address="10.0.0.1", mtu=4200, up=True,
                         rdma_device="mlx5_0", rdma_port=1, rdma_state="ACTIVE",
                         link_layer="Ethernet", gid_index=3, timestamping="hardware", phc_index=2)  # fmt: skip
LEAF = {"ens1": (LldpNeighbor("leaf0", "aa", "Ethernet8", "Ethernet8"),)}


def _status(checks: tuple[object, ...], name: str) -> Status:
    return next(c.status for c in checks if c.name == name)  # type: ignore[attr-defined]


def test_a_healthy_rdma_host_passes() -> None:
    f = HostFacts((RDMA_NIC,), transport="rdma", port=4791, cap_eff=ALL_CAPS,
                  broker=BrokerResult(True, "connected"), lldp=LEAF)  # fmt: skip
    checks = run_checks(f)
    assert not blocking(checks)
    assert {c.status for c in checks} == {Status.OK}, [c.line() for c in checks]
    assert [c.name for c in checks] == ["nics", "link ens1", "timestamping ens1", "rdma ens1",
                                        "mtu ens1", "lldp ens1", "port ens1", "clock", "broker",
                                        "capabilities"]  # fmt: skip
    assert (
        checks[3].line() == "ok    rdma ens1: mlx5_0 port 1 (ACTIVE, Ethernet), RoCEv2 GID index 3"
    )


@pytest.mark.parametrize(
    ("change", "name", "status"),
    [
        ({"nics": ()}, "nics", Status.FAIL),
        ({"nics": (RDMA_NIC.__class__(**{**RDMA_NIC.to_json(), "addresses": (), "up": False}),)},
         "link ens1", Status.FAIL),
        ({"nics": (RDMA_NIC.__class__(**{**RDMA_NIC.to_json(), "addresses": (), "gid_index": None}),)},
         "rdma ens1", Status.FAIL),
        ({"transport": "udp"}, "port ens1", Status.WARN),  # UDP 4791 on a RoCE NIC
        ({"port_errors": {"10.0.0.1": "in use"}}, "port ens1", Status.FAIL),
        ({"broker": BrokerResult(False, "refused")}, "broker", Status.FAIL),
        ({"broker": None}, "broker", Status.SKIP),
        ({"cap_eff": 1 << CAP_NET_RAW, "memlock_bytes": 8 << 20}, "capabilities", Status.FAIL),
        ({"cap_eff": 1 << CAP_NET_RAW, "memlock_bytes": -1}, "capabilities", Status.WARN),
        ({"cap_eff": None}, "capabilities", Status.WARN),
        ({"lldp": {}}, "lldp ens1", Status.WARN),
        ({"lldp": None, "lldp_error": "lldpcli: no socket"}, "lldp", Status.WARN),
        ({"processes": ("bash", "ptp4l")}, "clock", Status.WARN),
        ({"processes": ("chronyd",), "chrony_conf": "makestep 1 3\n"}, "clock", Status.OK),
        ({"processes": ("chronyd",), "chrony_conf": "makestep 0.1 -1 # always\n"}, "clock", Status.WARN),
    ],
)  # fmt: skip
def test_each_problem_has_its_status(change: dict[str, object], name: str, status: Status) -> None:
    base = {"nics": (RDMA_NIC,), "transport": "rdma", "port": 4791, "cap_eff": ALL_CAPS,
            "broker": BrokerResult(True, "connected"), "lldp": LEAF}  # fmt: skip
    checks = run_checks(HostFacts(**{**base, **change}))  # type: ignore[arg-type]
    assert _status(checks, name) == status
    assert blocking(checks) == (status == Status.FAIL)


def test_chrony_makestep() -> None:
    assert chrony_steps("pool x iburst\nmakestep 1 3\n") is None  # only in its first 3 updates
    assert chrony_steps("") is None  # no makestep: chronyd only slews
    assert "makestep 1.0 -1" in (chrony_steps("makestep 1.0 -1") or "")


def test_port_error_names_a_taken_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert "in use" in port_error("127.0.0.1", port)
    assert port_error("127.0.0.1", port) == ""
    assert port_error("192.0.2.254", port) != ""  # not an address of this host


def _probe_ifname() -> str:
    """An interface of this host with a global IPv4 address (eth0 here)."""
    for name, addrs in sorted(read_ip_addr().items()):
        if addrs:
            return name
    pytest.skip("this host has no interface with a global IPv4 address")


def test_doctor_on_this_host_without_rdma(capsys: pytest.CaptureFixture[str]) -> None:
    """No RDMA device: nothing is selected by default (exit 1); named interfaces are checked."""
    assert main(["doctor", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["checks"][0]["name"] == "nics"
    assert doc["checks"][0]["status"] == "fail" and "no RDMA port" in doc["checks"][0]["detail"]
    name = _probe_ifname()
    assert main(["doctor", "--nics", name, "--port", str(free_port())]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"ok    nics: {name} (")
    assert any(line.startswith(f"skip  rdma {name}: no RDMA device") for line in lines)
    assert any(line.startswith(f"ok    mtu {name}:") for line in lines)
    assert main(["doctor", "--port", "0"]) == 2  # bad input: one line, exit 2
    assert "--port 0" in capsys.readouterr().err


@pytest.fixture
def password_broker(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A mosquitto on 127.0.0.1 that admits user ``probe`` with the password in the file."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    passwd = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not (os.path.exists(binary) and os.path.exists(passwd)):
        pytest.skip("mosquitto and mosquitto_passwd are not installed")
    subprocess.run([passwd, "-b", "-c", str(tmp_path / "passwd"), "probe", "s3cret"], check=True)
    os.chmod(tmp_path / "passwd", 0o600)
    port = free_port()
    user = "user root\n" if os.geteuid() == 0 else ""  # keep reading the 0600 file as root
    (tmp_path / "m.conf").write_text(
        f"{user}listener {port} 127.0.0.1\nallow_anonymous false\n"
        f"password_file {tmp_path / 'passwd'}\n"
    )
    proc = subprocess.Popen([binary, "-c", str(tmp_path / "m.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_listening(port, proc, 10.0)
        yield port, tmp_path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _config(tmp: Path, port: int, secret: str) -> Path:
    pw = tmp / f"pw-{secret}"
    pw.write_text(secret + "\n")
    os.chmod(pw, 0o600)
    cfg = tmp / f"prober-{secret}.toml"
    cfg.write_text(f'[prober]\nhost = "h0"\nport = {free_port()}\n\n'
                   f'[mqtt]\nhost = "127.0.0.1"\nport = {port}\ntimeout_s = 5.0\n'
                   f'username = "probe"\npassword_file = "{pw}"\n\n'
                   '[[nics]]\nid = "n0"\naddress = "127.0.0.1"\n')  # fmt: skip
    return cfg


@pytest.mark.broker
def test_doctor_checks_the_broker_with_the_configured_credentials(
    password_broker: tuple[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    port, tmp = password_broker
    name = _probe_ifname()
    assert (
        main(["doctor", "--json", "--nics", name, "--config", str(_config(tmp, port, "s3cret"))])
        == 0
    )
    broker = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "broker")
    assert (
        broker["status"] == "ok"
        and broker["detail"] == f"connected to 127.0.0.1:{port} (plain, user probe)"
    )
    assert (
        main(["doctor", "--json", "--nics", name, "--config", str(_config(tmp, port, "wrong"))])
        == 1
    )
    broker = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "broker")
    assert broker["status"] == "fail" and "user probe" in broker["detail"]
    assert "wrong" not in broker["detail"]  # the password is never printed
