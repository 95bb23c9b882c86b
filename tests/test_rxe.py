"""Real RDMA: two probers exchange UD probes over Soft-RoCE (rxe) inside one VM boot.

The module boots one VM (`testbed.rxevm.vm.start_in_vm`, ~25 s to the shell under software
emulation, a few minutes in all on a busy machine; started at the session's start when the
session has this module, `tests.rxe_early`) and runs `testbed.rxevm.scenario` in it:
a real mosquitto, probers ``ha`` (NIC a0 on rxe0) and ``hb`` (NIC b0 on rxe1) started with
``qpmesh prober --transport rdma``, a subscriber decoding the published batches, a packet
sniffer on the wire, a netem fault on one source port, and a restart of ``hb``. Each test here
judges one part of that run's JSON. Skipped only when this machine cannot run the VM at all
(no qemu, no kernel image, no vng: ``make setup`` installs them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from contract.records import MISSING
from prober.rdma.flowlabel import rxe_sport_of_qpn
from testbed.rxevm.scenario import read_skew_s
from testbed.rxevm.vm import vm_unavailable
from tests.rxe_early import EARLY, VM_TIMEOUT_S, start_scenario

pytestmark = [pytest.mark.rxe, pytest.mark.slow, pytest.mark.timeout(1200)]

MARGIN_NS = 300_000_000

# row layout of result.json "rows"
ORIGIN, STAMP, SRC, DST, SPORT, SEQ, T1, T2, T3, T4, LOST, RX = range(12)


@pytest.fixture(scope="module")
def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The VM's scenario result (result.json; fails with log tails): the run the session
    started early (`tests.rxe_early`), or one started here.

    The run's folder (result.json, logs) stays in pytest's temp area (last 3 sessions kept).
    """
    reason = vm_unavailable()
    if reason is not None:
        pytest.skip(f"cannot run a VM here: {reason}")
    early = request.config.stash.get(EARLY, None)
    if early is None:
        out = tmp_path_factory.mktemp("rxe")
        vm = start_scenario(out)
    else:
        vm, out = early
    result = vm.wait(VM_TIMEOUT_S)
    path = out / "result.json"
    assert path.exists(), f"no result (vng exit {result.returncode}): {result.stderr[-2000:]}"
    res: dict[str, Any] = json.loads(path.read_text())
    res["vm_seconds"] = result.seconds
    if "error" in res:
        logs = "\n".join(f"== {k}\n{v[-1200:]}" for k, v in res["logs"].items())
        pytest.fail(f"scenario failed: {res['error']}\n{logs}")
    yield res


def rows(res: dict[str, Any], src: str, dst: str, lo: int = 0, hi: int = 2**63) -> list[Any]:
    """Return the records src -> dst whose t1 is in [lo, hi)."""
    return [r for r in res["rows"] if r[SRC] == src and r[DST] == dst and lo <= r[T1] < hi]


def few_lost(rs: list[Any]) -> bool:
    """Whether at most a tenth of the records ``rs`` are lost. With the guest starved by a
    busy host a short burst is lost on a path no fault touches (a fresh-clone make test,
    2026-11-27: 4 of 93 b0 -> a0 probes within 26 ms, on three source ports; not a timeout,
    which is 8 s here, so a drop somewhere in the starved guest's receive path; the cause is
    not pinned down); a fault or a wrong reply port loses every probe of what it hits, which
    this still tells apart."""
    return sum(1 for r in rs if r[LOST]) <= len(rs) // 10


def test_probes_cross_rxe_through_the_broker_with_four_host_stamps(run: dict[str, Any]) -> None:
    """Both directions answered; records carry all four stamps, flagged "sw", right NIC ids."""
    assert "rxe0" in run["rdma_link"] and "ACTIVE" in run["rdma_link"]
    for origin, src, dst in (("ha", "a0", "b0"), ("hb", "b0", "a0")):
        got = [r for r in rows(run, src, dst) if not r[LOST]]
        assert len(got) >= 20, (src, dst, len(got))
        assert all(r[ORIGIN] == origin for r in rows(run, src, dst))
        for r in got:
            assert MISSING not in (r[T1], r[T2], r[T3], r[T4])
            # both probers read the one guest clock: the four stamps are fully ordered
            assert r[T1] < r[T2] <= r[T3] < r[T4], r
    # rxe has no completion timestamps: every batch is flagged as host ("sw") stamps
    assert {r[STAMP] for r in run["rows"]} == {"sw"}
    # kept for a loss nobody planned: both devices' counters (rdma statistic) and link drops
    assert all(
        f"link {d}/1 sent_pkts" in run["counters"]["rdma_statistic"] for d in ("rxe0", "rxe1")
    )


def test_the_rdma_collector_sees_the_fault_in_rxe_counters(run: dict[str, Any]) -> None:
    """The prober's RDMA collector (`prober.telemetry.rdma`, catalogue names) reads rxe's own
    hw_counters: in the clean phase rxe1 receives what rxe0 sends (give or take what flows
    in the time between the two devices' reads: on a busy host they are ~0.1 s apart, and
    310 sent against 323 received was seen); while netem drops one of a0's source ports on
    the wire, rxe1 receives fewer than rxe0 sent."""
    sig, reads = run["signals"], run.get("signal_reads", {})

    def delta(phase: str, dev: str, name: str) -> float:
        return float(sig[f"{phase}_end"][dev][name] - sig[f"{phase}_start"][dev][name])

    sent, rcvd = (
        delta("clean", "rxe0", "rdma_tx_packets"),
        delta("clean", "rxe1", "rdma_rx_packets"),
    )
    clean_s = (run["phases"]["clean"][1] - run["phases"]["clean"][0]) / 1e9
    skew_s = read_skew_s(reads.get("clean_start", {}), reads.get("clean_end", {}), "rxe0", "rxe1")
    slack = sent / clean_s * skew_s  # packets sent while the two reads were apart
    assert sent >= 20 and abs(rcvd - sent) <= 0.02 * sent + 2 + slack, (sent, rcvd, skew_s)
    sent, rcvd = (
        delta("fault", "rxe0", "rdma_tx_packets"),
        delta("fault", "rxe1", "rdma_rx_packets"),
    )
    assert sent >= 20 and sent - rcvd >= 2, (sent, rcvd)  # the dropped source port's packets
    assert "packet_seq_err" in sig["fault_end"]["rxe0"]  # rxe's names map to the catalogue's


def test_records_carry_the_source_ports_seen_on_the_wire(run: dict[str, Any]) -> None:
    """a0 sweeps several QPs; each record's sport is a port its probes really left from."""
    wire_a = {int(p) for p in run["wire"]["10.9.0.1"]}
    wire_b = {int(p) for p in run["wire"]["10.9.0.2"]}
    sports_a = {r[SPORT] for r in rows(run, "a0", "b0")}
    sports_b = {r[SPORT] for r in rows(run, "b0", "a0")}
    assert len(sports_a) >= 2, sports_a  # the sweep: one UD QP per source port on rxe
    assert sports_a <= wire_a, (sports_a, wire_a)
    assert sports_b <= wire_b, (sports_b, wire_b)
    assert rxe_sport_of_qpn(run["qpn_a"]) == run["home_sport_a0"] in wire_a


def test_netem_loss_on_one_source_port_hits_exactly_those_probes(run: dict[str, Any]) -> None:
    """Dropping a0's packets from one port loses exactly a0 -> b0 probes on that port."""
    add0, f0, f1, del1 = run["phases"]["fault"]  # surely faulty in [f0, f1]
    bad = run["fault_sport"]
    inside = rows(run, "a0", "b0", f0, f1 - MARGIN_NS)  # a probe needs a moment to leave
    hit = [r for r in inside if r[SPORT] == bad]
    spared = [r for r in inside if r[SPORT] != bad]
    assert len(hit) >= 3 and all(r[LOST] for r in hit), [(r[SPORT], r[LOST]) for r in hit]
    assert spared and few_lost(spared), [(r[SPORT], r[T1] - f0) for r in spared if r[LOST]]
    back = rows(run, "b0", "a0", f0, f1)
    assert back and few_lost(back)  # a0's replies leave from its home QP (else all are lost)
    c0, c1 = run["phases"]["clean"]
    clean = rows(run, "a0", "b0", c0, add0) + rows(run, "b0", "a0", c0, c1)
    assert clean and few_lost(clean)
    after = rows(run, "a0", "b0", del1, run["phases"]["restart"][0] - 2 * MARGIN_NS)
    after_bad = [r for r in after if r[SPORT] == bad]  # the fault is gone: they complete
    assert after_bad and few_lost(after_bad) and few_lost(after)


def test_restart_keeps_discovery_working(run: dict[str, Any]) -> None:
    """hb restarts with a new QP; ha re-learns it from presence and probes it again."""
    stop, gone, start, back, end = run["phases"]["restart"]
    assert run["qpn_b_before"] and run["qpn_b_after"]
    assert [r for r in rows(run, "a0", "b0", back, end) if not r[LOST]]
    assert [r for r in rows(run, "b0", "a0", start, end) if not r[LOST]]
    # once ha saw hb leave, its probes to b0 are skipped (peer unknown), not lost
    assert few_lost(rows(run, "a0", "b0", gone + MARGIN_NS, end))

    def skipped(lo: int, hi: int) -> list[int]:
        return [h["doc"]["counters"]["sessions"]["a0"].get("peer_unknown", 0)
                for h in run["health"] if h["host"] == "ha" and lo <= h["rx_ns"] < hi]  # fmt: skip

    before, away = skipped(0, stop), skipped(gone, back)
    assert before and away and max(away) > max(before)  # skipped and counted while hb was away
    codes = run["exit_codes"]
    assert all(c == 0 for c in codes.values()), codes
