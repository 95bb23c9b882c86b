"""``qpmesh testbed chaos SCENARIO --seed S``: the scenario's network faults while qpmesh's own
parts are killed and starved (thin shell over `testbed.runner`).

`run_chaos` runs the scenario through `testbed.runner.run_scenario` with `ChaosHooks`: the
controller gets an API (loopback, an operator token), a time series (a VictoriaMetrics it
starts, ``interval_s`` 2) and remediation as the recovery demo's controller trigger has it
(Control on, hold 1 s, ttl 60 s, min interval 5 s) with a state directory (what it sent
and the findings it had open survive its restarts) and a persistent MQTT session (``[mqtt]
session``); the broker keeps its sessions on disk across its restarts and the harness's
monitor holds a persistent session too (`testbed.runner.mosquitto_conf`), so batches
published while the controller, or the monitor, is away are queued for it. Two recovery
agents (`testbed.chaos_agent`, ranks of one job on a NIC of leaf 1 and one of the last
leaf) follow their NICs' remediation topics. The
scenario's faults repeat every scenario duration over the longer chaos run
(`testbed.chaos.repeat_faults`) and the component faults of `testbed.chaos.chaos_plan`
happen among them: SIGKILL by pid and a restart as the part was started, or a CPU limit
(`testbed.cgroup`). Threads poll the API and VictoriaMetrics every `POLL_S`. After the run
`testbed.chaosreport.judge` turns what was seen into the report's chaos part.

Everything started is recorded by pid in the testbed state (teardown ends it); CPU groups
are removed when the run ends, also on an error or a signal.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.records import RecordError, decode_batch
from contract.remediation import AckDoc, ActionDoc, DocumentError
from testbed.cgroup import CgroupError, CpuGroup, Layout, machine_layout, sweep
from testbed.chaos import (
    DEFAULT_FAULTS,
    STARVE_S,
    STARVE_SHARE,
    ComponentFault,
    chaos_plan,
    min_duration_s,
    repeat_faults,
)
from testbed.chaosreport import Applied, Batch, Observed, Poll, judge
from testbed.runner import RunContext, run_scenario
from testbed.scenario import Scenario
from testbed.schedule import Action

VM = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
POLL_S = 0.5
BATCH_INTERVAL_S = 0.5  # the runner's prober config
SPOOL_BATCHES = 10_000  # the prober's default [spool] max_batches
JOB = "chaosjob"
REMEDIATION = """
[remediation]
control = true
hold_s = 1.0
ttl_s = 60
min_interval_s = 5
state_dir = "{state}"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, token: str = "", timeout: float = 2.0) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return bytes(r.read())


class _Poller:
    """A thread that polls the API's snapshot and VictoriaMetrics' health every `POLL_S`."""

    def __init__(self, api: str, token: str, vm: str) -> None:
        self.api, self.token, self.vm = api, token, vm
        self.api_polls: list[Poll] = []
        self.vm_polls: list[tuple[int, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _main(self) -> None:
        while not self._stop.wait(POLL_S):
            t = time.time_ns()
            try:
                doc = json.loads(_get(f"{self.api}/api/v1/snapshot", self.token))
                links = tuple((str(x["id"]), str(x["state"])) for x in doc["links"]
                              if x["state"] not in ("up", "unknown"))  # fmt: skip
                self.api_polls.append(Poll(t, True, int(doc["t_ns"]), int(doc["unknown_nics"]),
                                           links))  # fmt: skip
            except (OSError, ValueError, KeyError, TypeError):
                self.api_polls.append(Poll(t, False))
            t = time.time_ns()
            try:
                self.vm_polls.append((t, _get(f"{self.vm}/health").strip() == b"OK"))
            except OSError:
                self.vm_polls.append((t, False))


def _children(pid: int) -> list[int]:
    """Return the pids whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (d / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes()).replace(b"\0", b" ").decode()
    except OSError:
        return ""


class ChaosHooks:
    """`testbed.runner.RunHooks` of a chaos run (see the module docstring)."""

    def __init__(
        self,
        plan: Sequence[ComponentFault],
        *,
        agents: Mapping[str, tuple[str, tuple[str, ...]]],
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        """``plan``: the component faults; ``agents``: agent name -> (its host, its NICs)."""
        self.plan = list(plan)
        self.agents = agents
        self.progress = progress
        self.token = "chaos-" + secrets.token_hex(8)
        self.api_port = self.vm_port = 0
        self.vm_dir = ""
        self.poller: _Poller | None = None
        self.layout: Layout | None = None
        self.groups: dict[int, CpuGroup] = {}
        self.applied: dict[int, Applied] = {}
        self.t0_ns = 0
        self.tsdb: dict[str, Any] = {}
        self.errors: list[str] = []
        self.seen: Observed | None = None  # what the run saw, once it reported

    # ---- RunHooks ------------------------------------------------------------------------
    def watch(self) -> tuple[str, ...]:
        return ("remediation", "remediation-ack")

    def durable_broker(self) -> bool:
        return True  # the broker is killed: it keeps the sessions on disk

    def prober_toml(self, host: str) -> str:
        return ""

    def controller_toml(self, run: RunContext) -> str:
        self.api_port, self.vm_port = _free_port(), _free_port()
        self.vm_dir = tempfile.mkdtemp(prefix=f"qpmesh-vm-{run.prefix}")
        run.spawn("tsdb", [VM, f"-storageDataPath={self.vm_dir}",
                           f"-httpListenAddr=127.0.0.1:{self.vm_port}", "-search.latencyOffset=0s",
                           "-search.disableCache", "-loggerLevel=ERROR"],
                  run.run_dir / "victoria-metrics.log")  # fmt: skip
        state = run.run_dir / "remediation-state"
        state.mkdir(exist_ok=True)
        return "\n".join([
            "", "[api]", f'listen = "127.0.0.1:{self.api_port}"', f'operator_token = "{self.token}"',
            "", "[timeseries]", f'url = "http://127.0.0.1:{self.vm_port}"', "interval_s = 2.0",
            REMEDIATION.format(state=state),
            "[mqtt]", f'session = "{run.prefix}controller"',
        ])  # fmt: skip

    def started(self, run: RunContext) -> None:
        broker = f"{run.broker[0]}:{run.broker[1]}"
        for k, (name, (host, nics)) in enumerate(sorted(self.agents.items())):
            argv = ["ip", "netns", "exec", run.plan.node_ns[host], sys.executable, "-m",
                    "testbed.chaos_agent", "--broker", broker, "--job", JOB, "--rank", str(k),
                    "--nics", ",".join(nics), "--log", str(run.run_dir / f"{name}.jsonl")]  # fmt: skip
            run.spawn(name, argv, run.run_dir / f"{name}.out")
        self.poller = _Poller(f"http://127.0.0.1:{self.api_port}", self.token,
                              f"http://127.0.0.1:{self.vm_port}")  # fmt: skip
        self.poller.start()
        if any(f.op == "starve" for f in self.plan):
            self.layout = machine_layout()  # CgroupError (exit 1) before the scenario starts
            sweep(self.layout, run.prefix.rstrip("-"))
        time.sleep(2.0)  # the agents' registrations reach the controller's job registry
        self.t0_ns = time.time_ns()

    def actions(self) -> Sequence[Action]:
        out = []
        for i, f in enumerate(self.plan):
            out.append(Action(f.t_s, f"chaos_{f.op}", f.name, float(i)))
            if f.op == "starve" or (f.op == "kill" and f.component != "api"):
                undo = "chaos_unstarve" if f.op == "starve" else "chaos_restart"
                out.append(Action(f.t_s + f.down_s, undo, f.name, float(i)))
        return out

    def apply(self, act: Action, run: RunContext) -> bool:
        if not act.op.startswith("chaos_"):
            return False
        i = int(act.value)
        f = self.plan[i]
        try:
            self._apply(act.op, i, f, run)
        except (OSError, KeyError) as exc:  # CgroupError is an OSError
            self.errors.append(f"{act.op} {f.name}: {exc}")
        self.progress(f"chaos {act.op[6:]} {f.name}")
        return True

    def _role(self, f: ComponentFault) -> str:
        return {"controller": "controller", "broker": "mosquitto", "tsdb": "tsdb",
                "prober": f"prober:{f.target}", "agent": f.target}[f.component]  # fmt: skip

    def _apply(self, op: str, i: int, f: ComponentFault, run: RunContext) -> None:
        now = time.time_ns()
        if op == "chaos_kill":
            if f.component == "api":
                ctl = run.pid("controller")
                kids = (
                    [p for p in _children(ctl) if "controller.api.child" in _cmdline(p)]
                    if ctl
                    else []
                )
                for p in kids:
                    os.kill(p, signal.SIGKILL)
                if not kids:
                    raise OSError("no API process to kill")
                self.applied[i] = Applied(f, now, now)
            else:
                run.kill(self._role(f))
                self.applied[i] = Applied(f, now, 0)
        elif op == "chaos_restart":
            run.restart(self._role(f))
            self.applied[i] = replace(self.applied[i], undone_ns=time.time_ns())
        elif op == "chaos_starve":
            pid = run.pid(self._role(f))
            if pid is None or self.layout is None:
                raise OSError(f"nothing to starve ({self._role(f)} not running)")
            g = CpuGroup(self.layout, run.prefix.rstrip("-"))
            self.groups[i] = g
            g.limit(f.share)
            g.add(pid)
            self.applied[i] = Applied(f, now, 0)
        elif op == "chaos_unstarve":
            g = self.groups.pop(i)
            thr = g.throttled()
            g.remove()
            self.applied[i] = replace(self.applied[i], undone_ns=time.time_ns(), throttled=thr)

    def stopping(self, run: RunContext) -> None:
        for g in self.groups.values():
            with contextlib.suppress(CgroupError):
                g.remove()
        self.groups.clear()
        if self.poller is not None:
            self.poller.stop()
        with contextlib.suppress(OSError, ValueError):
            self.tsdb = self._tsdb_check()

    def _tsdb_check(self) -> dict[str, Any]:
        """The time series of one link's state as VictoriaMetrics holds it: intervals missing
        between the first and the last point (the writer buffers through an outage)."""
        base = f"http://127.0.0.1:{self.vm_port}"
        _get(f"{base}/internal/force_flush")
        q = urllib.parse.urlencode({"match[]": '{__name__="qpmesh_link_state"}', "start": "0"})
        body = _get(f"{base}/api/v1/export?{q}", timeout=30)
        stamps: set[int] = set()
        for line in body.splitlines():
            if line.strip():
                stamps |= set(json.loads(line)["timestamps"])
        ts = sorted(stamps)
        gaps = [(x, round((y - x) / 2000) - 1) for x, y in itertools.pairwise(ts)]
        gaps = [(x, n) for x, n in gaps if n > 0]
        return {
            "series": "qpmesh_link_state",
            "interval_s": 2.0,
            "points": len(ts),
            "span_s": round((ts[-1] - ts[0]) / 1e3, 1) if ts else 0,
            "missing_intervals": sum(n for _, n in gaps),
            "gaps": [
                {"after_t_s": round((x * 1_000_000 - self.t0_ns) / 1e9, 1), "intervals": n}
                for x, n in gaps
            ],
        }

    def report(self, report: dict[str, Any], run: RunContext) -> None:
        if self.vm_dir:
            shutil.rmtree(self.vm_dir, ignore_errors=True)
        self.seen = self.observed(run, Path(report["out_dir"]))

    def observed(self, run: RunContext, out: Path) -> Observed:
        """Return what the run saw (see `testbed.chaosreport.Observed`)."""
        m = run.monitor
        obs = Observed(t0_ns=self.t0_ns, hosts=tuple(h.id for h in run.fabric.hosts))
        obs.applied = [self.applied[i] for i in sorted(self.applied)]
        if m is not None:
            for at, topic, payload in m.raw:
                kind = topic.split("/")[-2] if topic.count("/") >= 2 else ""
                if kind == "probes":
                    with contextlib.suppress(RecordError, ValueError):
                        b = decode_batch(payload)
                        newest = int(b.t1.max()) if len(b) else at
                        obs.batches.append(Batch(at, b.origin, b.batch_seq, len(b), newest))
                elif kind == "presence":
                    with contextlib.suppress(ValueError):
                        doc = json.loads(payload)
                        if isinstance(doc, dict):
                            obs.presence.append((at, topic.rsplit("/", 1)[-1],
                                                 bool(doc.get("alive"))))  # fmt: skip
            obs.events = list(zip(m.event_at, m.events, strict=False))
            for at, topic, payload in m.other:
                with contextlib.suppress(DocumentError):
                    if "/remediation-ack/" in topic:
                        obs.acks.append((at, AckDoc.decode(payload).to_dict()))
                    else:
                        a = ActionDoc.decode(payload)
                        obs.actions.append((at, {**a.to_dict(), "target": a.target}))
        for line in _lines(out / "controller.jsonl"):
            obs.controller_log.append((int(line.get("t_ns", 0)), str(line.get("msg"))))
        for name, (_, nics) in self.agents.items():
            obs.agent_log[name] = [(int(x.get("t_ns", 0)), str(x.get("msg")))
                                   for x in _lines(out / f"{name}.jsonl")]  # fmt: skip
            obs.agent_nics[name] = nics
        if self.poller is not None:
            obs.api, obs.tsdb = self.poller.api_polls, self.poller.vm_polls
        return obs


def _lines(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
    return out


def run_chaos(
    sc: Scenario,
    prefix: str,
    *,
    seed: int,
    duration_s: float | None = None,
    components: Sequence[str] = DEFAULT_FAULTS,
    starve_s: float = STARVE_S,
    share: float = STARVE_SHARE,
    out_dir: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Run ``sc`` with the component faults of ``chaos_plan(seed, ...)``; return the report
    (`testbed.runner.run_scenario`'s, the chaos part of `testbed.chaosreport.judge` on top).
    ``duration_s``: the run's length (default: the shortest that fits the faults, at least
    the scenario's). Raises `testbed.chaos.ChaosError` for a bad plan, OSError (a
    `testbed.cgroup.CgroupError` among them) for the environment."""
    fab = sc.fabric()
    hosts = tuple(h.id for h in fab.hosts)
    leaves = sorted({n.leaf for n in fab.nics})
    first = next(n for n in fab.nics if n.leaf == leaves[min(1, len(leaves) - 1)])
    last = next(n for n in fab.nics if n.leaf == leaves[-1])
    agents = {"agent-rank0": (first.host, (first.id,)), "agent-rank1": (last.host, (last.id,))}
    start_s = 6.0
    dur = duration_s or max(sc.duration_s, min_duration_s(components, start_s, starve_s))
    plan = chaos_plan(seed, dur, components, hosts=hosts, agents=sorted(agents),
                      start_s=start_s, starve_s=starve_s, share=share)  # fmt: skip
    faults = repeat_faults(sc.faults, sc.duration_s, dur)
    long = replace(sc, duration_s=dur, faults=tuple(faults))
    hooks = ChaosHooks(plan, agents=agents, progress=progress)
    progress(f"chaos: {len(plan)} component faults over {dur:g} s, network faults every "
             f"{sc.duration_s:g} s: " + ", ".join(f"{f.name}@{f.t_s:g}s" for f in plan))  # fmt: skip
    report = run_scenario(long, prefix, progress=progress, out_dir=out_dir, hooks=hooks)
    if hooks.seen is None:  # the run never got as far as its report
        return report
    chaos = judge(
        hooks.seen, faults, spool_batches=SPOOL_BATCHES, batch_interval_s=BATCH_INTERVAL_S
    )
    report.update({
        "seed": seed,
        "chaos_duration_s": dur,
        "plan": [f.to_dict() for f in plan],
        "agents": {k: {"host": h, "nics": list(n)} for k, (h, n) in agents.items()},
        "tsdb": hooks.tsdb,
        "chaos_errors": hooks.errors,
        **{k: v for k, v in chaos.items() if k != "estimators"},
    })  # fmt: skip
    report["estimators"] = {**report.get("estimators", {}), **chaos["estimators"]}
    with contextlib.suppress(OSError):
        (Path(report["out_dir"]) / "report.json").write_text(json.dumps(report, indent=1))
    return report
