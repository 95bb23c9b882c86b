"""The gloo shell of the recovery agent: a process group that can be abandoned and re-formed.

`RecoverableGloo` drives the pure `recovery.machine` with real events:

- every collective runs on a copy of the tensor with a short timeout (``collective_timeout_s``):
  pending gloo work cannot be cancelled, so a stuck one is abandoned (its late result lands in
  the copy, never in the caller's tensor) and the machine decides: wait for qpmesh's verdict,
  re-form at once, or fail;
- a re-form builds a new ``ProcessGroupGloo`` whose options carry a gloo device created for the
  chosen interface (``ProcessGroupGloo.create_device(interface=...)``: the same thing
  ``GLOO_SOCKET_IFNAME`` selects when a group is built), under a fresh prefix of the shared
  rendezvous store (``qpmesh/g<gen>/``), with every rank: the rank that starts a re-form
  announces the generation in the store (``qpmesh/gen``), the others see it at their next
  collective timeout or safe point and join;
- at a re-form the ranks agree on the step to resume from (the smallest step any rank is in:
  a rank whose last all-reduce completed while its peer's did not is one step ahead and
  rolls back its one-step undo copy): `Reformed` carries that step to the training loop.

Actions arrive on ``inbox`` (the MQTT follower puts `ActionDoc`s there); acks go to ``ack``.
Raises `RecoveryFailed` where the job would have failed without the agent.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from contract.remediation import AckDoc
from recovery.machine import (
    Ack,
    ActionReceived,
    AgentConfig,
    CollectiveTimedOut,
    Command,
    ControlChanged,
    Event,
    Fail,
    Log,
    PeerReform,
    Phase,
    Reform,
    ReformDone,
    ReformFailed,
    SafePoint,
    handle,
    initial,
)

log = logging.getLogger("qpmesh.recovery")
GEN_KEY = "qpmesh/gen"


class RecoveryFailed(RuntimeError):
    """The agent gave up (or was not allowed to act): the job fails as it would without it."""


class Reformed(Exception):
    """The group was re-formed; resume at step ``step`` (roll back if you are past it)."""

    def __init__(self, step: int, gen: int, nic: str) -> None:
        super().__init__(f"re-formed (generation {gen}) on {nic}: resume at step {step}")
        self.step, self.gen, self.nic = step, gen, nic


class RecoverableGloo:
    """A gloo process group for one rank that the agent can move to another interface.

    ``store``: a ``torch.distributed.Store`` every rank reaches (not over the data NICs);
    ``iface_of``: NIC id -> interface name; ``inbox``: `ActionDoc`s (and ``("control", bool)``
    tuples) from the follower; ``ack``: called with each `AckDoc`; ``now_ns``/``wall_ns``:
    clocks (monotonic for timeouts, wall for ack times).
    """

    def __init__(
        self,
        cfg: AgentConfig,
        store: Any,
        world: int,
        *,
        iface_of: Callable[[str], str] = lambda nic: nic,
        inbox: queue.Queue[Any] | None = None,
        ack: Callable[[AckDoc], None] = lambda _a: None,
        collective_timeout_s: float = 1.0,
        reform_timeout_s: float = 30.0,
        poll_s: float = 0.05,
        now_ns: Callable[[], int] = time.monotonic_ns,
        wall_ns: Callable[[], int] = time.time_ns,
        on_event: Callable[[str], None] = lambda _t: None,
    ) -> None:
        import torch.distributed as dist

        self._dist: Any = dist
        self.cfg, self.store, self.world = cfg, store, world
        self.iface_of, self.inbox, self.ack = iface_of, inbox or queue.Queue(), ack
        self.collective_timeout_s, self.reform_timeout_s, self.poll_s = (
            collective_timeout_s, reform_timeout_s, poll_s)  # fmt: skip
        self.now_ns, self.wall_ns, self.on_event = now_ns, wall_ns, on_event
        self.state = initial(cfg)
        self.step = 0
        self.reforms: list[dict[str, Any]] = []
        self.timeouts = 0  # collectives that outlived collective_timeout_s
        self.pg: Any = None
        self._stuck_at: float | None = None

    # ---- group building ------------------------------------------------------------------
    def _build(self, gen: int, nic: str) -> Any:
        gloo = self._dist.ProcessGroupGloo
        opts = gloo._Options()
        opts._devices = [gloo.create_device(interface=self.iface_of(nic))]
        opts._timeout = dt.timedelta(seconds=self.reform_timeout_s)
        pg = gloo(self._dist.PrefixStore(f"qpmesh/g{gen}/", self.store), self.cfg.rank,
                  self.world, opts)  # fmt: skip
        pg.set_timeout(dt.timedelta(seconds=self.collective_timeout_s))
        return pg

    def start(self) -> None:
        """Build generation 0 on the first NIC (every rank calls it)."""
        self.store.add(GEN_KEY, 0)
        self.pg = self._build(0, self.state.nic)
        self._emit(f"rank {self.cfg.rank} up on {self.state.nic}")

    def _emit(self, text: str) -> None:
        log.info("%s: %s", self.cfg.receiver, text)
        self.on_event(text)

    # ---- the machine ---------------------------------------------------------------------
    def _feed(self, ev: Event) -> Reformed | None:
        self.state, cmds = handle(self.cfg, self.state, ev, self.now_ns())
        return self._run(cmds)

    def _run(self, cmds: list[Command]) -> Reformed | None:
        out: Reformed | None = None
        for c in cmds:
            match c:
                case Log(text=t):
                    self._emit(t)
                case Ack(action=aid, outcome=o, detail=d):
                    self.ack(AckDoc(aid, self.cfg.receiver, o, self.wall_ns(), d))
                case Fail(reason=why):
                    raise RecoveryFailed(why)
                case Reform(gen=g, nic=nic):
                    out = self._reform(g, nic) or out
        return out

    def _drain(self) -> Reformed | None:
        out: Reformed | None = None
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            ev: Event = (
                ControlChanged(bool(item[1])) if isinstance(item, tuple) else ActionReceived(item)
            )
            out = self._feed(ev) or out
        gen = int(self.store.add(GEN_KEY, 0))
        if gen > self.state.gen and self.state.phase != Phase.REFORMING:
            out = self._feed(PeerReform(gen)) or out
        return out

    def _reform(self, gen: int, nic: str) -> Reformed | None:
        t0 = time.monotonic()
        cur = int(self.store.add(GEN_KEY, 0))
        if cur < gen:
            cur = int(self.store.compare_set(GEN_KEY, str(cur), str(gen)).decode())
        gen = max(gen, cur)
        old, self.pg = self.pg, None
        try:
            if old is not None:
                try:
                    old.abort()  # gloo: closes its pairs; pending work stays abandoned
                except Exception as exc:
                    log.debug("abort of the old group: %s", exc)
            log.info("%s: old group aborted after %.3f s", self.cfg.receiver, time.monotonic() - t0)
            self.store.set(f"qpmesh/g{gen}/step/{self.cfg.rank}", str(self.step))
            self.pg = self._build(gen, nic)
            log.info(
                "%s: group %d built after %.3f s", self.cfg.receiver, gen, time.monotonic() - t0
            )
            keys = [f"qpmesh/g{gen}/step/{r}" for r in range(self.world)]
            self.store.wait(keys, dt.timedelta(seconds=self.reform_timeout_s))
            resume = min(int(self.store.get(k).decode()) for k in keys)
        except Exception as exc:
            self.state, cmds = handle(
                self.cfg, self.state, ReformFailed(str(exc)[:200]), self.now_ns()
            )
            self._run(cmds)
            return None
        took = time.monotonic() - t0
        self.reforms.append({"gen": gen, "nic": nic, "step": resume, "seconds": took})
        self.state, cmds = handle(self.cfg, self.state, ReformDone(gen, nic), self.now_ns())
        self._run(cmds)
        return Reformed(resume, gen, nic)

    # ---- what the training loop calls ----------------------------------------------------
    def allreduce(self, tensor: Any) -> None:
        """Sum ``tensor`` over all ranks in place.

        Raises `Reformed` when the group was re-formed meanwhile (``tensor`` is unchanged then:
        redo the step `Reformed.step`), `RecoveryFailed` when the agent gives up.
        """
        work_t = tensor.clone()
        work = self.pg.allreduce([work_t])
        wait_s = self.collective_timeout_s
        stuck = False
        while True:
            try:
                work.wait(dt.timedelta(seconds=wait_s))
                tensor.copy_(work_t)
                return
            except RuntimeError as exc:
                if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                    log.info("%s: collective error: %s", self.cfg.receiver, exc)
                    work = _Dead()
            # stuck: let the machine decide; keep waiting on the real work (a short flap ends
            # with the collective completing late) in short polls while it waits for a verdict
            if not stuck:
                stuck = True
                self.timeouts += 1  # one per stuck collective (reported in PerfDoc)
            wait_s = min(self.poll_s, self.collective_timeout_s)
            r = self._drain() or self._feed(CollectiveTimedOut())
            if r is not None:
                self.step = r.step
                raise r

    def safe_point(self, step: int) -> None:
        """Call at each step boundary (``step`` steps done). Raises `Reformed` if re-formed."""
        self.step = step
        r = self._drain() or self._feed(SafePoint(step))
        if r is not None:
            self.step = r.step
            raise r


class _Dead:
    """Stands for failed work: waiting on it always times out (after a short poll)."""

    def wait(self, timeout: dt.timedelta) -> None:
        time.sleep(min(0.05, timeout.total_seconds()))
        raise RuntimeError("timed out (abandoned collective)")
