"""``qpmesh testbed run SCENARIO``: fabric + broker + probers + controller + timed faults -> report.

Thin shell: the timeline is pure (`testbed.schedule`); this module starts processes (recorded
by pid in the testbed state), applies the actions on time and always cleans up (also on Ctrl-C
or SIGTERM). The report lists the applied faults, the controller's findings (its JSON-lines log)
and, when the controller logs clock estimates, the sync error against the virtual clocks.

``discover``: nothing of the fabric is written for the probers or the controller. The fabric
comes up with lldpd in every namespace and switches that answer TTL probes from router ids;
each prober's config has its host, the broker and ``[discover]`` (`discover_prober_config`):
it finds its NIC, reads its leaf from lldpd and learns its peers from the others' neighbours
documents; the controller's (`learned_controller_config`) has no fabric, only the plan to
check what it learns against and the spines' router ids to name them by. The scenario's clock
starts once the controller's learned fabric matches the plan (or after `TOPOLOGY_WAIT_S`),
and the report gains ``topology`` (`topology_report`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from contract.interrupt import interruptible
from mesh.fabric import Fabric, NodeKind
from testbed import faults
from testbed.netns.apply import TestbedEnvError
from testbed.netns.lifecycle import up
from testbed.netns.lldp import lldp_dir, lldp_socket, lldpd_available
from testbed.netns.nsutil import stop_processes, wait_port
from testbed.netns.plan import Plan
from testbed.netns.state import record_process, state_dir
from testbed.netns.teardown import tear_down
from testbed.replay import CAPTURE, live_clock, write_capture
from testbed.runreport import Monitor, localization, sync_report
from testbed.runscore import estimators
from testbed.scenario import TESTBED_CONGEST, FaultKind, Scenario, random_faults
from testbed.schedule import Action, timeline
from testbed.securerun import SecureRun
from testbed.vclock import VirtualClock, assign_clocks, write_clock, write_truth

MOSQUITTO = "/usr/sbin/mosquitto"


def prober_config(
    fabric: Fabric,
    plan: Plan,
    host: str,
    broker: tuple[str, int],
    mqtt_extra: Sequence[str] = (),
    extra: str = "",
) -> str:
    """Return the prober TOML for ``host``: its NICs, every other NIC as a peer, the broker.

    ``mqtt_extra``: more ``[mqtt]`` lines (TLS, credentials); ``extra``: more tables.

    Source ports per NIC cover the fabric's ECMP width (``paths`` = spines); path discovery
    traces 20 flows/s per NIC up to TTL 4 (two tiers). The host's virtual clock is not in
    it: ``qpmesh testbed prober --clock`` supplies it as the prober's clock hook.
    """
    spines = sum(1 for n in fabric.switches if n.kind == NodeKind.SPINE)
    lines = [
        "[prober]", f'host = "{host}"', 'transport = "udp"', "port = 4791", 'timestamps = "sw"',
        "batch_interval_ms = 500", "",
        "[schedule]", f"paths = {max(2, spines)}", "",
        "[paths]", "traces_per_s = 20.0", "max_ttl = 4", "refresh_s = 30.0", "",
        "[mqtt]", f'host = "{broker[0]}"', f"port = {broker[1]}", *mqtt_extra, "", extra,
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


def discover_prober_config(
    host: str,
    broker: tuple[str, int],
    lldp_socket: str,
    spines: int,
    mqtt_extra: Sequence[str] = (),
    extra: str = "",
) -> str:
    """Return the prober TOML for ``host`` of a ``discover`` run: no NIC and no peer, only the
    host id (namespaces share the machine's host name), the broker and ``[discover]``: the
    interfaces named ``nic*`` (a testbed NIC is a veth with no RDMA port), ids the interface
    names (unique in the testbed, and the plan's NIC ids), the host's own lldpd. The schedule
    and path discovery are `prober_config`'s (``spines`` sets the source ports' ECMP width,
    tuning as on a real fleet, not a description of the fabric)."""
    lines = [
        "[prober]", f'host = "{host}"', 'transport = "udp"', "port = 4791", 'timestamps = "sw"',
        "batch_interval_ms = 500", "",
        "[schedule]", f"paths = {max(2, spines)}", "",
        "[paths]", "traces_per_s = 20.0", "max_ttl = 4", "refresh_s = 30.0", "",
        "[discover]", 'nics = ["nic*"]', 'nic_id = "{ifname}"', f'lldp_socket = "{lldp_socket}"',
        "lldp_interval_s = 5.0", "",
        "[mqtt]", f'host = "{broker[0]}"', f"port = {broker[1]}", *mqtt_extra, "", extra,
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def learned_controller_config(plan: Plan, plan_file: str) -> str:
    """Return the controller TOML of a ``discover`` run: no fabric; ``plan_file`` (the
    testbed's fabric as JSON) to check the learned one against, the spines named by their
    router ids (an operator's inventory), a relearn every second; no model paths."""
    names = {rid: sw for sw, rid in sorted(plan.router_ids.items()) if not sw.startswith("leaf")}
    lines = ["[fabric]", f'plan = "{plan_file}"', "relearn_s = 1.0", "", "[fabric.routers]"]
    lines += [f'"{a}" = "{n}"' for a, n in sorted(names.items())]
    lines += ["", "[paths]", "model = false"]
    return "\n".join(lines) + "\n"


def router_nodes(plan: Plan) -> dict[str, str]:
    """Return router address -> fabric switch id for every switch-side address of ``plan``
    and every switch's router id.

    Without router ids routers answer TTL-expired probes from the inbound interface's address
    (``icmp_errors_use_inbound_ifaddr``), so each address names a switch; the leaf gateway
    ``10.x.y.254`` is the same on every downlink of one leaf. With them, from their router id.
    """
    node_of_ns = {ns: node for node, ns in plan.node_ns.items()}
    out: dict[str, str] = {rid: sw for sw, rid in plan.router_ids.items()}
    for lp in plan.links.values():
        for end in (lp.lower, lp.upper):
            node = node_of_ns.get(end.ns, "")
            if end.addr and not node.startswith("host"):
                out[end.addr.split("/")[0]] = node
    return out


def controller_config(fabric: Fabric, plan: Plan) -> str:
    """Return the controller TOML: the fabric's shape and the router address map.

    ``[paths] model = false``: the kernel's multipath hash is not the fabric model's, so a flow
    whose path was not discovered is localized without a path (NIC / host) instead of on a
    wrong spine.
    """
    lines = ["[fabric]"]
    lines += [f"{k} = {v!r}" for k, v in fabric.shape.items()]
    lines += ["", "[paths]", "model = false", "", "[paths.routers]"]
    lines += [f'"{a}" = "{n}"' for a, n in sorted(router_nodes(plan).items())]
    return "\n".join(lines) + "\n"


AUTOSAVE_S = 1
"""A durable broker saves its state this often (a SIGKILL loses at most what came since)."""


def mosquitto_conf(listen: tuple[str, int], store: Path | None = None, user: str = "") -> str:
    """Return the broker config of a run: a listener on ``listen`` (address, port),
    anonymous clients. Without ``store`` nothing is kept on disk (a restarted broker
    forgets every session and queued message); with it (a folder, created here) the broker
    keeps persistent sessions, their subscriptions and queued QoS 1 messages and retained
    messages there, saved every `AUTOSAVE_S` s, and loads them when it starts again.
    ``user``: the account the broker runs as when started by root (mosquitto's default,
    ``mosquitto``, cannot write a store in root's folders; pass the caller's own)."""
    lines = [f"listener {listen[1]} {listen[0]}", "allow_anonymous true"]
    if store is None:
        lines.append("persistence false")
    else:
        store.mkdir(parents=True, exist_ok=True)
        lines += ["persistence true", f"persistence_location {store}/",
                  f"autosave_interval {AUTOSAVE_S}", "autosave_on_changes false"]  # fmt: skip
        lines += [f"user {user}"] if user else []
    return "\n".join(lines) + "\n"


def _spawn(
    argv: list[str], log: Path, prefix: str, role: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    fh = log.open("ab")
    p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    fh.close()
    record_process(prefix, role, p.pid)
    return p


@dataclass(eq=False)
class RunContext:
    """What a running scenario started, for `RunHooks`: its processes by role (``controller``,
    ``mosquitto``, ``prober:<host>``, and what hooks `spawn`), how each was started (so it can
    be started again), the monitor, fabric, plan, run directory, the environment its
    processes get, the broker's address and the scenario's start (``t0``, monotonic s; 0 until
    it starts)."""

    prefix: str
    run_dir: Path
    fabric: Fabric
    plan: Plan
    env: dict[str, str]
    monitor: Monitor | None = None
    t0: float = 0.0
    broker: tuple[str, int] = ("", 0)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, tuple[list[str], Path]] = field(default_factory=dict)
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)  # all, for the cleanup

    def spawn(self, role: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` as ``role`` (output appended to ``log``, recorded by pid in the
        testbed state, so teardown ends it); return it."""
        p = _spawn(argv, log, self.prefix, role, self.env)
        self.procs[role], self.argv[role] = p, (argv, log)
        self.started.append(p)
        return p

    def pid(self, role: str) -> int | None:
        """Return the pid of ``role`` if it runs, else None."""
        p = self.procs.get(role)
        return p.pid if p is not None and p.poll() is None else None

    def kill(self, role: str) -> bool:
        """SIGKILL ``role`` (its process only: the children it started see their parent
        gone); return False when it did not run."""
        p = self.procs.get(role)
        if p is None or p.poll() is not None:
            return False
        p.kill()
        p.wait()
        return True

    def restart(self, role: str) -> subprocess.Popen[bytes]:
        """Start ``role`` again as it was started; raises KeyError for an unknown role."""
        argv, log = self.argv[role]
        return self.spawn(role, argv, log)


class RunHooks(Protocol):
    """What `run_scenario` lets another harness (`testbed.chaosrun`) add to a run."""

    def durable_broker(self) -> bool:
        """Return whether the broker keeps its sessions and queued messages on disk across
        a restart (`mosquitto_conf` with a store) and the run's monitor holds a persistent
        session (a harness that kills the broker)."""

    def controller_toml(self, run: RunContext) -> str:
        """Return more controller TOML (tables the scenario's config does not have); the
        broker runs, the controller starts next."""

    def prober_toml(self, host: str) -> str:
        """Return more prober TOML for ``host``."""

    def watch(self) -> tuple[str, ...]:
        """Return more topic kinds for the run's `Monitor` to keep (``Monitor.other``)."""

    def started(self, run: RunContext) -> None:
        """The broker, the controller and the probers measure; the scenario starts next."""

    def actions(self) -> Sequence[Action]:
        """Return more timeline actions (``t_s`` from the scenario's start)."""

    def apply(self, act: Action, run: RunContext) -> bool:
        """Apply ``act`` if it is one of the hook's; return whether it was."""

    def stopping(self, run: RunContext) -> None:
        """The run ends (also on an error or a signal): undo what must not outlive it."""

    def report(self, report: dict[str, Any], run: RunContext) -> None:
        """Add the hook's part to the finished run's report (after teardown)."""


def run_scenario(
    sc: Scenario,
    prefix: str,
    *,
    random_k: int = 0,
    seed: int | None = None,
    progress: Callable[[str], None] = lambda _: None,
    out_dir: Path | None = None,
    secure: bool = False,
    discover: bool = False,
    hooks: RunHooks | None = None,
) -> dict[str, Any]:
    """Run ``sc`` on a fresh namespace testbed; return the JSON-ready report.

    ``out_dir`` (default ``/var/tmp/qpmesh/<prefix>``) keeps the run's logs, configs, clock
    truth and ``report.json`` after teardown. ``secure``: TLS, passwords and the ACL on the
    broker, probe HMAC, and an adversary (`testbed.securerun`); the report gains ``security``.
    ``discover``: probers and controller told nothing of the fabric (module doc); the report
    gains ``topology``. ``hooks``: more config, processes, timeline actions and report
    (`RunHooks`; the run's processes are theirs to kill and restart through `RunContext`).
    Raises `testbed.netns.apply.TestbedEnvError` when ``discover`` is asked for without
    lldpd.
    """
    if discover and not lldpd_available():
        raise TestbedEnvError("--discover needs lldpd in the namespaces (Debian lldpd)")
    if random_k:
        sc = replace(
            sc,
            faults=random_faults(
                sc.fabric(),
                random_k,
                seed=seed or sc.seed,
                duration_s=sc.duration_s,
                congest_magnitude=TESTBED_CONGEST,
            ),
        )
    missing: list[str] = []
    applied: list[dict[str, Any]] = []
    procs: list[subprocess.Popen[bytes]] = []
    congest: dict[str, list[subprocess.Popen[bytes]]] = {}
    fabric, plan = up(sc.shape, prefix, progress=progress, router_ids=discover,
                      lldp=True if discover else None)  # fmt: skip
    d = state_dir(prefix)
    report: dict[str, Any] = {"scenario": sc.name, "prefix": prefix, "duration_s": sc.duration_s}
    monitor: Monitor | None = None
    sec: SecureRun | None = None
    t0_wall = 0
    clocks: dict[str, VirtualClock] = {}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = RunContext(prefix, d, fabric, plan, env, started=procs)
    run.broker = (plan.broker_addr, 1883)
    # SIGTERM or SIGINT end the run early: its finally tears the testbed down (a second
    # signal does not cut that short) and the report covers what ran (contract.interrupt)
    with interruptible() as stop:
        try:
            clocks = assign_clocks([h.id for h in fabric.hosts], seed=sc.seed, t0_ns=time.time_ns())
            truth = write_truth(d / "clocks.json", clocks, {n.id: n.host for n in fabric.nics})
            report["truth_file"] = str(truth)
            broker = (plan.broker_addr, 1883)
            conf = d / "mosquitto.conf"
            durable = hooks is not None and hooks.durable_broker()
            store = d / "mosquitto-store" if durable else None
            conf.write_text(mosquitto_conf(broker, store, pwd.getpwuid(os.geteuid()).pw_name))
            if secure:
                sec = SecureRun(d, fabric, plan)
                broker = run.broker = sec.broker
                conf.write_text(sec.broker_conf())
            run.spawn("mosquitto", [MOSQUITTO, "-c", str(conf)], d / "mosquitto.log")
            if not wait_port(*broker, timeout_s=5):
                raise OSError(f"mosquitto did not listen on {broker[0]}:{broker[1]}")
            progress(f"broker on {broker[0]}:{broker[1]}")
            watch = hooks.watch() if hooks is not None else ()
            session = f"{prefix}monitor" if durable else ""
            monitor = (
                sec.monitor() if sec is not None else Monitor(*broker, watch=watch, session=session)
            )
            monitor.start()
            run.monitor = monitor
            qp = [sys.executable, "-m", "qpmesh.cli"]
            ctl_log = d / "controller.jsonl"
            ctl_conf = d / "controller.toml"
            if discover:
                (d / PLAN_FILE).write_text(json.dumps(fabric.to_dict()))
                ctl_text = learned_controller_config(plan, PLAN_FILE)
            else:
                ctl_text = controller_config(fabric, plan)
            ctl_conf.write_text(
                ctl_text
                + (sec.controller_extra() if sec is not None else "")
                + (hooks.controller_toml(run) if hooks is not None else "")
            )
            run.spawn("controller", [*qp, "controller", "--broker", f"mqtt://{broker[0]}:{broker[1]}",
                                     "--config", str(ctl_conf), "--log", str(ctl_log)],
                      d / "controller.out")  # fmt: skip
            spines = sum(1 for n in fabric.switches if n.kind == NodeKind.SPINE)
            for h in fabric.hosts:
                cfg = d / f"prober-{h.id}.toml"
                mqtt_extra = sec.prober_mqtt_lines(h.id) if sec is not None else ()
                extra = sec.prober_extra() if sec is not None else ""
                extra += hooks.prober_toml(h.id) if hooks is not None else ""
                if discover:
                    sock = lldp_socket(lldp_dir(prefix), h.id)
                    cfg.write_text(
                        discover_prober_config(h.id, broker, sock, spines, mqtt_extra, extra)
                    )
                else:
                    cfg.write_text(prober_config(fabric, plan, h.id, broker, mqtt_extra, extra))
                clk = d / f"clock-{h.id}.json"
                write_clock(clocks[h.id], clk)
                argv = ["ip", "netns", "exec", plan.node_ns[h.id], *qp, "testbed", "prober",
                        "--config", str(cfg), "--clock", str(clk)]  # fmt: skip
                run.spawn(f"prober:{h.id}", argv, d / f"prober-{h.id}.log")
            # the scenario's clock starts once the mesh measures: on a busy machine the probers
            # and the controller took seconds to start, and a fault at 5 s then fell before the
            # controller's first trusted clocks (nothing can localize what nobody measured)
            report["startup_s"] = _wait_mesh(monitor, [h.id for h in fabric.hosts], ctl_log)
            if discover:  # the scenario starts on the fabric the controller learned
                report["startup_s"] = round(report["startup_s"] + _wait_topology(ctl_log), 2)
            progress(
                f"{len(fabric.hosts)} probers and the controller up after {report['startup_s']:g}s: "
                f"running {sc.duration_s:g}s, {len(sc.faults)} faults"
            )
            if hooks is not None:
                hooks.started(run)
            t0 = run.t0 = time.monotonic()
            t0_wall = time.time_ns()
            if sec is not None:
                sec.start(monitor, t0, sc.duration_s, progress, env)
            acts = timeline(sc.faults, _fabric_rate(plan))
            if hooks is not None:
                acts = sorted([*acts, *hooks.actions()], key=lambda a: a.t_s)
            for act in acts:
                delay = act.t_s - (time.monotonic() - t0)
                if delay > 0:
                    time.sleep(delay)
                if hooks is None or not hooks.apply(act, run):
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
        finally:
            for ps in congest.values():
                for p in ps:
                    p.kill()
            if hooks is not None:
                hooks.stopping(run)
            if sec is not None:
                sec.stop()
            if monitor is not None:
                monitor.stop()
            stop_processes(procs)
            out = out_dir or Path("/var/tmp/qpmesh") / prefix
            with contextlib.suppress(OSError):
                shutil.copytree(d, out, dirs_exist_ok=True)
                if monitor is not None:  # what the controller read, for `qpmesh testbed replay`
                    write_capture(out / CAPTURE, monitor.raw)
            tear_down(prefix, progress)
    report["interrupted"] = stop.interrupted
    events = monitor.events if monitor is not None and monitor.events else []
    if not events:  # fall back on the controller's JSON-lines log
        events = _read_events(out / "controller.jsonl")
    sync = None
    spans = _sync_windows(sc, t0_wall) if t0_wall else []
    if monitor is not None and t0_wall:
        sync = sync_report(monitor.batches, clocks, {n.id: n.host for n in fabric.nics},
                           spans)  # fmt: skip
        if sync is None:
            missing.append("no usable probe batches for the sync figures")
    report.update({
        "faults": [f.to_dict() for f in sc.faults],
        "applied": applied,
        "events": [e for e in events if e.get("kind") not in ("remediation",)],
        "remediation": [e for e in events if e.get("kind") == "remediation" or "action" in e],
        "localization": localization(sc.faults, events),
        "estimators": estimators(
            fabric, sc.faults, events, monitor.batches if monitor is not None else [],
            monitor.paths if monitor is not None else [], router_nodes(plan),
        ),
        "sync": sync,
        "sync_windows": [list(x) for x in spans],  # kernel ns: `testbed replay`'s clock check
        "probe_batches": len(monitor.batches) if monitor is not None else 0,
        "paths": _paths_summary(monitor.paths if monitor is not None else []),
        "missing": missing,
        "out_dir": str(out),
    })  # fmt: skip
    if monitor is not None and spans:  # the controller's own clock, honest or not
        try:
            report["live_clock"] = live_clock(out, spans)
        except (OSError, ValueError) as exc:  # CaptureError and ConfigError are ValueErrors
            missing.append(f"live clock check: {exc}")
    if discover:
        report["topology"] = topology_report(_read_log(out / "controller.jsonl"), t0_wall)
        if not report["topology"]["matches_plan"]:
            missing.append("the learned fabric does not match the plan")
    if sec is not None:
        report["security"] = sec.report(monitor, out / "controller.jsonl")
        missing += [
            f"security: {k} not tried: {v}" for k, v in report["security"]["not_tried"].items()
        ]
    if hooks is not None:
        hooks.report(report, run)
    with contextlib.suppress(OSError):
        (out / "report.json").write_text(json.dumps(report, indent=1))
    return report


WARMUP_S = 6.0
PLAN_FILE = "plan.json"
TOPOLOGY_WAIT_S = 60.0
"""How long a ``discover`` run waits for the learned fabric to match the plan."""


def topology_report(log: Sequence[Mapping[str, Any]], t0_ns: int = 0) -> dict[str, Any]:
    """Return the ``topology`` part of a ``discover`` run's report from the controller's
    JSON-lines log (its ``topology`` lines, one per change it applied): ``matches_plan``
    and ``differences`` (from the plan) of the last change, ``changes`` (how many),
    ``changes_during_run`` (after ``t0_ns``, the scenario's start: a stable fabric has none),
    the NICs and links of the last fabric and what it could not place (``problems``)."""
    lines = [x for x in log if x.get("msg") == "topology"]
    last = lines[-1] if lines else {}
    return {
        "matches_plan": last.get("matches_plan") is True,
        "differences": list(last.get("plan_differences", ["no fabric was learned"])),
        "changes": len(lines),
        "changes_during_run": sum(1 for x in lines if t0_ns and int(x.get("t_ns", 0)) >= t0_ns),
        "nics": last.get("nics", 0),
        "links": last.get("links", 0),
        "problems": list(last.get("problems", [])),
    }


def _read_log(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines log (unreadable lines and files: none)."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
    return out


def _wait_topology(ctl_log: Path, timeout_s: float = TOPOLOGY_WAIT_S) -> float:
    """Wait until the controller's last applied fabric matches the plan (its log says so),
    at most ``timeout_s``; return the seconds waited (the report says if it never did)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if topology_report(_read_log(ctl_log))["matches_plan"]:
            break
        time.sleep(0.2)
    return round(time.monotonic() - start, 2)


def _paths_summary(paths: list[dict[str, Any]]) -> dict[str, Any]:
    flows = {(p.get("src"), p.get("dst"), p.get("sport")): p for p in paths}
    full = [p for p in flows.values() if p.get("reached") and None not in p.get("hops", [None])]
    return {"traced_flows": len(flows), "complete": len(full), "sample": full[:2]}


def _sync_windows(sc: Scenario, t0_wall: int) -> list[tuple[str, int, int]]:
    """Return (label, start, end) kernel-ns windows: idle (no fault) and congested."""
    s = 1_000_000_000
    first = min((f.start_s for f in sc.faults), default=sc.duration_s)
    out = [("idle", t0_wall + int(WARMUP_S * s), t0_wall + int(first * s))]
    for f in sc.faults:
        if f.kind == FaultKind.CONGEST:
            out.append(
                ("congested", t0_wall + int((f.start_s + 1) * s), t0_wall + int(f.end_s * s))
            )
    return out


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


MESH_UP_S = 60.0
"""How long a run waits for every prober's first probe batch and the controller's connection."""


def mesh_missing(origins: frozenset[str], hosts: Sequence[str], controller_log: str) -> list[str]:
    """Return what of the mesh is not up yet: hosts none of whose probe batches were seen
    (``origins``), then ``"controller"`` unless its JSON-lines log (text) says it connected.
    Empty when everything measures."""
    out = [h for h in hosts if h not in origins]
    connected = False
    for line in controller_log.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            connected |= isinstance(doc, dict) and doc.get("msg") == "connected"
    return out if connected else [*out, "controller"]


def _wait_mesh(
    monitor: Monitor, hosts: Sequence[str], ctl_log: Path, timeout_s: float = MESH_UP_S
) -> float:
    """Wait until `mesh_missing` is empty; return the seconds waited. Raises OSError naming
    what is missing after ``timeout_s``."""
    start = time.monotonic()
    while True:
        log = ctl_log.read_text() if ctl_log.exists() else ""
        missing = mesh_missing(monitor.origins(), hosts, log)
        waited = time.monotonic() - start
        if not missing:
            return round(waited, 2)
        if waited > timeout_s:
            raise OSError(f"mesh not up after {timeout_s:g}s: no sign of {', '.join(missing)}")
        time.sleep(0.1)


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
