"""The gloo shell with the process group and store faked at their boundary (no sockets)."""

from __future__ import annotations

import datetime as dt
import queue
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from contract.remediation import AckDoc, ActionDoc  # noqa: E402
from recovery.gloo import GEN_KEY, RecoverableGloo, RecoveryFailed, Reformed  # noqa: E402
from recovery.machine import SEC, AgentConfig  # noqa: E402


class FakeStore:
    """The calls RecoverableGloo makes on a torch Store, on a dict."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    def add(self, key: str, n: int) -> int:
        v = int(self.kv.get(key, b"0")) + n
        self.kv[key] = str(v).encode()
        return v

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        cur = self.kv.get(key, b"")
        if cur.decode() == expected:
            self.kv[key] = desired.encode()
        return self.kv[key]

    def set(self, key: str, value: str) -> None:
        self.kv[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.kv[key]

    def wait(self, keys: list[str], timeout: dt.timedelta) -> None:
        missing = [k for k in keys if k not in self.kv]
        if missing:
            raise RuntimeError(f"wait timeout, keys: {missing}")


class Work:
    def __init__(self, tensor: Any, stuck: bool) -> None:
        self.tensor, self.stuck = tensor, stuck

    def wait(self, timeout: dt.timedelta) -> None:
        if self.stuck:
            raise RuntimeError("Operation timed out!")
        self.tensor.mul_(2)  # "sum over two equal ranks"


class FakePg:
    def __init__(self, nic: str, stuck: bool) -> None:
        self.nic, self.stuck, self.aborted = nic, stuck, False

    def allreduce(self, ts: list[Any]) -> Work:
        return Work(ts[0], self.stuck)

    def abort(self) -> None:
        self.aborted = True


class Shell(RecoverableGloo):
    """RecoverableGloo whose groups are fakes: NICs in ``dead`` never finish a collective."""

    dead: set[str]

    def _build(self, gen: int, nic: str) -> Any:
        self.built.append((gen, nic))
        return FakePg(nic, nic in self.dead)


def make(
    dead: set[str], peer_step: int | None = None
) -> tuple[Shell, FakeStore, list[AckDoc], list[int]]:
    store = FakeStore()
    if peer_step is not None:  # the other rank writes its step when it joins a generation
        store.kv["qpmesh/g1/step/0"] = str(peer_step).encode()
    clock = [0]
    acks: list[AckDoc] = []
    cfg = AgentConfig("job", 1, ("nic2", "nic3"), verdict_wait_ns=5 * SEC)

    def now() -> int:  # every look at the clock is 1 s later
        clock[0] += SEC
        return clock[0]

    sh = Shell(cfg, store, 2, inbox=queue.Queue(), ack=acks.append, collective_timeout_s=0.01,
               poll_s=0.0, now_ns=now, wall_ns=lambda: 7)  # fmt: skip
    sh.dead, sh.built = dead, []  # type: ignore[attr-defined]
    sh.start()
    return sh, store, acks, clock


def move(nic: str) -> ActionDoc:
    return ActionDoc(
        "move_off_nic-1", "move_off_nic", "down", "f", 0, 100 * SEC, nic=nic, job="job"
    )


def test_healthy_allreduce_sums_in_place() -> None:
    sh, *_ = make(set())
    t = torch.ones(3)
    sh.allreduce(t)
    assert t.tolist() == [2, 2, 2]


def test_stuck_collective_and_a_verdict_reform_on_the_other_nic_and_resume_at_the_agreed_step() -> (
    None
):
    sh, store, acks, _ = make({"nic2"}, peer_step=4)
    sh.step = 5
    sh.inbox.put(move("nic2"))
    t = torch.ones(3)
    with pytest.raises(Reformed) as r:
        sh.allreduce(t)
    assert (r.value.step, r.value.gen, r.value.nic) == (4, 1, "nic3")  # the peer was at step 4
    assert t.tolist() == [1, 1, 1]  # the abandoned collective never touches the caller's tensor
    assert sh.built == [(0, "nic2"), (1, "nic3")] and store.kv[GEN_KEY] == b"1"  # type: ignore[attr-defined]
    assert [(a.action, a.outcome) for a in acks] == [("move_off_nic-1", "done")]
    sh.allreduce(t)
    assert t.tolist() == [2, 2, 2]


def test_move_at_a_safe_point_when_healthy() -> None:
    sh, *_ = make(set(), peer_step=3)
    sh.inbox.put(move("nic2"))
    with pytest.raises(Reformed) as r:
        sh.safe_point(3)
    assert r.value.nic == "nic3" and r.value.step == 3


def test_peer_generation_in_the_store_makes_this_rank_join() -> None:
    sh, store, _, _ = make(set(), peer_step=9)
    store.kv[GEN_KEY] = b"1"
    with pytest.raises(Reformed) as r:
        sh.safe_point(9)
    assert r.value.gen == 1 and r.value.nic == "nic2"  # no verdict on this rank's NIC: stays


def test_stuck_without_verdict_past_the_wait_reforms_in_place_then_gives_up() -> None:
    sh, store, _, _ = make({"nic2"})
    for g in (1, 2, 3):
        store.kv[f"qpmesh/g{g}/step/0"] = b"0"
    t = torch.ones(2)
    seen = []
    for _ in range(3):
        with pytest.raises(Reformed) as r:
            sh.allreduce(t)
        seen.append(r.value.nic)
    assert seen == ["nic2", "nic2", "nic2"]
    with pytest.raises(RecoveryFailed, match="after 3 re-forms"):
        sh.allreduce(t)
