"""``qpmesh testbed run SCENARIO``: fabric + broker + probers + controller + timed faults -> report.

Thin shell: the timeline is pure (`testbed.schedule`); this module starts processes (recorded
by pid in the testbed state), applies the actions on time and always cleans up (also on Ctrl-C
or SIGTERM). The report lists the applied faults, the controller's findings (its JSON-lines log)
and, when the controller logs clock estimates, the sync error against the virtual clocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from controller.fabric import Fabric
from testbed import faults
from testbed.netns.lifecycle import up
from testbed.netns.plan import Plan
from testbed.netns.state import record_process, state_dir
from testbed.netns.teardown import tear_down
from testbed.scenario import Scenario, random_faults
from testbed.schedule import Action, timeline
from testbed.vclock import assign_clocks, write_truth

MOSQUITTO = "/usr/sbin/mosquitto"


def prober_config(fabric: Fabric, plan: Plan, host: str, broker: tuple[str, int]) -> str:
    """Return the prober TOML for ``host``: its NICs, every other NIC as a peer, the broker."""
    lines = [
        "[prober]", f'host = "{host}"', 'transport = "udp"', "port = 4791", 'timestamps = "sw"',
        "", "[mqtt]", f'host = "{broker[0]}"', f"port = {broker[1]}", "",
    ]  # fmt: skip
    for n in fabric.nics:
        table = "nics" if n.host == host else "peers"
        extra = f'\ndevice = "{n.id}"' if table == "nics" else ""
        lines += [
            f"[[{table}]]",
            f'id = "{n.id}"',
            f'address = "{n.address}"',
            f'group = "{n.group}"' + extra,
            "",
        ]
    return "\n".join(lines)


def _has_command(name: str) -> bool:
    from controller.cli import build_parser

    sub = build_parser()._subparsers
    return bool(sub and any(name in getattr(a, "choices", {}) or {} for a in sub._group_actions))


def _spawn(
    argv: list[str], log: Path, prefix: str, role: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    fh = log.open("ab")
    p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    fh.close()
    record_process(prefix, role, p.pid)
    return p


def _wait_port(addr: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((addr, port), timeout=0.2):
            return True
        time.sleep(0.05)
    return False


def run_scenario(
    sc: Scenario,
    prefix: str,
    *,
    random_k: int = 0,
    seed: int | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Run ``sc`` on a fresh namespace testbed; return the JSON-ready report."""
    if random_k:
        sc = replace(
            sc,
            faults=random_faults(
                sc.fabric(), random_k, seed=seed or sc.seed, duration_s=sc.duration_s
            ),
        )
    missing: list[str] = []
    applied: list[dict[str, Any]] = []
    procs: list[subprocess.Popen[bytes]] = []
    congest: dict[str, list[subprocess.Popen[bytes]]] = {}
    fabric, plan = up(sc.shape, prefix, progress=progress)
    prev = signal.signal(signal.SIGTERM, _interrupt)
    d = state_dir(prefix)
    report: dict[str, Any] = {"scenario": sc.name, "prefix": prefix, "duration_s": sc.duration_s}
    try:
        clocks = assign_clocks([h.id for h in fabric.hosts], seed=sc.seed, t0_ns=time.time_ns())
        truth = write_truth(d / "clocks.json", clocks, {n.id: n.host for n in fabric.nics})
        report["truth_file"] = str(truth)
        broker = (plan.broker_addr, 1883)
        conf = d / "mosquitto.conf"
        conf.write_text(
            f"listener {broker[1]} {broker[0]}\nallow_anonymous true\npersistence false\n"
        )
        procs.append(_spawn([MOSQUITTO, "-c", str(conf)], d / "mosquitto.log", prefix, "mosquitto"))
        if not _wait_port(*broker, timeout_s=5):
            raise OSError(f"mosquitto did not listen on {broker[0]}:{broker[1]}")
        progress(f"broker on {broker[0]}:{broker[1]}")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        qp = [sys.executable, "-m", "controller.cli"]
        if _has_command("controller"):
            ctl_log = d / "controller.jsonl"
            procs.append(_spawn([*qp, "controller", "--broker", f"mqtt://{broker[0]}:{broker[1]}", "--log", str(ctl_log)],
                                d / "controller.out", prefix, "controller", env))  # fmt: skip
        else:
            missing.append("controller service (qpmesh controller) not registered")
        if _has_command("prober"):
            for h in fabric.hosts:
                cfg = d / f"prober-{h.id}.toml"
                cfg.write_text(prober_config(fabric, plan, h.id, broker))
                penv = {**env, "QPMESH_VCLOCK": json.dumps(asdict(clocks[h.id]))}
                argv = [
                    "ip",
                    "netns",
                    "exec",
                    plan.node_ns[h.id],
                    *qp,
                    "prober",
                    "--config",
                    str(cfg),
                ]
                procs.append(_spawn(argv, d / f"prober-{h.id}.log", prefix, f"prober:{h.id}", penv))
            missing.append(
                "prober agent has no virtual-clock input yet (QPMESH_VCLOCK is set but unread)"
            )
        else:
            missing.append("prober agent (qpmesh prober) not registered")
        progress(
            f"{len(fabric.hosts)} probers, controller: running {sc.duration_s:g}s, {len(sc.faults)} faults"
        )
        t0 = time.monotonic()
        for act in timeline(sc.faults, _fabric_rate(plan)):
            delay = act.t_s - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            _apply(plan, act, congest, sc.duration_s)
            applied.append(
                {
                    "t_s": round(time.monotonic() - t0, 3),
                    "op": act.op,
                    "target": act.target,
                    "value": act.value,
                }
            )
            progress(f"t={act.t_s:6.2f}s {act.op} {act.target}")
        rest = sc.duration_s - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
    except KeyboardInterrupt:
        report["interrupted"] = True
    finally:
        for ps in congest.values():
            for p in ps:
                p.kill()
        events = _read_events(d / "controller.jsonl")
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        tear_down(prefix, progress)
        signal.signal(signal.SIGTERM, prev)
    report.update({
        "faults": [f.to_dict() for f in sc.faults],
        "applied": applied,
        "events": [e for e in events if e.get("kind") not in ("remediation",)],
        "remediation": [e for e in events if e.get("kind") == "remediation" or "action" in e],
        "sync": None,
        "missing": missing,
    })  # fmt: skip
    return report


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _fabric_rate(plan: Plan) -> float:
    return min(lp.rate_mbit for lp in plan.links.values())


def _apply(
    plan: Plan, act: Action, congest: dict[str, list[subprocess.Popen[bytes]]], dur: float
) -> None:
    if act.op == "link_down":
        faults.set_link(plan, act.target, up=False)
    elif act.op == "link_up":
        faults.set_link(plan, act.target, up=True)
    elif act.op == "loss":
        faults.set_loss(plan, act.target, act.value)
    elif act.op == "loss_clear":
        faults.set_loss(plan, act.target, 0)
    elif act.op == "congest":
        congest[act.target] = faults.start_congestion(plan, act.target, act.value, seconds=dur)
    elif act.op == "congest_stop":
        for p in congest.pop(act.target, []):
            p.kill()
    elif act.op == "nic_down":
        faults.set_nic(plan, act.target, up=False)
    elif act.op == "nic_up":
        faults.set_nic(plan, act.target, up=True)
    elif act.op == "prober_stop":
        with contextlib.suppress(OSError):
            faults.stop_prober(plan, act.target)


def _read_events(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and ("event" in doc or "kind" in doc):
                out.append(doc)
    return out
