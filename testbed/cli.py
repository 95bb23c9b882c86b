"""``qpmesh testbed ...``: the namespace fabric (up, down, status), faults and scenario runs."""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from contract.interrupt import EXIT_INTERRUPTED, finish, interruptible
from testbed import chaos_cli, faults
from testbed.netns.apply import check_environment
from testbed.netns.lifecycle import plan_from_state, up
from testbed.netns.status import testbed_status
from testbed.netns.teardown import tear_down
from testbed.schedule import parse_duration
from testbed.sim.cli import add_shape_options, shape_from_args


def _progress(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def _add_prefix(p: argparse.ArgumentParser, default: str | None = "qpm-") -> None:
    """Add ``--prefix`` (None: a fresh random prefix per run)."""
    p.add_argument(
        "--prefix",
        default=default,
        help=(
            "name prefix of the testbed's namespaces and links (default %(default)s)"
            if default
            else "name prefix of the testbed (default: a fresh random one, so runs never collide)"
        ),
    )


def _json_arg(
    p: argparse.ArgumentParser, help_: str = "print the report as JSON on stdout"
) -> None:
    p.add_argument("--json", action="store_true", help=help_)


def _up_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p)
    add_shape_options(p)
    p.add_argument(
        "--rate-mbit", type=float, default=100.0, help="fabric link shaping (default %(default)s)"
    )
    p.add_argument(
        "--nic-rate-mbit", type=float, default=1000.0, help="NIC link shaping (default %(default)s)"
    )
    p.add_argument(
        "--latency-ms", type=float, default=20.0, help="tbf queue bound (default %(default)s)"
    )
    _json_arg(p, "print what was built as JSON")


def _up(a: argparse.Namespace) -> int:
    fabric, plan = up(
        shape_from_args(a), a.prefix, fabric_rate_mbit=a.rate_mbit,
        nic_rate_mbit=a.nic_rate_mbit, latency_ms=a.latency_ms, progress=_progress,
    )  # fmt: skip
    doc = {"prefix": plan.prefix, "namespaces": len(plan.namespaces), "links": len(plan.links),
           "broker_addr": plan.broker_addr, "hosts": {h.id: plan.node_ns[h.id] for h in fabric.hosts}}  # fmt: skip
    print(json.dumps(doc) if a.json else f"testbed {plan.prefix} up: {doc['namespaces']} namespaces, "
          f"{doc['links']} links, broker address {plan.broker_addr}")  # fmt: skip
    return 0


def _down(a: argparse.Namespace) -> int:
    check_environment()
    counts = tear_down(a.prefix, _progress)
    print(f"testbed {a.prefix} down: removed {counts['namespaces']} namespaces, "
          f"{counts['links']} root links, {counts['processes']} processes")  # fmt: skip
    return 0


def _status_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p)
    _json_arg(p, "print namespaces, links and processes as JSON")


def _status(a: argparse.Namespace) -> int:
    check_environment()
    st = testbed_status(a.prefix)
    if a.json:
        print(json.dumps(st))
        return 0
    if not st["namespaces"] and not st["root_links"]:
        print(f"testbed {a.prefix}: not running")
        return 0
    alive = [p for p in st["processes"] if p["alive"]]
    print(f"testbed {a.prefix}: {len(st['namespaces'])} namespaces, {len(st['root_links'])} root links, "
          f"broker {st['broker']}, {len(alive)} processes")  # fmt: skip
    for p in alive:
        print(f"  pid {p['pid']}: {p['role']}")
    return 0


def _flap_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p)
    p.add_argument("link", help="link id, e.g. leaf1-spine2 or nic5-leaf1")
    p.add_argument("--down", default="2s", help="down period (default %(default)s)")
    p.add_argument("--up", default="3s", help="up period (default %(default)s)")
    p.add_argument("--times", type=int, default=1, help="cycles (default %(default)s)")


def _flap(a: argparse.Namespace) -> int:
    _, plan = plan_from_state(a.prefix)
    plan.link(a.link)
    sched = faults.flap_schedule(parse_duration(a.down), parse_duration(a.up), a.times)
    t0 = time.monotonic()
    try:
        for t, is_up in sched:
            time.sleep(max(0.0, t - (time.monotonic() - t0)))
            faults.set_link(plan, a.link, up=is_up)
            _progress(f"t={t:.1f}s {a.link} {'up' if is_up else 'down'}")
    finally:
        faults.set_link(plan, a.link, up=True)
    return 0


def _hold(seconds: float | None) -> None:
    if seconds is not None:
        time.sleep(seconds)


def _congest_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p)
    p.add_argument("link", help="link id, e.g. leaf1-spine0")
    p.add_argument(
        "--rate", type=float, default=150.0, help="generator rate in Mbit/s (default %(default)s)"
    )
    p.add_argument(
        "--direction",
        choices=faults.DIRECTIONS,
        default="both",
        help="up = lower end sends, down = upper end sends (default %(default)s)",
    )
    p.add_argument(
        "--for", dest="for_", help="duration, then stop (default: run in background for 1h)"
    )
    p.add_argument("--stop", action="store_true", help="stop this link's background congestion")


def _congest(a: argparse.Namespace) -> int:
    _, plan = plan_from_state(a.prefix)
    plan.link(a.link)
    if a.stop:
        import os

        from testbed.netns.state import alive, load_state

        for p in (load_state(a.prefix) or {}).get("processes", []):
            if p.get("role") == f"congest:{a.link}" and alive(p):
                os.kill(int(p["pid"]), signal.SIGTERM)
        return 0
    dur = parse_duration(a.for_) if a.for_ else 3600.0
    procs = faults.start_congestion(plan, a.link, a.rate, dur, a.direction)
    _progress(
        f"congesting {a.link} ({a.direction}) at {a.rate:g} Mbit/s for {dur:g}s: pids {[p.pid for p in procs]}"
    )
    if a.for_:
        for p in procs:
            p.wait()
    return 0


def _loss_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p)
    p.add_argument("link", help="link id, e.g. leaf0-spine1")
    p.add_argument("--percent", type=float, required=True, help="drop percentage; 0 clears")
    p.add_argument("--for", dest="for_", help="duration, then clear (default: until cleared)")


def _loss(a: argparse.Namespace) -> int:
    _, plan = plan_from_state(a.prefix)
    faults.set_loss(plan, a.link, a.percent)
    if a.for_:
        try:
            _hold(parse_duration(a.for_))
        finally:
            faults.set_loss(plan, a.link, 0)
    return 0


def _nic_down_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p)
    p.add_argument("nic", help="NIC id, e.g. nic5")
    p.add_argument("--up", action="store_true", help="bring it back up (routes restored)")
    p.add_argument("--for", dest="for_", help="duration, then bring it up")


def _nic_down(a: argparse.Namespace) -> int:
    _, plan = plan_from_state(a.prefix)
    faults.set_nic(plan, a.nic, up=a.up)
    if a.for_ and not a.up:
        try:
            _hold(parse_duration(a.for_))
        finally:
            faults.set_nic(plan, a.nic, up=True)
    return 0


def _stop_prober_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p)
    p.add_argument("host", help="host id, e.g. host3")
    p.add_argument(
        "--signal",
        default="SIGKILL",
        choices=("SIGKILL", "SIGTERM", "SIGSTOP"),
        help="SIGKILL (default) fires the prober's MQTT last will: 'prober down'",
    )


def _stop_prober(a: argparse.Namespace) -> int:
    _, plan = plan_from_state(a.prefix)
    pids = faults.stop_prober(plan, a.host, getattr(signal, a.signal))
    print(f"signalled {a.signal} to prober pids {pids} on {a.host}")
    return 0


_REPLAY_DESCRIPTION = (
    "Feed the messages a 'testbed run' captured (OUT/mqtt.jsonl: probe batches, paths, "
    "health, presence, with their arrival times) to the controller that OUT/controller.toml "
    "describes, ticking and solving clocks on arrival time, and print its events: why a "
    "fault was or was not localized can be examined after the namespaces are gone."
)


def _replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="the run's output directory (--out of 'testbed run')")
    _json_arg(p, "print events and message counts as JSON")


def _replay(a: argparse.Namespace) -> int:
    from testbed.replay import CAPTURE, clock_check, replay

    out = Path(a.dir)
    for name in (CAPTURE, "controller.toml"):
        if not (out / name).is_file():
            raise ValueError(f"{out / name}: not found (a 'testbed run' output directory has it)")
    doc: dict[str, Any] | None = None
    check, on_tick = clock_check(out)
    with interruptible() as stop:  # the replay's result comes at the end: none if stopped
        r = replay(out, on_tick=on_tick)
        trust = dict(zip(("fine", "coarse", "withheld"), r.delay_trust, strict=True))
        doc = {"events": [e.to_json() for e in r.events],  # the one form of a finding
               "messages": r.outcomes, "clock_solves": r.solves, "delays": trust,
               "clock_check": None if check is None else check.report()}  # fmt: skip
    return finish(stop, doc, as_json=a.json, show=_show_replay)


def _show_replay(doc: Mapping[str, Any]) -> None:
    events = doc["events"]
    t0 = events[0]["t_ns"] if events else 0
    for e in events:
        print(f"{(e['t_ns'] - t0) / 1e9:8.2f} s  {e['kind']:12s} {e['target']:20s} {e['detail']}")
    d = doc["delays"]
    print(f"{len(events)} events; messages {doc['messages']}; {doc['clock_solves']} clock "
          f"solves; delays {d['fine']} fine, {d['coarse']} coarse, {d['withheld']} withheld")  # fmt: skip
    for label, c in (doc.get("clock_check") or {}).items():
        err = c["trusted_error"] or {}
        print(f"clock vs truth, {label}: {c['ticks']} ticks; NIC-ticks {c['fine']} fine, "
              f"{c['coarse']} coarse, {c['withheld']} withheld, {c['unknown']} unknown; "
              f"{c['overconfident']} overconfident; trusted error p99 {err.get('p99_ns')} ns")  # fmt: skip


def _run_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p, None)
    p.add_argument("scenario", help="scenario TOML (see docs/scenarios.md)")
    _json_arg(p)
    p.add_argument(
        "--random-faults", type=int, default=0, metavar="K", help="replace faults by K random ones"
    )
    p.add_argument("--seed", type=int, default=None, help="seed for --random-faults and clocks")
    p.add_argument("--out", help="keep logs and report.json here (default /var/tmp/qpmesh/PREFIX)")
    p.add_argument(
        "--secure",
        action="store_true",
        help="TLS, passwords and the ACL on the broker, probe HMAC, and an adversary (forged "
        "probes, batches as another host, a replay, a forged action); the report gains "
        '"security": what was tried and what got through (docs/mqtt-security.md)',
    )
    p.add_argument(
        "--discover",
        action="store_true",
        help="tell the probers and the controller nothing of the fabric: lldpd in every "
        "namespace, switches answering TTL probes from router ids, probers that find their "
        "NICs and learn their peers, a controller that learns the fabric (checked against "
        'the plan); the report gains "topology": matches_plan, differences (docs/testbed.md)',
    )


def _run(a: argparse.Namespace) -> int:
    from testbed.runner import run_scenario
    from testbed.scenario import load_scenario

    sc = load_scenario(a.scenario)
    prefix = a.prefix or ("r" + secrets.token_hex(3) + "-")
    report: dict[str, Any] = run_scenario(
        sc, prefix, random_k=a.random_faults, seed=a.seed, progress=_progress,
        out_dir=Path(a.out) if a.out else None, secure=a.secure, discover=a.discover,
    )  # fmt: skip
    if a.json:
        print(json.dumps(report))
    else:
        print(f"scenario {report['scenario']}: {len(report['applied'])} fault actions, "
              f"{len(report['events'])} events; missing: {report['missing'] or 'nothing'}")  # fmt: skip
        if "topology" in report:
            t = report["topology"]
            print(f"topology: matches the plan: {t['matches_plan']}; {t['changes']} changes "
                  f"({t['changes_during_run']} during the run); differences: "
                  f"{'; '.join(t['differences']) or 'none'}")  # fmt: skip
        if "security" in report:
            s = report["security"]
            print("security: " + ", ".join(f"{k} {s[k]}" for k in (
                "forged_probes_sent", "forged_probes_accepted", "forged_batches_sent",
                "forged_batches_accepted", "replayed_batches_sent", "replayed_batches_accepted",
                "forged_actions_sent", "forged_actions_accepted")))  # fmt: skip
    return EXIT_INTERRUPTED if report["interrupted"] else 0


_PROBER_DESCRIPTION = (
    "Run 'qpmesh prober --config FILE' with the UDP endpoints' clock hook set to the "
    "virtual clock in --clock (JSON of testbed.vclock.VirtualClock): all namespaces "
    "share one kernel clock, so the testbed gives each emulated host its own."
)


def _prober_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="prober TOML (see docs/prober.md)")
    p.add_argument("--clock", required=True, help="virtual clock JSON written by 'testbed run'")


def _prober(a: argparse.Namespace) -> int:
    from prober.cli import run_prober
    from prober.config import load_config
    from testbed.vclock import load_clock

    return run_prober(load_config(a.config), clock=load_clock(a.clock).apply)


def _prober_cpu_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p, None)
    p.add_argument(
        "--nics", type=int, default=8, help="NICs of the measured host (default %(default)s)"
    )
    p.add_argument(
        "--peers",
        type=int,
        default=32,
        help="peers per NIC: NICs of its group + 16 cross-group (default %(default)s)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=20.0,
        help="measured interval per run (default %(default)s)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=6.0,
        help="seconds after the prober starts before measuring (default %(default)s)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per path, interleaved; medians reported (default %(default)s)",
    )
    p.add_argument(
        "--path",
        choices=(
            "both",
            "all",
            "defer-ab",
            "batch-ab",
            "compiled",
            "batched",
            "per-datagram",
            "compiled-nodefer",
            "compiled-pernic",
        ),
        default="both",
        help="prober.hot_path(s) to measure: both = compiled and the per-datagram baseline, "
        "defer-ab = compiled with and without deferred follow-ups (compiled-nodefer: "
        "prober.defer_follow_ups = false), batch-ab = compiled with and without one C call per "
        "tick for all NICs (compiled-pernic: prober.tick_batch = false), all = every one of "
        "them and batched (default %(default)s)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="run each prober under cProfile; stats in the work directory (prober-PATH-N.prof)",
    )
    p.add_argument(
        "--perf",
        action="store_true",
        help="also sample each prober with `perf record -g` while it is measured: the split of "
        "its CPU (kernel, of which the net_rx softirq veth charges it with, C engine, Python) "
        "and its share without that softirq (the peers' receive of what it sent)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="authenticated probes: a fresh hmac-sha256 key file (mode 0600, in the work "
        "directory) is the prober's [auth] key_file and the peers' keys; the report says "
        '"auth": true and counts "bad_auth" (prober and peers)',
    )
    p.add_argument(
        "--peer-ticks",
        choices=("driver", "readiness"),
        default="driver",
        help="how the peer processes wake: driver = one 10 ms timer ticks all their NICs, as "
        "the prober's own driver does; readiness = a wake-up per arriving datagram batch "
        "(before 2026-11-23 22:30; on veth the prober's sends pay for waking them) "
        "(default %(default)s)",
    )
    _json_arg(p)


def _prober_cpu(a: argparse.Namespace) -> int:
    from testbed.probercpu import (
        BATCH_AB_PATHS,
        DEFAULT_PATHS,
        DEFER_AB_PATHS,
        PATHS,
        run_prober_cpu,
    )

    paths = {
        "both": DEFAULT_PATHS, "all": PATHS, "defer-ab": DEFER_AB_PATHS, "batch-ab": BATCH_AB_PATHS
    }.get(a.path, (a.path,))  # fmt: skip
    report: dict[str, Any] | None = None
    with interruptible() as stop:  # the figures come at the end: none if stopped before
        report = run_prober_cpu(
            nics=a.nics, peers_per_nic=a.peers, seconds=a.seconds, warmup_s=a.warmup,
            repeats=a.repeats, paths=paths, prefix=a.prefix, progress=_progress,
            profile=a.profile, perf=a.perf, auth=a.auth, peer_ticks=a.peer_ticks,
        )  # fmt: skip
    return finish(stop, report, as_json=a.json, show=_show_prober_cpu)


def _show_prober_cpu(report: Mapping[str, Any]) -> None:
    for key in ("prober", "baseline"):
        if f"{key}_cpu_percent_of_one_core" in report:
            print(f"{key:8s} {report[f'{key}_cpu_percent_of_one_core']:6.2f} % of one core, "
                  f"{report[f'{key}_cpu_us_per_probe']} us per probe, "
                  f"{report[f'{key}_records_per_s']} records/s, "
                  f"{report[f'{key}_answered_per_s']} answered/s")  # fmt: skip
        if f"{key}_cpu_percent_excluding_net_rx_softirq" in report:
            print(f"{'':8s} {report[f'{key}_cpu_percent_excluding_net_rx_softirq']:6.2f} % "
                  "without the net_rx softirq veth charges it with (perf)")  # fmt: skip
    if report["auth"]:
        print(f"auth     hmac-sha256 both ways, {report['bad_auth']} datagrams failed auth")
    if "nodefer_cpu_percent_of_one_core" in report:
        print(f"nodefer  {report['nodefer_cpu_percent_of_one_core']:6.2f} % of one core "
              "(compiled, a FOLLOW_UP per reply)")  # fmt: skip
    if "pernic_cpu_percent_of_one_core" in report:
        print(f"pernic   {report['pernic_cpu_percent_of_one_core']:6.2f} % of one core "
              "(compiled, each NIC ticked from Python)")  # fmt: skip


def _recovery_demo_args(p: argparse.ArgumentParser) -> None:
    _add_prefix(p, None)
    _json_arg(p)
    p.add_argument("--steps", type=int, default=60, help="training steps (default %(default)s)")
    p.add_argument(
        "--step-s",
        type=float,
        default=0.05,
        help="emulated compute per step, s (default %(default)s)",
    )
    p.add_argument(
        "--fault-step", type=int, default=15, help="cut the link once rank 0 did this many steps"
    )
    p.add_argument(
        "--down", default="6s", help="link down time, > --job-timeout (default %(default)s)"
    )
    p.add_argument(
        "--short-flap",
        default="0.5s",
        help="down time of the short_flap run, < --hold (default %(default)s)",
    )
    p.add_argument(
        "--hold", default="1s", help="policy hold before moving a job (default %(default)s)"
    )
    p.add_argument(
        "--job-timeout",
        default="3s",
        help="the stock job's collective timeout (default %(default)s)",
    )
    p.add_argument(
        "--collective-timeout",
        default="1s",
        help="the agent's short collective timeout (default %(default)s)",
    )
    p.add_argument(
        "--trigger",
        choices=("injector", "mesh", "controller"),
        default="injector",
        help="who reports the link failure to the policy: the fault injector when it cuts the link "
        "(deterministic), or the probe mesh (probers + controller, detection time included; "
        "see docs/recovery.md for how often it reported in time here); controller: the probe "
        "mesh and the controller's own remediation (Control on) acts, the driver only watches "
        "(default %(default)s)",
    )
    p.add_argument("--out", help="copy the runs' logs and per-rank results here")


def _recovery_demo(a: argparse.Namespace) -> int:
    from testbed.recovery_demo import run_demo

    check_environment()
    report: dict[str, Any] | None = None
    with interruptible() as stop:  # the report comes at the end: none if stopped before
        report = run_demo(
            steps=a.steps, step_s=a.step_s, fault_step=a.fault_step,
            down_s=parse_duration(a.down), short_flap_s=parse_duration(a.short_flap),
            hold_s=parse_duration(a.hold), job_timeout_s=parse_duration(a.job_timeout),
            collective_timeout_s=parse_duration(a.collective_timeout), trigger=a.trigger,
            prefix=a.prefix, progress=_progress, out_dir=Path(a.out) if a.out else None,
        )  # fmt: skip
    return finish(stop, report, as_json=a.json, show=_show_recovery_demo)


def _show_recovery_demo(report: Mapping[str, Any]) -> None:
    for name, r in report["runs"].items():
        extra = r.get("outcome", "") or (
            f"recovered in {r['recovery_seconds']} s" if "recovery_seconds" in r else ""
        )
        print(f"{name:12s} completed={r['completed']!s:5s} {r['seconds']:7.2f} s "
              f"steps={r['steps_done']} checksum={r['param_checksum']} {extra}")  # fmt: skip
    print(f"same parameters as no_failure: {report['same_params_as_no_failure']}")


Handler = Callable[[argparse.Namespace], int]
AddArgs = Callable[[argparse.ArgumentParser], None]

# The subcommands in --help order: name, help, handler, its arguments, description (""= help).
COMMANDS: tuple[tuple[str, str, Handler, AddArgs, str], ...] = (
    ("up", "build the fabric (namespaces, veths, ECMP routes, shaping, management bridge)",
     _up, _up_args, ""),
    ("down", "remove everything the testbed made (idempotent, also after a crash)",
     _down, _add_prefix, ""),
    ("status", "list what exists of the testbed", _status, _status_args, ""),
    ("flap", "flap a link: down/up cycles (the link black-holes both ways while down)",
     _flap, _flap_args, ""),
    ("congest", "congest a link with background UDP sharing its queue", _congest, _congest_args,
     ""),
    ("loss", "random loss on a link, both directions (nftables numgen)", _loss, _loss_args, ""),
    ("nic-down", "take a NIC down (or --up)", _nic_down, _nic_down_args, ""),
    ("stop-prober", "stop the prober of a host (by pid)", _stop_prober, _stop_prober_args, ""),
    ("prober", "run a prober whose stamps read an emulated host's virtual clock (used by 'run')",
     _prober, _prober_args, _PROBER_DESCRIPTION),
    ("run", "run a scenario: fabric, broker, probers, controller, faults -> JSON report",
     _run, _run_args, ""),
    ("chaos", chaos_cli.HELP, chaos_cli.chaos, chaos_cli.chaos_args, ""),
    ("replay", "replay a 'testbed run' output directory through a fresh controller, offline",
     _replay, _replay_args, _REPLAY_DESCRIPTION),
    ("prober-cpu", "CPU share of one prober process running the default schedule (8 NICs x 32 "
     "peers by default) in namespaces, compiled hot path and per-datagram baseline in the same "
     "run", _prober_cpu, _prober_cpu_args, ""),
    ("recovery-demo", "a PyTorch (CPU, gloo) job across two hosts survives a NIC link failure: "
     "runs no_failure, no_recovery, recovery, short_flap side by side",
     _recovery_demo, _recovery_demo_args, ""),
)  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``qpmesh testbed`` and its subcommands (`COMMANDS`)."""
    tb = sub.add_parser("testbed", help="emulated leaf-spine fabric in network namespaces, faults",
                        description="Real packets through namespaces: up/down/status, faults, scenario runs (root).")  # fmt: skip
    ts = tb.add_subparsers(dest="testbed_command", metavar="TESTBED_COMMAND", required=True)
    for name, help_, handler, add_args, description in COMMANDS:
        p = ts.add_parser(name, help=help_, description=description or help_)
        add_args(p)
        p.set_defaults(func=handler)
