"""Fault injection on a running namespace testbed: pure plans, thin shell adapters.

Each fault is first a plan (data: which namespace runs which command), then applied by
`run_plan`. Semantics:

- **loss** on a link: in both end namespaces an nftables table ``qpml_<ifname>`` drops
  ``numgen random mod 100 < P`` of the packets leaving by the link's interface (forwarded and
  locally sent), i.e. both directions;
- **link down / flap**: the same with P = 100 (the link black-holes everything, routing
  unchanged: the window before a real fabric's routing converges); a flap toggles it on a
  schedule (`flap_schedule`);
- **congest**: a UDP generator (`testbed.netns.blast`) in an end namespace sends to the other
  end's address at a rate above the shaping rate, so it queues in the same tbf as the probes
  (``up``: lower -> upper end, ``down``: upper -> lower);
- **nic-down**: the NIC's interface in the host namespace goes admin down (its routes are
  re-added when it comes back up);
- **stop-prober**: the recorded prober process of the host is signalled (by pid).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.netns.apply import TestbedEnvError, run
from testbed.netns.plan import End, Plan, PlanError
from testbed.netns.state import alive, load_state, record_process
from testbed.netns.teardown import namespace_pids

DIRECTIONS = ("up", "down", "both")


@dataclass(frozen=True, slots=True)
class Step:
    """One command of a fault plan: argv, and stdin text (or None)."""

    argv: tuple[str, ...]
    stdin: str | None = None


def _nft_table(ifname: str) -> str:
    return f"qpml_{ifname}"


def _loss_script(end: End, percent: float) -> str:
    pct = round(percent)
    rule = f'oifname "{end.ifname}" numgen random mod 100 < {pct} counter drop'
    if pct >= 100:
        rule = f'oifname "{end.ifname}" counter drop'
    table = _nft_table(end.ifname)
    return (
        f"table inet {table} {{}}\ndelete table inet {table}\n"
        f"table inet {table} {{\n"
        f"  chain qfwd {{ type filter hook forward priority 0; policy accept; {rule}; }}\n"
        f"  chain qout {{ type filter hook output priority 0; policy accept; {rule}; }}\n"
        "}\n"
    )


def loss_plan(plan: Plan, link_id: str, percent: float) -> list[Step]:
    """Return the steps setting ``percent`` loss (0 clears, 100 = down) on both ends of a link.

    Raises `PlanError` for an unknown link or a percent outside [0, 100].
    """
    if not 0 <= percent <= 100:
        raise PlanError(f"loss percent must be in [0, 100], got {percent:g}")
    lp = plan.link(link_id)
    steps = []
    for end in (lp.lower, lp.upper):
        table = _nft_table(end.ifname)
        script = f"table inet {table} {{}}\ndelete table inet {table}\n"
        if percent > 0:
            script = _loss_script(end, percent)
        steps.append(Step(("ip", "netns", "exec", end.ns, "nft", "-f", "-"), script))
    return steps


def flap_schedule(down_s: float, up_s: float, times: int) -> list[tuple[float, bool]]:
    """Return (time offset s, link up?) transitions of ``times`` down/up cycles from t = 0.

    Raises `PlanError` if a period is not > 0 or ``times`` < 1.
    """
    if down_s <= 0 or up_s <= 0 or times < 1:
        raise PlanError("flap needs --down > 0, --up > 0 and --times >= 1")
    out: list[tuple[float, bool]] = []
    for k in range(times):
        t = k * (down_s + up_s)
        out += [(t, False), (t + down_s, True)]
    return out


def nic_plan(plan: Plan, nic: str, up: bool) -> list[Step]:
    """Return the steps taking NIC ``nic`` down, or up again with its routes restored."""
    end = plan.nic_end(nic)
    steps = [Step(("ip", "-n", end.ns, "link", "set", end.ifname, "up" if up else "down"))]
    if up:
        lines = [
            ln.replace("route add", "route replace")
            for ln in plan.ns_ip[end.ns]
            if ln.startswith("route add") and f" dev {nic} " in f"{ln} "
        ]
        steps.append(Step(("ip", "-n", end.ns, "-force", "-batch", "-"), "\n".join(lines) + "\n"))
    return steps


def congest_targets(plan: Plan, link_id: str, direction: str) -> list[tuple[End, End]]:
    """Return (sender end, receiver end) of the generator(s) congesting ``link_id``.

    Raises `PlanError` for an unknown link or direction.
    """
    if direction not in DIRECTIONS:
        raise PlanError(f"direction must be one of {DIRECTIONS}")
    lp = plan.link(link_id)
    out = []
    if direction in ("up", "both"):
        out.append((lp.lower, lp.upper))
    if direction in ("down", "both"):
        out.append((lp.upper, lp.lower))
    return out


def blast_argv(sender: End, receiver: End, rate_mbit: float, seconds: float) -> list[str]:
    """Return the command running the UDP generator from ``sender`` to ``receiver``."""
    return [
        "ip", "netns", "exec", sender.ns, sys.executable, "-m", "testbed.netns.blast",
        "--src", sender.addr.split("/")[0], "--dst", receiver.addr.split("/")[0],
        "--rate-mbit", f"{rate_mbit:g}", "--seconds", f"{seconds:g}",
    ]  # fmt: skip


# ---- shell adapters ----------------------------------------------------------------------


def run_steps(steps: Sequence[Step]) -> None:
    """Run the steps in order; raise `TestbedEnvError` on the first failure."""
    for st in steps:
        run(st.argv, stdin=st.stdin)


def set_loss(plan: Plan, link_id: str, percent: float) -> None:
    """Apply ``percent`` loss on ``link_id`` (0 clears it)."""
    run_steps(loss_plan(plan, link_id, percent))


def set_link(plan: Plan, link_id: str, up: bool) -> None:
    """Take ``link_id`` down (black-hole both ways) or bring it back up."""
    set_loss(plan, link_id, 0 if up else 100)


def set_nic(plan: Plan, nic: str, up: bool) -> None:
    """Take NIC ``nic`` down or bring it back up (routes restored)."""
    run_steps(nic_plan(plan, nic, up))


def start_congestion(
    plan: Plan, link_id: str, rate_mbit: float, seconds: float, direction: str = "both"
) -> list[subprocess.Popen[bytes]]:
    """Start generator process(es) congesting ``link_id``; they are recorded in the state file.

    Returns the processes (they stop by themselves after ``seconds``).
    """
    if rate_mbit <= 0 or seconds <= 0:
        raise PlanError("congest needs --rate > 0 and a duration > 0")
    procs = []
    env = {**os.environ, "PYTHONPATH": _repo_root()}
    for sender, receiver in congest_targets(plan, link_id, direction):
        argv = blast_argv(sender, receiver, rate_mbit, seconds)
        p = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip
        record_process(plan.prefix, f"congest:{link_id}", p.pid)
        procs.append(p)
    return procs


def stop_prober(plan: Plan, host: str, sig: int = signal.SIGKILL) -> list[int]:
    """Signal the prober(s) of ``host``: recorded ones first, else any process in its namespace
    whose command line names the prober. Returns the pids signalled; raises `TestbedEnvError`
    if none runs."""
    ns = plan.host_ns(host)
    state = load_state(plan.prefix) or {}
    pids = [
        int(p["pid"])
        for p in state.get("processes", [])
        if p.get("role") == f"prober:{host}" and alive(p)
    ]
    if not pids:
        for pid in namespace_pids(ns):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"prober" in cmd:
                pids.append(pid)
    if not pids:
        raise TestbedEnvError(f"no prober runs on {host}")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
