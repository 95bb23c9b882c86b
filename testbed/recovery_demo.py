"""``qpmesh testbed recovery-demo``: a real PyTorch (CPU, gloo) job survives a NIC link failure.

A two-host testbed, two NICs per host (``nic0,nic1`` on host0, ``nic2,nic3`` on host1), one
rank per host, a fixed number of all-reduce training steps (`testbed.recovery_worker`), the
ranks talking over the emulated fabric, a rendezvous store and the MQTT broker on the
management bridge. Runs, reported side by side:

1. ``no_failure``: the stock gloo job, no fault;
2. ``no_recovery``: the stock job; rank 1's NIC link (``nic2-leaf1``) black-holes for longer
   than the job's collective timeout: the job fails (or stalls: reported which, and when);
3. ``recovery``: the same fault, the job runs through the recovery agent; the link-down
   finding goes through the real remediation policy (hold time, ids, rate limits) and out as a
   ``move_off_nic`` action on the broker; the agent re-forms the group on ``nic3`` and the job
   finishes all steps; its parameters are compared with run 1's;
4. ``short_flap`` (run second): as 3 with a down time shorter than the policy's hold: the job
   is not moved.

What triggers the action (``trigger``): ``injector`` (default) hands the link-down finding to
the policy the moment the link is cut (no detection time in ``recovery_seconds``: link down
to the first step completed after the re-form). ``mesh`` runs a prober per host and the qpmesh
controller and feeds the controller's findings (events on MQTT) to the policy, detection
included (the finding came 1.2-2.0 s after the cut on a busy machine: docs/benchmarks.md).
``controller`` runs the same mesh with the controller's own remediation on (``[remediation]
control = true``): the controller finds, decides and sends; the driver only records the
actions it sees on the broker and the acks. The report says which in ``trigger``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import queue
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.documents import EventDoc
from contract.remediation import AckDoc, ActionDoc, DocumentError, parse_rank_topic
from controller.control import Control
from controller.jobs import Job, JobRegistry
from controller.remediation.loop import Remediator
from controller.remediation.policy import SEC, PolicyConfig, Rule, nic_of
from mesh.fabric import FabricShape
from testbed import faults
from testbed.netns.lifecycle import up
from testbed.netns.nsutil import stop_processes, wait_port
from testbed.netns.plan import PlanError
from testbed.netns.state import record_process, state_dir
from testbed.netns.teardown import tear_down

MOSQUITTO = "/usr/sbin/mosquitto"
SHAPE = FabricShape(leaves=2, hosts_per_leaf=1, nics_per_host=2, spines=1)
RANK_NICS = (("host0", ("nic0", "nic1")), ("host1", ("nic2", "nic3")))
FAILED_NIC, FAILED_LINK = "nic0", "nic0-leaf0"
JOB = "demo"
TRIGGERS = {
    "injector": "injector: the fault injector hands the link-down finding to the remediation "
    "policy when it cuts the link (probe-mesh detection latency not included)",
    "mesh": "mesh: probers in the host namespaces + the qpmesh controller detect the link; the "
    "driver feeds the controller's findings (events on MQTT) to the remediation policy",
    "controller": "controller: probers + the qpmesh controller detect the link and the "
    "controller's own remediation (Control on, [remediation]) sends the action; the driver "
    "only watches",
}
MESHED = ("mesh", "controller")
MESH_WARMUP_S = 10.0
VERDICT_WAIT_S = 8.0


def _start_mesh(fabric: Any, plan: Any, d: Path, port: int, progress: Callable[[str], None],
                remediation: str = "") -> list[subprocess.Popen[bytes]]:  # fmt: skip
    """Start the controller (with ``remediation``: its ``[remediation]`` table) and one prober
    per host (recorded by pid); wait the warm-up."""
    from testbed.runner import controller_config, prober_config

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    qp = [sys.executable, "-m", "qpmesh.cli"]
    broker = (plan.broker_addr, port)
    (d / "controller.toml").write_text(controller_config(fabric, plan) + remediation)
    out = []
    argvs = [("controller", [*qp, "controller", "--broker", f"mqtt://{broker[0]}:{broker[1]}",
                             "--config", str(d / "controller.toml"),
                             "--log", str(d / "controller.jsonl")])]  # fmt: skip
    for h in fabric.hosts:
        cfg = d / f"prober-{h.id}.toml"
        cfg.write_text(prober_config(fabric, plan, h.id, broker))
        argvs.append((f"prober:{h.id}", ["ip", "netns", "exec", plan.node_ns[h.id], *qp,
                                         "prober", "--config", str(cfg)]))  # fmt: skip
    for role, argv in argvs:
        fh = (d / f"{role.replace(':', '-')}.log").open("wb")
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)  # fmt: skip
        fh.close()
        record_process(plan.prefix, role, p.pid)
        out.append(p)
    progress(
        f"probe mesh: controller + {len(fabric.hosts)} probers, warming up {MESH_WARMUP_S:g} s"
    )
    time.sleep(MESH_WARMUP_S)
    return out


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


class _Mqtt:
    """The driver's MQTT client: publishes actions, collects acks and rank registrations."""

    def __init__(self, host: str, port: int) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.acks: queue.Queue[AckDoc] = queue.Queue()
        self.sent: queue.Queue[ActionDoc] = queue.Queue()  # actions seen on the broker
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.raised: set[str] = set()  # NICs the controller reports bad and has not cleared
        self.ranks: dict[str, dict[str, Any]] = {}
        self.c: Any = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"demo-{os.getpid()}")
        self.c.on_connect = self._connected
        self.c.on_message = self._msg
        self.c.connect(host, port, keepalive=10)
        self.c.loop_start()

    def _connected(self, c: Any, *_a: Any) -> None:
        c.subscribe("qpmesh/v1/remediation-ack/#", 1)
        c.subscribe("qpmesh/v1/jobs/#", 1)
        c.subscribe("qpmesh/v1/events/#", 1)
        c.subscribe("qpmesh/v1/remediation/#", 1)

    def _msg(self, _c: Any, _u: Any, msg: Any) -> None:
        if "/remediation/" in msg.topic:
            with contextlib.suppress(DocumentError):
                self.sent.put(ActionDoc.decode(msg.payload))
        elif "/remediation-ack/" in msg.topic:
            with contextlib.suppress(DocumentError):
                self.acks.put(AckDoc.decode(msg.payload))
        elif "/events/" in msg.topic:
            with contextlib.suppress(ValueError):
                doc = json.loads(msg.payload)
                if isinstance(doc, dict) and doc.get("kind") and doc.get("target"):
                    self.events.put(doc)
                    nic = nic_of(str(doc["target"]))
                    if nic and doc["kind"] in ("nic_down", "link_down", "link_flap"):
                        self.raised.add(nic)
                    elif nic and doc["kind"] == "clear":
                        self.raised.discard(nic)
        elif parse_rank_topic("qpmesh/v1", msg.topic) is not None and msg.payload:
            # a rank registration (not its .../perf reports)
            with contextlib.suppress(ValueError):
                self.ranks[msg.topic] = json.loads(msg.payload)

    def publish(self, topic: str, payload: bytes) -> None:
        self.c.publish(topic, payload, qos=1)

    def findings(self, t_min_ns: int) -> list[EventDoc]:
        """Return the controller's findings since the last call at or after ``t_min_ns``."""
        out = []
        while not self.events.empty():
            e = self.events.get()
            if int(e.get("t_ns", 0)) >= t_min_ns and e["kind"] in (
                "nic_down", "link_down", "link_flap", "clear", "contention"
            ):  # fmt: skip
                with contextlib.suppress(DocumentError):
                    out.append(EventDoc.from_json(e))
        return out

    def clear_retained(self) -> None:
        for t in list(self.ranks):
            self.c.publish(t, b"", qos=1, retain=True)
        self.ranks.clear()

    def registry(self) -> JobRegistry:
        """Return the job registry built from the ranks' retained registrations."""
        ranks: dict[str, dict[int, tuple[str, ...]]] = {}
        for doc in self.ranks.values():
            ranks.setdefault(str(doc.get("job")), {})[int(doc.get("rank", 0))] = tuple(
                doc.get("nics", [])
            )
        return JobRegistry(tuple(Job(j, "demo", tuple(rs[k] for k in sorted(rs)))
                                 for j, rs in ranks.items()))  # fmt: skip

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def _run_once(
    name: str, plan: Any, d: Path, mode: str, down_s: float, args: dict[str, Any],
    mq: _Mqtt | None, progress: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    import torch.distributed as _dist

    dist: Any = _dist
    addr = plan.broker_addr
    sport = _free_port(addr)
    store = dist.TCPStore(addr, sport, 2, True, wait_for_workers=False,
                          timeout=dt.timedelta(seconds=120))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs: list[subprocess.Popen[bytes]] = []
    outs = [d / f"{name}-rank{r}.json" for r in range(2)]
    for r, (host, nics) in enumerate(RANK_NICS):
        argv = ["ip", "netns", "exec", plan.node_ns[host], sys.executable, "-m",
                "testbed.recovery_worker", "--rank", str(r), "--world", "2",
                "--store", f"{addr}:{sport}", "--nics", ",".join(nics), "--mode", mode,
                "--broker", f"{addr}:{args['broker_port']}", "--job", JOB,
                "--steps", str(args["steps"]), "--step-s", str(args["step_s"]),
                "--timeout-s", str(args["job_timeout_s"]),
                "--collective-timeout-s", str(args["collective_timeout_s"]),
                "--verdict-wait-s", str(args["verdict_wait_s"]),
                "--out", str(outs[r])]  # fmt: skip
        fh = (d / f"{name}-rank{r}.log").open("wb")
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)  # fmt: skip
        fh.close()
        record_process(plan.prefix, f"recovery-demo:{name}:rank{r}", p.pid)
        procs.append(p)
    cfg = PolicyConfig(
        rules=(Rule(("nic_down", "link_down", "link_flap"), "move_off_nic",
                    hold_ns=int(args["hold_s"] * SEC)),),
        ttl_ns=60 * SEC, min_interval_ns=5 * SEC,
    )  # fmt: skip
    rem = Remediator(cfg)
    control = Control(enabled=True)
    actions: list[dict[str, Any]] = []
    acks: list[dict[str, Any]] = []
    t_down = t_up = None
    deadline = time.monotonic() + args["run_timeout_s"]
    try:
        if down_s > 0:
            while time.monotonic() < deadline and all(p.poll() is None for p in procs):
                with contextlib.suppress(Exception):
                    if int(store.get("demo/step").decode()) >= args["fault_step"]:
                        break
                time.sleep(0.02)
            faults.set_link(plan, FAILED_LINK, up=False)
            t_down = time.time()
            progress(f"{name}: {FAILED_LINK} down at step >= {args['fault_step']} for {down_s:g} s")
            t_down_ns = time.time_ns()
            pending = []
            if args["trigger"] == "injector":
                pending = [EventDoc(t_down_ns, "link_down", FAILED_LINK, "fault injector")]
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            now = time.time()
            if t_down is not None and t_up is None and now - t_down >= down_s:
                faults.set_link(plan, FAILED_LINK, up=True)
                t_up = now
                progress(f"{name}: {FAILED_LINK} up again")
                if args["trigger"] == "injector":
                    pending.append(EventDoc(time.time_ns(), "clear", FAILED_LINK, "fault injector"))
            if args["trigger"] == "controller" and mq is not None:
                while not mq.sent.empty():  # the controller's own actions
                    a = mq.sent.get()
                    actions.append({"t_ns": time.time_ns(), "disposition": "send",
                                    "sent_by": "controller", **a.to_dict()})  # fmt: skip
                    progress(f"{name}: controller sent {a.kind} {a.target} job {a.job or '-'}")
            elif mode == "agent" and mq is not None and t_down is not None:
                if args["trigger"] == "mesh":
                    found = mq.findings(t_down_ns - SEC)
                    pending += found
                    for f in found:
                        progress(f"{name}: controller finding {f.kind} {f.target} at "
                                 f"+{(f.t_ns - t_down_ns) / SEC:.2f} s (seen +{now - t_down:.2f} s)")  # fmt: skip
                for f in pending:
                    rem.observe(f)
                pending = []
                actions += rem.tick_with(mq.registry(), control, time.time_ns(), mq.publish)
            time.sleep(0.05)
    finally:
        if t_down is not None and t_up is None:
            faults.set_link(plan, FAILED_LINK, up=True)
            t_up = time.time()
        stalled = [p for p in procs if p.poll() is None]
        for p in stalled:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
        for p in procs:
            p.wait(timeout=10)
    if mq is not None:
        time.sleep(0.3)
        while not mq.acks.empty():
            acks.append(mq.acks.get().to_dict())
    ranks = []
    for o in outs:
        try:
            ranks.append(json.loads(o.read_text()))
        except (OSError, ValueError):
            ranks.append({"completed": False})
    return _summary(name, ranks, bool(stalled), t_down, t_up, actions, acks)


def _summary(name: str, ranks: list[dict[str, Any]], stalled: bool, t_down: float | None,
             t_up: float | None, actions: list[dict[str, Any]], acks: list[dict[str, Any]]
             ) -> dict[str, Any]:  # fmt: skip
    done = all(r.get("completed") for r in ranks)
    out: dict[str, Any] = {
        "completed": done,
        "seconds": round(max(r.get("seconds", 0.0) for r in ranks), 3),
        "steps_done": min(r.get("steps_done", 0) for r in ranks),
        "param_checksum": ranks[0].get("param_checksum"),
        "param_sha256": ranks[0].get("param_sha256"),
        "ranks_agree": len({r.get("param_sha256") for r in ranks}) == 1,
    }
    if t_down is not None:
        out["down_seconds"] = round((t_up or t_down) - t_down, 3)
    if not done:
        failed = [r["failed_wall"] for r in ranks if "failed_wall" in r]
        out["outcome"] = "stalled" if stalled and not failed else "failed"
        if failed and t_down is not None:
            out["failed_after_down_s"] = round(min(failed) - t_down, 3)
        out["errors"] = sorted({r["error"] for r in ranks if "error" in r})
    reforms = [x for r in ranks for x in r.get("reforms", [])]
    if reforms or name in ("recovery", "short_flap"):
        out["reforms"] = reforms
        out["final_nics"] = [r.get("final_nic", "") for r in ranks]
    if t_down is not None and reforms:
        after = [min((t for t in r.get("step_done_wall", []) if t > t_down), default=None)
                 for r in ranks]  # fmt: skip
        if all(a is not None for a in after):
            out["recovery_seconds"] = round(max(a for a in after if a is not None) - t_down, 3)
    if actions:
        out["actions"] = actions
    if acks:
        out["acks"] = acks
    return out


def run_demo(
    *,
    steps: int = 60,
    step_s: float = 0.05,
    fault_step: int = 15,
    down_s: float = 6.0,
    short_flap_s: float = 0.5,
    hold_s: float = 1.0,
    job_timeout_s: float = 3.0,
    collective_timeout_s: float = 1.0,
    trigger: str = "injector",
    prefix: str | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    out_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the demo's runs on a fresh testbed; return the JSON-ready report.

    Raises `PlanError` for bad figures, `TestbedEnvError`/OSError for the environment.
    """
    if not (steps > fault_step >= 1 and down_s > job_timeout_s > 0 and 0 < short_flap_s < hold_s):
        raise PlanError(
            "need steps > fault step >= 1, down > job timeout > 0, 0 < short flap < hold"
        )
    if trigger not in TRIGGERS:
        raise PlanError(f"trigger must be one of {', '.join(TRIGGERS)}")
    prefix = prefix or ("rd" + secrets.token_hex(2) + "-")
    fabric, plan = up(SHAPE, prefix, progress=progress)
    d = state_dir(prefix)
    mq: _Mqtt | None = None
    mosq: subprocess.Popen[bytes] | None = None
    args = {"steps": steps, "step_s": step_s, "fault_step": fault_step, "hold_s": hold_s,
            "job_timeout_s": job_timeout_s, "collective_timeout_s": collective_timeout_s,
            "run_timeout_s": steps * step_s * 4 + down_s + 60, "trigger": trigger,
            # a stuck collective without a verdict re-forms in place after this; the mesh's
            # verdict comes 1.3-2 s after the cut (docs/benchmarks.md), so 8 s for every
            # trigger (it was the down time + 10 s while the mesh often missed the NIC)
            "verdict_wait_s": VERDICT_WAIT_S}  # fmt: skip
    rem_table = (f"\n[remediation]\ncontrol = true\nhold_s = {hold_s}\nttl_s = 60\n"
                 "min_interval_s = 5\n") if trigger == "controller" else ""  # fmt: skip
    mesh: list[subprocess.Popen[bytes]] = []
    report: dict[str, Any] = {"prefix": prefix, "ranks": 2, "steps": steps, "runs": {}}
    try:
        port = _free_port(plan.broker_addr)
        conf = d / "mosquitto.conf"
        conf.write_text(
            f"listener {port} {plan.broker_addr}\nallow_anonymous true\npersistence false\n"
        )
        fh = (d / "mosquitto.log").open("wb")
        mosq = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        fh.close()
        record_process(prefix, "mosquitto", mosq.pid)
        if not wait_port(plan.broker_addr, port, 5):
            raise OSError(f"mosquitto did not listen on {plan.broker_addr}:{port}")
        args["broker_port"] = port
        mq = _Mqtt(plan.broker_addr, port)
        if trigger in MESHED:
            mesh = _start_mesh(fabric, plan, d, port, progress, rem_table)
        runs = report["runs"]
        # the short flap goes first: to the controller it is then one down episode, not the
        # third (a link that went down repeatedly is "flapping", and that moves a job at once)
        for name, mode, down in (("no_failure", "plain", 0.0),
                                 ("short_flap", "agent", short_flap_s),
                                 ("no_recovery", "plain", down_s),
                                 ("recovery", "agent", down_s)):  # fmt: skip
            if trigger in MESHED:  # runs start from a fabric the controller calls healthy
                t_wait = time.monotonic() + 60
                while FAILED_NIC in mq.raised and time.monotonic() < t_wait:
                    time.sleep(0.2)
                if FAILED_NIC in mq.raised:
                    progress(f"controller still reports {FAILED_NIC} bad after 60 s")
            progress(f"run {name} ({mode})")
            mq.clear_retained()
            runs[name] = _run_once(name, plan, d, mode, down, args, mq, progress)
            progress(
                f"run {name}: completed={runs[name]['completed']} in {runs[name]['seconds']} s"
            )
    finally:
        if mq is not None:
            mq.stop()
        stop_processes(mesh)
        if mosq is not None:
            mosq.terminate()
            mosq.wait(timeout=5)
        if out_dir is not None:
            import shutil

            with contextlib.suppress(OSError):
                shutil.copytree(d, out_dir, dirs_exist_ok=True)
        tear_down(prefix, progress)
    runs = report["runs"]
    base, rec = runs.get("no_failure", {}), runs.get("recovery", {})
    report.update({
        "flap_down_seconds": down_s,
        "short_flap_seconds": short_flap_s,
        "policy_hold_seconds": hold_s,
        "job_collective_timeout_s": job_timeout_s,
        "agent_collective_timeout_s": collective_timeout_s,
        "agent_verdict_wait_s": VERDICT_WAIT_S,
        "failed_nic": FAILED_NIC,
        "failed_link": FAILED_LINK,
        "trigger": TRIGGERS[trigger],
        "same_params_as_no_failure": bool(rec.get("param_sha256"))
        and rec.get("param_sha256") == base.get("param_sha256"),
        "time_ratio_vs_no_failure_plus_down": (
            round(rec["seconds"] / (base["seconds"] + down_s), 3)
            if rec.get("seconds") and base.get("seconds") else None
        ),
    })  # fmt: skip
    return report
