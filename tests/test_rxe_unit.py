"""The pure parts of the Soft-RoCE support: rxe source ports, the QP sweep, the guest setup."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prober.events import ProbeLost, ProbeResult
from prober.rdma.flowlabel import rxe_sport_of_qpn
from prober.rdma.transport import full_gid, rewrite_sports, sweep_assignment
from testbed.rxevm.guest import RxePair, setup_script
from testbed.rxevm.scenario import read_skew_s
from testbed.rxevm.vm import find_kernel, vng_command


def test_rxe_sport_matches_ports_seen_on_the_wire() -> None:
    # captured on qpvb in a kernel 6.1 guest: UD QPs 17..20 of rxe0, any flow label
    assert [rxe_sport_of_qpn(q) for q in (17, 18, 19, 20)] == [57236, 63494, 53368, 59626]
    assert all(0xC000 <= rxe_sport_of_qpn(q) <= 0xFFFF for q in range(0, 5000, 7))
    with pytest.raises(ValueError):
        rxe_sport_of_qpn(1 << 24)


def test_sweep_assignment_round_robin_and_replies_on_qp0() -> None:
    assert sweep_assignment((50000, 50001, 50002), 2) == {0: 0, 50000: 0, 50001: 1, 50002: 0}
    assert sweep_assignment((), 1) == {0: 0}
    with pytest.raises(ValueError):
        sweep_assignment((1,), 0)


def test_rewrite_sports_replaces_only_mapped_results_and_losses() -> None:
    r = ProbeResult(1, "a0", "b0", 50000, -1, 0, 1, 2, 3, 4)
    lost = ProbeLost(2, "a0", "b0", 50001, -1, 0, 5, 5)
    other = ProbeResult(3, "a0", "b0", 50002, -1, 0, 1, 2, 3, 4)
    out = rewrite_sports([r, lost, other], {50000: 57236, 50001: 63494})
    assert [e.sport for e in out] == [57236, 63494, 50002]
    assert out[0].t4 == 4 and out[1].seq == 2 and out[2] is other


def test_full_gid_forms_pyverbs_parses() -> None:
    assert full_gid("10.9.0.2") == "0000:0000:0000:0000:0000:ffff:0a09:0002"
    assert full_gid("::ffff:a09:2") == "0000:0000:0000:0000:0000:ffff:0a09:0002"
    with pytest.raises(ValueError):
        full_gid("not-a-gid")


def test_setup_script_forces_traffic_onto_the_wire() -> None:
    text = setup_script(RxePair())
    assert text.startswith("set -e\nmodprobe rdma_rxe\n")
    assert "ip rule add pref 10 to 10.9.0.2 iif lo lookup 100" in text
    assert "ip route add 10.9.0.2 dev qpva src 10.9.0.1 table 100" in text
    assert text.index("ip rule add pref 100 lookup local") < text.index("ip rule del pref 0")
    assert "rdma link add rxe1 type rxe netdev qpvb" in text
    assert "ip neigh replace 10.9.0.2 dev qpva lladdr $(cat /sys/class/net/qpvb/address)" in text
    with pytest.raises(ValueError):
        RxePair(veth_a="bad name!")
    with pytest.raises(ValueError):
        RxePair(addr_b="10.9.0.1")


def test_vng_command_and_kernel_lookup(tmp_path: Path) -> None:
    cmd = vng_command(Path("/boot/vmlinuz-x"), "true", tmp_path)
    assert cmd[:4] == ["vng", "--run", "/boot/vmlinuz-x", "--disable-kvm"]
    assert cmd[cmd.index("--rwdir") + 1] == str(tmp_path) and cmd[-2:] == ["--exec", "true"]
    assert find_kernel(tmp_path) is None
    (tmp_path / "vmlinuz-0.0-none").write_bytes(b"")
    assert find_kernel(tmp_path) is None  # no /lib/modules/0.0-none


class _FakeCtx:
    def __init__(self, khz: int) -> None:
        self.khz = khz

    def query_device_ex(self) -> object:
        return type("A", (), {"hca_core_clock": self.khz, "completion_timestamp_mask": 0xFFFF})()

    def query_rt_values_ex(self) -> tuple[int, int]:
        return (0, 1234)


@pytest.mark.parametrize(
    ("khz", "cqex_errno", "want"),
    [(0, None, "sw"), (1_000_000, 95, "sw"), (1_000_000, None, "hw")],
)
def test_stamp_source_falls_back_to_host_clock_without_completion_timestamps(
    monkeypatch: pytest.MonkeyPatch, khz: int, cqex_errno: int | None, want: str
) -> None:
    """No NIC clock (rxe: hca_core_clock 0, or CQEX EOPNOTSUPP) -> plain CQs, "sw" stamps."""
    cq_mod = pytest.importorskip("pyverbs.cq", reason="pyverbs not installed (make setup)")
    from pyverbs.pyverbs_error import PyverbsRDMAError

    from prober.config import NicConfig
    from prober.rdma.transport import RdmaEndpoint
    from prober.session import ProbeSession

    made: list[str] = []

    def cqex(_ctx: object, _attr: object) -> str:
        if cqex_errno is not None:
            raise PyverbsRDMAError("Failed to create extended CQ", cqex_errno)
        made.append("cqex")
        return "cqex"

    def cq(_ctx: object, _n: int) -> str:
        made.append("cq")
        return "cq"

    monkeypatch.setattr(cq_mod, "CQEX", cqex)
    monkeypatch.setattr(cq_mod, "CqInitAttrEx", lambda **kw: kw)
    monkeypatch.setattr(cq_mod, "CQ", cq)
    e = pytest.importorskip("pyverbs.enums")
    ep = RdmaEndpoint(ProbeSession("a0"), NicConfig("a0", "10.9.0.1", rdma_device="rxe0"))
    ep._make_cqs(_FakeCtx(khz), e, 8, 8)
    assert ep.stamp_source == want
    assert made == (["cqex", "cqex"] if want == "hw" else ["cq", "cq"])
    assert (ep.clock is None) == (want == "sw")
    if want == "sw":
        assert abs(ep.now_ns() - time.time_ns()) < 60_000_000_000


def test_a_started_vm_run_is_waited_for_or_killed_by_its_process_group(tmp_path: Path) -> None:
    """`VmRun` on a stand-in for vng (a shell whose child sleeps): `wait` past its timeout
    kills the whole group and raises; `kill` of a finished run is harmless."""
    import subprocess

    from testbed.rxevm.vm import VmError, VmRun

    def start(script: str) -> VmRun:
        proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        return VmRun(proc, time.monotonic())

    pid_file = tmp_path / "child.pid"
    slow = start(f"sleep 60 & echo $! > {pid_file}.new; mv {pid_file}.new {pid_file}; wait")
    deadline = time.monotonic() + 30.0
    while not pid_file.exists() and time.monotonic() < deadline:  # a busy host starts late
        time.sleep(0.05)
    with pytest.raises(VmError, match="did not finish"):
        slow.wait(0.5)
    child = int(pid_file.read_text())

    def alive(pid: int) -> bool:  # a killed orphan may stay a zombie until init reaps it
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10.0
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)  # the group, the sleeping child included, was killed
    done = start("echo hello")
    res = done.wait(30.0)
    assert (res.returncode, res.stdout) == (0, "hello\n") and res.seconds >= 0.0
    done.kill()


def test_read_skew_spans_both_devices_reads_at_each_end() -> None:
    ms = 1_000_000
    start = {"rxe0": [0, 40 * ms], "rxe1": [40 * ms, 90 * ms]}  # read one after the other
    end = {"rxe0": [1000 * ms, 1010 * ms], "rxe1": [1010 * ms, 1030 * ms]}
    assert read_skew_s(start, end, "rxe0", "rxe1") == pytest.approx(0.12)
    assert read_skew_s({}, {}, "rxe0", "rxe1") == 0.0  # a result from before the reads were timed
